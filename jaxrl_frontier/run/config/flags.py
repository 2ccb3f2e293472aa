"""The command line of `scripts/train.py`: `--config=FILE[:ARG]`, `--config.KEY=VALUE`
overrides, the help text listing every key, the user's modules named by `--config.modules`
imported before the file loads, and one-line errors naming the flag or key."""

from __future__ import annotations

import difflib
import re

import ml_collections

from jaxrl_frontier.core.errors import ConfigError

USAGE = """usage: train.py --config=configs/FILE.py[:ARG] --workdir=DIR [--config.KEY=VALUE ...]

Train from a config file (SFT or RL); the same command resumes when DIR holds a checkpoint.
  --config=FILE[:ARG]   an experiment file in configs/ (ARG goes to its get_config, e.g.
                        :runlocal for a laptop-sized run)
  --workdir=DIR         checkpoints, metrics.jsonl, rollouts.jsonl, TensorBoard, export/
  --config.KEY=VALUE    override any key, e.g. --config.optimizer.lr=1e-5
  -h, --help            this text

examples:
  python scripts/train.py --config=configs/sft_arith.py:runlocal --workdir=runs/sft_local
  python scripts/train.py --config=configs/grpo_arith.py --workdir=runs/grpo_arith \\
      --config.model.path=runs/sft_arith --config.rollout.temperature=0.8 \\
      --config.metrics.writers="('tensorboard', 'jsonl', 'wandb')"

Ctrl-C or SIGTERM saves a checkpoint and stops; a kill loses at most the steps since the
last checkpoint (docs/reliability.md). Errors in the config, the data or a checkpoint are
one line naming the key, file or step.
"""

HELP_FLAGS = ("-h", "--help", "-help", "--helpfull", "--helpshort")


def wants_help(argv: list[str]) -> bool:
    """Whether `argv` (argv[0]: the program) asks for the help text."""
    return any(a in HELP_FLAGS for a in argv[1:])


def flags_help(fv, doc: str) -> str:
    """The `--help` text of a script whose flags are absl flags in `fv`: its docstring `doc`
    (what it does, with examples), then each flag with its help and default; a ConfigDict
    flag (`--campaign.KEY=VALUE`) lists its keys with their defaults."""
    lines = [doc.strip(), "", "flags:"]
    for name in sorted(fv):
        flag = fv[name]
        if isinstance(flag.default, ml_collections.ConfigDict):
            keys = " ".join(f"{k}={v!r}" for k, v in _flat(flag.default))
            lines.append(_wrap(f"  --{name}.KEY=VALUE  {flag.help}: {keys}"))
            continue
        default = "" if flag.default is None else f" (default: {flag.default!r})"
        lines.append(_wrap(f"  --{name}  {flag.help}{default}"))
    lines.append("  -h, --help  this text")
    return "\n".join(lines)


def _flat(node: ml_collections.ConfigDict, prefix: str = ""):
    for k, v in node.items():
        if isinstance(v, ml_collections.ConfigDict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield prefix + k, v


def usage() -> str:
    """USAGE and the config's key groups (each section with its keys and defaults)."""
    from jaxrl_frontier.run.config import base_config

    lines = [USAGE, "config keys (section: key=default ...):"]
    for section, value in base_config().items():
        if isinstance(value, ml_collections.ConfigDict):
            keys = [f"{k}={_short(v)}" for k, v in value.items()]
            lines.append(_wrap(f"  {section}: " + " ".join(keys)))
        else:
            lines.append(f"  {section}={_short(value)}")
    return "\n".join(lines)


def _short(v) -> str:
    return "{...}" if isinstance(v, ml_collections.ConfigDict) else repr(v)


def _wrap(text: str, width: int = 96) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width, subsequent_indent="      "))


def import_flag_modules(argv: list[str]) -> None:
    """Import the modules of a `--config.modules=...` flag before the config file is loaded:
    the file's kwargs blocks then hold the user's entries' knobs, so `--config.objective.
    advantage_kwargs.KEY=VALUE` can set them (ml-collections adds no key the file lacks)."""
    from jaxrl_frontier.run.config.schema import import_modules

    for i, arg in enumerate(argv):
        if arg.startswith("--config.modules="):
            import_modules(arg.split("=", 1)[1])
        elif arg == "--config.modules" and i + 1 < len(argv):
            import_modules(argv[i + 1])


def parse(argv: list[str]) -> tuple[ml_collections.ConfigDict | None, str | None]:
    """The config (`--config=FILE[:ARG]`, then each `--config.KEY=VALUE`) and `--workdir` of
    `argv` (argv[0]: the program). Bad input is a `ConfigError` of one line naming the flag,
    the key and what is wrong (the nearest key, the expected type)."""
    from absl import flags
    from ml_collections import config_flags

    import_flag_modules(argv)
    fv = flags.FlagValues()
    try:
        config_flags.DEFINE_config_file(
            "config",
            None,
            "Experiment config file (get_config).",
            lock_config=False,
            flag_values=fv,
            sys_argv=list(argv),  # where the --config.KEY=VALUE overrides are read from
        )
        flags.DEFINE_string("workdir", None, "Run directory (checkpoints, logs).", flag_values=fv)
        fv(list(argv))
        return _loaded(fv.config), fv.workdir
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError) as e:
        # ml_collections rejects a typo'd or mistyped override, and a file that sets a key the
        # config lacks, with a repr of its KeyError: say it in one line instead
        raise ConfigError(flag_error(argv, e)) from None


def flag_error(argv: list[str], err: Exception) -> str:
    """One line for the error `err` of parsing `argv`: the `--config.KEY=VALUE` it is about
    with the key's problem (no such key: the nearest one; a value of the wrong type: the type),
    or the config file's own error."""
    text = _one_line(err)
    file_arg = next((a for a in argv[1:] if a.startswith("--config=")), "--config")
    base = _file_config(argv)  # the file's config without the overrides; None if it fails
    if base is None:  # the file's error: its last line (after any traceback config_flags adds)
        last = str(err.args[0] if isinstance(err, KeyError) and err.args else err)
        return f"{file_arg}: {_locked_key_error(text) or last.strip().splitlines()[-1].strip()}"
    overrides = [a for a in argv[1:] if a.startswith("--config.")]
    for arg in overrides:  # a key the config lacks
        problem = key_problem(base, arg[len("--config.") :].split("=", 1)[0])
        if problem:
            return f"{arg}: {problem}"
    for arg in overrides:  # a value that does not parse as the key's type
        key, sep, value = arg[len("--config.") :].partition("=")
        if f"--config.{key}=" in text or text.endswith(f"--config.{key}"):
            if not sep:
                return f"{arg}: no value; give {arg}=VALUE"
            return f"{arg}: config key {key!r} = {value!r}: {_expects(base, key)}"
    return text


def key_problem(config: ml_collections.ConfigDict, key: str) -> str | None:
    """What is wrong with the dotted `key` in `config`: no such key (with the nearest one, or
    the keys there), or a part that is a value, not a section; None if the key exists."""
    node = config
    parts = key.split(".")
    for i, part in enumerate(parts):
        here = ".".join(parts[:i])
        if not isinstance(node, ml_collections.ConfigDict):
            return f"config key {here!r} is a {type(node).__name__}, not a section"
        if part not in node:
            close = difflib.get_close_matches(part, list(node.keys()), n=1)
            if close:
                return f"no config key {key!r}; did you mean {_join(here, close[0])!r}?"
            where = f"under {here!r}" if here else "at the top"
            return f"no config key {key!r}; the keys {where}: {', '.join(sorted(node))}"
        node = node[part]
    return None


def _join(section: str, key: str) -> str:
    return f"{section}.{key}" if section else key


def _expects(config: ml_collections.ConfigDict, key: str) -> str:
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
        node = node[part]
    if isinstance(node[leaf], ml_collections.ConfigDict):
        return f"a section: set its keys (--config.{key}.KEY=VALUE)"
    return f"expected a value of type {node.get_type(leaf).__name__}"


def _loaded(config):
    """The config a file gave (None without --config); for a file that failed to load,
    config_flags hands back a stand-in that raises the file's error when first used."""
    if config is None or isinstance(config, ml_collections.ConfigDict):
        return config
    return config.to_dict()


def _file_config(argv: list[str]) -> ml_collections.ConfigDict | None:
    """The config file's config alone (no overrides), or None when loading it fails."""
    from absl import flags
    from ml_collections import config_flags

    own = [argv[0], *(a for a in argv[1:] if a.startswith("--config="))]  # the file alone
    fv = flags.FlagValues()
    try:
        config_flags.DEFINE_config_file(
            "config", None, "", lock_config=False, flag_values=fv, sys_argv=own
        )
        fv(own)
        return _loaded(fv.config)
    except Exception:  # the file's own error is the one reported
        return None


def _locked_key_error(text: str) -> str | None:
    """ml_collections' error for a file setting a key its (locked) config lacks, which lists
    every field of the section, as one line with the nearest dotted key of the schema."""
    missing = re.search(r'Key "([^"]+)" does not exist', text)
    if not missing:
        return None
    near = re.search(r'Did you mean "([^"]+)"', text)
    if not near:
        return f"the file sets config key {missing[1]!r}, which does not exist"
    from jaxrl_frontier.run.config import base_config

    # the shortest dotted keys of the schema ending in the suggestion ('rollout.temperature',
    # not 'schedules.rollout.temperature')
    found = [k for k in _dotted_keys(base_config()) if k.rsplit(".", 1)[-1] == near[1]]
    depth = min((k.count(".") for k in found), default=0)
    hints = " or ".join(repr(k) for k in found if k.count(".") == depth) or repr(near[1])
    return f"the file sets config key {missing[1]!r}, which does not exist; did you mean {hints}?"


def _dotted_keys(node: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    out = []
    for k, v in node.items():
        out.append(prefix + k)
        if isinstance(v, ml_collections.ConfigDict):
            out += _dotted_keys(v, f"{prefix}{k}.")
    return out


def _one_line(err: Exception) -> str:
    """The text of `err` on one line (a KeyError's str is the repr of its message)."""
    text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
    return " ".join(str(text).replace("\\'", "'").split())
