"""TokenStats: the per-token statistics record every objective reads.

All fields are [B, T] and aligned with `tokens`: `x[b, t]` is about token `tokens[b, t]`
given `tokens[b, :t]` (so column 0 is never a completion token and is masked).
Rows are prompt-major: rows `g*G .. g*G+G-1` share prompt g.
"""

from __future__ import annotations

import jax
from flax import struct

Array = jax.Array


@struct.dataclass
class TokenStats:
    """Per-token statistics, all [B, T], aligned with the tokens.

    logp:         log pi_theta(y_t), current policy (differentiable).
    old_logp:     log pi_old(y_t), the behaviour / sampler policy (constant).
    mask:         1.0 on completion tokens, 0.0 on prompt and padding.
    ref_logp:     log pi_ref(y_t), frozen reference (optional).
    teacher_logp: log pi_teacher(y_t) on the student's sampled token (optional; OPD).
    sc_logp:      log pi_theta(y_t | prompt + one verified own solution), the
                  self-conditioned pass of SC-GRPO (optional).
    sc_kl:        KL(pi_theta(. | prompt, y<t) || pi_theta(. | prompt + that solution, y<t)),
                  summed over the vocabulary by the same pass (optional; SC-GRPO).
    """

    logp: Array
    old_logp: Array
    mask: Array
    ref_logp: Array | None = None
    teacher_logp: Array | None = None
    sc_logp: Array | None = None
    sc_kl: Array | None = None


OPTIONAL_FIELDS = ("ref_logp", "teacher_logp", "sc_logp", "sc_kl")
