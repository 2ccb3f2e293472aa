"""Rollout records (`Rollout`, `Sequences`) and the host-side prompt padding both samplers
share (`left_pad_prompts`)."""

from __future__ import annotations

from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.sampling.params import FinishReason

# Prompt widths a sampler pads to (the update's rows take the same width): 16 * 2^j and,
# from 48 on, 24 * 2^j between them. A prompt is then at most a third padding, not half as
# with powers of two alone (an 84-token chat prompt: 96 positions, not 128, in the prefill
# and in every update), for at most twice the compiled prompt shapes. Each is a multiple
# of 16, which `mesh.sequence` must divide.
DEFAULT_PROMPT_BUCKETS = (
    16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192
)  # fmt: skip


@flax.struct.dataclass
class Sequences:
    """A rollout as full sequences [B, Tp + Tn], `x[b, t]` about `tokens[b, t]` given
    `tokens[b, :t]`: tokens (prompt, completion, pad_id), attention_mask (1 on real tokens),
    loss_mask (1.0 on completion tokens, stop included), old_logp (behaviour log-prob; 0 off
    the completion), policy_mask (1.0 on tokens the policy sampled)."""

    tokens: jax.Array
    attention_mask: jax.Array
    loss_mask: jax.Array
    old_logp: jax.Array
    policy_mask: jax.Array


@flax.struct.dataclass
class Rollout:
    """B = P * n completions, prompt-major (rows g*n .. g*n+n-1 share prompt g).

    prompt_tokens:     int32 [B, Tp]   left-padded to the prompt bucket Tp.
    prompt_mask:       int32 [B, Tp]   1 on real prompt tokens.
    completion_tokens: int32 [B, Tn]   pad_id after the end of the completion.
    completion_mask:   int32 [B, Tn]   1 up to and including the stop token.
    policy_mask:       int32 [B, Tn]   1 on tokens the policy sampled (the completion mask;
                                       multi-turn rollouts zero observation tokens).
    lengths:           int32 [B]       completion lengths (sum of completion_mask).
    finish_reason:     int32 [B]       a `FinishReason` code (STOP or LENGTH).
    sample_logp:       f32   [B, Tn]   log q(y_t), the sampled distribution; 0 off the mask.
    policy_logp:       f32   [B, Tn]   log p(y_t), the behaviour log-prob; 0 off the mask.
    policy_version:    int32 [B]       version of the weights that sampled each row.
    dropout_keys:      uint32 [B, ...] key data of each row's MLP dropout mask, or None.
    token_version:     int32 [B, Tn]   the version of each token, or None (all policy_version):
                                       partial rollouts continue rows with newer weights.
    routing:           int16 [B, Tp + Tn, L, k] a mixture of experts' experts of each token
                       and layer as the sampler routed it (`Sampler(record_routing=True)`),
                       aligned with `sequences()`; -1 where none was recorded (padding, the
                       last token, which is never fed); or None.
    group_size:        n (static).
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    completion_tokens: jax.Array
    completion_mask: jax.Array
    policy_mask: jax.Array
    lengths: jax.Array
    finish_reason: jax.Array
    sample_logp: jax.Array
    policy_logp: jax.Array
    policy_version: jax.Array
    dropout_keys: jax.Array | None = None
    token_version: jax.Array | None = None
    routing: jax.Array | None = None
    group_size: int = flax.struct.field(pytree_node=False, default=1)

    @property
    def num_prompts(self) -> int:
        return self.completion_tokens.shape[0] // self.group_size

    def take_rows(self, num_rows: int) -> Rollout:
        """The first `num_rows` rows (the rest: batch-bucket padding)."""
        if num_rows == self.completion_tokens.shape[0]:
            return self
        return jax.tree.map(lambda x: x[:num_rows], self)

    def finish_reason_names(self) -> list[str]:
        """Host list of 'stop' / 'length', one per row."""
        return [FinishReason(int(c)).name.lower() for c in np.asarray(self.finish_reason)]

    def sequences(self) -> Sequences:
        """The rollout as full [B, Tp + Tn] sequences with per-token arrays aligned to them."""
        prompt_zeros = jnp.zeros(self.prompt_mask.shape, jnp.float32)

        def cat(prompt_part, completion_part):
            return jnp.concatenate([prompt_part, completion_part], axis=1)

        return Sequences(
            tokens=cat(self.prompt_tokens, self.completion_tokens),
            attention_mask=cat(self.prompt_mask, self.completion_mask),
            loss_mask=cat(prompt_zeros, self.completion_mask.astype(jnp.float32)),
            old_logp=cat(prompt_zeros, self.policy_logp),
            policy_mask=cat(prompt_zeros, self.policy_mask.astype(jnp.float32)),
        )


def make_rollout(
    prompt_tokens, prompt_mask, out, lengths, stopped, *, n, version, dropout_keys, routing=None
):
    """The `Rollout` of a decode: prompts [P, Tp] (each repeated n times), out = (tokens,
    policy_logp, sample_logp) [B, Tn] (pad_id / 0 past each row's end), lengths int32 [B],
    stopped bool [B] (it emitted a stop token), version int32 []; routing: the recorded
    experts [B, Tp + Tn, L, k] or None."""
    tokens, policy_logp, sample_logp = out
    num_rows, tn = tokens.shape
    completion_mask = (jnp.arange(tn)[None, :] < lengths[:, None]).astype(jnp.int32)
    return Rollout(
        prompt_tokens=jnp.repeat(prompt_tokens, n, axis=0),
        prompt_mask=jnp.repeat(prompt_mask, n, axis=0),
        completion_tokens=tokens,
        completion_mask=completion_mask,
        policy_mask=completion_mask,
        lengths=lengths,
        finish_reason=jnp.where(stopped, FinishReason.STOP, FinishReason.LENGTH).astype(jnp.int32),
        sample_logp=sample_logp,
        policy_logp=policy_logp,
        policy_version=jnp.full((num_rows,), version, jnp.int32),
        dropout_keys=dropout_keys,
        routing=routing,
        group_size=n,
    )


def bucket(size: int, buckets: Sequence[int], what: str, option: str, owner: str) -> int:
    for b in sorted(buckets):
        if size <= b:
            return b
    raise ValueError(
        f"{what} {size} is larger than the largest bucket {max(buckets)}; "
        f"add a bucket to {owner}({option}=...)"
    )


def left_pad_prompts(
    prompt_tokens, prompt_mask, *, pad_id: int, prompt_buckets, num_rows=None, owner="Sampler"
) -> tuple[np.ndarray, np.ndarray]:
    """Host prompts [P, T] -> int32 (tokens, mask) [num_rows or P, Tp], left-padded to the
    smallest bucket Tp that fits; rows past P repeat prompt 0. Errors name what breaks the
    contract: [P, T] shapes, an empty prompt, a row not left-padded."""
    tokens = np.asarray(prompt_tokens)
    mask = np.asarray(prompt_mask)
    if tokens.ndim != 2 or tokens.shape != mask.shape:
        raise ValueError(
            f"prompt_tokens {tokens.shape} and prompt_mask {mask.shape} must both be [P, T]"
        )
    mask = (mask != 0).astype(np.int32)
    num_prompts = tokens.shape[0]
    if num_prompts == 0:
        raise ValueError("no prompts")
    lengths = mask.sum(axis=1)
    if np.any(lengths == 0):
        raise ValueError(f"prompts {np.flatnonzero(lengths == 0).tolist()} are empty")
    if np.any(np.diff(mask, axis=1) < 0):
        rows = np.flatnonzero(np.any(np.diff(mask, axis=1) < 0, axis=1)).tolist()
        raise ValueError(f"prompts must be left-padded; rows {rows[:8]} are not")
    longest = int(lengths.max())
    tp = bucket(longest, prompt_buckets, "prompt length", "prompt_buckets", owner)
    num_rows = num_prompts if num_rows is None else num_rows
    # left-padded: the last `longest` columns hold every real token
    widths = ((0, num_rows - num_prompts), (tp - longest, 0))
    out_tokens, out_mask = (np.pad(x[:, x.shape[1] - longest :], widths) for x in (tokens, mask))
    out_tokens[num_prompts:], out_mask[num_prompts:] = out_tokens[0], out_mask[0]  # batch padding
    return np.where(out_mask == 1, out_tokens, pad_id).astype(np.int32), out_mask
