"""SC-GRPO's self-conditioned rows and the per-token KL over the vocabulary.

"Learning from Own Solutions: Self-Conditioned Credit Assignment for Reinforcement Learning
with Verifiable Rewards" (Shan et al. 2026): conditioning the policy on one of its own
verified solutions s to a prompt x moves its next-token distribution most on the pivotal
tokens of a completion y. Per completion token t,

    KL_t = KL( pi(. | x, y<t) || pi(. | x, s, y<t) )
         = sum_v p_u(v) (z_u(v) - z_c(v)) - LSE(z_u) + LSE(z_c)

with z_u, z_c the unconditioned and conditioned logits and p_u = softmax(z_u). The sum runs
over chunks of the vocabulary with running (online) log-sum-exps, so neither [B, T, V]
array exists: one [positions, chunk] block of each side at a time.

The conditioned row is [prompt | solution | completion], the group's first verified
completion (with its stop token) right-aligned in its block so its last token directly
precedes the completion; the padding before it is masked out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_frontier.objectives.logprobs import cap_logits, output_weights

Array = jax.Array


def conditioned_rows(
    tokens: Array,
    attention_mask: Array,
    correct: Array,
    *,
    group_size: int,
    completion_len: int,
) -> tuple[Array, Array, Array]:
    """[prompt | solution | completion] rows for every row of an RL batch.

    tokens, attention_mask int [B, T] (T = Tp + Tn, prompt left-padded, completion
    right-padded); correct bool [B] (verified completions), prompt-major groups of
    `group_size`. -> (tokens [B, Tp + 2 Tn], mask [B, Tp + 2 Tn], solved bool [B]: the row's
    group has a verified completion; the group's first one is the solution). Rows of groups
    without one get the first row as a (meaningless) solution: callers select on `solved`.
    """
    b, t = tokens.shape
    tn = completion_len
    tp = t - tn
    by_group = correct.reshape(-1, group_size)  # [P, G]
    first = jnp.argmax(by_group, axis=1)
    solved = jnp.repeat(jnp.any(by_group, axis=1), group_size)
    rows = jnp.repeat(jnp.arange(b // group_size) * group_size + first, group_size)
    sol, sol_mask = tokens[rows, tp:], attention_mask[rows, tp:]
    shift = tn - jnp.sum(sol_mask, axis=1)  # right-align: no gap before the completion
    sol, sol_mask = (jax.vmap(jnp.roll)(x, shift) for x in (sol, sol_mask))
    out_tokens = jnp.concatenate([tokens[:, :tp], sol, tokens[:, tp:]], axis=1)
    out_mask = jnp.concatenate([attention_mask[:, :tp], sol_mask, attention_mask[:, tp:]], 1)
    return out_tokens, out_mask, solved


def chunked_kl_and_logp(
    h_p: Array,
    h_q: Array,
    w_out: Array,
    y: Array,
    *,
    vocab_chunk: int = 2048,
    position_chunk: int = 1024,
) -> tuple[Array, Array]:
    """(KL(p || q) [N], log q(y) [N]) from hidden states, never forming [N, V] logits.

    h_p, h_q [N, D]: the hidden states whose logits z_p = h_p @ w_out, z_q = h_q @ w_out
    (f32 accumulation, as `Transformer.logits`) define p and q; w_out [D, V] (or an
    `OutputLayer`: the logits soft-capped); y int [N].
    Positions go in chunks of `position_chunk` (`lax.map`), and within each the vocabulary in
    chunks of `vocab_chunk` (`lax.scan`) carrying, per position, the running maxima m_p, m_q,
    the rescaled sums s_p = sum e^(z_p - m_p), s_q, a = sum e^(z_p - m_p) (z_p - z_q) and the
    sampled token's z_q(y); then KL = a / s_p - (m_p + log s_p) + (m_q + log s_q) (clipped at 0
    against rounding) and log q(y) = z_q(y) - (m_q + log s_q).
    """
    n, d = h_p.shape
    w_out, cap = output_weights(w_out)  # a soft-capped output layer (Gemma 2): per logit
    v = w_out.shape[1]
    vc = max(1, min(vocab_chunk, v))
    vpad = -v % vc
    w = jnp.pad(w_out.astype(h_p.dtype), ((0, 0), (0, vpad)))
    w_chunks = w.reshape(d, -1, vc).transpose(1, 0, 2)  # [C, D, vc]
    pc = max(1, min(position_chunk, n))
    npad = -n % pc

    def positions(x):
        x = jnp.pad(x, ((0, npad),) + ((0, 0),) * (x.ndim - 1))
        return x.reshape(-1, pc, *x.shape[1:])

    def one_block(args):
        hp, hq, yy = args  # [pc, D], [pc, D], [pc]

        def step(carry, inputs):
            m_p, s_p, a, m_q, s_q, zy = carry
            wc, v0 = inputs
            zp = jnp.einsum("nd,dv->nv", hp, wc, preferred_element_type=jnp.float32)
            zq = jnp.einsum("nd,dv->nv", hq, wc, preferred_element_type=jnp.float32)
            zp, zq = cap_logits(zp, cap), cap_logits(zq, cap)
            ids = v0 + jnp.arange(vc)
            real = (ids < v)[None]
            zp = jnp.where(real, zp, -jnp.inf)
            zq = jnp.where(real, zq, -jnp.inf)
            new_mp = jnp.maximum(m_p, zp.max(1))
            new_mq = jnp.maximum(m_q, zq.max(1))
            e_p = jnp.exp(zp - new_mp[:, None])  # 0 on padded ids
            scale_p = jnp.exp(m_p - new_mp)
            a = a * scale_p + jnp.sum(e_p * jnp.where(real, zp - zq, 0.0), axis=1)
            s_p = s_p * scale_p + e_p.sum(1)
            s_q = s_q * jnp.exp(m_q - new_mq) + jnp.exp(zq - new_mq[:, None]).sum(1)
            zy = zy + jnp.sum(jnp.where(ids[None] == yy[:, None], zq, 0.0), axis=1)
            return (new_mp, s_p, a, new_mq, s_q, zy), None

        neg = jnp.full((pc,), -jnp.inf, jnp.float32)
        zero = jnp.zeros((pc,), jnp.float32)
        starts = jnp.arange(w_chunks.shape[0]) * vc
        (m_p, s_p, a, m_q, s_q, zy), _ = jax.lax.scan(
            step, (neg, zero, zero, neg, zero, zero), (w_chunks, starts)
        )
        lse_p, lse_q = m_p + jnp.log(s_p), m_q + jnp.log(s_q)
        return jnp.maximum(a / s_p - lse_p + lse_q, 0.0), zy - lse_q

    kl, logq = jax.lax.map(one_block, (positions(h_p), positions(h_q), positions(y)))
    return kl.reshape(-1)[:n], logq.reshape(-1)[:n]
