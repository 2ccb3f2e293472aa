"""Below `run/`, no function takes a whole config (docs/design.md, "Sections"): `run/config/sections.py`
builds each layer's typed record from its section, and the builders take the record.

The check reads the package's source (no import needed): a function below `run/` fails when it

- annotates a parameter as a `ConfigDict`;
- reads two top-level keys of one parameter (`config.rollout.x` and `config.data.y`,
  `config.get("env")` and `config.seed`): a whole config, not a section;
- reads a section through a name that says it is the whole config (`config.rewards`,
  `c.train`, `cfg.get("pact")`);

and a call in `run/` fails when it hands a function from below `run/` the whole config
(`config`, `c`, `self.config`, `self.launch_config`). A planted module shows each rule fires.
"""

import ast
import os
import pathlib
import textwrap

import pytest

from jaxrl_frontier.objectives import schema
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run.config import sections

REPO = str(pathlib.Path(__file__).resolve().parents[3])  # tests/run/config/ -> the repository
PKG = os.path.join(REPO, "jaxrl_frontier")
ABOVE = ("run", "sweeps")  # the layers that may hold a whole config

TOP = set(config_lib.base_config().keys())  # seed, mode, rollout, data, ...
SECTIONS = {k for k, v in config_lib.base_config().items() if hasattr(v, "keys")}
WHOLE_NAMES = {"config", "c", "cfg", "conf"}  # names that say: the whole config
WHOLE_ARGS = {"config", "c", "launch_config"}  # in run/: the whole config handed down


def _key_read(node) -> tuple[str, str] | None:
    """(root name, top-level key) of `root.key`, `root.get("key")` or `root["key"]`."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        root, key = node.value.id, node.attr
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and isinstance(node.func.value, ast.Name)
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ):
        root, key = node.func.value.id, node.args[0].value
    elif (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and isinstance(node.slice, ast.Constant)
    ):
        root, key = node.value.id, node.slice.value
    else:
        return None
    if root in ("self", "cls") or key not in TOP:
        return None
    return root, key


def whole_config_reads(source: str, where: str) -> list[str]:
    """The rule breaks (see the module docstring) of the functions in `source`."""
    out = []
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        args = fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs
        for a in args:
            if a.annotation is not None and "ConfigDict" in ast.unparse(a.annotation):
                out.append(f"{where}:{fn.lineno} {fn.name}({a.arg}: ConfigDict)")
        # a parameter typed as something else (a record: `options: SourceOptions`) is not a
        # config, whatever its fields are called; an untyped one is judged by what it reads
        typed = {
            a.arg
            for a in args
            if a.annotation is not None and ast.unparse(a.annotation) not in ("Any", "object")
        }
        params = {a.arg for a in args} - typed
        keys: dict[str, set[str]] = {}
        for node in ast.walk(fn):
            read = _key_read(node)
            if read is not None and read[0] in params:  # a config handed in, not one built
                keys.setdefault(read[0], set()).add(read[1])
        for root, read in keys.items():
            sectioned = read & SECTIONS
            if sectioned and (len(read) >= 2 or root in WHOLE_NAMES):
                out.append(
                    f"{where}:{fn.lineno} {fn.name} reads {root}.{{{', '.join(sorted(read))}}}"
                )
    return out


def below_run_imports(tree: ast.Module) -> set[str]:
    """Names in a run/ module bound to functions or modules from below `run/`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] == "jaxrl_frontier" and len(parts) > 1 and parts[1] not in ABOVE:
                names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == "jaxrl_frontier" and len(parts) > 1 and parts[1] not in ABOVE:
                    names.add(a.asname or a.name)
    return names


def whole_config_handed_down(source: str, where: str) -> list[str]:
    """Calls in a run/ module that hand a function from below `run/` the whole config."""
    tree = ast.parse(source)
    lower = below_run_imports(tree)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        while isinstance(f, ast.Attribute):
            f = f.value
        if not (isinstance(f, ast.Name) and f.id in lower):
            continue
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            whole = (isinstance(arg, ast.Name) and arg.id in WHOLE_ARGS) or (
                isinstance(arg, ast.Attribute) and arg.attr in WHOLE_ARGS
            )
            if whole:
                out.append(f"{where}:{node.lineno} {ast.unparse(node.func)}({ast.unparse(arg)})")
    return out


def _package_files():
    for dirpath, _, files in os.walk(PKG):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                yield os.path.relpath(path, PKG).split(os.sep)[0], os.path.relpath(path, REPO), path


def test_no_function_below_run_takes_the_whole_config():
    broken = []
    for layer, rel, path in _package_files():
        source = open(path).read()
        if layer in ABOVE:
            if layer == "run":
                broken += whole_config_handed_down(source, rel)
        else:
            broken += whole_config_reads(source, rel)
    assert not broken, "the whole config below run/:\n" + "\n".join(broken)


PLANTED = textwrap.dedent(
    """
    import ml_collections

    def typed(section: ml_collections.ConfigDict):
        return section.lr

    def two_sections(cfg_like, tokenizer):
        return cfg_like.rollout.temperature, cfg_like.data.max_prompt_len

    def section_and_seed(options):
        return options.get("data"), options.seed

    def typed_record(options: SourceOptions):
        return options.env, options.seed

    def named_whole(config):
        r = config.rewards
        return r.scorer

    def fine(section, env):
        return section.lr, env.name, section.get("kind")
    """
)


def test_the_check_finds_each_planted_violation():
    found = whole_config_reads(PLANTED, "planted.py")
    assert [f.split()[1].split("(")[0] for f in found] == [
        "typed",
        "two_sections",
        "section_and_seed",
        "named_whole",
    ], found
    handed = textwrap.dedent(
        """
        from jaxrl_frontier.data.tasks import task_for
        from jaxrl_frontier.core import distributed
        from jaxrl_frontier.run.build import build_meshes

        def build(self, config, tok):
            c = config
            build_meshes(c)  # run/ may take the whole config
            task_for(sections.task_options(c), tok)  # a record: fine
            distributed.initialize(self.config)
            return task_for(c, tok)
        """
    )
    found = whole_config_handed_down(handed, "run/planted.py")
    assert [f.split()[1] for f in found] == ["distributed.initialize(self.config)", "task_for(c)"]


def test_sections_build_every_record_from_the_default_config():
    c = config_lib.resolve(config_lib.base_config())
    built = sections.build_all(c)
    assert set(built) >= {"task", "rewards", "source", "eval", "guard", "sft", "distributed"}
    with pytest.raises(AttributeError):
        built["task"].name = "x"  # frozen
    assert built["pact"] is None and built["task"].env is None  # off by default


def test_records_carry_what_spans_sections():
    c = config_lib.resolve(config_lib.base_config())
    c.rollout.update(overlong_cache=2, editors=("dre",), max_new_tokens=6)
    c.update(seed=7)
    c.critic.lr, c.optimizer.lr = None, 3e-4
    c.train.collapse.metric = "eval/pass@4"
    source = sections.source_options(c)
    # empty objective.reward_weights: correctness and every shaped component at weight 1
    assert source.shaped == ("dre", "overlong") and source.seed == 7
    assert dict(source.reward_weights) == {"correctness": 1.0, "dre": 1.0, "overlong": 1.0}
    assert sections.critic_options(c).optimizer.lr == 3e-4  # critic.lr None: optimizer.lr
    c.critic.lr = 1e-3
    assert sections.critic_options(c).optimizer.lr == 1e-3
    peak = sections.peak_options(c)
    assert (peak.export, peak.collapse.metric, peak.collapse.patience) == ("last", "eval/pass@4", 2)
    ev = sections.eval_options(c)
    assert (ev.seed, ev.max_new_tokens, ev.prompts.max_prompt_len) == (7, 6, 16)
    c.env.name = "gridworld"
    assert sections.env_options(c).max_prompt_len == 16  # data.max_prompt_len joins it
    c.rewards.scorer = "sandboxd"
    with pytest.raises(config_lib.ConfigError, match="rewards.scorer.*did you mean 'sandboxed'"):
        sections.reward_options(c)


def test_the_objective_record_is_the_losses_keys_with_an_unset_distill_none():
    c = config_lib.base_config()
    c.objective.weight_kwargs = {"eps_high": 0.28}
    objective = sections.objective_section(c.objective)  # `as_written` is not a loss key
    assert isinstance(objective, schema.ObjectiveSection)
    assert objective.distill is None and objective.weight_kwargs == {"eps_high": 0.28}
    c.objective.distill = ""
    assert sections.objective_section(c.objective).distill is None
    c.objective.distill = "jsd"
    assert sections.objective_section(c.objective).distill == "jsd"
