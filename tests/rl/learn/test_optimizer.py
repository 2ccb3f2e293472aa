"""The optimizer (rl/learn/optimizer.py): the learning-rate schedule at hand-computed steps
(linear warm-up, then constant, cosine or linear decay to 0 at the last update), and one
AdamW step after global-norm clipping against its formula."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.rl.learn.optimizer import (
    OptimizerSection,
    build_optimizer,
    learning_rate_schedule,
)


def _opt(**kw):
    return OptimizerSection(**kw)


@pytest.mark.parametrize(
    "schedule,want",  # lr 0.1, 2 warm-up steps, 10 updates: decay over the last 8
    [
        ("constant", [0.0, 0.05, 0.1, 0.1, 0.1]),
        ("linear", [0.0, 0.05, 0.1, 0.1 * (1 - 4 / 8), 0.0]),
        ("cosine", [0.0, 0.05, 0.1, 0.1 * 0.5 * (1 + math.cos(math.pi * 4 / 8)), 0.0]),
    ],
)
def test_learning_rate_schedule_by_hand(schedule, want):
    lr = learning_rate_schedule(_opt(lr=0.1, warmup_steps=2, schedule=schedule), 10)
    got = [float(lr(s)) for s in (0, 1, 2, 6, 10)]
    np.testing.assert_allclose(got, want, atol=1e-7)


def test_no_warmup_starts_at_lr():
    lr = learning_rate_schedule(_opt(lr=0.1, warmup_steps=0, schedule="linear"), 4)
    np.testing.assert_allclose([float(lr(s)) for s in (0, 2, 4)], [0.1, 0.05, 0.0], atol=1e-7)


def test_one_adamw_step_after_clipping():
    # gradient (3, 4): norm 5, clipped to norm 1 -> g = (0.6, 0.8). Adam's first step is
    # m_hat / (sqrt(v_hat) + eps) = g / (|g| + eps); eps = 1 makes it depend on the gradient's
    # scale, so an unclipped gradient would give (0.75, 0.8) instead. Weight decay adds wd * w.
    opt = _opt(lr=0.1, max_grad_norm=1.0, weight_decay=0.5, eps=1.0)
    tx = build_optimizer(opt, total_updates=10)
    params = {"w": jnp.asarray([1.0, -2.0])}
    updates, _ = tx.update({"w": jnp.asarray([3.0, 4.0])}, tx.init(params), params)
    want = -0.1 * (np.array([0.6 / 1.6, 0.8 / 1.8]) + 0.5 * np.array([1.0, -2.0]))
    np.testing.assert_allclose(np.asarray(updates["w"]), want, rtol=1e-6)
