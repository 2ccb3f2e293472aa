"""Attention over a forward's tokens, apart from the layers that project into it: the one
selection point (`attention`, `ModelConfig.attention` / config key `model.attention`), its
implementations (`ATTENTION`: XLA einsums, `jax.nn.dot_product_attention`, cuDNN's fused
kernel, ring attention over the mesh's `sequence` axis), the one-query decode step over a
KV cache, and the masks as additive biases (causal, valid, and per segment for packed rows:
`same_segment`, `mask_to_bias`) or by their parts (`RowMask`, which 'ring' builds block by
block).

Shapes: q [B, T, H, Dh]; k, v [B, S, K, Dh] ('bskd') or the cache's [B, K, S, Dh] ('bksd');
bias [B, 1, 1, T, S] f32, 0 where a query may attend and -1e30 where not; sinks [H] f32.

Attention sinks (GPT-OSS): a learned logit per query head joins each softmax's denominator
and contributes no value, p_j = exp(s_j) / (exp(sink) + sum_i exp(s_i)) (`softmax_with_sink`):
every path but `jax.nn.dot_product_attention`'s takes it (`SINK_IMPLS`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jaxrl_frontier.core import sharding as shd

_NEG_INF = -1e30  # finite, so a fully masked (padding) query row gives a uniform softmax, not NaN


def attention(q, k, v, attn_bias, kv_spec: str = "bskd", *, impl: str = "xla", **scores):
    """The model's one attention-selection point (`ModelConfig.attention`, static).

    q [B, T, H, Dh]; k, v [B, S, K, Dh] (kv_spec 'bskd') or [B, K, S, Dh] ('bksd', the
    cache's layout); attn_bias [B, 1, 1, T, S] additive. Returns [B, T, H, Dh].

    A one-query step over the cache (decode) runs as broadcast-multiply and reductions
    (`_attend_one_query`) whatever the implementation; every other call runs
    `ATTENTION[impl]`: 'xla' (`attend`'s einsums), 'dot_product'
    (`jax.nn.dot_product_attention`, XLA's implementation of the same math), 'cudnn' (its
    cuDNN fused kernel: a GPU, bf16 / fp16 compute only), 'ring' (`attend_ring`: ring
    attention over the mesh's `sequence` axis where attn_bias is a `RowMask`, else 'xla').
    `scores`: `scale` (default Dh ** -0.5), `softcap` (c: scores -> c * tanh(scores / c)
    before the bias) and `sinks` ([H] f32: each head's sink logit, `softmax_with_sink`;
    `SINK_IMPLS` only). attn_bias may be a `RowMask` (a forward over whole rows): the
    implementations other than 'ring' take its bias.
    """
    if impl not in ATTENTION:
        raise ValueError(f"attention impl {impl!r}; allowed: {ATTENTION_IMPLS}")
    if isinstance(attn_bias, RowMask) and impl != "ring":
        attn_bias = attn_bias.bias()
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


def softmax_with_sink(scores, sinks=None):
    """The softmax over the last axis of f32 scores [..., S]; with sinks (broadcastable to
    scores[..., 0]: one logit per row) the sink joins the denominator as one more column,
    dropped after (HF GPT-OSS's `eager_attention_forward`):

        p_j = exp(s_j) / (exp(sink) + sum_i exp(s_i))

    so a row's weights sum to less than 1, the rest going nowhere (no value)."""
    if sinks is None:
        return jax.nn.softmax(scores, axis=-1)
    sink = jnp.broadcast_to(sinks, scores.shape[:-1])[..., None]
    return jax.nn.softmax(jnp.concatenate([scores, sink], axis=-1), axis=-1)[..., :-1]


def grouped_sinks(sinks, kv_heads: int):
    """sinks [H] -> [K, G] f32: query head h = kv head h // G, member h % G (as q's grouping
    [.., K, G, Dh] and HF's repeat_kv order)."""
    return sinks.astype(jnp.float32).reshape(kv_heads, -1)


def attend(q, k, v, attn_bias, kv_spec: str = "bskd", scale=None, softcap=None, sinks=None):
    """softmax(q k^T / sqrt(Dh) + bias) v with grouped-query heads; scores and softmax in f32.

    q [B, T, H, Dh]; k, v [B, S, K, Dh] (kv_spec 'bskd') or [B, K, S, Dh] ('bksd', the
    cache's layout); attn_bias [B, 1, 1, T, S] additive; sinks None or [H] (each head's
    sink logit in the softmax, `softmax_with_sink`). Returns [B, T, H, Dh], q's dtype.
    """
    b, t, h, hd = q.shape
    dt = q.dtype
    kvh = k.shape[kv_spec.index("k")]
    q = q.reshape(b, t, kvh, h // kvh, hd)  # group query heads by their kv head
    scores = jnp.einsum(
        f"btkgd,{kv_spec}->bkgts", q, k.astype(dt), preferred_element_type=jnp.float32
    )
    scores = scaled_scores(scores, hd, scale, softcap) + attn_bias
    sink = None if sinks is None else grouped_sinks(sinks, kvh)[:, :, None]  # [K, G, 1]
    probs = softmax_with_sink(scores, sink).astype(dt)
    out = jnp.einsum(f"bkgts,{kv_spec}->btkgd", probs, v.astype(dt))
    return out.reshape(b, t, h, hd)


def attend_dot_product(
    q, k, v, attn_bias, kv_spec: str = "bskd", scale=None, softcap=None, sinks=None,
    implementation=None,
):  # fmt: skip
    """`attend` by `jax.nn.dot_product_attention` (same shapes; implementation None: XLA's,
    scores and softmax in f32 as `attend`; 'cudnn': the fused cuDNN kernel, on a GPU). It
    has no soft-capping and no sinks: a `softcap` or `sinks` raises (use attention 'xla' or
    'ring')."""
    if softcap is not None:
        raise ValueError(
            "attention logit soft-capping (Gemma 2) runs only with model.attention='xla' or 'ring'"
        )
    if sinks is not None:
        raise ValueError(f"attention sinks (GPT-OSS) run only with model.attention in {SINK_IMPLS}")
    dt = q.dtype
    if kv_spec == "bksd":  # the cache's layout -> the [B, S, K, Dh] the call takes
        k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
    bias = attn_bias[:, 0]  # [B, 1, T, S]: one bias for every head
    if implementation == "cudnn":
        bias = bias.astype(dt)
    return jax.nn.dot_product_attention(
        q, k.astype(dt), v.astype(dt), bias=bias, scale=scale, implementation=implementation
    )


def _attend_one_query(q, k, v, bias, scale=None, softcap=None, sinks=None):
    """One decode step's attention as broadcast-multiply + reduce, in f32.

    q [B, K, G, Dh] (query heads grouped by kv head); k, v: one layer's cache [B, K, S, Dh]
    (or a sliding layer's ring of W slots); bias [B, S] additive; sinks None or [H]. Returns
    f32 [B, K, G, Dh]. With one query per row, XLA:CPU runs
    the einsum form as B*K tiny batched dots (measured ~150 us per layer at B=16, S=144,
    ~1% of peak); as reductions they fuse into loops that read the cache in place.
    """
    f32 = jnp.float32
    qf = q.astype(f32)
    scores = jnp.sum(qf[:, :, :, None, :] * k[:, :, None].astype(f32), axis=-1)  # [B,K,G,S]
    scores = scaled_scores(scores, q.shape[-1], scale, softcap) + bias[:, None, None, :]
    probs = softmax_with_sink(scores, None if sinks is None else grouped_sinks(sinks, k.shape[1]))
    return jnp.sum(probs[..., None] * v[:, :, None].astype(f32), axis=3)  # [B, K, G, Dh]


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["valid", "segment_ids", "window"],
    meta_fields=[],
)
@dataclasses.dataclass(frozen=True)
class RowMask:
    """The mask of a forward over whole rows (no cache: queries and keys are the row's T
    slots) by its parts instead of as a [B, 1, 1, T, T] bias: query i may attend to key j
    where j <= i (causal), key j is real (`valid` [B, T] bool), both lie in one segment
    (`segment_ids` [B, T] int, packed rows; 0 an empty slot) and i - j < `window` (an int
    array, a sliding-window layer's; None: no limit). 'ring' builds each block's mask from
    these (`block_allowed`); `bias()` is the others' bias, the same mask."""

    valid: jax.Array
    segment_ids: jax.Array | None = None
    window: jax.Array | None = None

    def with_window(self, window) -> RowMask:
        return dataclasses.replace(self, window=window)

    def bias(self) -> jax.Array:
        """The additive bias [B, 1, 1, T, T] of the whole rows."""
        t = self.valid.shape[1]
        seg = self.segment_ids
        allowed = block_allowed(0, 0, (t, t), self.valid, seg, seg, self.window)
        return mask_to_bias(allowed)


def block_allowed(q_start, k_start, shape, k_valid, q_seg, k_seg, window) -> jax.Array:
    """The `RowMask` of one block of a row: queries at slots q_start + [0, tq) and keys at
    k_start + [0, tk) (shape (tq, tk)); k_valid [B, tk] bool; q_seg [B, tq], k_seg [B, tk]
    segment ids (None: unpacked rows); window None or an int. -> allowed [B, tq, tk] bool."""
    tq, tk = shape
    distance = (q_start + jnp.arange(tq))[:, None] - (k_start + jnp.arange(tk))[None, :]
    causal = distance >= 0 if window is None else (distance >= 0) & (distance < window)
    allowed = causal[None] & k_valid[:, None, :]
    if q_seg is not None:  # packed rows: nothing attends across segments (`same_segment`)
        allowed = allowed & (q_seg[:, :, None] == k_seg[:, None, :]) & (k_seg[:, None, :] > 0)
    return allowed


def attend_ring(q, k, v, attn_bias, kv_spec: str = "bskd", scale=None, softcap=None, sinks=None):
    """`attend` as ring attention over the mesh's `sequence` axis (context parallelism)
    where attn_bias is a `RowMask` and q lies on a mesh with that axis (`ring_attention`);
    `attend` on the bias otherwise (a cache's or a shared prompt's bias, one device, or a
    sequence axis of 1), so 'ring' is 'xla' wherever no axis splits the positions."""
    if not isinstance(attn_bias, RowMask):
        return attend(q, k, v, attn_bias, kv_spec, scale, softcap, sinks)
    mesh = shd.mesh_of(q)
    if shd.sequence_size(mesh) == 1:
        return attend(q, k, v, attn_bias.bias(), kv_spec, scale, softcap, sinks)
    if kv_spec != "bskd" or k.shape[1] != q.shape[1]:
        raise ValueError(
            "model.attention='ring' takes a forward over whole rows (keys = the queries' own "
            f"positions, kv_spec 'bskd'); got q {q.shape}, k {k.shape} ({kv_spec!r})"
        )
    return ring_attention(q, k, v, attn_bias, mesh, scale=scale, softcap=softcap, sinks=sinks)


def ring_attention(
    q, k, v, mask: RowMask, mesh, *, scale=None, softcap=None, sinks=None
) -> jax.Array:
    """Ring attention (Liu et al., 2023) over `mesh`'s `sequence` axis of s devices: q [B,
    T, H, Dh], k, v [B, T, K, Dh] and the mask's [B, T] parts with T split in s blocks of
    T / s. Under `jax.shard_map` each device keeps its own queries and passes the K/V block
    (with its keys' validity and segment ids) around the ring with `lax.ppermute`, s - 1
    hops, folding each block into an online softmax (running max and sum in f32, as flash
    attention), so it holds [T / s, T / s] scores at a time and no [T / s, T] bias. Each
    block's mask is built from slots, validity, segments and window (`block_allowed`);
    blocks the mask empties (later positions, keys past the window) are skipped by
    `lax.cond`. Rows split over the batch axes, heads over `tensor` (where it divides the
    kv heads). A query with no key to see (padding) gets 0, where 'xla' averages the row's
    values; the model never reads those outputs. Attention sinks ([H], split over `tensor`
    with the heads) join each query's denominator once: the online softmax starts from the
    sink (running max = sink, sum = 1, no value), not once per block. Returns
    [B, T, H, Dh], q's dtype."""
    s, (b, t, _, _), kvh = shd.sequence_size(mesh), q.shape, k.shape[2]
    if t % s:
        raise ValueError(
            f"model.attention='ring': the mesh's sequence axis ({s} devices) must divide the "
            f"rows' {t} positions"
        )
    batch = shd.logical_to_spec(("batch",), (b,), mesh)[0]
    tensor = mesh.shape.get("tensor", 1)
    heads = "tensor" if tensor > 1 and kvh % tensor == 0 else None
    qs, rows = P(batch, shd.SEQUENCE_AXIS, heads, None), P(batch, shd.SEQUENCE_AXIS)
    packed, windowed = mask.segment_ids is not None, mask.window is not None
    seg = mask.segment_ids if packed else mask.valid.astype(jnp.int32)  # unused unpacked
    window = jnp.asarray(mask.window if windowed else 0, jnp.int32)
    sunk = sinks is not None
    sinks = jnp.asarray(sinks if sunk else jnp.zeros(q.shape[2]), jnp.float32)  # unused: 0
    local = functools.partial(
        _ring_local, size=s, score_options=dict(scale=scale, softcap=softcap), packed=packed,
        windowed=windowed, sunk=sunk,
    )  # fmt: skip
    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(qs, qs, qs, rows, rows, P(), P(heads)),
        out_specs=qs,
        check_vma=False,
    )(q, k, v, mask.valid, seg, window, sinks)


def _ring_local(q, k, v, valid, seg, window, sinks, *, size, score_options, packed, windowed, sunk):
    """One device's share of `ring_attention`: its queries q [b, n, H, Dh] (block i of the
    row, n = T / s), and the K/V block k, v [b, n, K, Dh], valid, seg [b, n] that start as
    its own and arrive from device i - r at step r; sinks [H] its heads' (used if `sunk`)."""
    i = jax.lax.axis_index(shd.SEQUENCE_AXIS)
    b, n, h, hd = q.shape
    kvh, dt = k.shape[2], q.dtype
    grouped = q.reshape(b, n, kvh, h // kvh, hd)
    q_seg = seg if packed else None

    @jax.checkpoint  # the backward recomputes a block's scores: [n, n] at a time, not [n, T]
    def fold(carry, block, src):
        acc, run_max, run_sum = carry
        k_b, v_b, valid_b, seg_b = block
        scores = jnp.einsum(
            "btkgd,bskd->bkgts", grouped, k_b.astype(dt), preferred_element_type=jnp.float32
        )
        scores = scaled_scores(scores, hd, **score_options)
        allowed = block_allowed(
            i * n, src * n, (n, n), valid_b, q_seg, seg_b if packed else None,
            window if windowed else None,
        )[:, None, None]  # fmt: skip
        scores = jnp.where(allowed, scores, _NEG_INF)
        new_max = jnp.maximum(run_max, jax.lax.stop_gradient(scores.max(-1)))
        probs = jnp.where(allowed, jnp.exp(scores - new_max[..., None]), 0.0)
        rescale = jnp.exp(run_max - new_max)
        out = jnp.einsum(
            "bkgts,bskd->bkgtd", probs.astype(dt), v_b.astype(dt),
            preferred_element_type=jnp.float32,
        )  # fmt: skip
        return acc * rescale[..., None] + out, new_max, run_sum * rescale + probs.sum(-1)

    stats = (b, kvh, h // kvh, n)
    carry = (
        jnp.zeros((*stats, hd), jnp.float32),
        jnp.full(stats, _NEG_INF, jnp.float32),
        jnp.zeros(stats, jnp.float32),
    )
    if sunk:  # the sink enters once, before any block: max = sink, sum = exp(0) = 1, no value
        sink = jnp.broadcast_to(grouped_sinks(sinks, kvh)[:, :, None], stats)
        held = jax.lax.stop_gradient(sink)  # the max carries no gradient (it cancels out)
        carry = (carry[0], held, jnp.exp(sink - held))
    block = (k, v, valid, seg)
    ring = [(j, (j + 1) % size) for j in range(size)]  # device j sends to j + 1
    for r in range(size):
        src = (i - r) % size  # the block that reached this device after r hops
        visible = src <= i  # causal: a later block's keys are all ahead of these queries
        if windowed:  # the block's nearest key lies within the window of the first query
            visible &= i * n - (src * n + n - 1) < window
        carry = jax.lax.cond(
            visible, functools.partial(fold, block=block, src=src), lambda c: c, carry
        )
        if r < size - 1:
            block = jax.tree.map(lambda a: jax.lax.ppermute(a, shd.SEQUENCE_AXIS, ring), block)
    acc, _, run_sum = carry
    seen = run_sum > 0  # a query with no key to see (padding) gets 0
    out = jnp.where(seen[..., None], acc / jnp.where(seen, run_sum, 1.0)[..., None], 0.0)
    return jnp.moveaxis(out, 3, 1).reshape(b, n, h, hd).astype(dt)


# ModelConfig.attention (config key `model.attention`) -> the attention of a forward over T
# tokens (`attention`; a one-query decode step over the cache is `_attend_one_query`)
ATTENTION = {
    "xla": attend,
    "dot_product": attend_dot_product,
    "cudnn": functools.partial(attend_dot_product, implementation="cudnn"),
    "ring": attend_ring,
}
ATTENTION_IMPLS = tuple(ATTENTION)
SINK_IMPLS = ("xla", "ring")  # the implementations that take attention sinks


def same_segment(segment_ids: jax.Array) -> jax.Array:
    """segment_ids [B, T] int (0: an empty slot of a packed row) -> [B, T, T] bool: query i
    and key j lie in the same segment, and key j is not empty. With the causal mask, the
    attention of packed rows (`Transformer.hidden_states(segment_ids=)`): each sequence sees
    only itself, as in a row of its own."""
    return (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] > 0)


def mask_to_bias(allowed: jax.Array) -> jax.Array:
    """allowed [B, T, S] bool -> additive attention bias [B, 1, 1, T, S] (f32)."""
    return jnp.where(allowed, 0.0, _NEG_INF).astype(jnp.float32)[:, None, None]
