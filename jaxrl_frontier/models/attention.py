"""Attention over a forward's tokens, apart from the layers that project into it: the one
selection point (`attention`, `ModelConfig.attention` / config key `model.attention`), its
implementations (`ATTENTION`: XLA einsums, `jax.nn.dot_product_attention`, cuDNN's fused
kernel), the one-query decode step over a KV cache, and the masks as additive biases
(causal, valid, and per segment for packed rows: `same_segment`, `mask_to_bias`).

Shapes: q [B, T, H, Dh]; k, v [B, S, K, Dh] ('bskd') or the cache's [B, K, S, Dh] ('bksd');
bias [B, 1, 1, T, S] f32, 0 where a query may attend and -1e30 where not.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

_NEG_INF = -1e30  # finite, so a fully masked (padding) query row gives a uniform softmax, not NaN


def attention(q, k, v, attn_bias, kv_spec: str = "bskd", *, impl: str = "xla", **scores):
    """The model's one attention-selection point (`ModelConfig.attention`, static).

    q [B, T, H, Dh]; k, v [B, S, K, Dh] (kv_spec 'bskd') or [B, K, S, Dh] ('bksd', the
    cache's layout); attn_bias [B, 1, 1, T, S] additive. Returns [B, T, H, Dh].

    A one-query step over the cache (decode) runs as broadcast-multiply and reductions
    (`_attend_one_query`) whatever the implementation; every other call runs
    `ATTENTION[impl]`: 'xla' (`attend`'s einsums), 'dot_product'
    (`jax.nn.dot_product_attention`, XLA's implementation of the same math), 'cudnn' (its
    cuDNN fused kernel: a GPU, bf16 / fp16 compute only). `scores`: `scale` (default
    Dh ** -0.5) and `softcap` (c: scores -> c * tanh(scores / c) before the bias).
    """
    if impl not in ATTENTION:
        raise ValueError(f"attention impl {impl!r}; allowed: {ATTENTION_IMPLS}")
    if q.shape[1] == 1 and kv_spec == "bksd":
        b, _, h, hd = q.shape
        kvh = k.shape[1]
        grouped = q.reshape(b, kvh, h // kvh, hd)
        out = _attend_one_query(grouped, k, v, attn_bias[:, 0, 0, 0], **scores)
        return out.astype(q.dtype).reshape(b, 1, h, hd)
    return ATTENTION[impl](q, k, v, attn_bias, kv_spec, **scores)


def scaled_scores(scores, head_dim: int, scale=None, softcap=None):
    """f32 scores q.k -> scaled (by `scale`, default head_dim ** -0.5) and soft-capped."""
    scores = scores / math.sqrt(head_dim) if scale is None else scores * scale
    if softcap is not None:
        scores = softcap * jnp.tanh(scores / softcap)
    return scores


def attend(q, k, v, attn_bias, kv_spec: str = "bskd", scale=None, softcap=None):
    """softmax(q k^T / sqrt(Dh) + bias) v with grouped-query heads; scores and softmax in f32.

    q [B, T, H, Dh]; k, v [B, S, K, Dh] (kv_spec 'bskd') or [B, K, S, Dh] ('bksd', the
    cache's layout); attn_bias [B, 1, 1, T, S] additive. Returns [B, T, H, Dh], q's dtype.
    """
    b, t, h, hd = q.shape
    dt = q.dtype
    kvh = k.shape[kv_spec.index("k")]
    q = q.reshape(b, t, kvh, h // kvh, hd)  # group query heads by their kv head
    scores = jnp.einsum(
        f"btkgd,{kv_spec}->bkgts", q, k.astype(dt), preferred_element_type=jnp.float32
    )
    scores = scaled_scores(scores, hd, scale, softcap) + attn_bias
    probs = jax.nn.softmax(scores, axis=-1).astype(dt)
    out = jnp.einsum(f"bkgts,{kv_spec}->btkgd", probs, v.astype(dt))
    return out.reshape(b, t, h, hd)


def attend_dot_product(
    q, k, v, attn_bias, kv_spec: str = "bskd", scale=None, softcap=None, implementation=None
):
    """`attend` by `jax.nn.dot_product_attention` (same shapes; implementation None: XLA's,
    scores and softmax in f32 as `attend`; 'cudnn': the fused cuDNN kernel, on a GPU). It
    has no soft-capping: a `softcap` raises (use attention 'xla')."""
    if softcap is not None:
        raise ValueError(
            "attention logit soft-capping (Gemma 2) runs only with model.attention='xla'"
        )
    dt = q.dtype
    if kv_spec == "bksd":  # the cache's layout -> the [B, S, K, Dh] the call takes
        k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
    bias = attn_bias[:, 0]  # [B, 1, T, S]: one bias for every head
    if implementation == "cudnn":
        bias = bias.astype(dt)
    return jax.nn.dot_product_attention(
        q, k.astype(dt), v.astype(dt), bias=bias, scale=scale, implementation=implementation
    )


def _attend_one_query(q, k, v, bias, scale=None, softcap=None):
    """One decode step's attention as broadcast-multiply + reduce, in f32.

    q [B, K, G, Dh] (query heads grouped by kv head); k, v: one layer's cache [B, K, S, Dh];
    bias [B, S] additive. Returns f32 [B, K, G, Dh]. With one query per row, XLA:CPU runs
    the einsum form as B*K tiny batched dots (measured ~150 us per layer at B=16, S=144,
    ~1% of peak); as reductions they fuse into loops that read the cache in place.
    """
    f32 = jnp.float32
    qf = q.astype(f32)
    scores = jnp.sum(qf[:, :, :, None, :] * k[:, :, None].astype(f32), axis=-1)  # [B,K,G,S]
    scores = scaled_scores(scores, q.shape[-1], scale, softcap) + bias[:, None, None, :]
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.sum(probs[..., None] * v[:, :, None].astype(f32), axis=3)  # [B, K, G, Dh]


# ModelConfig.attention (config key `model.attention`) -> the attention of a forward over T
# tokens (`attention`; a one-query decode step over the cache is `_attend_one_query`)
ATTENTION = {
    "xla": attend,
    "dot_product": attend_dot_product,
    "cudnn": functools.partial(attend_dot_product, implementation="cudnn"),
}
ATTENTION_IMPLS = tuple(ATTENTION)


def same_segment(segment_ids: jax.Array) -> jax.Array:
    """segment_ids [B, T] int (0: an empty slot of a packed row) -> [B, T, T] bool: query i
    and key j lie in the same segment, and key j is not empty. With the causal mask, the
    attention of packed rows (`Transformer.hidden_states(segment_ids=)`): each sequence sees
    only itself, as in a row of its own."""
    return (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] > 0)


def mask_to_bias(allowed: jax.Array) -> jax.Array:
    """allowed [B, T, S] bool -> additive attention bias [B, 1, 1, T, S] (f32)."""
    return jnp.where(allowed, 0.0, _NEG_INF).astype(jnp.float32)[:, None, None]
