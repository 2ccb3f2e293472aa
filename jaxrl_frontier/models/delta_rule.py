"""The gated delta rule (Yang, Kautz and Hatamizadeh, 2024, "Gated Delta Networks:
Improving Mamba2 with Delta Rule"), the recurrence of Qwen3.5's linear-attention layers
(`models/linear_attention.py`), in two forms with the same values:

    S_t = g_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T,      o_t = S_t q_t

S_t [Dv, Dk] the state of one head, g_t = exp(log_g_t) in (0, 1] its decay, b_t in [0, 1]
the write strength, k_t (unit norm), q_t [Dk], v_t [Dv]. We store the state transposed,
as transformers and the FLA kernels do: `state` [B, H, Dk, Dv] = S^T, o_t = q_t^T S^T.

- `recurrent_gated_delta_rule`: token by token (a `lax.scan` over T); the decode's
  one-token step is its T = 1 case (`delta_rule_step`).
- `chunk_gated_delta_rule`: chunk-parallel (the WY / UT form of DeltaNet, Yang et al.
  2024): within a chunk of C tokens the C rank-one updates are condensed by one unit lower
  triangular solve into matmuls, and only the chunks are scanned (T / C steps). It serves
  the full forwards (update, log-probs, prefill). Any C; T need not be a multiple (the tail
  is padded with tokens that do not touch the state).

Shapes: q, k [B, T, H, Dk]; v [B, T, H, Dv]; log_g, beta [B, T, H] (H the value heads:
callers repeat grouped key heads first); state [B, H, Dk, Dv]. Everything runs in f32.
A token with log_g = 0 and beta = 0 leaves the state exactly unchanged (S_t = S_{t-1}):
that is how padding is masked (`linear_attention.GatedDeltaNet`).

Packed rows (`segment` [B, T] int, several sequences per row): a token whose segment differs
from the token before it starts from the zero state (S_{t-1} := 0), so each sequence's
outputs and state are its own alone's. In the chunked form no decay crosses a segment
boundary: D_ij = 0 between segments, the chunk's incoming state reaches only the tokens of
its own segment, and only the last token's segment writes the outgoing state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

F32 = jnp.float32


def l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / sqrt(sum(x^2) + eps) over the last axis, in f32 (transformers' and FLA's)."""
    x = x.astype(F32)
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def _zero_state(q, v):
    b, _, h, dk = q.shape
    return jnp.zeros((b, h, dk, v.shape[-1]), F32)


def delta_rule_step(state, q, k, v, log_g, beta):
    """One token: state [B, H, Dk, Dv]; q, k [B, H, Dk]; v [B, H, Dv]; log_g, beta [B, H]
    -> (o [B, H, Dv], the new state). S <- g S; S <- S + k (b (v - S^T k))^T; o = S^T q."""
    state = state * jnp.exp(log_g)[..., None, None]
    kv_mem = jnp.einsum("bhkv,bhk->bhv", state, k)
    delta = (v - kv_mem) * beta[..., None]
    state = state + k[..., :, None] * delta[..., None, :]
    return jnp.einsum("bhkv,bhk->bhv", state, q), state


def segment_starts(segment) -> jax.Array:
    """bool [B, T]: the token's segment id [B, T] differs from the token before it (False at
    t = 0: the first token continues the initial state)."""
    return jnp.concatenate(
        [jnp.zeros_like(segment[:, :1], bool), segment[:, 1:] != segment[:, :-1]], axis=1
    )


def segment_runs(segment) -> jax.Array:
    """int [B, T]: a new id wherever the segment id changes (each contiguous run its own,
    whatever ids the caller used)."""
    return jnp.cumsum(segment_starts(segment), axis=1)


def recurrent_gated_delta_rule(
    q, k, v, log_g, beta, initial_state=None, segment=None, every_state: bool = False
):
    """The gated delta rule token by token (module docstring; `segment` [B, T]: packed
    rows, the state zeroed where a segment starts). -> (o [B, T, H, Dv] f32, final state
    [B, H, Dk, Dv] f32, or every_state: the state after each token [B, T, H, Dk, Dv])."""
    q, k, v, log_g, beta = (a.astype(F32) for a in (q, k, v, log_g, beta))
    state = _zero_state(q, v) if initial_state is None else initial_state.astype(F32)
    inputs = (q, k, v, log_g, beta)
    if segment is not None:  # the state kept (1) or zeroed (0) before each token
        inputs += (1.0 - segment_starts(segment).astype(F32),)

    def step(s, xs):
        if segment is not None:
            *xs, keep = xs
            s = s * keep[:, None, None, None]
        o, s = delta_rule_step(s, *xs)
        return s, (o, s) if every_state else o

    state, ys = jax.lax.scan(step, state, tuple(jnp.moveaxis(a, 1, 0) for a in inputs))
    if every_state:
        return jnp.moveaxis(ys[0], 0, 1), jnp.moveaxis(ys[1], 0, 1)
    return jnp.moveaxis(ys, 0, 1), state


def chunk_gated_delta_rule(
    q, k, v, log_g, beta, chunk_size: int = 64, initial_state=None, segment=None
):
    """The gated delta rule, chunk-parallel (as transformers' `torch_chunk_gated_delta_rule`).

    Per chunk of C tokens with in-chunk cumulative log decay c_i (position i), decays
    D_ij = exp(c_i - c_j) for j <= i (0 above), and A = I + strictly_lower((b k) k^T * D):

        U = A^-1 (b v),    W = A^-1 (b k exp(c))                       [C, Dv], [C, Dk]
        V' = U - W S                         (the new values less what S already predicts)
        O = (q exp(c)) S + ((q k^T) * D) V'
        S <- exp(c_C) S + (k exp(c_C - c))^T V'

    S the state at the chunk's start ([Dk, Dv]); the chunks are scanned in order. The tail
    is padded to a whole chunk with tokens of log_g = beta = 0 and k = 0, which change
    nothing. Packed rows (`segment` [B, T]): D_ij also 0 unless i and j share a segment,
    exp(c_i) 0 unless token i is in the segment of the token before the chunk (S's), and
    exp(c_C - c_j) 0 unless token j is in the chunk's last token's (as is exp(c_C) unless
    that is S's): the products of the recurrence's zeroed states, without an infinite log
    decay. -> (o [B, T, H, Dv] f32, final state [B, H, Dk, Dv] f32)."""
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    c = int(chunk_size)
    if c < 1:
        raise ValueError(f"chunk_size={chunk_size}; must be >= 1")
    state = _zero_state(q, v) if initial_state is None else initial_state.astype(F32)
    pad = -t % c
    n = (t + pad) // c

    def chunks(a):  # [B, T, H, ...] f32 -> [B, H, N, C, ...], the tail padded with zeros
        a = jnp.pad(a.astype(F32), [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))
        a = jnp.moveaxis(a, 2, 1)
        return a.reshape(b, h, n, c, *a.shape[3:])

    q, k, v, log_g, beta = map(chunks, (q, k, v, log_g, beta))
    cum = jnp.cumsum(log_g, axis=-1)  # [B, H, N, C]
    lower = jnp.tril(jnp.ones((c, c), bool))
    same, from_start, to_end, through = _segment_masks(segment, b, pad, n, c)
    diff = jnp.where(lower & same, cum[..., :, None] - cum[..., None, :], -jnp.inf)
    decay = jnp.exp(diff)  # D_ij, 0 above the diagonal (and across segments)
    k_beta = k * beta[..., None]
    strict = jnp.tril(jnp.ones((c, c), bool), -1)
    a = jnp.where(strict, jnp.einsum("...id,...jd->...ij", k_beta, k) * decay, 0.0)
    a = a + jnp.eye(c, dtype=F32)
    start_decay = jnp.exp(cum) * from_start  # exp(c_i), 0 where S's segment has ended
    rhs = jnp.concatenate([v * beta[..., None], k_beta * start_decay[..., None]], axis=-1)
    solved = jax.lax.linalg.triangular_solve(a, rhs, left_side=True, lower=True,
                                             unit_diagonal=True)  # fmt: skip
    u, w = solved[..., :dv], solved[..., dv:]
    attn = jnp.einsum("...id,...jd->...ij", q, k) * decay
    q_dec = q * start_decay[..., None]
    k_dec = k * (jnp.exp(cum[..., -1:] - cum) * to_end)[..., None]
    chunk_decay = (jnp.exp(cum[..., -1]) * through)[..., None, None]  # [B, H, N, 1, 1]

    def step(s, xs):  # s [B, H, Dk, Dv]; xs: one chunk's [B, H, C, ...]
        u_i, w_i, q_i, k_i, attn_i, decay_i = xs
        v_new = u_i - jnp.einsum("bhck,bhkv->bhcv", w_i, s)
        o = jnp.einsum("bhck,bhkv->bhcv", q_i, s) + jnp.einsum("bhcj,bhjv->bhcv", attn_i, v_new)
        s = s * decay_i + jnp.einsum("bhck,bhcv->bhkv", k_i, v_new)
        return s, o

    xs = tuple(jnp.moveaxis(x, 2, 0) for x in (u, w, q_dec, k_dec, attn, chunk_decay))
    state, o = jax.lax.scan(step, state, xs)  # o [N, B, H, C, Dv]
    o = jnp.moveaxis(o, 0, 2).reshape(b, h, n * c, dv)[:, :, :t]
    return jnp.moveaxis(o, 1, 2), state


def _segment_masks(segment, b: int, pad: int, n: int, c: int):
    """The chunked form's segment masks (`chunk_gated_delta_rule`), each broadcasting
    against [B, H, N, C(, C)]: same [.., C, C] (i and j share a segment), from_start [.., C]
    (token i is in the segment of the token before its chunk), to_end [.., C] (token j is in
    the chunk's last token's), through [..] (the chunk's last token is in the segment of the
    token before it: S carries through). All True without segments."""
    if segment is None:
        return True, 1.0, 1.0, 1.0
    seg = jnp.pad(segment_runs(segment), [(0, 0), (0, pad)], mode="edge").reshape(b, 1, n, c)
    # the token before each chunk: the previous chunk's last (chunk 0: its own first, whose
    # segment the initial state belongs to)
    before = jnp.concatenate([seg[..., :1, :1], seg[..., :-1, -1:]], axis=2)  # [B, 1, N, 1]
    same = seg[..., :, None] == seg[..., None, :]
    from_start = (seg == before).astype(F32)
    to_end = (seg == seg[..., -1:]).astype(F32)
    through = (seg[..., -1] == before[..., 0]).astype(F32)
    return same, from_start, to_end, through
