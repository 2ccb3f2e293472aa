"""The Gated DeltaNet layer (models/linear_attention.py): a row padded on the left, on the
right or inside gives the unpadded row's outputs and (conv, delta) state, and its one-token
decode steps continue the full forward. (The delta rule itself: test_delta_rule.py; the
layer against transformers inside a model: test_qwen3_5.py.)

Tolerance: f32, 9 tokens; padding changes no sum (a masked token adds exact zeros), the
decode sums the recurrence's terms in another order than the chunked forward: 2e-6.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_frontier.models.kv_cache import init_linear_state
from jaxrl_frontier.models.linear_attention import GatedDeltaNet
from jaxrl_frontier.models.model_config import ModelConfig

TOL = 2e-6
CFG = ModelConfig(
    vocab_size=16, hidden_size=16, intermediate_size=16, num_layers=1, num_heads=2,
    num_kv_heads=2, layer_types=("linear_attention",), linear_num_key_heads=2,
    linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=4,
    linear_conv_kernel_dim=3, linear_chunk_size=4,
)  # fmt: skip


@pytest.fixture(scope="module")
def layer():
    layer = nnx.eval_shape(lambda: GatedDeltaNet(CFG, nnx.Rngs(0)))
    state = nnx.state(layer)
    r = np.random.RandomState(0)
    redrawn = jax.tree.map(lambda a: np.asarray(0.5 * r.randn(*a.shape), a.dtype), state)
    nnx.update(layer, redrawn)
    return layer


def test_layer_padding_and_decode_continue_the_forward(layer):
    """A row padded on the left, on the right or inside gives the unpadded row's outputs
    (at its real tokens) and (conv, delta) state; one-token recurrent steps from a prefix's
    state give the full forward's outputs."""
    x = jnp.asarray(np.random.RandomState(5).randn(1, 9, 16), jnp.float32)
    run = jax.jit(lambda x, real, state=None, rec=False: layer(x, real, state, rec),
                  static_argnames="rec")  # fmt: skip
    out, (conv, delta) = run(x, jnp.ones((1, 9), bool))
    pad = jnp.zeros((1, 3, 16), jnp.float32)
    left = jnp.concatenate([pad, x], 1)
    out_l, (conv_l, delta_l) = run(left, jnp.asarray([[False] * 3 + [True] * 9]))
    np.testing.assert_allclose(out_l[:, 3:], out, atol=TOL)
    np.testing.assert_allclose(conv_l, conv, atol=TOL)
    np.testing.assert_allclose(delta_l, delta, atol=TOL)
    right = jnp.concatenate([x, pad + 1.0], 1)
    out_r, (conv_r, delta_r) = run(right, jnp.asarray([[True] * 9 + [False] * 3]))
    np.testing.assert_allclose(out_r[:, :9], out, atol=TOL)
    np.testing.assert_allclose(conv_r, conv, atol=TOL)
    np.testing.assert_allclose(delta_r, delta, atol=TOL)

    hole = jnp.concatenate([x[:, :4], pad + 2.0, x[:, 4:]], 1)  # 3 masked tokens inside
    out_h, (conv_h, delta_h) = run(hole, jnp.asarray([[True] * 4 + [False] * 3 + [True] * 5]))
    np.testing.assert_allclose(jnp.concatenate([out_h[:, :4], out_h[:, 7:]], 1), out, atol=TOL)
    np.testing.assert_allclose(conv_h, conv, atol=TOL)
    np.testing.assert_allclose(delta_h, delta, atol=TOL)

    one = jnp.ones((1, 1), bool)
    _, state = run(x[:, :5], jnp.ones((1, 5), bool), init_linear_state(CFG, 1))
    for t in range(5, 9):
        o_t, state = run(x[:, t : t + 1], one, state, rec=True)
        np.testing.assert_allclose(o_t[:, 0], out[:, t], atol=TOL)
    np.testing.assert_allclose(state[1], delta, atol=TOL)
    np.testing.assert_allclose(state[0], conv, atol=TOL)
