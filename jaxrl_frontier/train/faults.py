"""Run-level fault handling the loop calls: resume, log flushing, and the stop rules for
updates that keep being skipped and rewards that keep failing.

Each check raises `TrainingFault` (a one-line message naming the step, the config key that
set the limit and what to do) instead of letting a broken run exit 0 and export broken
weights. Every process reaches the same decision at the same step: the skip flags come from
the global update and the failure counts are summed over processes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxrl_frontier.core.errors import TrainingFault


def flush_logs(*loggers) -> None:
    """Flush and fsync the JSONL logs (called before each checkpoint save, so every row up to
    the checkpoint's step is on disk when the checkpoint is)."""
    for logger in loggers:
        if logger is not None:
            logger.flush(sync=True)


def resume(ckpt, abstract_state, loggers: Sequence, say: Callable[[str], None]):
    """(state, meta) of the newest intact checkpoint, or None for a fresh run (whose logs
    are emptied: rows left by a run killed before its first checkpoint are written again).

    Damaged steps are skipped with a warning naming the step and the file; the JSONL logs
    lose the rows written after the restored step (the resumed run writes them again), so
    each step's row appears exactly once."""
    restored = ckpt.restore_latest(abstract_state, warn=lambda m: say(f"warning: {m}"))
    if restored is None:
        # no checkpoint: a run killed before its first one starts over, and so do its logs
        dropped = sum(log.truncate_after(-1) for log in loggers if log is not None)
        if dropped:
            say(
                f"no checkpoint: starting from step 0; dropped {dropped} log rows of a run "
                "killed before its first checkpoint"
            )
        return None
    state, meta, step = restored
    dropped = sum(log.truncate_after(step) for log in loggers if log is not None)
    say(
        f"resumed from step {step} ({ckpt.directory})"
        + (f"; dropped {dropped} log rows written after it" if dropped else "")
    )
    return state, meta


@dataclasses.dataclass(frozen=True)
class GuardOptions:
    """The stop rules' limits: `train.max_skipped_updates` updates skipped in a row and
    `rewards.max_failure_steps` steps of failing rewards in a row (0: never)."""

    max_skipped_updates: int = 10
    max_failure_steps: int = 3


class RunGuard:
    """Counts consecutive skipped updates and consecutive all-failed reward steps.

    max_skipped_updates: that many skipped updates in a row stop the run (0: never).
    max_failure_steps: that many steps in a row where every completion's reward raised stop
    the run (0: never). `scorer.first_failure` (if the scorer has one) names the first error.
    """

    def __init__(
        self,
        *,
        max_skipped_updates: int,
        max_failure_steps: int,
        say: Callable[[str], None] = print,
        scorer: Any = None,
    ):
        self.max_skipped = max_skipped_updates
        self.max_failure_steps = max_failure_steps
        self.say = say
        self.scorer = scorer
        self.skipped_in_a_row = 0
        self.failed_steps_in_a_row = 0

    @classmethod
    def from_options(cls, options: GuardOptions, *, say=print, scorer=None) -> RunGuard:
        """The limits `train.max_skipped_updates` and `rewards.max_failure_steps`."""
        return cls(
            max_skipped_updates=options.max_skipped_updates,
            max_failure_steps=options.max_failure_steps,
            say=say,
            scorer=scorer,
        )

    def check_updates(self, step: int, metrics: Mapping | Sequence[Mapping]) -> None:
        """After step `step`'s update(s): warn on skipped ones, stop after too many in a row."""
        metrics = [metrics] if isinstance(metrics, Mapping) else list(metrics)
        flags = [bool(f) for f in jax.device_get([m["update_skipped"] for m in metrics])]
        for skipped in flags:
            self.skipped_in_a_row = self.skipped_in_a_row + 1 if skipped else 0
        if not any(flags):
            return
        norms = jax.device_get([m.get("grad_norm", np.nan) for m in metrics])
        self.say(
            f"warning: step {step}: {sum(flags)} of {len(flags)} updates skipped (non-finite "
            f"loss or gradient; grad_norm {', '.join(f'{float(g):.3g}' for g in norms)}); "
            f"{self.skipped_in_a_row} skipped in a row"
        )
        if self.max_skipped and self.skipped_in_a_row >= self.max_skipped:
            raise TrainingFault(
                f"step {step}: {self.skipped_in_a_row} updates in a row were skipped for a "
                f"non-finite loss or gradient (train.max_skipped_updates={self.max_skipped}): "
                "the run has diverged; no weights exported. Lower optimizer.lr or "
                "optimizer.max_grad_norm and resume from the last checkpoint"
            )

    def check_rewards(self, step: int, n_failed: float, n_rows: int) -> None:
        """After step `step`'s scoring: stop once every reward failed for too many steps."""
        all_failed = n_rows > 0 and int(n_failed) >= n_rows
        self.failed_steps_in_a_row = self.failed_steps_in_a_row + 1 if all_failed else 0
        limit = self.max_failure_steps
        if limit and self.failed_steps_in_a_row >= limit:
            first = getattr(self.scorer, "first_failure", None)
            raise TrainingFault(
                f"step {step}: the reward failed on every completion for "
                f"{self.failed_steps_in_a_row} steps in a row (rewards.max_failure_steps="
                f"{limit}); first failure: {first or 'see the warning above'}"
            )
