"""The config schema: every key a run reads, its default, and validation.

Experiment files in `configs/` start from `base_config()` (a locked `ConfigDict`: assigning a
key it lacks, or a value of another type, fails at once in ml-collections) and override what
they change. `resolve(config)` merges any config (a ConfigDict or a plain nested dict) over the
schema, so unknown keys and wrong types raise `ConfigError` naming the dotted key, and settles
the registry kwargs (below). `validate(config)` resolves, then checks choices, consistency and
the registry names and kwargs before anything is built; every error names the key and the
allowed values. None means unset (`config_dict.placeholder`, so a command line can set it).

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
import inspect
import logging
from collections.abc import Mapping
from typing import Any

import ml_collections

from jaxrl_frontier.core import defaults as core_defaults
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.data import defaults as data_defaults
from jaxrl_frontier.models import defaults as model_defaults
from jaxrl_frontier.objectives import losses
from jaxrl_frontier.rl import defaults as rl_defaults
from jaxrl_frontier.rl.learn import defaults as learn_defaults
from jaxrl_frontier.run import parts, population_config
from jaxrl_frontier.train import defaults as train_defaults

log = logging.getLogger(__name__)

# Subtrees whose keys are not fixed by the schema (checked against what they configure).
FREE_FORM = (
    "task.kwargs",
    "task.as_written",  # the file's task and kwargs (presets.with_defaults)
    "env.kwargs",  # the environment's keyword arguments (checked by the environment)
    "objective.reward_weights",  # reward component -> weight, checked against the task's names
    "objective.advantage_kwargs",
    "objective.weight_kwargs",
    "objective.aggregation_kwargs",
    "objective.distill_kwargs",
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
    """All keys with their defaults (a tiny char model on arithmetic, GRPO), composed from each
    layer's sections."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.mode = "rl"  # rl | sft
    c.workdir = ""  # set by --workdir; a run resumes when it holds a checkpoint
    c.mesh = core_defaults.mesh_section()
    c.tokenizer = model_defaults.tokenizer_section()
    c.model = model_defaults.model_section()
    c.teacher = model_defaults.teacher_section()
    c.task = data_defaults.task_section()
    c.data = data_defaults.data_section()
    c.distributed = core_defaults.distributed_section()
    c.rollout = rl_defaults.rollout_section()
    # every key and default of the objective is defined once, in objectives.losses.DEFAULTS
    c.objective = losses.default_config()
    # the registry choices and kwargs as the config file wrote them (presets.finish): how
    # resolve tells a command-line switch of objective.weight etc. from the file's choice
    c.objective.as_written = ml_collections.ConfigDict()
    c.critic = rl_defaults.critic_section()
    c.optimizer = learn_defaults.optimizer_section()
    c.train = train_defaults.train_section()
    c.rewards = data_defaults.rewards_section()
    c.eval = train_defaults.eval_section()
    c.metrics = train_defaults.metrics_section()
    c.env = data_defaults.env_section()
    c.pact = rl_defaults.pact_section()
    # keys that move during a run: a schedule of the step, or a feedback controller (run/knobs.py)
    c.schedules = train_defaults.knob_section()
    c.controllers = train_defaults.knob_section()
    c.population = population_config.population_section()
    # keys that fix shapes or programs, switched at chosen steps (run/stages.py): a list of
    # dict(step=..., overrides={dotted key: value}), each stage on top of the ones before
    c.stages = ()
    c.lock()
    return c


# --------------------------------------------------------------------------- resolve

# The allowed values and ranges of every key, composed from the layers that own them.
CHOICES: dict[str, tuple] = {
    "mode": ("rl", "sft"),
    **model_defaults.CHOICES,
    **data_defaults.CHOICES,
    **rl_defaults.CHOICES,
    **learn_defaults.CHOICES,
    **train_defaults.CHOICES,
    **losses.CHOICES,
}
# (low, high, low inclusive, high inclusive); None = open. The keys also checked for
# consistency below (e.g. group_size >= 2 in RL) are here too.
RANGES: dict[str, tuple] = {
    "seed": (0, None, True, None),
    **core_defaults.RANGES,
    **model_defaults.RANGES,
    **data_defaults.RANGES,
    **rl_defaults.RANGES,
    **learn_defaults.RANGES,
    **train_defaults.RANGES,
    **losses.RANGES,
}


def _range_text(low, high, low_in, high_in) -> str:
    if high is None:
        return f"{'>=' if low_in else '>'} {low}"
    return f"in {'[' if low_in else '('}{low}, {high}{']' if high_in else ')'}"


def _check_ranges(c: ml_collections.ConfigDict) -> None:
    """Each RANGES key (present in this schema) is a finite number within its range."""
    import math

    for key, (low, high, low_in, high_in) in RANGES.items():
        node, *path = c, *key.split(".")
        for part in path[:-1]:
            node = node.get(part) if part in node else None
            if node is None:
                break
        if node is None or path[-1] not in node:
            continue  # a key another part of the schema dropped: nothing to check
        v = node[path[-1]]
        bad = isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
        if not bad:
            bad = v < low or (v == low and not low_in)
            bad = bad or (high is not None and (v > high or (v == high and not high_in)))
        if bad:
            raise ConfigError(
                f"config key {key!r} = {v!r}; allowed: a finite number "
                + _range_text(low, high, low_in, high_in)
            )


def resolve(config: Mapping | ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` merged over `base_config()` (locked): a file may replace a whole section
    (`c.mesh = dict(data=2)`) and still get the section's other keys at their defaults.
    An unknown key or a value of the wrong type raises ConfigError naming the dotted key;
    the objective's kwargs blocks are settled for the entries now chosen (module docstring).
    Idempotent: resolving a resolved config changes nothing."""
    given = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else dict(config)
    out = base_config()
    _merge(out, given, "")
    _settle_task_kwargs(out.task)
    _settle_registry_kwargs(out.objective)
    return out


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


def validate(config: Mapping | ml_collections.ConfigDict, num_devices: int | None = None) -> None:
    """Raise ConfigError naming the first bad key; returns None when the config is usable.

    Resolves first (unknown keys, types, kwargs blocks), then: choices, consistency of the
    sizes with each other and with `num_devices`, registry names and their kwargs."""
    c = resolve(config)
    for key, allowed in CHOICES.items():
        section, name = key.rsplit(".", 1) if "." in key else ("", key)
        value = (c[section] if section else c)[name]
        if value not in allowed:
            raise ConfigError(
                f"config key {key!r} = {value!r}; allowed: {', '.join(map(repr, allowed))}"
            )
    _check_ranges(c)
    _check_consistency(c, num_devices)
    _check_registries(c)
    from jaxrl_frontier.run.knobs import KnobPlan

    KnobPlan.from_config(c, RANGES)  # schedules and controllers: keys, specs, value ranges
    _check_stages(c, num_devices)


def at_step(config: ml_collections.ConfigDict, done: int) -> ml_collections.ConfigDict:
    """The run's config after `done` RL steps: the overrides of every stage started by then
    (step <= done, run/stages.py) over `config`; `config` itself before the first."""
    from jaxrl_frontier.run import stages

    plan = stages.parse(config)
    index = stages.index_at(plan, done)
    return with_overrides(config, stages.overrides_of(plan, index)) if index else config


def with_overrides(config, overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """`config` resolved with {dotted key: value} set: the registry choices first (a switched
    `objective.weight` restarts its kwargs from the new entry's defaults, `resolve`), then
    the keys inside the kwargs blocks. ConfigError names an unknown key or a wrong type."""
    out = resolve(config)
    inside = lambda key: any(key.startswith(f"{b}.") for b in FREE_FORM)
    for group in ([k for k in overrides if not inside(k)], [k for k in overrides if inside(k)]):
        if not group:
            continue
        tree = out.to_dict()
        for key in group:
            *parents, leaf = key.split(".")
            node = tree
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = overrides[key]
        out = resolve(tree)
    return out


def _check_stages(c: ml_collections.ConfigDict, num_devices: int | None) -> None:
    """Each stage's config is a valid run (its errors prefixed with the stage)."""
    from jaxrl_frontier.run import stages

    for i, stage in enumerate(stages.parse(c)):
        try:
            staged = at_step(c, stage.step)
            staged.stages = ()  # checked here, stage by stage
            validate(staged, num_devices)
        except ConfigError as e:
            keys = ", ".join(stage.overrides)
            raise ConfigError(
                f"config key 'stages[{i}]' (from step {stage.step}, sets {keys}): {e}"
            ) from None


def _check_task_kwargs(task_cls: type, kwargs: Mapping) -> None:
    """`task.kwargs` keys against the task's __init__ (following **kwargs up the MRO)."""
    allowed: list[str] = []
    for cls in task_cls.__mro__:
        if "__init__" not in vars(cls):
            continue
        params = list(inspect.signature(vars(cls)["__init__"]).parameters.values())[1:]
        allowed += [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    else:
        return  # **kwargs all the way up: nothing to check against
    for k in kwargs:
        if k not in allowed:
            raise ConfigError(
                f"config key 'task.kwargs.{k}' is not a parameter of task "
                f"{task_cls.__name__}; allowed: {', '.join(sorted(set(allowed)))}"
            )


def _check_registries(c: ml_collections.ConfigDict) -> None:
    """Registry names and their kwargs (task, reward weights, objective) before anything is built."""
    from jaxrl_frontier.data.tasks import TASKS, load_task_module
    from jaxrl_frontier.objectives import advantages, losses

    try:
        load_task_module(c.task.module)  # registers the user's tasks before the lookup
    except (ImportError, OSError) as e:
        raise ConfigError(f"config key 'task.module' = {c.task.module!r}: {e}") from None
    task_cls = TASKS.get(c.task.name)
    _check_task_kwargs(task_cls, c.task.kwargs.to_dict())
    from jaxrl_frontier.run.sections import shaped_rewards

    names = list(task_cls.reward_names) + shaped_rewards(c)  # + rollout shapers' rewards
    if c.env.name:  # an environment run: the episode's rewards (empty weights: the return)
        names = list(check_env_run(c))
    for k, v in c.objective.reward_weights.items():
        if k not in names:
            raise ConfigError(
                f"config key 'objective.reward_weights.{k}': the task {c.task.name!r} has no "
                f"reward {k!r}; its rewards: {', '.join(names)}"
            )
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ConfigError(f"config key 'objective.reward_weights.{k}' = {v!r} is not a number")
    if not c.objective.reward_weights and "correctness" not in names and not c.env.name:
        raise ConfigError(
            "config key 'objective.reward_weights' is empty (the correctness reward only) but "
            f"the task {c.task.name!r} has no 'correctness' reward; its rewards: {', '.join(names)}"
        )
    for k in c.objective.advantage_kwargs:
        if k in advantages.SUPPLIED_KWARGS:
            raise ConfigError(
                f"config key 'objective.advantage_kwargs.{k}' is supplied from the batch "
                "(reward_weights: set objective.reward_weights)"
            )
    section = {k: v for k, v in c.objective.to_dict().items() if k in losses.DEFAULTS}
    try:
        losses.validate_objective_config(section)
    except (KeyError, ValueError) as e:  # both name config.objective.<key>
        raise ConfigError(e.args[0] if e.args else str(e)) from None


def _positive(config, *keys):
    for key in keys:
        section, name = key.split(".")
        if config[section][name] <= 0:
            raise ConfigError(f"config key {key!r} = {config[section][name]} must be positive")


def _check_roles(c: ml_collections.ConfigDict, num_devices: int) -> None:
    """rollout.devices / rollout.mesh / rollout.max_staleness against the devices at hand."""
    import jax

    from jaxrl_frontier.core import sharding

    n, procs = c.rollout.devices, jax.process_count()
    if n < 0 or n >= num_devices or n % procs:
        raise ConfigError(
            f"config key 'rollout.devices' = {n}: must be 0 (rollouts on the training mesh) or "
            f"a multiple of the {procs} processes below the run's {num_devices} devices"
        )
    if n:
        try:
            sharding.resolve_mesh_shape(sharding.mesh_sizes(c.rollout.mesh), n)
        except ValueError as e:
            raise ConfigError(f"config key 'rollout.mesh': {e}") from None
    if c.rollout.max_staleness < 0:
        raise ConfigError("config key 'rollout.max_staleness' must be >= 0")
    parts.check_capabilities(c, procs)  # what the run needs of its parts (run/parts.py)


def check_local_rollouts(c: ml_collections.ConfigDict) -> None:
    """rollout.max_staleness > 0 on several processes: each samples its own prompts in a
    background thread, which must talk to no other process (rl/ahead.py). The parts of a
    run that lack `process_local` are refused, naming their key (run/parts.py)."""
    parts.check_capabilities(c, procs=2, only=("process_local",))


def check_env_run(c: ml_collections.ConfigDict) -> tuple[str, ...]:
    """An environment run (`env.name` set): its section (`check_env_config`), the keys that do
    not go with episodes, and 3SPO's source; returns the run's reward names."""
    from jaxrl_frontier.data.envs.task import check_env_config

    names = check_env_config(c.env)
    if c.env.credit == "3spo" and c.data.source != "sspo":
        raise ConfigError(
            "config key 'env.credit' = '3spo' reads the state history that data.source='sspo' "
            f"keeps (and checkpoints); data.source is {c.data.source!r}"
        )
    refused = {
        "rollout.dropout_rate": c.rollout.dropout_rate > 0,
        "rollout.speculative.draft": c.rollout.speculative.draft is not None,
        "rollout.editors": bool(c.rollout.editors),
        "data.source": c.data.source not in ("uniform", "sspo"),
    }
    for key, bad in refused.items():
        if bad:
            raise ConfigError(f"config key {key!r} is not supported with an environment (env.name)")
    if c.mode == "sft" and not c.env.demonstrations:
        raise ConfigError("config key 'env.demonstrations' is empty: mode='sft' needs them")
    return names


def _check_lora(c: ml_collections.ConfigDict) -> None:
    from jaxrl_frontier.models import lora

    if c.mode != "rl":
        raise ConfigError(
            f"config key 'model.lora.rank' = {c.model.lora.rank}: adapters train in mode='rl' "
            f"only (mode={c.mode!r}); set model.lora.rank = 0"
        )
    try:
        lora.check_targets(c.model.lora.targets)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_consistency(c: ml_collections.ConfigDict, num_devices: int | None) -> None:
    _positive(c, "rollout.group_size", "rollout.max_new_tokens", "data.prompt_batch", "train.steps")
    _positive(c, "train.epochs", "train.minibatches", "optimizer.grad_accum")
    if c.mode == "rl" and c.rollout.group_size < 2:
        raise ConfigError("config key 'rollout.group_size' must be >= 2 for group baselines")
    if c.model.attention == "cudnn" and c.model.dtype != "bfloat16":
        raise ConfigError(
            f"config key 'model.attention' = 'cudnn' runs cuDNN's fused attention, which takes "
            f"bf16 / fp16 inputs only, but model.dtype = {c.model.dtype!r}: set model.dtype = "
            "'bfloat16', or choose 'xla' or 'dot_product'"
        )
    recomputed = {
        "train.recompute_old_logp": c.train.recompute_old_logp,
        "rollout.editors": "dre" in c.rollout.editors,  # DRE changes tokens: recomputed
    }
    if c.mode == "rl" and c.objective.weight == "tis" and any(recomputed.values()):
        key = next(k for k, v in recomputed.items() if v)
        raise ConfigError(
            "config key 'objective.weight' = 'tis' weighs each token by the trainer's over the "
            f"sampler's probability, but {key!r} = {c[key.split('.')[0]][key.split('.')[1]]!r} "
            "replaces the sampler's log-probs with the trainer's (every ratio would be 1): "
            "turn that off, or choose another weight"
        )
    if c.mode == "rl" and c.objective.advantage == "progress":
        raise ConfigError(
            "config key 'objective.advantage' = 'progress' cannot train a policy: its "
            "a_t = beta * (l_policy - l_ref) is 0 at step 0, where the reference is the initial "
            "policy, so the gradient is 0 and the policy never moves from it. Progress is a "
            "test-time score (advantages.step_scores); choose another advantage for mode='rl'"
        )
    if c.mode == "rl" and (c.objective.advantage == "gae") != (c.critic.kind != "none"):
        raise ConfigError(
            f"config key 'critic.kind' = {c.critic.kind!r} with objective.advantage = "
            f"{c.objective.advantage!r}: GAE reads a learned critic's values, so "
            "objective.advantage = 'gae' goes with critic.kind 'head' or 'model', and the "
            "other advantages with critic.kind = 'none'"
        )
    rows = c.data.prompt_batch * c.rollout.group_size
    per_update = c.train.minibatches * c.optimizer.grad_accum
    if rows % per_update:
        raise ConfigError(
            f"batch of {rows} rollouts (data.prompt_batch={c.data.prompt_batch} x "
            f"rollout.group_size={c.rollout.group_size}) is not divisible by "
            f"train.minibatches x optimizer.grad_accum = {per_update}"
        )
    if num_devices is not None:
        from jaxrl_frontier.core import sharding

        if c.mesh.num_devices > num_devices:
            raise ConfigError(
                f"config key 'mesh.num_devices' = {c.mesh.num_devices} but only {num_devices} "
                "devices are available"
            )
        num_devices = c.mesh.num_devices or num_devices
        _check_roles(c, num_devices)
        num_devices -= c.rollout.devices
        try:
            dims = sharding.resolve_mesh_shape(sharding.mesh_sizes(c.mesh), num_devices)
        except ValueError as e:
            raise ConfigError(f"config key 'mesh': {e}") from None
        batch_devices = dims[0] * dims[1]
        micro = rows // per_update
        if micro % batch_devices:
            raise ConfigError(
                f"microbatch of {micro} rollouts is not divisible by the {batch_devices} devices "
                f"on the mesh's batch axes (mesh.data x mesh.fsdp)"
            )
    if c.model.lora.rank:
        _check_lora(c)
    if c.model.init != "scratch" and not c.model.path:
        raise ConfigError(f"config key 'model.path' is required when model.init={c.model.init!r}")
    if c.teacher.init in ("hf", "checkpoint") and not c.teacher.path:
        raise ConfigError(
            f"config key 'teacher.path' is required when teacher.init={c.teacher.init!r}"
        )
    if c.tokenizer.kind == "hf" and not c.tokenizer.path:
        raise ConfigError("config key 'tokenizer.path' is required when tokenizer.kind='hf'")
