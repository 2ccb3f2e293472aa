"""Per-token statistics from logits or hidden states, aligned with `tokens`.

ALIGNMENT. Every [B, T] per-token statistic is aligned with `tokens`: `x[b, t]` is about
`tokens[b, t]` given `tokens[b, :t]`. Model logits are not: `logits[:, t]` predicts token
t + 1. The functions here do the shift (logits at t - 1 predict token t) and put 0 in column
0, which is never a completion token. From hidden states the output layer is applied in
chunks of positions (`DEFAULT_LOGPROB_CHUNK`), so the [B, T, V] logits never exist at once.

OUTPUT LAYER. Where logits come from hidden states, the output layer is a [D, V] array
(logits h @ W), or an `OutputLayer`: the weights as the model stores them (a tied
embedding [V, D] is not transposed) and a soft-cap where the model has one (Gemma 2:
c tanh(h W / c)); `output_logits` applies either.

CHUNKS. N predicting positions run in the fewest chunks of at most `chunk` positions,
evened out (`even_chunk`): 384 positions in two chunks of 192, not 256 and a half-empty
second one, whose padding the output matmul would compute two or three times (forward,
backward, and the checkpoint's recompute where there is one).

RECOMPUTE. The backward pass needs each chunk's [chunk, V] logits. Where all chunks' logits
(student and teachers, f32) fit in `RECOMPUTE_ABOVE_BYTES`, they are kept from the forward
pass; above it, each chunk runs under `jax.checkpoint` and its logits are computed again in
the backward pass. The choice follows from static shapes: an RL batch at SmolLM2-135M's
shape (384 positions x 49,152: 75 MB) keeps them and saves a quarter of the output layer's
FLOPs; 8 rows of 4,096 tokens at a 152k vocabulary (20 GB) recompute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import flax.struct
import jax
import jax.numpy as jnp

from jaxrl_frontier.core import sharding

Array = jax.Array
sg = jax.lax.stop_gradient


@flax.struct.dataclass
class OutputLayer:
    """The output layer as the model stores it, and its final logit soft-cap: logits
    z = h @ W, soft-capped to softcap * tanh(z / softcap) where `softcap` is set (Gemma 2).
    w is W [D, V], or with `vocab_major` its transpose [V, D]: a tied input embedding,
    which `chunked_token_stats` contracts as it lies (handed E^T instead, XLA copied the
    transposed table into the chunked loop at every update: 229 ms of a 1.8 s update at
    SmolLM2-135M's shape, docs/performance.md). softcap and vocab_major are static."""

    w: Array
    softcap: float | None = flax.struct.field(pytree_node=False, default=None)
    vocab_major: bool = flax.struct.field(pytree_node=False, default=False)


def output_weights(w_out) -> tuple[Array, float | None]:
    """(W [D, V], the soft-cap or None) of a [D, V] array or an `OutputLayer`."""
    if isinstance(w_out, OutputLayer):
        return (w_out.w.T if w_out.vocab_major else w_out.w), w_out.softcap
    return w_out, None


def output_contraction(w_out) -> tuple[Array, float | None, str]:
    """(the weights as stored, the soft-cap or None, the einsum of hidden states [C, D]
    with those weights that gives logits [C, V]) of a [D, V] array or an `OutputLayer`."""
    if isinstance(w_out, OutputLayer) and w_out.vocab_major:
        return w_out.w, w_out.softcap, "cd,vd->cv"
    return *output_weights(w_out), "cd,dv->cv"


def cap_logits(z: Array, softcap: float | None) -> Array:
    """f32 logits z soft-capped elementwise (softcap * tanh(z / softcap)); None: z."""
    return z if softcap is None else softcap * jnp.tanh(z / softcap)


def output_logits(h: Array, w_out, spec: str = "...d,dv->...v") -> Array:
    """f32 logits of hidden states h through the output layer `w_out` (a [D, V] array or an
    `OutputLayer`), accumulated in f32 from h's dtype, as `Transformer.logits`."""
    w, softcap = output_weights(w_out)
    z = jnp.einsum(spec, h, w.astype(h.dtype), preferred_element_type=jnp.float32)
    return cap_logits(z, softcap)


def shift_right(x_bt: Array) -> Array:
    """Prepend a zero column and drop the last: position t - 1's value lands on column t."""
    pad = jnp.zeros_like(x_bt[:, :1])
    return jnp.concatenate([pad, x_bt[:, :-1]], axis=1)


def shift_left(x_bt: Array) -> Array:
    """Drop the first column and append a zero one: column t + 1's value lands on column t."""
    return jnp.concatenate([x_bt[:, 1:], jnp.zeros_like(x_bt[:, :1])], axis=1)


def token_logprobs(logits_btv: Array, tokens_bt: Array) -> Array:
    """logp[b, t] = log p(tokens[b, t] | tokens[b, :t]) from logits[b, t - 1]; logp[:, 0] = 0.

    [B, T, V], [B, T] int -> [B, T] float32. Gathers the logit and subtracts the logsumexp,
    so no [B, T, V] log-softmax is materialised.
    """
    z = logits_btv[:, :-1].astype(jnp.float32)
    z_y = jnp.take_along_axis(z, tokens_bt[:, 1:, None], axis=-1)[..., 0]
    return shift_right(jnp.pad(z_y - jax.nn.logsumexp(z, axis=-1), ((0, 0), (0, 1))))


def token_entropy(logits_btv: Array) -> Array:
    """H[b, t] = entropy of p(. | tokens[b, :t]) (from logits[b, t - 1]); H[:, 0] = 0. [B, T]."""
    l = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
    return shift_right(-jnp.sum(jnp.exp(l) * l, axis=-1))


DEFAULT_LOGPROB_CHUNK = 256  # positions per chunk of the fused output layer (logits [chunk, V])
RECOMPUTE_ABOVE_BYTES = 256 * 2**20  # all chunks' f32 logits above this: recomputed in backward


def token_stats_from_hidden(
    hidden_btd: Array,
    w_out_dv: Array,
    tokens_bt: Array,
    chunk: int = DEFAULT_LOGPROB_CHUNK,
    *,
    entropy: bool = False,
    entropy_grad: bool = True,
    start: int = 1,
) -> tuple[Array, Array | None]:
    """`token_logprobs` (and `token_entropy`) from final hidden states, never holding the
    [B, T, V] logits: the output layer, logsumexp and gather run over chunks of `chunk`
    positions (`lax.map`). The backward pass keeps every chunk's [chunk, V] logits where they
    fit in `RECOMPUTE_ABOVE_BYTES`; above it each chunk runs under `jax.checkpoint` and the
    backward pass recomputes one chunk's logits at a time instead of storing all of them.

    hidden [B, T, D] (compute dtype), w_out [D, V] (or an `OutputLayer`), tokens [B, T] int
    -> (logp [B, T] f32,
    entropy [B, T] f32 or None), aligned with tokens like `token_logprobs` (column 0 is 0).
    Logits are accumulated in f32 as in `Transformer.logits`. `entropy_grad=False` holds the
    entropy constant (a metric only). Cost under the checkpoint: the output matmul runs once
    more in the backward pass (8 instead of 6 * B * T * D * V FLOPs). start >= 1: only
    tokens [start, T) are scored, the columns before it are 0 (an RL batch's prompt, which
    the loss masks out).
    """
    logp, ent, _ = chunked_token_stats(
        hidden_btd,
        w_out_dv,
        tokens_bt,
        chunk,
        entropy=entropy,
        entropy_grad=entropy_grad,
        start=start,
    )
    return logp, ent


def chunked_token_stats(
    hidden_btd: Array,
    w_out_dv: Array,
    tokens_bt: Array,
    chunk: int = DEFAULT_LOGPROB_CHUNK,
    *,
    entropy: bool = False,
    entropy_grad: bool = True,
    start: int = 1,
    teacher_hidden: tuple | None = None,
    distill: Callable[..., Array] | None = None,
    teacher_index: Array | None = None,
) -> tuple[Array, Array | None, Array | None]:
    """`token_stats_from_hidden`, plus a distillation loss from the teacher's hidden states.

    teacher_hidden = (teacher final hidden [B, T, D_t], teacher output layer [D_t, V]) and
    distill = a per-position loss (`DISTILL_LOSSES.get(name).per_position` with its kwargs
    bound): each chunk computes the student's [chunk, V] and the teacher's [chunk, V] logits
    (the teacher's held constant) and the loss between them, so neither [B, T, V] exists.
    Several teachers (`teacher.by_tag`, one vocabulary): teacher_hidden a tuple of K such
    pairs and teacher_index [B, T] each position's teacher k; each chunk computes every
    teacher's [chunk, V] logits and keeps each position's own (`select_teacher`), so the loss
    at (b, t) is D(student, teacher_{index[b, t]}) exactly; K teacher logit blocks a chunk.
    -> (logp [B, T], entropy [B, T] or None, distill [B, T] or None), all aligned with the
    tokens (column t scores token t; columns before `start` are 0).
    """
    t = hidden_btd.shape[1]
    if not 1 <= start < t:
        raise ValueError(f"start = {start} must be in [1, {t}) for {t} positions")
    with_distill = distill is not None
    if with_distill and teacher_hidden is None:
        raise ValueError("chunked_token_stats: distill needs teacher_hidden")

    layout = PositionChunks.of(hidden_btd, w_out_dv, chunk, start)
    chunked = layout.chunked
    w, cap, spec = output_contraction(w_out_dv)
    w = w.astype(hidden_btd.dtype)
    xs = (chunked(layout.positions(hidden_btd)), chunked(layout.targets(tokens_bt)))
    if with_distill:
        pairs = teacher_pairs(teacher_hidden)
        xs += (tuple(chunked(layout.positions(sg(h_t))) for h_t, _ in pairs),)
        w_ts = tuple(output_contraction(sg(w_t)) for _, w_t in pairs)
        w_ts = tuple((w_t.astype(h_t.dtype), *rest) for (w_t, *rest), (h_t, _) in zip(w_ts, pairs))
        if len(pairs) > 1:
            xs += (chunked(layout.positions(teacher_index)),)

    def one(args):
        h_cd, y_c = args[:2]
        z = jnp.einsum(spec, h_cd, w, preferred_element_type=jnp.float32)
        z = cap_logits(sharding.constrain_vocab(z, w), cap)  # vocab-parallel: w not gathered
        lse = jax.nn.logsumexp(z, axis=-1)
        logp = jnp.take_along_axis(z, y_c[:, None], axis=-1)[:, 0] - lse
        ent = jnp.zeros_like(logp)
        if entropy:
            zh, lh = (z, lse) if entropy_grad else (sg(z), sg(lse))
            ent = lh - jnp.sum(jnp.exp(zh - lh[:, None]) * zh, axis=-1)  # H = lse - E_p[z]
        dist = jnp.zeros_like(logp)
        if with_distill:
            z_ts = [
                cap_logits(sharding.constrain_vocab(
                    jnp.einsum(spec_t, h_c, w_t, preferred_element_type=jnp.float32), w_t
                ), cap_t)
                for h_c, (w_t, cap_t, spec_t) in zip(args[2], w_ts)
            ]  # fmt: skip
            dist = distill(z, select_teacher(z_ts, args[3] if len(z_ts) > 1 else None), y_c)
        return logp, ent, dist

    vocab = output_weights(w_out_dv)[0].shape[1]
    held = xs[1].size * vocab * 4 * (1 + (len(w_ts) if with_distill else 0))  # f32 logits, bytes
    step = one if held <= RECOMPUTE_ABOVE_BYTES else jax.checkpoint(one)
    logp, ent, dist = jax.lax.map(step, xs)
    aligned = layout.aligned
    return (
        aligned(logp),
        aligned(ent) if entropy else None,
        aligned(dist) if with_distill else None,
    )


def teacher_pairs(teacher_hidden) -> tuple:
    """One teacher's (hidden, output layer) pair, or several teachers' tuple of them, as a
    tuple of pairs."""
    return tuple(teacher_hidden) if isinstance(teacher_hidden[0], tuple) else (teacher_hidden,)


def select_teacher(logits: Sequence[Array], index: Array | None) -> Array:
    """Each position's own teacher's logits: logits K x [..., V] (one per teacher), index
    [...] (k, as a float or an int; None with one teacher) ->
        z[..., v] = logits[index[...]][..., v]   (an index past K - 1 reads teacher 0)."""
    z = logits[0]
    if index is None:
        return z
    k_of = index.astype(jnp.int32)[..., None]
    for k in range(1, len(logits)):
        z = jnp.where(k_of == k, logits[k], z)
    return z


def even_chunk(n: int, most: int) -> int:
    """The chunk size that covers n positions in the fewest chunks of at most `most`, k =
    ceil(n / most), evened out: ceil(n / k), rounded up to a multiple of 8 rows (the matmul
    libraries' register blocking) where that stays within `most`; n itself for one chunk."""
    most = max(1, min(most, n))
    k = -(-n // most)
    even = -(-n // k)
    rounded = -(-even // 8) * 8
    return rounded if k > 1 and rounded <= most else even


class PositionChunks:
    """How `chunked_token_stats` cuts a batch's predicting positions into `lax.map` chunks,
    and puts the per-chunk results back [B, T] aligned with the tokens.

    Flat (`blocks` = 1): positions start - 1 .. T - 2 of every row (each predicts the next
    token), flattened to [N] and cut into chunks of at most `chunk` (`even_chunk`).
    Blocked (`blocks` = s > 1, the mesh's sequence axis: context parallelism, rows of
    positions split in s slices): every position of every row, [B, T] seen as [B, s, T / s];
    chunk j takes positions [j c, (j + 1) c) of every row's every slice, so each device's
    chunk is its own positions and no hidden state moves between devices; the results are
    shifted right by one at the end (position t - 1 predicts token t) and the columns before
    `start` zeroed.
    """

    def __init__(self, shape: tuple[int, int], chunk: int, start: int, blocks: int):
        self.b, self.t = shape
        self.start, self.blocks = start, blocks
        if blocks == 1:
            self.n = self.b * (self.t - start)
            self.chunk = even_chunk(self.n, chunk)
        else:
            self.n = self.t // blocks  # each slice's positions
            self.chunk = even_chunk(self.n, chunk // (self.b * blocks))
        self.pad = -self.n % self.chunk

    @classmethod
    def of(cls, hidden_btd: Array, w_out, chunk: int, start: int) -> PositionChunks:
        b, t, _ = hidden_btd.shape
        s = sharding.sequence_size(sharding.mesh_of(output_weights(w_out)[0]))
        return cls((b, t), chunk, start, s if s > 1 and t % s == 0 else 1)

    def positions(self, x_btx: Array) -> Array:
        """The predicting positions' values: flat [N, ...]; blocked [B, s, T / s, ...]."""
        if self.blocks == 1:
            x = x_btx[:, self.start - 1 : -1]
            return x.reshape(-1, *x.shape[2:])
        return x_btx.reshape(self.b, self.blocks, self.n, *x_btx.shape[2:])

    def targets(self, tokens_bt: Array) -> Array:
        """The token each position predicts (flat: [N]; blocked: [B, s, T / s], the last
        position's target a 0 whose result is dropped)."""
        if self.blocks == 1:
            return tokens_bt[:, self.start :].reshape(-1)
        return self.positions(shift_left(tokens_bt))

    def chunked(self, x: Array) -> Array:
        """positions' values -> [chunks, chunk rows, ...] for `lax.map`."""
        if self.blocks == 1:
            x = jnp.pad(x, ((0, self.pad),) + ((0, 0),) * (x.ndim - 1))
            return x.reshape(-1, self.chunk, *x.shape[1:])
        x = jnp.pad(x, ((0, 0), (0, 0), (0, self.pad)) + ((0, 0),) * (x.ndim - 3))
        x = x.reshape(self.b, self.blocks, -1, self.chunk, *x.shape[3:])
        x = jnp.moveaxis(x, 2, 0)  # [chunks, B, s, chunk, ...]
        return x.reshape(x.shape[0], -1, *x.shape[4:])

    def aligned(self, x: Array) -> Array:
        """Per-chunk results [chunks, chunk rows] -> [B, T], column t the score of token t
        (columns before `start` 0)."""
        if self.blocks == 1:
            x = x.reshape(-1)[: self.n].reshape(self.b, self.t - self.start)
            return jnp.pad(x, ((0, 0), (self.start, 0)))
        x = x.reshape(-1, self.b, self.blocks, self.chunk)
        x = jnp.moveaxis(x, 0, 2).reshape(self.b, self.blocks, -1)[:, :, : self.n]
        x = shift_right(x.reshape(self.b, self.t))
        return jnp.where(jnp.arange(self.t) >= self.start, x, 0.0)


def token_logprobs_from_hidden(
    hidden_btd: Array,
    w_out_dv: Array,
    tokens_bt: Array,
    chunk: int = DEFAULT_LOGPROB_CHUNK,
    start: int = 1,
) -> Array:
    """[B, T] log-probs of `tokens` from hidden states and the output layer, chunked.

    Equals `token_logprobs(hidden @ w_out, tokens)` on columns >= start (0 before); see
    `token_stats_from_hidden`.
    """
    return token_stats_from_hidden(hidden_btd, w_out_dv, tokens_bt, chunk, start=start)[0]
