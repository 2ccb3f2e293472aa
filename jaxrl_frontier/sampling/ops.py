"""Pure ops on logits [..., V]: truncation, the exact draw, log-probs, dropout masks. `draw`
gives the token, log q (q = softmax(truncate(logits / T))) and log p (p = softmax(logits))."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jaxrl_frontier.sampling.params import Knobs, Plan, SamplingParams

_CDF_BLOCK = 128  # vocabulary block of the two-level inverse CDF


def truncate_logits(
    logits: jax.Array, top_k: int = 0, top_p=1.0, min_p=0.0, *, use_top_p=None, use_min_p=None
) -> jax.Array:
    """Logits [..., V], -inf outside the kept set: top-k (ties at the k-th kept), then top-p
    (the smallest top set of the remainder with mass >= top_p), then min-p (p >= min_p * max
    p). top_k static; traced top_p / min_p run when use_top_p / use_min_p (default: unless a
    Python 1.0 / 0.0). Temperature is the caller's, before truncation."""
    python = (int, float)
    use_top_p = not (isinstance(top_p, python) and top_p >= 1) if use_top_p is None else use_top_p
    use_min_p = not (isinstance(min_p, python) and min_p <= 0) if use_min_p is None else use_min_p
    neg_inf = jnp.asarray(-jnp.inf, logits.dtype)
    top_values = None  # the kept values in descending order, when we already have them
    if 0 < top_k < logits.shape[-1]:
        top_values = jax.lax.top_k(logits, top_k)[0]  # [..., k] descending
        logits = jnp.where(logits >= top_values[..., -1:], logits, neg_inf)
    if use_top_p:
        # Keep token i (in descending order) while the mass strictly above it is < top_p:
        # the smallest top set with mass >= top_p. After top-k only those k values matter.
        desc = top_values if top_values is not None else -jnp.sort(-logits, axis=-1)
        probs = jax.nn.softmax(desc, axis=-1)
        mass_above = jnp.cumsum(probs, axis=-1) - probs
        n_keep = jnp.sum(mass_above < top_p, axis=-1, keepdims=True)  # >= 1
        threshold = jnp.take_along_axis(desc, n_keep - 1, axis=-1)
        logits = jnp.where(logits >= threshold, logits, neg_inf)
    if use_min_p:  # p_i >= min_p * p_max  <=>  l_i >= l_max + log(min_p)
        l_max = jnp.max(logits, axis=-1, keepdims=True)
        logits = jnp.where(logits >= l_max + jnp.log(min_p), logits, neg_inf)
    return logits


def sampling_logits(logits: jax.Array, plan: Plan, knobs: Knobs) -> jax.Array:
    """f32 logits of q: temperature, then truncation (greedy: the plain logits)."""
    logits = logits.astype(jnp.float32)
    if plan.greedy:
        return logits
    on = dict(use_top_p=plan.use_top_p, use_min_p=plan.use_min_p)
    return truncate_logits(logits / knobs.temperature, plan.top_k, knobs.top_p, knobs.min_p, **on)


def log_prob(logits: jax.Array, token: jax.Array) -> jax.Array:
    """log softmax(logits)[token] over the last axis (token: logits' leading shape)."""
    picked = jnp.take_along_axis(logits, token[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def _last_true(mask):
    """Index of the last True along the last axis (0 when there is none)."""
    return (mask.shape[-1] - 1 - jnp.argmax(mask[..., ::-1], axis=-1)).astype(jnp.int32)


def inverse_cdf(q_logits: jax.Array, u: jax.Array) -> tuple[jax.Array, jax.Array]:
    """token ~ softmax(q_logits) by inverse CDF: q_logits f32 [B, V] (-inf outside the kept
    set), u f32 [B] uniform in [0, 1) -> (token int32 [B], log q(token) f32 [B]).

    One uniform per row, not Gumbel-max's V (`jax.random.categorical`: on CPU hashing [B, V]
    random bits cost more than the matmuls at small batch). Two levels keep the f32 prefix
    sums short: the block of `_CDF_BLOCK` tokens holding u * total, then the token in it.
    Exact up to f32 rounding and u's 2^-24 granularity (as Gumbel-max on f32 uniforms); a
    zero-mass token never raises a prefix sum, so it is never drawn; a draw rounding pushes
    past the last kept block or token falls back to the last one with mass."""
    b, v = q_logits.shape
    m = jnp.max(q_logits, axis=-1, keepdims=True)
    p = jnp.exp(q_logits - m)  # in [0, 1]; 0 on truncated tokens
    c = min(_CDF_BLOCK, v)
    nb = -(-v // c)
    blocks = jnp.pad(p, ((0, 0), (0, nb * c - v))).reshape(b, nb, c)
    block_cum = jnp.cumsum(jnp.sum(blocks, axis=-1), axis=-1)  # [B, nb]
    total = block_cum[:, -1]
    target = u * total
    blk = jnp.sum(block_cum <= target[:, None], axis=-1, dtype=jnp.int32)
    blk = jnp.where(blk < nb, blk, _last_true(block_cum > 0))
    before = jnp.where(blk > 0, jnp.take_along_axis(block_cum, (blk - 1)[:, None], 1)[:, 0], 0.0)
    within = jnp.take_along_axis(blocks, blk[:, None, None], axis=1)[:, 0]  # [B, c]
    j = jnp.sum(jnp.cumsum(within, axis=-1) <= (target - before)[:, None], axis=-1, dtype=jnp.int32)
    token = blk * c + jnp.where(j < c, j, _last_true(within > 0))
    picked = jnp.take_along_axis(q_logits, token[:, None], axis=-1)[:, 0]
    return token, picked - m[:, 0] - jnp.log(total)


def draw(logits: jax.Array, u, plan: Plan, knobs: Knobs):
    """One token per row of logits [B, V] with uniforms u [B] (unused when greedy) ->
    (token int32 [B], log q(token) f32 [B] (0 when greedy: a point mass), log p(token))."""
    logits = logits.astype(jnp.float32)
    if plan.greedy:
        token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        sample_logp = jnp.zeros(token.shape, jnp.float32)
    else:
        token, sample_logp = inverse_cdf(sampling_logits(logits, plan, knobs), u)
    return token, sample_logp, log_prob(logits, token)


def sample_logits(
    logits: jax.Array, key: jax.Array, params: SamplingParams
) -> tuple[jax.Array, jax.Array]:
    """Sample one token per row of logits [..., V] -> (token int32 [...], log q(token) [...])."""
    lead, v = logits.shape[:-1], logits.shape[-1]
    u = jax.random.uniform(key, (math.prod(lead),))
    plan, knobs = Plan.of(params), Knobs.of(params)
    token, sample_logp, _ = draw(logits.reshape(-1, v), u, plan, knobs)
    return token.reshape(lead), sample_logp.reshape(lead)


def row_keys(key: jax.Array, num_rows: int, first_row=0) -> tuple[jax.Array, jax.Array]:
    """Per row r: (dropout-mask key, sampling stream key) from fold_in(key, first_row + r)
    (first_row: the global index of row 0, `Knobs.first_row`)."""
    rows = jax.vmap(lambda r: jax.random.fold_in(key, first_row + r))(jnp.arange(num_rows))
    pair = jax.vmap(jax.random.split)(rows)  # [B, 2]
    return pair[:, 0], pair[:, 1]


def mlp_dropout_mask(
    keys: jax.Array, rate, num_layers: int, hidden: int, dtype=jnp.float32
) -> jax.Array:
    """[L, B, F] inverted-dropout mask, Bernoulli(1 - rate) / (1 - rate), one per row key.
    Dropout-GRPO (Jung, 2026): fixed over a rollout, so a group's completions differ through
    the sampled sub-network; the trainer rebuilds it from `Rollout.dropout_keys`."""
    keep = jax.vmap(lambda k: jax.random.bernoulli(k, 1.0 - rate, (num_layers, hidden)))(keys)
    return (jnp.swapaxes(keep, 0, 1) / (1.0 - rate)).astype(dtype)


def is_stop(token: jax.Array, stop_ids: jax.Array) -> jax.Array:
    """token int32 [...] -> bool [...]: it is one of stop_ids [S]."""
    return jnp.any(token[..., None] == stop_ids, axis=-1)
