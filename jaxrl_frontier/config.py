"""The config schema: every key a run reads, its default, and validation.

Experiment files in `configs/` start from `base_config()` and override what they change.
`validate(config)` runs before anything is built: an unknown key (a typo in a sweep), a
value of the wrong type, or an inconsistent setting raises `ConfigError` naming the key
and the allowed values. Free-form kwargs dicts (`task.kwargs`, `objective.*_kwargs`) are
checked against the signature of the registry entry they configure.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

# Subtrees whose keys are not fixed by the schema (checked against a signature instead).
FREE_FORM = (
    "task.kwargs",
    "objective.reward_weights",  # reward component -> weight, checked against the task's names
    "objective.advantage_kwargs",
    "objective.weight_kwargs",
    "objective.aggregation_kwargs",
    "objective.distill_kwargs",
)


class ConfigError(ValueError):
    """A config value is unknown, mistyped or inconsistent; the message names the key."""


def base_config() -> ml_collections.ConfigDict:
    """All keys with their defaults (a tiny char model on arithmetic, GRPO)."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.mode = "rl"  # rl | sft
    c.workdir = ""  # set by --workdir; a run resumes when it holds a checkpoint

    # -1 takes the remaining devices; num_devices=0 uses all, N > 0 the first N (tests, roles)
    c.mesh = dict(data=-1, fsdp=1, tensor=1, num_devices=0)

    c.tokenizer = dict(kind="char", path="")  # char | hf (path to a tokenizer.json dir)

    c.model = ml_collections.ConfigDict()
    c.model.init = "scratch"  # scratch | hf (path = HF dir) | checkpoint (path = workdir)
    c.model.path = ""
    c.model.vocab_size = 0  # 0: the tokenizer's
    c.model.hidden_size = 128
    c.model.intermediate_size = 384
    c.model.num_layers = 2
    c.model.num_heads = 4
    c.model.num_kv_heads = 2
    c.model.head_dim = 0  # 0: hidden_size // num_heads
    c.model.rope_theta = 10000.0
    c.model.tie_word_embeddings = True
    c.model.qkv_bias = False
    c.model.qk_norm = False
    c.model.max_position_embeddings = 512
    c.model.dtype = "float32"  # compute dtype: float32 | bfloat16
    c.model.remat = False  # recompute each block in the backward pass (memory for FLOPs)

    c.teacher = dict(init="none", path="", dtype="float32")  # none | scratch | hf | checkpoint

    c.task = ml_collections.ConfigDict()
    c.task.name = "arithmetic"
    c.task.kwargs = ml_collections.ConfigDict()

    c.data = dict(prompt_batch=16, max_prompt_len=16)  # P prompts per RL step

    c.rollout = ml_collections.ConfigDict()
    c.rollout.group_size = 8  # G completions per prompt
    c.rollout.max_new_tokens = 8
    c.rollout.temperature = 1.0
    c.rollout.top_k = 0
    c.rollout.top_p = 1.0
    c.rollout.min_p = 0.0
    c.rollout.dropout_rate = 0.0  # Dropout-GRPO: per-rollout fixed MLP dropout mask
    c.rollout.cache_dtype = ""  # KV cache dtype: '' (the compute dtype) | float32 | bfloat16
    # bf16 compute on f32 params: cast the weights once per rollout program (a bf16 copy while
    # it runs) rather than re-read the f32 weights at every decode step
    c.rollout.cast_weights_once = True

    c.objective = ml_collections.ConfigDict()
    c.objective.advantage = "grpo"
    c.objective.advantage_kwargs = ml_collections.ConfigDict()
    c.objective.reward_weights = (
        ml_collections.ConfigDict()
    )  # component -> weight; {} = correctness only
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = ml_collections.ConfigDict()
    c.objective.aggregation = "token_mean"
    c.objective.aggregation_kwargs = ml_collections.ConfigDict()
    c.objective.kl_coef = 0.0
    c.objective.kl_estimator = "k3"
    c.objective.kl_in_reward = False
    c.objective.entropy_coef = 0.0
    c.objective.pg_coef = 1.0
    c.objective.distill = ""  # '' | forward_kl | reverse_kl | jsd | cr_opd
    c.objective.distill_coef = 0.0
    c.objective.distill_kwargs = ml_collections.ConfigDict()

    c.optimizer = ml_collections.ConfigDict()
    c.optimizer.lr = 1e-4
    c.optimizer.schedule = "constant"  # constant | cosine | linear
    c.optimizer.warmup_steps = 0
    c.optimizer.b1 = 0.9
    c.optimizer.b2 = 0.99
    c.optimizer.eps = 1e-8
    c.optimizer.weight_decay = 0.0
    c.optimizer.max_grad_norm = 1.0
    c.optimizer.grad_accum = 1  # microbatches per minibatch

    c.train = ml_collections.ConfigDict()
    c.train.steps = 100
    c.train.epochs = 1  # passes over each rollout batch (PPO epochs)
    c.train.minibatches = 1  # optimizer steps per epoch
    c.train.recompute_old_logp = (
        False  # True: old log-probs from a trainer forward, not the sampler
    )
    # RL: each group's prompt runs through the model once, not once per completion, in the
    # update and the reference/teacher log-probs (same values; the prompt's FLOPs / group
    # size). Minibatches are then drawn as whole groups. Off by itself when a microbatch
    # (rows / minibatches / grad_accum) is not whole groups that split evenly over the
    # batch devices (mesh data x fsdp).
    c.train.share_prompt_forward = True
    c.train.log_every = 10
    c.train.eval_every = 50
    c.train.checkpoint_every = 50
    c.train.keep_checkpoints = 2
    c.train.rollout_log_every = 50
    c.train.sft_batch = 64  # sequences per SFT step
    # > 0: finish once held-out greedy pass@1 reaches this (checked at each eval); e.g. an
    # SFT warm start that should hand RL a policy near 50%, whatever the learning curve.
    c.train.stop_at_pass1 = 0.0

    c.eval = dict(num_prompts=256, pass_k=4, batch=128)
    c.eval.at_start = True  # RL: evaluate the starting policy at step 0 (off: faster tests)
    return c


# --------------------------------------------------------------------------- validation

CHOICES: dict[str, tuple] = {
    "mode": ("rl", "sft"),
    "tokenizer.kind": ("char", "hf"),
    "model.init": ("scratch", "hf", "checkpoint"),
    "model.dtype": ("float32", "bfloat16"),
    "rollout.cache_dtype": ("", "float32", "bfloat16"),
    "teacher.init": ("none", "scratch", "hf", "checkpoint"),
    "teacher.dtype": ("float32", "bfloat16"),
    "optimizer.schedule": ("constant", "cosine", "linear"),
    "objective.kl_estimator": ("k1", "k2", "k3"),
}


def _flatten(cfg: Mapping, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if key in FREE_FORM:
            out[key] = v
        elif isinstance(v, Mapping | ml_collections.ConfigDict):  # ConfigDict is no Mapping
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _type_ok(value, default) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, str):
        return isinstance(value, str)
    return True


def keyword_names(fn: Callable) -> list[str]:
    """Names of the parameters of `fn` that can be passed by keyword."""
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind in kinds]


def check_kwargs(fn: Callable, kwargs: Mapping, key: str, *, skip: int = 0) -> None:
    """Every key of `kwargs` must be a keyword parameter of `fn` (after `skip` positionals)."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    allowed = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for k in kwargs:
        if k not in allowed:
            raise ConfigError(
                f"config key {key}.{k} is not a parameter of {fn.__name__}; "
                f"allowed: {', '.join(allowed) or '(none)'}"
            )


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
    """Raise ConfigError naming the first bad key; returns None when the config is usable."""
    schema = _flatten(base_config())
    given = _flatten(config)
    for key, value in given.items():
        if key not in schema:
            parent = key.rsplit(".", 1)[0] if "." in key else ""
            siblings = sorted(k.rsplit(".", 1)[-1] for k in schema if k.startswith(parent + "."))
            where = f" under {parent!r}" if parent else ""
            raise ConfigError(
                f"unknown config key {key!r}; known keys{where}: {', '.join(siblings)}"
            )
        if not _type_ok(value, schema[key]):
            raise ConfigError(
                f"config key {key!r} = {value!r} has type {type(value).__name__}; "
                f"expected {type(schema[key]).__name__}"
            )
        if key in CHOICES and value not in CHOICES[key]:
            raise ConfigError(
                f"config key {key!r} = {value!r}; allowed: {', '.join(map(repr, CHOICES[key]))}"
            )
    _check_consistency(config, num_devices)
    _check_registries(config)


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
    from jaxrl_frontier.objectives import losses
    from jaxrl_frontier.tasks import TASKS

    try:
        task_cls = TASKS.get(c.task.name)
    except KeyError as e:
        raise ConfigError(f"config key 'task.name': {e.args[0]}") from None
    _check_task_kwargs(task_cls, c.task.kwargs.to_dict())
    names = list(task_cls.reward_names)
    for k, v in c.objective.reward_weights.items():
        if k not in names:
            raise ConfigError(
                f"config key 'objective.reward_weights.{k}': the task {c.task.name!r} has no "
                f"reward {k!r}; its rewards: {', '.join(names)}"
            )
        if not _type_ok(v, 0.0):
            raise ConfigError(f"config key 'objective.reward_weights.{k}' = {v!r} is not a number")
    section = {k: v for k, v in c.objective.to_dict().items() if k in losses.DEFAULTS}
    section["distill"] = section.get("distill") or None
    try:
        losses.validate_objective_config(section)
    except (KeyError, ValueError) as e:  # both name config.objective.<key>
        raise ConfigError(e.args[0] if e.args else str(e)) from None


def _positive(config, *keys):
    for key in keys:
        section, name = key.split(".")
        if config[section][name] <= 0:
            raise ConfigError(f"config key {key!r} = {config[section][name]} must be positive")


def _check_consistency(c: ml_collections.ConfigDict, num_devices: int | None) -> None:
    _positive(c, "rollout.group_size", "rollout.max_new_tokens", "data.prompt_batch", "train.steps")
    _positive(c, "train.epochs", "train.minibatches", "optimizer.grad_accum")
    if c.mode == "rl" and c.rollout.group_size < 2:
        raise ConfigError("config key 'rollout.group_size' must be >= 2 for group baselines")
    rows = c.data.prompt_batch * c.rollout.group_size
    per_update = c.train.minibatches * c.optimizer.grad_accum
    if rows % per_update:
        raise ConfigError(
            f"batch of {rows} rollouts (data.prompt_batch={c.data.prompt_batch} x "
            f"rollout.group_size={c.rollout.group_size}) is not divisible by "
            f"train.minibatches x optimizer.grad_accum = {per_update}"
        )
    if num_devices is not None:
        from jaxrl_frontier import sharding

        if c.mesh.num_devices > num_devices:
            raise ConfigError(
                f"config key 'mesh.num_devices' = {c.mesh.num_devices} but only {num_devices} "
                "devices are available"
            )
        num_devices = c.mesh.num_devices or num_devices
        try:
            dims = sharding.resolve_mesh_shape([c.mesh[a] for a in sharding.MESH_AXES], num_devices)
        except ValueError as e:
            raise ConfigError(f"config key 'mesh': {e}") from None
        batch_devices = dims[0] * dims[1]
        micro = rows // per_update
        if micro % batch_devices:
            raise ConfigError(
                f"microbatch of {micro} rollouts is not divisible by the {batch_devices} devices "
                f"on the mesh's batch axes (mesh.data x mesh.fsdp)"
            )
    if c.model.init != "scratch" and not c.model.path:
        raise ConfigError(f"config key 'model.path' is required when model.init={c.model.init!r}")
    if c.teacher.init in ("hf", "checkpoint") and not c.teacher.path:
        raise ConfigError(
            f"config key 'teacher.path' is required when teacher.init={c.teacher.init!r}"
        )
    if c.tokenizer.kind == "hf" and not c.tokenizer.path:
        raise ConfigError("config key 'tokenizer.path' is required when tokenizer.kind='hf'")


def resolve(config: Mapping) -> ml_collections.ConfigDict:
    """`config` deep-merged over `base_config()`: a file may replace a whole section
    (`c.mesh = dict(data=2)`) and still get the section's other keys at their defaults.
    Unknown keys are kept, so `validate` can name them."""

    def merge(base: dict, given: Mapping, prefix: str) -> dict:
        out = dict(base)
        for k, v in given.items():
            key = f"{prefix}{k}"
            if isinstance(v, Mapping) and isinstance(base.get(k), dict) and key not in FREE_FORM:
                out[k] = merge(base[k], v, key + ".")
            else:
                out[k] = v.to_dict() if hasattr(v, "to_dict") else v
        return out

    given = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return ml_collections.ConfigDict(merge(base_config().to_dict(), given, ""))
