"""The optimizer every update uses (`optimizer.*`): AdamW after global-norm clipping, on a
learning-rate schedule of linear warm-up then constant, cosine or linear decay.

With `optimizer.lr_in_state` the peak learning rate is a value of the optimizer state (the
schedule runs at peak 1, then `optax.scale` by the state's `lr`): the same update program
serves any `lr`, so a population's members may vary it and population-based training may
move it (`learning_rate`, `with_learning_rate`). Mathematically the same update; the f32
rounding of lr x schedule differs, so a run keeps the form it started with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import numpy as np
import optax

from jaxrl_frontier.core import records
from jaxrl_frontier.core.records import key


@dataclasses.dataclass(frozen=True)
class OptimizerSection:
    """`optimizer`: AdamW, its schedule, clipping, and gradient accumulation (read by the
    learner). lr_in_state: the peak lr a value of the optimizer state, not of the program,
    so a population may vary it (module docstring)."""

    lr: float = key(1e-4, "the peak learning rate", low=0, low_open=True)
    schedule: str = key("constant", "after the warm-up", choices=("constant", "cosine", "linear"))
    warmup_steps: int = key(0, "updates of linear warm-up from 0", low=0)
    b1: float = key(0.9, "Adam's first-moment decay", low=0, high=1, high_open=True)
    b2: float = key(0.99, "Adam's second-moment decay", low=0, high=1, high_open=True)
    eps: float = key(1e-8, "Adam's epsilon", low=0)
    weight_decay: float = key(0.0, "AdamW's decoupled weight decay", low=0)
    max_grad_norm: float = key(1.0, "global-norm clipping (0: none)", low=0)
    grad_accum: int = key(1, "microbatches per minibatch", low=0, low_open=True)
    lr_in_state: bool = key(False, "the peak lr a value of the optimizer state")

    def __post_init__(self):
        records.check(self, "optimizer")


def learning_rate_schedule(
    opt_cfg: OptimizerSection, total_updates: int, peak: float | None = None
):
    """Linear warmup to `lr` (or `peak`) over `warmup_steps`, then constant / cosine / linear
    decay to 0 at `total_updates`."""
    lr = opt_cfg.lr if peak is None else peak
    warmup = opt_cfg.warmup_steps
    decay_steps = max(total_updates - warmup, 1)
    decay = {
        "constant": lambda: optax.constant_schedule(lr),
        "cosine": lambda: optax.cosine_decay_schedule(lr, decay_steps),
        "linear": lambda: optax.linear_schedule(lr, 0.0, decay_steps),
    }[opt_cfg.schedule]()
    if not warmup:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), decay], [warmup])


def build_optimizer(
    opt_cfg: OptimizerSection, total_updates: int, fixed: Callable | None = None
) -> optax.GradientTransformation:
    """Clipping, then AdamW on `learning_rate_schedule` (its peak in the state with
    `lr_in_state`). fixed(path) -> bool (a `jax.tree_util` key path of the params): the
    leaves the optimizer leaves alone, no AdamW state, step or decay for them (0 updates:
    `optax.set_to_zero`), e.g. an MoE router's balancing bias, which the update moves by
    its own rule (`moe.balance_biases`)."""
    in_state = opt_cfg.lr_in_state
    adamw = optax.adamw(
        learning_rate_schedule(opt_cfg, total_updates, peak=1.0 if in_state else None),
        b1=opt_cfg.b1,
        b2=opt_cfg.b2,
        eps=opt_cfg.eps,
        weight_decay=opt_cfg.weight_decay,
    )
    if fixed is not None:
        label = lambda path, _: "fixed" if fixed(path) else "train"  # noqa: E731
        adamw = optax.multi_transform(
            {"train": adamw, "fixed": optax.set_to_zero()},
            lambda params: jax.tree_util.tree_map_with_path(label, params),
        )
    parts = [optax.clip_by_global_norm(opt_cfg.max_grad_norm), adamw]
    if in_state:  # updates x lr, lr a value of the state (module docstring)
        parts.append(optax.inject_hyperparams(optax.scale)(step_size=opt_cfg.lr))
    return optax.chain(*parts)


INJECTED = (optax.InjectStatefulHyperparamsState, optax.InjectHyperparamsState)


def _injected(opt_state):
    """The state's injected `lr` holder (`optimizer.lr_in_state`: the chain's last), or None."""
    last = opt_state[-1] if isinstance(opt_state, tuple) and opt_state else None
    return last if isinstance(last, INJECTED) and "step_size" in last.hyperparams else None


def learning_rate(opt_state) -> float:
    """The peak learning rate an `optimizer.lr_in_state` optimizer state holds."""
    holder = _injected(opt_state)
    if holder is None:
        raise ValueError("learning_rate: the optimizer state holds no lr (optimizer.lr_in_state)")
    return float(jax.device_get(holder.hyperparams["step_size"]))


def with_learning_rate(opt_state, lr: float):
    """`opt_state` with its peak learning rate set to `lr` (placed as the old value was)."""
    holder = _injected(opt_state)
    if holder is None:
        raise ValueError("with_learning_rate: the optimizer state holds no lr")
    old = holder.hyperparams["step_size"]
    new = jax.device_put(np.asarray(lr, old.dtype), old.sharding)
    holder = holder._replace(hyperparams={**holder.hyperparams, "step_size": new})
    return (*opt_state[:-1], holder)
