"""objectives/logprobs.py: log-probs and entropies aligned with the tokens (logits at t - 1
score token t, column 0 is 0), the shifts, the soft-capped output layer, and the chunk
layout of the hidden-state path. The chunked path's values and gradients against the full
logits: tests/rl/learn/test_perf_paths.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.objectives import logprobs
from jaxrl_frontier.objectives.logprobs import (
    OutputLayer,
    PositionChunks,
    chunked_token_stats,
    even_chunk,
    output_logits,
    shift_left,
    shift_right,
    token_entropy,
    token_logprobs,
)

B, T, V = 3, 6, 7


def np_log_softmax(z):
    z = np.asarray(z, np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def data(seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 1.5, (B, T, V)).astype(np.float32)
    tokens = rng.integers(0, V, (B, T)).astype(np.int32)
    return logits, None, tokens


def test_token_logprobs_and_entropy_alignment():
    logits, _, tokens = data()
    logp = np.asarray(token_logprobs(jnp.asarray(logits), jnp.asarray(tokens)))
    ent = np.asarray(token_entropy(jnp.asarray(logits)))
    for b in range(B):
        assert logp[b, 0] == 0.0 and ent[b, 0] == 0.0
        for t in range(1, T):
            l = np_log_softmax(logits[b, t - 1])  # logits at t - 1 predict token t
            np.testing.assert_allclose(logp[b, t], l[tokens[b, t]], rtol=1e-5)
            np.testing.assert_allclose(ent[b, t], -(np.exp(l) * l).sum(), rtol=1e-5)


def test_shifts_by_hand():
    x = jnp.asarray([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    np.testing.assert_array_equal(shift_right(x), [[0, 1, 2], [0, 4, 5]])
    np.testing.assert_array_equal(shift_left(x), [[2, 3, 0], [5, 6, 0]])


def test_output_logits_with_and_without_the_soft_cap():
    h = np.array([[0.5, -1.0], [2.0, 3.0]], np.float32)  # [2, D=2]
    w = np.array([[1.0, 2.0, -4.0], [0.5, 3.0, 1.0]], np.float32)  # [D, V=3]
    z = h @ w  # [[0, -2, -3], [3.5, 13, -5]]
    np.testing.assert_allclose(output_logits(jnp.asarray(h), jnp.asarray(w)), z, rtol=1e-6)
    capped = output_logits(jnp.asarray(h), OutputLayer(jnp.asarray(w), softcap=5.0))
    np.testing.assert_allclose(capped, 5.0 * np.tanh(z / 5.0), rtol=1e-6)
    assert float(jnp.max(capped)) < 5.0  # 13 capped


@pytest.mark.parametrize("blocks", [1, 2])
def test_position_chunks_put_every_result_back_on_its_token(blocks):
    """A per-position result that is the position's target token, through the layout: each
    column t holds token t (columns before `start` 0), whatever the chunking."""
    tokens = jnp.asarray([[5, 1, 2, 3], [6, 7, 8, 9]])
    for start in (1, 2):
        for chunk in (1, 3, 8):
            layout = PositionChunks((2, 4), chunk, start, blocks)
            back = layout.aligned(layout.chunked(layout.targets(tokens)))
            want = np.where(np.arange(4) >= start, np.asarray(tokens), 0)
            np.testing.assert_array_equal(back, want, err_msg=f"start {start} chunk {chunk}")


def test_even_chunk_covers_n_in_the_fewest_chunks_evened_out():
    # (n, at most) -> size: one chunk is n itself; k > 1 chunks of ceil(n / k), rounded up
    # to 8 rows while that stays within the bound
    cases = {(100, 256): 100, (384, 256): 192, (257, 256): 136, (520, 256): 176, (10, 3): 3}
    for (n, most), size in cases.items():
        assert even_chunk(n, most) == size, (n, most)
        assert -(-n // size) == -(-n // min(most, n))  # never more chunks than the bound's
    assert even_chunk(5, 0) == 1  # a bound under one row (context-parallel rows) is one


def test_a_vocab_major_output_layer_scores_as_its_transpose_without_copying_it():
    """A tied embedding E [V, D] as `OutputLayer(E, vocab_major=True)`: the same log-probs
    and gradient (E's) as the [D, V] array E^T, over ragged chunks, and the compiled
    gradient holds no [D, V] array (the transposed table a copy would make)."""
    rng = np.random.default_rng(3)
    d, v = 5, 24  # V, D distinct from every other dimension here (B 3, T 6, chunk 4)
    h = jnp.asarray(rng.normal(size=(B, T, d)), jnp.float32)
    e = jnp.asarray(rng.normal(size=(v, d)), jnp.float32)
    tok = jnp.asarray(rng.integers(0, v, (B, T)), jnp.int32)

    def loss(e, vocab_major):
        w = OutputLayer(e, vocab_major=True) if vocab_major else e.T
        return jnp.sum(chunked_token_stats(h, w, tok, 4, start=2)[0])

    grads = [jax.value_and_grad(loss)(e, vm) for vm in (False, True)]
    np.testing.assert_allclose(grads[1][0], grads[0][0], rtol=1e-6)
    np.testing.assert_allclose(grads[1][1], grads[0][1], rtol=1e-5, atol=1e-6)
    assert grads[1][0] != 0.0
    hlo = jax.jit(jax.grad(loss), static_argnums=1).lower(e, True).compile().as_text()
    assert f"f32[{d},{v}]" not in hlo and f"[{v},{d}]" in hlo


def test_logits_within_the_byte_budget_are_kept_for_the_backward_pass(monkeypatch):
    """Under `RECOMPUTE_ABOVE_BYTES` the gradient runs the output matmul 3 times (forward,
    and the backward's two products); over it, each chunk is checkpointed and its logits
    computed once more (4). Values and gradients agree either way."""
    rng = np.random.default_rng(4)
    d, v = 5, 24
    h = jnp.asarray(rng.normal(size=(B, T, d)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(d, v)), jnp.float32)
    tok = jnp.asarray(rng.integers(0, v, (B, T)), jnp.int32)

    def loss(h, w):
        return jnp.sum(chunked_token_stats(h, w, tok, 4, start=2)[0])

    def grad_and_matmuls():
        g = jax.value_and_grad(loss, argnums=(0, 1))
        return g(h, w), str(jax.make_jaxpr(g)(h, w)).count("dot_general")

    kept, kept_matmuls = grad_and_matmuls()  # 3 chunks x 4 x 24 x 4 bytes: 1,152 <= budget
    monkeypatch.setattr(logprobs, "RECOMPUTE_ABOVE_BYTES", 1151)
    recomputed, recomputed_matmuls = grad_and_matmuls()
    assert (kept_matmuls, recomputed_matmuls) == (3, 4)
    for a, b in zip(jax.tree.leaves(kept), jax.tree.leaves(recomputed)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_chunked_token_stats_refuses_a_bad_start_and_a_distill_without_teacher():
    h, w, tok = jnp.zeros((2, 3, 4)), jnp.zeros((4, 5)), jnp.zeros((2, 3), jnp.int32)
    with pytest.raises(ValueError, match=r"start = 3 must be in \[1, 3\)"):
        chunked_token_stats(h, w, tok, start=3)
    with pytest.raises(ValueError, match="distill needs teacher_hidden"):
        chunked_token_stats(h, w, tok, distill=lambda zs, zt, y: zs[:, 0])
