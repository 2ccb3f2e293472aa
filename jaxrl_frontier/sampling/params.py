"""SamplingParams, FinishReason, and the settings' split into Plan (static) and Knobs."""

from __future__ import annotations

import dataclasses
import enum

import flax.struct
import jax
import numpy as np


class FinishReason(enum.IntEnum):
    """Why a completion ended (`Rollout.finish_reason`)."""

    STOP = 0  # it emitted an EOS or stop token (the last completion token)
    LENGTH = 1  # it reached max_new_tokens


# field -> (is the value allowed, the allowed values in words)
_CHECKS = {
    "max_new_tokens": (lambda p: p.max_new_tokens >= 1, ">= 1"),
    "n": (lambda p: p.n >= 1, ">= 1"),
    "temperature": (lambda p: p.greedy or p.temperature > 0, "> 0 (or greedy=True)"),
    "top_k": (lambda p: p.top_k >= 0, ">= 0 (0 = off)"),
    "top_p": (lambda p: 0.0 < p.top_p <= 1.0, "in (0, 1]"),
    "min_p": (lambda p: 0.0 <= p.min_p < 1.0, "in [0, 1)"),
    "dropout_rate": (lambda p: 0.0 <= p.dropout_rate < 1.0, "in [0, 1)"),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How to sample completions.

    max_new_tokens Tn (stop token included); n completions per prompt (the group size);
    temperature (before truncation; not used when greedy); top_k (0 = off), then top_p (the
    smallest top set with mass >= top_p; 1 = off), then min_p (p >= min_p * max p; 0 = off);
    greedy: argmax of the plain logits (sample_logp 0); eos_ids, stop_ids end a row (kept).
    dropout_rate:   Dropout-GRPO: one Bernoulli(1 - rate) / (1 - rate) mask on the MLP hidden
                    units per row, fixed for the whole rollout (0 = off).
    """

    max_new_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    greedy: bool = False
    eos_ids: tuple[int, ...] = ()
    stop_ids: tuple[int, ...] = ()
    dropout_rate: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "eos_ids", tuple(int(i) for i in self.eos_ids))
        object.__setattr__(self, "stop_ids", tuple(int(i) for i in self.stop_ids))
        for name, (ok, allowed) in _CHECKS.items():
            if not ok(self):
                raise ValueError(
                    f"SamplingParams.{name}={getattr(self, name)!r}; must be {allowed}"
                )

    @property
    def all_stop_ids(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.eos_ids) | set(self.stop_ids)))

    @property
    def stop_id_slots(self) -> int:
        """Static width of the stop-id array: the count rounded up to a multiple of 4, so
        adding a stop token rarely recompiles (the ids themselves are traced)."""
        return max(4, -(-len(self.all_stop_ids) // 4) * 4)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything static about one compiled rollout (the jit cache key besides shapes)."""

    n: int
    max_new_tokens: int
    greedy: bool
    top_k: int
    use_top_p: bool
    use_min_p: bool
    num_stop_ids: int  # the stop ids themselves are traced, padded with -1 to this count
    use_dropout: bool

    @classmethod
    def of(cls, p: SamplingParams) -> Plan:
        on = (p.top_p < 1.0, p.min_p > 0.0, p.stop_id_slots, p.dropout_rate > 0.0)
        return cls(p.n, p.max_new_tokens, p.greedy, p.top_k, *on)


@flax.struct.dataclass
class Knobs:
    """The traced settings (changing them does not recompile): temperature, top_p, min_p,
    dropout_rate f32 []; stop_ids int32 [Plan.num_stop_ids], padded with -1 (no token);
    first_row int32 []: the global index of the batch's row 0, which row r's keys are drawn
    from (`ops.row_keys`: fold_in(key, first_row + r)): a process sampling its own rows of a
    batch that spans several (asynchronous rollouts on many hosts) draws what one process
    sampling the whole batch would."""

    temperature: jax.Array
    top_p: jax.Array
    min_p: jax.Array
    dropout_rate: jax.Array
    stop_ids: jax.Array
    first_row: jax.Array

    @classmethod
    def of(cls, p: SamplingParams, first_row: int = 0) -> Knobs:
        stop_ids = np.full((p.stop_id_slots,), -1, np.int32)
        stop_ids[: len(p.all_stop_ids)] = p.all_stop_ids
        f32 = np.float32
        return cls(
            f32(p.temperature), f32(p.top_p), f32(p.min_p), f32(p.dropout_rate), stop_ids,
            np.int32(first_row),
        )  # fmt: skip
