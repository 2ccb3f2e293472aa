"""Packed rows (`train.pack_tokens`, `train.microbatch_tokens`): the update's and the log-prob
passes' rows laid out without their padding.

An RL batch's rows are [B, T] = prompt (left-padded) | completion (right-padded), T the
longest prompt plus the longest completion, so a batch of widely spread completion lengths
is mostly padding. Packed, each row's real tokens (attention_mask 1, in order) become one
*segment* of a buffer row of N = `train.pack_tokens` slots; rows are placed first-fit
decreasing by length, and each segment attends causally to itself only
(`Transformer.hidden_states(segment_ids=)`), with RoPE positions counted from its start.

    host (numpy, `plan_packing`):   lengths [B] -> K microbatches of [R, N] slots
        src  [K, R, N]  flat index b * T + t of the token in each slot (B * T: empty)
        seg  [K, R, N]  segment id in its buffer row, 1, 2, ... (0: empty)
        pos  [K, R, N]  position of the token in its sequence (the padded row's position)
        start [K, B]    flat slot r * N + n of row b's first token in microbatch k (-1: not
                        there); its t-th real token is at start + t (`destinations`)
    device (`gather_packed`, `unpack`): [B, T, ...] -> [R, N, ...] and back, gathers by the
        maps above inside the jitted programs (the gradient flows through them).

The forward runs on the packed [R, N] tokens; per-token statistics (log-probs, entropy,
distillation terms) are computed over the packed slots and unpacked to [B, T] by the slots
before the objective, so every registered weight, aggregation and distillation loss reads
the same [B, T] arrays as on padded rows. A microbatch holds whole rows (a row is never split
over buffer rows, a buffer row never over microbatches): on microbatch k the rows it does not
hold read as all-masked rows (zero loss mask, log-probs and inputs), and since every
aggregation is a numerator additive over rows over the minibatch's denominator, the
microbatches' losses and gradients sum to the minibatch's exactly.

Shapes are bucketed so that a run compiles few programs: R (with K = `optimizer.grad_accum`
microbatches) or K (with `train.microbatch_tokens`: R = microbatch_tokens // N fixed) is the
next bucket size (`bucket`: four sizes per doubling, times the mesh's batch multiple), and
the bucket is logged per optimizer step (`train/pack_bucket`, with `train/pack_rows` and
`train/pack_fill`); empty microbatches of a bucket are skipped at run time (`lax.cond`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.core.errors import ConfigError

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class PackSpec:
    """How rows are packed, fixed for the run.

    tokens: N, slots per buffer row (`train.pack_tokens`).  microbatches: K when the rows per
    microbatch are bucketed (`optimizer.grad_accum`).  micro_rows: > 0, the buffer rows per
    microbatch, fixed (`train.microbatch_tokens` // N, a multiple of `multiple`), and K is
    bucketed instead.  multiple: the mesh's batch devices (R is always a multiple).
    """

    tokens: int
    microbatches: int = 1
    micro_rows: int = 0
    multiple: int = 1


def pack_spec(pack_tokens: int, *, grad_accum: int = 1, microbatch_tokens: int = 0,
              multiple: int = 1) -> PackSpec | None:  # fmt: skip
    """The run's `PackSpec` from its config values (None: padded rows, `pack_tokens` 0)."""
    if not pack_tokens:
        if microbatch_tokens:
            raise ConfigError(
                f"config key 'train.microbatch_tokens' = {microbatch_tokens} needs packed rows: "
                "set train.pack_tokens > 0 (the microbatches are sets of packed rows)"
            )
        return None
    if not microbatch_tokens:
        return PackSpec(pack_tokens, microbatches=grad_accum, multiple=multiple)
    if grad_accum != 1:
        raise ConfigError(
            f"config keys 'train.microbatch_tokens' = {microbatch_tokens} and "
            f"'optimizer.grad_accum' = {grad_accum}: choose one way to split a minibatch "
            "(set optimizer.grad_accum = 1 with token-budget microbatches)"
        )
    rows = max(microbatch_tokens // pack_tokens, 1)
    rows = -(-rows // multiple) * multiple
    return PackSpec(pack_tokens, micro_rows=rows, multiple=multiple)


def check_packing(pack_tokens: int, *, row_len: int) -> None:
    """ConfigError for packed rows (`train.pack_tokens` > 0) shorter than a row. What they do
    not run with is declared by the parts that need padded rows (their `capabilities`:
    `packed_rows`) and checked with the config (run/config/parts.py)."""
    if pack_tokens and pack_tokens < row_len:
        raise ConfigError(
            f"config key 'train.pack_tokens' = {pack_tokens} is shorter than a row ({row_len} "
            f"tokens: the longest prompt plus rollout.max_new_tokens); set it to at least "
            f"{row_len}"
        )


def bucket(n: int, multiple: int = 1) -> int:
    """The bucket of n: multiple * u, u the smallest of 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14,
    16, 20, 24, ... (four sizes per doubling) >= n / multiple. At most a quarter of a bucket
    is padding, and sizes up to n take at most 4 log2(n) programs."""
    units = max(-(-n // multiple), 1)
    step = 1 << max(units.bit_length() - 3, 0)
    return multiple * -(-units // step) * step


def first_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Bins of row indices: rows by decreasing length (ties by index), each into the first
    bin with room; every bin's total length <= capacity."""
    if len(lengths) and lengths.max() > capacity:
        raise ValueError(f"a row of {lengths.max()} tokens does not fit {capacity} slots")
    loads = np.zeros(len(lengths), np.int64)
    bins: list[list[int]] = []
    for i in np.argsort(-lengths, kind="stable"):
        j = int(np.argmax(loads[: len(bins)] + lengths[i] <= capacity)) if bins else 0
        if not bins or loads[j] + lengths[i] > capacity:
            j = len(bins)
            bins.append([])
        bins[j].append(int(i))
        loads[j] += lengths[i]
    return bins


def _split_bins(bins: list[list[int]], lengths: np.ndarray, k: int, per: int) -> list[list]:
    """k microbatches of at most `per` bins each, of about equal token counts: bins by
    decreasing load, each to the microbatch with the fewest tokens that has room."""
    loads = [int(lengths[b].sum()) for b in bins]
    micro: list[list] = [[] for _ in range(k)]
    tokens = np.zeros(k, np.int64)
    for i in np.argsort(-np.asarray(loads, np.int64), kind="stable"):
        room = [j for j in range(k) if len(micro[j]) < per]
        j = min(room, key=lambda j: (tokens[j], j))
        micro[j].append(bins[i])
        tokens[j] += loads[i]
    return micro


def plan_packing(attention_mask: np.ndarray, spec: PackSpec) -> tuple[dict, dict]:
    """(maps, stats) packing the rows of `attention_mask` [B, T] (host) by `spec`.

    maps: {'src', 'seg', 'pos': int32 [K, R, N], 'start': int32 [K, B]} (module docstring);
    stats: {'pack_rows': buffer rows used, 'pack_bucket': K * R, 'pack_fill': real tokens /
    (K * R * N)} (floats, logged per optimizer step).
    """
    mask = np.asarray(attention_mask) > 0
    b, t = mask.shape
    n = spec.tokens
    lengths = mask.sum(1)
    bins = first_fit_decreasing(lengths, n)
    if spec.micro_rows:  # token budget: R fixed, K bucketed
        r = spec.micro_rows
        k = bucket(-(-len(bins) // r))
    else:  # K fixed, R bucketed
        k = spec.microbatches
        r = bucket(-(-len(bins) // k), spec.multiple)
    micro = _split_bins(bins, lengths, k, r)
    src = np.full((k, r, n), b * t, np.int32)
    seg = np.zeros((k, r, n), np.int32)
    pos = np.zeros((k, r, n), np.int32)
    start = np.full((k, b), -1, np.int32)
    for mk, rows_bins in enumerate(micro):
        for ri, rows in enumerate(rows_bins):
            at = 0
            for si, row in enumerate(rows):
                cols = np.flatnonzero(mask[row])
                slots = at + np.arange(len(cols))
                src[mk, ri, slots] = row * t + cols
                seg[mk, ri, slots] = si + 1
                pos[mk, ri, slots] = np.arange(len(cols))
                start[mk, row] = ri * n + at
                at += len(cols)
    stats = dict(
        pack_rows=float(len(bins)),
        pack_bucket=float(k * r),
        pack_fill=float(lengths.sum() / (k * r * n)),
    )
    return dict(src=src, seg=seg, pos=pos, start=start), stats


def host_mask(attention_mask) -> np.ndarray:
    """The global [B, T] attention mask on the host (on several processes, gathered from
    every process's rows: a collective every process calls at the same point)."""
    if jax.process_count() > 1 and not attention_mask.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(attention_mask, tiled=True))
    return np.asarray(attention_mask)


def gather_packed(x_bt: Array, src_rn: Array) -> Array:
    """[B, T, ...] -> [R, N, ...]: slot (r, n) holds the token `src` names (0 where empty)."""
    flat = x_bt.reshape(-1, *x_bt.shape[2:])
    flat = jnp.concatenate([flat, jnp.zeros_like(flat[:1])])
    return flat[src_rn]


def unpack(x_rn: Array, dst_bt: Array) -> Array:
    """[R, N, ...] -> [B, T, ...]: each token's value from its slot (0 where not packed)."""
    flat = x_rn.reshape(-1, *x_rn.shape[2:])
    flat = jnp.concatenate([flat, jnp.zeros_like(flat[:1])])
    return flat[dst_bt]


def destinations(start_b: Array, attention_mask: Array, slots: int) -> Array:
    """[B, T] int32: the flat slot of each token in one microbatch of `slots` slots, from its
    rows' first slots start [B] (-1: not in it): a row's real tokens lie in order from
    there, so token t is at start + (its index among the row's real tokens); `slots` where
    there is none (padding, or a row another microbatch holds). Computed on device: no
    [B, T] map travels or stays replicated."""
    real = attention_mask > 0
    index = jnp.cumsum(real, axis=1, dtype=jnp.int32) - 1
    here = real & (start_b[:, None] >= 0)
    return jnp.where(here, start_b[:, None] + index, slots)


def present(dst_bt: Array, slots: int) -> Array:
    """[B, T] bool: the tokens packed in this microbatch (dst < its R * N slots)."""
    return dst_bt < slots


def packed_hidden(model, tokens_bt: Array, pack: dict) -> Array:
    """The model's final hidden states [R, N, D] over one microbatch's packed slots."""
    tokens = gather_packed(tokens_bt, pack["src"])
    return model.hidden_states(tokens, segment_ids=pack["seg"], positions=pack["pos"])[0]
