"""The gated delta rule (models/delta_rule.py): the chunk-parallel form equals the
token-by-token recurrence (outputs, final state and gradients) at chunk sizes that do and do
not divide the length; masked tokens (log g = beta = 0) leave the state as it was. (The
Gated DeltaNet layer around it: tests/models/test_linear_attention.py.)

Tolerance: f32 throughout, 12 tokens of unit-norm keys; the two forms sum the same terms in
another order, ~1e-7 apart: 2e-6 is the bound.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.models.delta_rule import (
    chunk_gated_delta_rule,
    delta_rule_step,
    l2norm,
    recurrent_gated_delta_rule,
)

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


# packed rows: row 0 holds sequences of 5, 4 and 3 tokens; row 1 one of 7 then 5 tokens of
# padding (segment 0, log g = beta = 0)
SEGMENTS = np.array([[1] * 5 + [2] * 4 + [3] * 3, [1] * 7 + [0] * 5], np.int32)


@pytest.mark.parametrize("chunk", [4, 5])  # segments cross chunk boundaries in both
def test_packed_segments_are_their_sequences_alone_with_gradients(chunk):
    """With `segment`, each sequence of a packed row starts from the zero state: the chunked
    rule equals the recurrence with resets (outputs, final state, gradients) and each
    sequence run alone (outputs; the final state is the last segment's alone)."""
    q, k, v, log_g, beta, state = inputs(4)
    real = jnp.asarray(SEGMENTS > 0)[..., None]
    log_g, beta = log_g * real, beta * real
    seg = jnp.asarray(SEGMENTS)
    zero = jnp.zeros_like(state)
    (o_ref, s_ref), g_ref = loss_grad(
        lambda *a: recurrent_gated_delta_rule(*a[:5], a[5], segment=seg)
    )(q, k, v, log_g, beta, zero)
    (o, s), g = loss_grad(lambda *a: chunk_gated_delta_rule(*a[:5], chunk, a[5], segment=seg))(
        q, k, v, log_g, beta, zero
    )
    np.testing.assert_allclose(o, o_ref, atol=TOL)
    np.testing.assert_allclose(s, s_ref, atol=TOL)
    for name, a, b in zip(("q", "k", "v", "log_g", "beta", "state"), g, g_ref):
        scale = float(jnp.abs(b).max())
        np.testing.assert_allclose(a, b, atol=TOL * max(scale, 1.0), err_msg=name)
    alone = jax.jit(recurrent_gated_delta_rule)
    for row, segments in ((0, (1, 2, 3)), (1, (1,))):
        for sid in segments:
            cols = SEGMENTS[row] == sid
            o_one, s_one = alone(*(x[row : row + 1, cols] for x in (q, k, v, log_g, beta)))
            np.testing.assert_allclose(o[row : row + 1, cols], o_one, atol=TOL)
        if row == 0:  # the last segment's own state
            np.testing.assert_allclose(s[:1], s_one, atol=TOL)
