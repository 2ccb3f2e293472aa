"""The optimizer every update uses (`optimizer.*`): AdamW after global-norm clipping, on a
learning-rate schedule of linear warm-up then constant, cosine or linear decay."""

from __future__ import annotations

import optax


def learning_rate_schedule(opt_cfg, total_updates: int) -> optax.Schedule:
    """Linear warmup to `lr` over `warmup_steps`, then constant / cosine / linear decay to 0
    at `total_updates`."""
    warmup = opt_cfg.warmup_steps
    decay_steps = max(total_updates - warmup, 1)
    decay = {
        "constant": lambda: optax.constant_schedule(opt_cfg.lr),
        "cosine": lambda: optax.cosine_decay_schedule(opt_cfg.lr, decay_steps),
        "linear": lambda: optax.linear_schedule(opt_cfg.lr, 0.0, decay_steps),
    }[opt_cfg.schedule]()
    if not warmup:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, opt_cfg.lr, warmup), decay], [warmup])


def build_optimizer(opt_cfg, total_updates: int) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(opt_cfg.max_grad_norm),
        optax.adamw(
            learning_rate_schedule(opt_cfg, total_updates),
            b1=opt_cfg.b1,
            b2=opt_cfg.b2,
            eps=opt_cfg.eps,
            weight_decay=opt_cfg.weight_decay,
        ),
    )
