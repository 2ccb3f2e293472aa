"""Command-line entry points (thin: parse flags, call the library)."""

from __future__ import annotations

import json
import logging
import re
import sys

USAGE = """usage: train.py --config=configs/FILE.py[:ARG] --workdir=DIR [--config.KEY=VALUE ...]

Train from a config file (SFT or RL); the same command resumes when DIR holds a checkpoint.
  --config=FILE[:ARG]   an experiment file in configs/ (ARG goes to its get_config, e.g.
                        :runlocal for a laptop-sized run)
  --workdir=DIR         checkpoints, metrics.jsonl, rollouts.jsonl, TensorBoard, export/
  --config.KEY=VALUE    override any key, e.g. --config.optimizer.lr=1e-5
  -h, --help            this text

Ctrl-C or SIGTERM saves a checkpoint and stops; a kill loses at most the steps since the
last checkpoint (docs/reliability.md). Errors in the config, the data or a checkpoint are
one line naming the key, file or step.
"""


def usage() -> str:
    """USAGE and the config's key groups (each section with its keys and defaults)."""
    from jaxrl_frontier.run.config import base_config

    lines = [USAGE, "config keys (section: key=default ...):"]
    for section, value in base_config().items():
        if hasattr(value, "items"):
            keys = [f"{k}={_short(v)}" for k, v in value.items()]
            lines.append(_wrap(f"  {section}: " + " ".join(keys)))
        else:
            lines.append(f"  {section}={_short(value)}")
    return "\n".join(lines)


def _short(v) -> str:
    if hasattr(v, "items"):
        return "{...}"
    return repr(v)


def _wrap(text: str, width: int = 96) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width, subsequent_indent="      "))


def train_main(argv: list[str] | None = None) -> None:
    """`scripts/train.py` / `jaxrl-train`: --config=FILE[:ARG] --workdir=DIR [--config.k=v ...]."""
    from absl import flags
    from ml_collections import config_flags

    if any(a in ("-h", "--help", "-help", "--helpfull", "--helpshort") for a in argv or sys.argv):
        print(usage())
        return
    flags_ = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config",
        None,
        "Experiment config file (get_config).",
        lock_config=False,
        flag_values=flags_,
    )
    flags.DEFINE_string("workdir", None, "Run directory (checkpoints, logs).", flag_values=flags_)
    argv = list(sys.argv if argv is None else argv)
    try:
        flags_(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
        # ml_collections rejects an override of a key the config lacks (a typo) or of the
        # wrong type with a bare traceback; name the --config.* key instead.
        raise SystemExit(f"config error: {_override_error(argv, e)}") from None
    if flags_.config is None or not flags_.workdir:
        raise SystemExit(USAGE.split("\n\n")[0] + "\n(--help lists the config keys)")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "orbax", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # A failed async save (disk full) makes orbax (through absl) and asyncio log the same
    # error with a traceback from every thread of the save; the one line that matters is the
    # CheckpointSaveError printed below, so orbax's own error records are dropped.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    logging.getLogger("absl").addFilter(_not_orbax_errors)
    sys.unraisablehook = _quiet_closed_loop(sys.unraisablehook)

    from jaxrl_frontier.core import distributed

    try:  # once, before anything touches a device (docs/distributed.md)
        distributed.initialize(flags_.config)
    except ValueError as e:
        raise SystemExit(f"config error: {e}") from None

    from jaxrl_frontier.core.errors import (
        CheckpointError,
        ConfigError,
        ModelFileError,
        TrainingFault,
        WorkdirLocked,
    )
    from jaxrl_frontier.run import trainer

    try:
        summary = _train_then_finish(trainer, flags_.config, flags_.workdir)
    except ConfigError as e:
        raise SystemExit(f"config error: {e}") from None
    except CheckpointError as e:  # a failed save, or no checkpoint that restores
        raise SystemExit(f"checkpoint error: {e}") from None
    except TrainingFault as e:
        raise SystemExit(f"training stopped: {e}") from None
    except WorkdirLocked as e:  # another live trainer writes this workdir
        raise SystemExit(f"workdir locked: {e}") from None
    except ModelFileError as e:
        raise SystemExit(f"model file error: {e}") from None
    except OSError as e:  # e.g. a full disk while writing the logs
        raise SystemExit(f"error: {e.filename or ''}: {e.strerror or e}") from None
    last = summary["history"]["eval"][-1] if summary["history"]["eval"] else {}
    print(json.dumps({"step": summary["step"], "stopped": summary["stopped"], **last}))


def _train_then_finish(trainer, config, workdir) -> dict:
    """Train; then, on several processes, leave in order (`distributed.finish`: process 0,
    which runs the coordination service, last), whatever the run's outcome."""
    from jaxrl_frontier.core import distributed

    try:
        return trainer.train(config, workdir)
    finally:
        distributed.finish(float(config.distributed.get("shutdown_timeout_s", 300)))


def _not_orbax_errors(record: logging.LogRecord) -> bool:
    """False for ERROR records logged from orbax's code (reported once by the trainer)."""
    return not (record.levelno >= logging.ERROR and "/orbax/" in record.pathname)


def _quiet_closed_loop(hook):
    """An unraisable-exception hook that drops the 'Event loop is closed' errors TensorStore's
    callbacks raise after a failed orbax save has closed its event loop."""

    def quiet(unraisable):
        exc = unraisable.exc_value
        if isinstance(exc, RuntimeError) and "Event loop is closed" in str(exc):
            return
        hook(unraisable)

    return quiet


def _override_error(argv: list[str], err: Exception) -> str:
    """Which `--config.KEY=V` override `err` is about (matched on the key's last part)."""
    text = str(err).replace("\\'", "'")
    for arg in argv:
        if arg.startswith("--config."):
            key = arg[len("--config.") :].split("=", 1)[0]
            if re.search(rf"\b{re.escape(key.rsplit('.', 1)[-1])}\b", text):
                return f"bad override {arg!r}: config key {key!r}: {text}"
    return text
