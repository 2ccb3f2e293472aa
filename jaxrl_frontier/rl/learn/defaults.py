"""The learner's config section: `optimizer` (the keys `optimizer.build_optimizer` reads:
AdamW, its schedule, clipping; and gradient accumulation, read by the learner)."""

from __future__ import annotations

import ml_collections


def optimizer_section() -> ml_collections.ConfigDict:
    """`optimizer`: AdamW, its schedule, clipping and gradient accumulation."""
    s = ml_collections.ConfigDict()
    s.lr = 1e-4
    s.schedule = "constant"  # constant | cosine | linear
    s.warmup_steps = 0
    s.b1 = 0.9
    s.b2 = 0.99
    s.eps = 1e-8
    s.weight_decay = 0.0
    s.max_grad_norm = 1.0
    s.grad_accum = 1  # microbatches per minibatch
    # the peak lr a value of the optimizer state, not of the program: a population varies it
    # (rl/learn/optimizer.py)
    s.lr_in_state = False
    return s


# The allowed values of this section's keys with a closed set of them (run/config.py checks).
CHOICES: dict[str, tuple] = {
    "optimizer.schedule": ("constant", "cosine", "linear"),
}

# This section's numeric keys: (low, high, low inclusive, high inclusive); None = open.
RANGES: dict[str, tuple] = {
    "optimizer.lr": (0, None, False, None),
    "optimizer.warmup_steps": (0, None, True, None),
    "optimizer.b1": (0, 1, True, False),
    "optimizer.b2": (0, 1, True, False),
    "optimizer.eps": (0, None, True, None),
    "optimizer.weight_decay": (0, None, True, None),
    "optimizer.max_grad_norm": (0, None, True, None),  # 0: no clipping
    "optimizer.grad_accum": (0, None, False, None),
}
