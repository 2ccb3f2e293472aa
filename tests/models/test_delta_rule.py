"""The gated delta rule (models/delta_rule.py) and the Gated DeltaNet layer
(models/linear_attention.py): the chunk-parallel form equals the token-by-token recurrence
(outputs, final state and gradients) at chunk sizes that do and do not divide the length;
masked tokens (log g = beta = 0) leave the state as it was; the layer's left-padded prompt
gives the unpadded one's outputs and state, and its one-token decode steps continue the
full forward.

Tolerance: f32 throughout, 12 tokens of unit-norm keys; the two forms sum the same terms in
another order, ~1e-7 apart: 2e-6 is the bound.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_frontier.models.delta_rule import (
    chunk_gated_delta_rule,
    delta_rule_step,
    l2norm,
    recurrent_gated_delta_rule,
)
from jaxrl_frontier.models.kv_cache import init_linear_state
from jaxrl_frontier.models.linear_attention import GatedDeltaNet
from jaxrl_frontier.models.model_config import ModelConfig

B, T, H, DK, DV = 2, 12, 3, 8, 6
TOL = 2e-6


def inputs(seed=0):
    r = np.random.RandomState(seed)
    q = l2norm(jnp.asarray(r.randn(B, T, H, DK), jnp.float32)) * DK**-0.5
    k = l2norm(jnp.asarray(r.randn(B, T, H, DK), jnp.float32))
    v = jnp.asarray(r.randn(B, T, H, DV), jnp.float32)
    log_g = -jnp.asarray(r.rand(B, T, H), jnp.float32)
    beta = jax.nn.sigmoid(jnp.asarray(r.randn(B, T, H), jnp.float32))
    state = jnp.asarray(r.randn(B, H, DK, DV), jnp.float32)
    return q, k, v, log_g, beta, state


W_O = jnp.asarray(np.random.RandomState(3).randn(B, T, H, DV), jnp.float32)
W_S = jnp.asarray(np.random.RandomState(4).randn(B, H, DK, DV), jnp.float32)


def loss_grad(fn):
    """args -> ((o, S), the gradient of sum(o w_o) + sum(S w_s) in all six inputs), one
    jitted program."""

    def f(*args):
        o, s = fn(*args)
        return jnp.sum(o * W_O) + jnp.sum(s * W_S), (o, s)

    grad = jax.grad(f, argnums=(0, 1, 2, 3, 4, 5), has_aux=True)
    return jax.jit(lambda *args: grad(*args)[::-1])


@pytest.fixture(scope="module")
def reference():
    """(inputs, (o, S), gradients) of the token-by-token recurrence."""
    args = inputs()
    return (args, *loss_grad(recurrent_gated_delta_rule)(*args))


@pytest.mark.parametrize("chunk", [4, 5])  # 4 divides T = 12, 5 does not (a padded tail)
def test_chunked_equals_recurrence_with_gradients(reference, chunk):
    args, (o_ref, s_ref), g_ref = reference
    (o, s), g = loss_grad(lambda *a: chunk_gated_delta_rule(*a[:5], chunk, a[5]))(*args)
    np.testing.assert_allclose(o, o_ref, atol=TOL)
    np.testing.assert_allclose(s, s_ref, atol=TOL)
    for name, a, b in zip(("q", "k", "v", "log_g", "beta", "state"), g, g_ref):
        scale = float(jnp.abs(b).max())
        np.testing.assert_allclose(a, b, atol=TOL * max(scale, 1.0), err_msg=name)


def test_chunked_outputs_at_edge_chunk_sizes(reference):
    """Chunks of one token and of more than T (one padded chunk), in one program."""
    args, (o_ref, s_ref), _ = reference
    both = jax.jit(lambda *a: [chunk_gated_delta_rule(*a[:5], c, a[5]) for c in (1, 16)])
    for o, s in both(*args):
        np.testing.assert_allclose(o, o_ref, atol=TOL)
        np.testing.assert_allclose(s, s_ref, atol=TOL)


def test_masked_tokens_leave_the_state_unchanged():
    """Tokens with log g = beta = 0 (how the layer masks padding) anywhere in the row: the
    chunked rule's final state and real outputs are those of the real tokens alone."""
    q, k, v, log_g, beta, state = inputs(1)
    real = np.ones((B, T), bool)
    real[0, :3] = False  # left padding
    real[1, 5:7] = False  # a hole
    real[1, -2:] = False  # right padding
    m = jnp.asarray(real)[..., None]
    o, s = jax.jit(chunk_gated_delta_rule, static_argnums=5)(q, k, v, log_g * m, beta * m, 5, state)
    for row in range(B):
        keep = real[row]
        sub = [a[row : row + 1, keep] for a in (q, k, v, log_g, beta)]
        o_ref, s_ref = jax.jit(recurrent_gated_delta_rule)(*sub, state[row : row + 1])
        np.testing.assert_allclose(s[row : row + 1], s_ref, atol=TOL)
        np.testing.assert_allclose(o[row : row + 1, keep], o_ref, atol=TOL)


def test_one_step_is_the_recurrence():
    q, k, v, log_g, beta, state = inputs(2)
    o, s = jax.jit(delta_rule_step)(state, q[:, 0], k[:, 0], v[:, 0], log_g[:, 0], beta[:, 0])
    o_ref, s_ref = jax.jit(recurrent_gated_delta_rule)(
        q[:, :1], k[:, :1], v[:, :1], log_g[:, :1], beta[:, :1], state
    )
    np.testing.assert_allclose(o, o_ref[:, 0], atol=TOL)
    np.testing.assert_allclose(s, s_ref, atol=TOL)


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
