"""The stop rules the loop calls (`RunGuard`): updates that keep being skipped and rewards
that keep failing. (Resume and log flushing: resume.py.)

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


@dataclasses.dataclass(frozen=True)
class GuardOptions:
    """The stop rules' limits: `train.max_skipped_updates` updates skipped in a row and
    `rewards.max_failure_steps` steps of failing rewards in a row (0: never)."""

    max_skipped_updates: int
    max_failure_steps: int


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
