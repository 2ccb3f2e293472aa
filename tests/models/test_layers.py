"""models/layers.py: an unsupported RoPE scaling, positions and RoPE by hand, `dense` against the
N-D contraction (values, gradients, and no transposed copies in XLA:CPU's backward)."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_model
from flax import nnx

from jaxrl_frontier.models.layers import apply_rope, dense, positions_from_mask, rope_inv_freq
from jaxrl_frontier.models.model_config import ModelConfig

BASE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
)


def test_an_unsupported_rope_scaling_is_an_error():
    with pytest.raises(ValueError, match=r"rope_scaling type 'dynamic' is not supported"):
        random_model(ModelConfig(**BASE).replace(rope_scaling=(("rope_type", "dynamic"),)))(
            jnp.zeros((1, 2), jnp.int32)
        )


@pytest.mark.parametrize("contract", [1, 2])
def test_dense_equals_einsum_values_and_gradients(contract):
    """`dense` (flattened 2-D matmul) == the N-D contraction, forward and backward."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((3, 5, 4, 6)), jnp.float32)  # [B, T, H, Dh]
    w_shape = (6, 7) if contract == 1 else (4, 6, 7)
    w = jnp.asarray(rng.standard_normal(w_shape), jnp.float32)

    def loss(dense_fn, x, w):
        return jnp.sum(jnp.sin(dense_fn(x, w)))

    flat = lambda x, w: dense(x, w, contract)
    nd = lambda x, w: jnp.tensordot(x, w, contract)
    assert flat(x, w).shape == nd(x, w).shape == x.shape[: 4 - contract] + (7,)
    np.testing.assert_allclose(flat(x, w), nd(x, w), rtol=1e-5, atol=1e-5)
    g_flat = jax.grad(lambda x, w: loss(flat, x, w), argnums=(0, 1))(x, w)
    g_nd = jax.grad(lambda x, w: loss(nd, x, w), argnums=(0, 1))(x, w)
    for a, b in zip(g_flat, g_nd):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="does not end in w's input dims"):
        dense(x, jnp.zeros((5, 7)))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="an XLA:CPU layout property")
def test_mlp_weight_gradients_need_no_transposed_copies():
    """The reason for `dense`: XLA:CPU copies a transposed [B, T, F] cotangent before each
    weight-gradient dot of a 3-D matmul; flattened, the compiled backward has no copy."""
    from jaxrl_frontier.models.layers import MLP

    mlp = MLP(ModelConfig(**BASE), rngs=nnx.Rngs(0))  # one layer's MLP (unstacked)
    graphdef, state = nnx.split(mlp)
    x = jnp.ones((4, 8, BASE["hidden_size"]), jnp.float32)

    def loss(state, x):
        return jnp.sum(nnx.merge(graphdef, state)(x) ** 2)

    hlo = jax.jit(jax.grad(loss)).lower(state, x).compile().as_text()
    copies = re.findall(r"= \S+ (?:copy|transpose)\(", hlo)  # instructions, not metadata
    assert not copies, copies


def test_positions_count_real_tokens_only():
    mask = jnp.asarray([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    np.testing.assert_array_equal(
        positions_from_mask(mask), [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]]
    )


def test_rope_frequencies_and_rotation_by_hand():
    cfg = ModelConfig(**{**BASE, "hidden_size": 16, "num_heads": 4})  # head_dim 4
    np.testing.assert_allclose(rope_inv_freq(cfg), [1.0, 0.01], rtol=1e-6)  # 1e4^(-j/2)
    linear = cfg.replace(rope_scaling=(("factor", 4.0), ("rope_type", "linear")))
    np.testing.assert_allclose(rope_inv_freq(linear), [0.25, 0.0025], rtol=1e-6)
    # rotate-half: pairs (x0, x2) and (x1, x3) turn by position * frequency
    x = jnp.asarray([[[1.0, 2.0, 3.0, 4.0]]])  # [T=1, H=1, Dh=4]
    a, b = 2 * 1.0, 2 * 0.01  # position 2
    want = [
        1 * math.cos(a) - 3 * math.sin(a),
        2 * math.cos(b) - 4 * math.sin(b),
        3 * math.cos(a) + 1 * math.sin(a),
        4 * math.cos(b) + 2 * math.sin(b),
    ]
    got = apply_rope(x, jnp.asarray([2]), jnp.asarray([1.0, 0.01]))
    np.testing.assert_allclose(got[0, 0], want, rtol=1e-5)
