"""The RL loss's parts that need no model (rl/learn/loss.py): an MoE router's terms and
metrics from its statistics, the microbatch's share of them, the replayed routing's
difference from the update's own, the rollout's Dropout-GRPO masks rebuilt from its row
keys, and LoRA's loss over base + adapters; values by hand. (The loss over a model, against
the plain and per-row paths: test_perf_paths.py, test_shared_prompt.py, test_packing.py.)"""

import types
from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_frontier.models.moe import RouterStats
from jaxrl_frontier.rl.learn.loss import (
    add_router_terms,
    dropout_masks,
    replay_difference,
    router_terms,
    with_base,
)
from jaxrl_frontier.run.build import objective_section
from jaxrl_frontier.run.config import base_config


def _objective(**values):
    return replace(objective_section(base_config().objective), **values)


def _stats(own=None):
    """2 layers, 2 experts, 2 counted tokens a layer (k = 1)."""
    own = jnp.zeros((2, 1, 3, 1), jnp.int32) if own is None else own
    return RouterStats(
        load=jnp.array([[3.0, 1.0], [2.0, 2.0]]),
        prob=jnp.array([[1.5, 0.5], [1.0, 1.0]]),
        z=jnp.array([4.0, 8.0]),
        entropy=jnp.array([1.0, 0.6]),
        tokens=jnp.array([2.0, 2.0]),
        experts=own,
        own=own,
        dropped=jnp.float32(1.0),
        assigned=jnp.float32(8.0),
    )


def test_router_terms_by_hand():
    """load balance: E sum_e f_e P_e per layer: 2 (0.75 x 0.75 + 0.25 x 0.25) = 1.25 and
    2 (0.5 x 0.5 + 0.5 x 0.5) = 1, mean 1.125; z: mean(4 / 2, 8 / 2) = 3."""
    loss, metrics = router_terms(_stats(), _objective(router_aux_coef=0.1, router_z_coef=0.01))
    assert float(loss) == pytest.approx(0.1 * 1.125 + 0.01 * 3.0)
    want = {
        "moe/load_balance_loss": 1.125,
        "moe/z_loss": 3.0,
        "moe/load_max": 1.5,  # 3 over layer 0's mean load 2
        "moe/load_min": 0.5,
        "moe/router_entropy": 0.4,  # mean(1 / 2, 0.6 / 2)
        "moe/dropped_share": 0.125,
    }
    assert {k: float(v) for k, v in metrics.items()} == pytest.approx(want)
    zero, _ = router_terms(_stats(), _objective())  # both coefficients 0 by default
    assert float(zero) == 0.0


def test_a_microbatch_adds_its_share_of_the_router_terms():
    """token_mean over a minibatch of 8 counted tokens; this microbatch holds 2 of them."""
    objective = _objective(router_aux_coef=0.1, router_z_coef=0.01)
    mask = jnp.array([[0.0, 1.0, 1.0]])
    loss, metrics = add_router_terms(
        jnp.float32(1.0), {"pg_loss": 0.5}, _stats(), None, objective, mask, jnp.float32(8.0)
    )
    assert float(loss) == pytest.approx(1.0 + 2 / 8 * (0.1 * 1.125 + 0.01 * 3.0))
    assert metrics["pg_loss"] == 0.5 and "moe/routing_diff_share" not in metrics
    whole, _ = add_router_terms(jnp.float32(1.0), {}, _stats(), None, objective, mask, None)
    assert float(whole) == pytest.approx(1.0 + 0.1 * 1.125 + 0.01 * 3.0)  # no denominator: 1


def test_the_replayed_routing_against_the_updates_own():
    """One row of 3 tokens, 2 layers, k = 1. Recorded: token 0 experts (0, 1), token 1
    (1, 1), token 2 none (-1: padding). The update's own: (0, 0), (1, 1), (1, 0): token 0's
    layer 1 differs; token 2 is not counted: 1 of 4 pairs."""
    routing = jnp.array([[[[0], [1]], [[1], [1]], [[-1], [-1]]]])  # [B, T, L, k]
    own = jnp.array([[[0, 1, 1]], [[0, 1, 0]]])[..., None]  # [L, B, T, k]
    assert float(replay_difference(_stats(own), routing)) == pytest.approx(0.25)
    _, metrics = add_router_terms(
        jnp.float32(0.0), {}, _stats(own), routing, _objective(), jnp.ones((1, 3)), None
    )
    assert float(metrics["moe/routing_diff_share"]) == pytest.approx(0.25)


def test_dropout_masks_are_the_rows_keys_masks():
    """[L, B, F]: each entry 0 or 1 / (1 - rate); a row's masks depend on its key alone."""
    cfg = types.SimpleNamespace(num_layers=2, intermediate_size=64, compute_dtype=jnp.float32)
    keys = jax.random.key_data(jax.random.split(jax.random.key(0), 3))
    masks = np.asarray(dropout_masks(cfg, 0.5, keys))
    assert masks.shape == (2, 3, 64) and set(np.unique(masks)) == {0.0, 2.0}
    assert 0.3 < (masks == 0).mean() < 0.7
    again = np.asarray(dropout_masks(cfg, 0.5, keys[::-1]))  # the rows in reverse order
    np.testing.assert_array_equal(again, masks[:, ::-1])
    assert not np.array_equal(masks[:, 0], masks[:, 1])


def test_with_base_differentiates_the_adapters_over_the_frozen_base():
    """loss_of(base + adapters) = w . a, its gradient in the adapters a is w (the base's)."""
    base = nnx.State({"w": jnp.array([1.0, 2.0])})
    adapters = nnx.State({"a": jnp.array([3.0, 4.0])})
    seen = {}

    def loss_of(params, batch, denominator=None, frozen=None):
        seen.update(keys=sorted(params), denominator=denominator)
        return jnp.dot(params["w"], params["a"]) * batch, {}

    adapters_loss = with_base(loss_of)
    (loss, _), grads = jax.value_and_grad(adapters_loss, has_aux=True)(
        adapters, 2.0, denominator=5.0, frozen={"base": base}
    )
    assert float(loss) == 2.0 * (3.0 + 8.0)
    np.testing.assert_array_equal(grads["a"], [2.0, 4.0])
    assert seen == dict(keys=["a", "w"], denominator=5.0)
