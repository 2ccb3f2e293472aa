"""Validation of a run's config, and the config API the rest of the package calls: the
schema's names (`base_config`, `resolve`, `CHOICES`, `RANGES`: `run/config/schema.py`) re-exported,
`validate`, `at_step` (the config after the stages started by a step) and `with_overrides`.

`validate(config)` resolves, then checks choices, ranges, the consistency of the sizes with
each other and with the devices, the registry names and their kwargs, schedules and
controllers, and each stage, before anything is built; every error names the key and the
allowed values. Rules between sections live here, each written once; what a run needs of its
parts (several processes, batches in flight, ...) is declared by the parts
(`run/config/parts.py`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import ml_collections

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.models import moe
from jaxrl_frontier.objectives import losses
from jaxrl_frontier.objectives.advantages import ADVANTAGES
from jaxrl_frontier.rl.produce.editors import EDITORS
from jaxrl_frontier.run.config import parts
from jaxrl_frontier.run.config.schema import (  # noqa: F401  (re-exported: the config API)
    CHOICES,
    FREE_FORM,
    RANGES,
    base_config,
    entry_defaults,
    registry_entry,
    resolve,
)


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
    (step <= done, run/config/stages.py) over `config`; `config` itself before the first."""
    from jaxrl_frontier.run.config import stages

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
    from jaxrl_frontier.run.config import stages

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
    from jaxrl_frontier.objectives import advantages

    try:
        load_task_module(c.task.module)  # registers the user's tasks before the lookup
    except (ImportError, OSError) as e:
        raise ConfigError(f"config key 'task.module' = {c.task.module!r}: {e}") from None
    task_cls = TASKS.get(c.task.name)
    _check_task_kwargs(task_cls, c.task.kwargs.to_dict())
    from jaxrl_frontier.run.config.sections import shaped_rewards

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
    parts.check_capabilities(c, procs)  # what the run needs of its parts (run/config/parts.py)


def check_local_rollouts(c: ml_collections.ConfigDict) -> None:
    """rollout.max_staleness > 0 on several processes: each samples its own prompts in a
    background thread, which must talk to no other process (rl/ahead.py). The parts of a
    run that lack `process_local` are refused, naming their key (run/config/parts.py)."""
    parts.check_capabilities(c, procs=2, only=("process_local",))


def check_env_run(c: ml_collections.ConfigDict) -> tuple[str, ...]:
    """An environment run (`env.name` set): its section (`check_env_config`), the parts that
    do not serve episodes, and 3SPO's source; returns the run's reward names."""
    from jaxrl_frontier.data.envs.task import check_env_config

    names = check_env_config(c.env)
    if c.env.credit == "3spo" and c.data.source != "sspo":
        raise ConfigError(
            "config key 'env.credit' = '3spo' reads the state history that data.source='sspo' "
            f"keeps (and checkpoints); data.source is {c.data.source!r}"
        )
    # the parts that lack episodes, as they declare it (run/config/parts.py)
    parts.check_capabilities(c, procs=1, only=("environment",))
    if c.mode == "sft" and not c.env.demonstrations:
        raise ConfigError("config key 'env.demonstrations' is empty: mode='sft' needs them")
    return names


def _check_teachers(c: ml_collections.ConfigDict) -> None:
    """The teacher's checkpoint (what several teachers and a teacher with its own tokenizer
    do not go with is declared: run/config/parts.py)."""
    t = c.teacher
    if t.init in ("hf", "checkpoint") and not t.path:
        raise ConfigError(f"config key 'teacher.path' is required when teacher.init={t.init!r}")


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


def _check_devices(c: ml_collections.ConfigDict, num_devices: int, micro: int) -> None:
    """`mesh.*`, `mesh.population` and the rollout roles against the `num_devices` at hand;
    `micro`: a microbatch's rollouts, which the mesh's batch axes must divide."""
    from jaxrl_frontier.core import sharding

    if c.mesh.num_devices > num_devices:
        raise ConfigError(
            f"config key 'mesh.num_devices' = {c.mesh.num_devices} but only {num_devices} "
            "devices are available"
        )
    num_devices = c.mesh.num_devices or num_devices
    _check_roles(c, num_devices)
    num_devices -= c.rollout.devices
    population = c.mesh.population  # members' blocks of devices: the mesh is one block's
    if population < 1 or num_devices % population:
        raise ConfigError(
            f"config key 'mesh.population' = {population}: must be >= 1 and divide the "
            f"{num_devices} training devices"
        )
    try:
        dims = sharding.resolve_mesh_shape(sharding.mesh_sizes(c.mesh), num_devices // population)
    except ValueError as e:
        raise ConfigError(f"config key 'mesh': {e}") from None
    batch_devices = dims[0] * dims[1]
    if micro % batch_devices:
        raise ConfigError(
            f"microbatch of {micro} rollouts is not divisible by the {batch_devices} devices "
            f"on the mesh's batch axes (mesh.data x mesh.fsdp)"
        )


def _check_scratch_family(c: ml_collections.ConfigDict) -> None:
    """A scratch model's family has what it needs: GPT-OSS and DeepSeek-V3 experts,
    DeepSeek-V3 a dense first layer before them; a balancing-bias step
    (`model.moe.bias_update_rate`) a router with a bias (a checkpoint's family is checked
    when the learner is built)."""
    if c.model.init != "scratch":
        return
    moe_family = c.model.family in ("gpt_oss", "deepseek_v3")
    if moe_family and not c.model.moe.num_experts:
        raise ConfigError(
            f"config key 'model.family' = {c.model.family!r} is a mixture of experts: set "
            "model.moe.num_experts > 0 (and model.moe.num_experts_per_tok, intermediate_size)"
        )
    if c.model.family == "deepseek_v3" and c.model.num_layers < 2:
        raise ConfigError(
            "config key 'model.family' = 'deepseek_v3' has a dense first layer before its "
            f"mixture-of-experts layers: model.num_layers = {c.model.num_layers} must be >= 2"
        )
    if c.model.moe.bias_update_rate:
        scoring = "softmax" if c.model.moe.num_experts else ""  # "": a dense MLP
        scoring = "sigmoid" if c.model.family == "deepseek_v3" else scoring
        moe.check_bias_update(c.model.moe.bias_update_rate, scoring)


def _check_consistency(c: ml_collections.ConfigDict, num_devices: int | None) -> None:
    _positive(c, "rollout.group_size", "rollout.max_new_tokens", "data.prompt_batch", "train.steps")
    _positive(c, "train.epochs", "train.minibatches", "optimizer.grad_accum")
    if c.mode == "rl" and c.rollout.group_size < 2:
        raise ConfigError("config key 'rollout.group_size' must be >= 2 for group baselines")
    _check_scratch_family(c)
    if c.model.attention == "cudnn" and c.model.dtype != "bfloat16":
        raise ConfigError(
            f"config key 'model.attention' = 'cudnn' runs cuDNN's fused attention, which takes "
            f"bf16 / fp16 inputs only, but model.dtype = {c.model.dtype!r}: set model.dtype = "
            "'bfloat16', or choose 'xla' or 'dot_product'"
        )
    recomputed = {
        "train.recompute_old_logp": c.train.recompute_old_logp,
        # an editor that changes tokens (DRE) has their behaviour log-probs recomputed
        "rollout.editors": any(EDITORS.part(e).changes_tokens for e in c.rollout.editors),
    }
    if c.mode == "rl" and c.objective.weight == "tis" and any(recomputed.values()):
        key = next(k for k, v in recomputed.items() if v)
        raise ConfigError(
            "config key 'objective.weight' = 'tis' weighs each token by the trainer's over the "
            f"sampler's probability, but {key!r} = {c[key.split('.')[0]][key.split('.')[1]]!r} "
            "replaces the sampler's log-probs with the trainer's (every ratio would be 1): "
            "turn that off, or choose another weight"
        )
    advantage = ADVANTAGES.get(c.objective.advantage)
    if c.mode == "rl" and advantage.test_time_only:
        raise ConfigError(
            f"config key 'objective.advantage' = {c.objective.advantage!r} cannot train a "
            f"policy: {advantage.test_time_only}"
        )
    if c.mode == "rl" and advantage.critic != (c.critic.kind != "none"):
        critics = [repr(n) for n in ADVANTAGES.names() if ADVANTAGES.get(n).critic]
        reads = "reads" if len(critics) == 1 else "read"
        raise ConfigError(
            f"config key 'critic.kind' = {c.critic.kind!r} with objective.advantage = "
            f"{c.objective.advantage!r}: {', '.join(critics)} {reads} a learned critic's "
            f"values, so objective.advantage = {' or '.join(critics)} goes with critic.kind "
            "'head' or 'model', and the other advantages with critic.kind = 'none'"
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
        _check_devices(c, num_devices, rows // per_update)
    if c.model.lora.rank:
        _check_lora(c)
    if c.model.init != "scratch" and not c.model.path:
        raise ConfigError(f"config key 'model.path' is required when model.init={c.model.init!r}")
    _check_teachers(c)
    if c.tokenizer.kind == "hf" and not c.tokenizer.path:
        raise ConfigError("config key 'tokenizer.path' is required when tokenizer.kind='hf'")
