"""The config schema: every key a run reads and its default (`base_config()`), the allowed
values and ranges composed from the layers that own them (`CHOICES`, `RANGES`), and
`resolve`, which merges any config over the schema. `run/config/validate.py` validates a resolved
config and re-exports these names (`config.base_config()`, `config.resolve`).

Experiment files in `configs/` start from `base_config()` (a locked `ConfigDict`: assigning a
key it lacks, or a value of another type, fails at once in ml-collections) and override what
they change. `resolve(config)` merges any config (a ConfigDict or a plain nested dict) over the
schema, so unknown keys and wrong types raise `ConfigError` naming the dotted key, and settles
the registry kwargs (below). None means unset (`config_dict.placeholder`, so a command line
can set it).

Free-form blocks (`task.kwargs`, `objective.reward_weights`, `objective.*_kwargs`) are
checked against what they configure: the task's `__init__`, the task's reward names, the
registry entry's keyword defaults (`objectives.losses.entry_defaults`).

Switching a registry entry. `presets.finish` spells out each `objective.<block>_kwargs`
(block = weight, advantage, aggregation, distill) with the chosen entry's defaults, adds an
unset placeholder for every other knob of that registry (so
`--config.objective.weight_kwargs.delta_low=0.1` parses), and records the choices in
`objective.as_written`. When a command line then switches the entry
(`--config.objective.weight=dppo`), `resolve` restarts that block from the new entry's
defaults: keys still holding the value the file wrote for the old entry are dropped (logged),
keys set since (a changed or a new value) are kept, and a key the new entry does not take is
an error naming the allowed keys.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping
from typing import Any

import ml_collections

from jaxrl_frontier.core import records
from jaxrl_frontier.core.defaults import MeshSection
from jaxrl_frontier.core.distributed import DistributedOptions
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.core.registry import import_user_module
from jaxrl_frontier.data.defaults import DataSection, EnvSection, TaskSection
from jaxrl_frontier.data.rewards.judge import JudgeSection
from jaxrl_frontier.data.rewards.reward_model import RewardModelSection
from jaxrl_frontier.data.rewards.scorer import RewardOptions
from jaxrl_frontier.models.defaults import ModelSection, TeacherSection, TokenizerSection
from jaxrl_frontier.objectives import losses
from jaxrl_frontier.objectives.schema import ObjectiveSection
from jaxrl_frontier.rl.learn.optimizer import OptimizerSection
from jaxrl_frontier.rl.methods.pact import PactOptions
from jaxrl_frontier.rl.methods.ppo import CriticSection
from jaxrl_frontier.run import knobs
from jaxrl_frontier.run.config.record_dicts import section
from jaxrl_frontier.run.population import section as population_config
from jaxrl_frontier.sampling.rollout_section import RolloutSection
from jaxrl_frontier.train.defaults import TrainSection
from jaxrl_frontier.train.evaluation import EvalSection
from jaxrl_frontier.train.writers import MetricsOptions

log = logging.getLogger(__name__)

# Every section a layer declares, as the record beside its code (core/records.py): keys,
# defaults, docs, ranges and choices written once, there. In the config's order.
RECORD_SECTIONS: dict[str, type] = {
    "mesh": MeshSection,
    "tokenizer": TokenizerSection,
    "model": ModelSection,
    "teacher": TeacherSection,
    "task": TaskSection,
    "data": DataSection,
    "distributed": DistributedOptions,
    "rollout": RolloutSection,
    "objective": ObjectiveSection,
    "critic": CriticSection,
    "optimizer": OptimizerSection,
    "train": TrainSection,
    "rewards": RewardOptions,
    "eval": EvalSection,
    "metrics": MetricsOptions,
    "env": EnvSection,
    "pact": PactOptions,
    "reward_model": RewardModelSection,
    "judge": JudgeSection,
}

# The sections the composition root declares beside its own code (run/), with keys generated
# from the registries beside theirs: `population.vary` and `population.grid`.
RUN_SECTIONS: dict[str, type] = {"population": population_config.PopulationSection}

# The config's own keys (the composition root's): key -> (default, doc).
RUN_KEYS: dict[str, tuple[Any, str]] = {
    "seed": (0, "the run's seed (every stream folds it in)"),
    "mode": ("rl", "rl | sft"),
    # imported before the config is resolved: the entries they register
    # (`register_advantage`, `register_weight`, `TASKS.register`, ...) can then be named
    "modules": ("", "the user's modules, comma-separated (dotted names or .py files)"),
    "workdir": ("", "set by --workdir; a run resumes when it holds a checkpoint"),
}

# Subtrees whose keys are not fixed by the schema (checked against what they configure): the
# records' free-form blocks (task.kwargs, env.kwargs, objective.<block>_kwargs,
# objective.reward_weights, task.as_written) and the objective's choices as the file wrote
# them (presets.finish).
FREE_FORM = (
    *(
        k
        for name, record in RECORD_SECTIONS.items()
        for k, f in records.flat_keys(name, record).items()
        if records.is_free(f)
    ),
    "objective.as_written",
)


def registry_entry(block: str, name: str):
    """The callable `objective.<block> = name` selects (ConfigError listing the known ones)."""
    from jaxrl_frontier.objectives import losses

    return losses.REGISTRIES[block].get(name)


def entry_defaults(block: str, name: str | None) -> dict[str, Any]:
    """The keyword defaults of the entry `objective.<block> = name` that are set (not None);
    {} for no entry (distill None)."""
    from jaxrl_frontier.objectives import losses

    if not name:
        return {}
    defaults = losses.entry_defaults(registry_entry(block, name))
    return {k: v for k, v in defaults.items() if v is not None}


def base_config() -> ml_collections.ConfigDict:
    """All keys with their defaults (a tiny char model on arithmetic, GRPO), generated from
    the records each layer declares (`RECORD_SECTIONS`), the run's own keys (`RUN_KEYS`) and
    the sections generated from the registries (schedules, controllers, the population's
    varied keys)."""
    c = ml_collections.ConfigDict({k: v for k, (v, _) in RUN_KEYS.items()})
    for name, record in RECORD_SECTIONS.items():
        c[name] = section(record)
    # the registry choices and kwargs as the config file wrote them (presets.finish): how
    # resolve tells a command-line switch of objective.weight etc. from the file's choice
    c.objective.as_written = ml_collections.ConfigDict()
    # keys that move during a run: a schedule of the step, or a feedback controller (run/knobs.py)
    c.schedules = knobs.knob_section()
    c.controllers = knobs.knob_section()
    c.population = population_config.population_section()
    # keys that fix shapes or programs, switched at chosen steps (run/config/stages.py): a list of
    # dict(step=..., overrides={dotted key: value}), each stage on top of the ones before
    c.stages = ()
    c.lock()
    return c


# --------------------------------------------------------------------------- resolve

# The allowed values and ranges of every key, from the records that declare them.
CHOICES: dict[str, tuple] = {
    "mode": ("rl", "sft"),
    **{
        k: v
        for n, r in (RECORD_SECTIONS | RUN_SECTIONS).items()
        for k, v in records.choices(n, r).items()
    },
}
# (low, high, low inclusive, high inclusive); None = open. The keys also checked for
# consistency below (e.g. group_size >= 2 in RL) are here too.
RANGES: dict[str, tuple] = {
    "seed": (0, None, True, None),
    **{
        k: v
        for n, r in (RECORD_SECTIONS | RUN_SECTIONS).items()
        for k, v in records.ranges(n, r).items()
    },
}


def resolve(config: Mapping | ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` merged over `base_config()` (locked): a file may replace a whole section
    (`c.mesh = dict(data=2)`) and still get the section's other keys at their defaults.
    An unknown key or a value of the wrong type raises ConfigError naming the dotted key;
    the objective's kwargs blocks are settled for the entries now chosen (module docstring).
    Idempotent: resolving a resolved config changes nothing."""
    given = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
    out = base_config()
    _merge(out, given, "")
    import_modules(out.modules)
    _settle_task_kwargs(out.task)
    _settle_registry_kwargs(out.objective)
    return out


def import_modules(modules: str) -> None:
    """Import each of the config's `modules` (comma-separated) so their registry entries exist
    before any name is looked up; one that cannot be imported is a `ConfigError` naming it."""
    for module in filter(None, (m.strip() for m in modules.split(","))):
        try:
            import_user_module(module, key="modules")
        except (ImportError, OSError) as e:
            said = str(e).startswith("config key")  # import_user_module's own errors name it
            raise ConfigError(
                str(e) if said else f"config key 'modules' = {module!r}: {e}"
            ) from None


def _merge(node: ml_collections.ConfigDict, given: Mapping, prefix: str) -> None:
    for k, v in given.items():
        key = f"{prefix}{k}"
        if k not in node:
            where = f" under {prefix[:-1]!r}" if prefix else ""
            close = difflib.get_close_matches(k, list(node.keys()), n=1)
            hint = f"; did you mean {prefix + close[0]!r}?" if close else ""
            raise ConfigError(
                f"unknown config key {key!r}{hint} (known keys{where}: {', '.join(sorted(node))})"
            )
        if key in FREE_FORM:
            node[k] = ml_collections.ConfigDict(dict(v or {}))
        elif isinstance(node[k], ml_collections.ConfigDict) and isinstance(v, Mapping):
            _merge(node[k], v, key + ".")
        else:
            try:
                node[k] = v
            except TypeError:  # ml-collections refuses to cast the value to the field's type
                expected = node.get_type(k).__name__
                raise ConfigError(
                    f"config key {key!r} = {v!r} has type {type(v).__name__}; expected {expected}"
                ) from None


def _settle_task_kwargs(t: ml_collections.ConfigDict) -> None:
    """`task.kwargs` without unset placeholders; after a switch away from the task recorded in
    `task.as_written`, restarted from the new task's defaults (keys the file wrote for the old
    task are dropped; keys set anew, e.g. on the command line, are kept)."""
    from jaxrl_frontier.data.tasks import load_task_module
    from jaxrl_frontier.data.tasks.base import task_defaults

    written = t.as_written.to_dict()
    given = {k: v for k, v in t.kwargs.to_dict().items() if v is not None}
    if written.get("name") and written["name"] != t.name:
        as_written = written.get("kwargs") or {}
        kept = {k: v for k, v in given.items() if as_written.get(k, None) != v}
        dropped = {k: v for k, v in given.items() if k not in kept}
        try:
            load_task_module(t.module)  # a user's task registers before its defaults are read
        except (ImportError, OSError) as e:
            raise ConfigError(f"config key 'task.module' = {t.module!r}: {e}") from None
        given = {**task_defaults(t.name), **kept}
        log.info(
            "config: task.name is %r, the config file chose %r: task.kwargs start from %r's "
            "defaults%s",
            t.name,
            written["name"],
            t.name,
            f" (dropped {dropped}, written for {written['name']!r})" if dropped else "",
        )
    t.kwargs = ml_collections.ConfigDict(given)
    if written.get("name"):
        t.as_written = ml_collections.ConfigDict({"name": t.name, "kwargs": dict(given)})


def _settle_registry_kwargs(o: ml_collections.ConfigDict) -> None:
    """Each `<block>_kwargs` for the entry `<block>` names now, without unset placeholders;
    after a switch away from the entry recorded in `as_written`, restarted from the new
    entry's defaults (keys left as the file wrote them for the old entry are dropped)."""
    written = o.as_written.to_dict()
    for block in losses.REGISTRIES:
        kw_key = f"{block}_kwargs"
        name = o[block]
        given = {k: v for k, v in o[kw_key].to_dict().items() if v is not None}
        if block in written and written[block] != name:
            as_written = written.get(kw_key) or {}
            kept = {k: v for k, v in given.items() if as_written.get(k, None) != v}
            dropped = {k: v for k, v in given.items() if k not in kept}
            given = {**entry_defaults(block, name), **kept}
            log.info(
                "config: objective.%s is %r, the config file chose %r: objective.%s start from "
                "%r's defaults%s",
                block,
                name,
                written[block],
                kw_key,
                name,
                f" (dropped {dropped}, written for {written[block]!r})" if dropped else "",
            )
        o[kw_key] = ml_collections.ConfigDict(given)
        written[block], written[kw_key] = name, dict(given)
    o.as_written = ml_collections.ConfigDict(written)


# --------------------------------------------------------------------------- validate
