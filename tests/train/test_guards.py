"""The stop rules (train/guards.py) on hand-made update flags and reward failures: a count
of consecutive skipped updates or all-failed reward steps, reset by a good one, and the
TrainingFault naming the step, the key and the first failure. (Through a run:
tests/train/test_reliability.py.)"""

import numpy as np
import pytest

from jaxrl_frontier.core.errors import TrainingFault
from jaxrl_frontier.train.guards import GuardOptions, RunGuard


def test_skips_that_recover_reset_the_count():
    said = []
    guard = RunGuard(max_skipped_updates=2, max_failure_steps=0, say=said.append)
    for step, flags in enumerate([[1, 0], [1], [0], [0, 1]], start=1):
        guard.check_updates(step, [dict(update_skipped=f, grad_norm=1.0) for f in flags])
    assert guard.skipped_in_a_row == 1 and len(said) == 3
    with pytest.raises(TrainingFault, match="step 5: 2 updates in a row"):
        guard.check_updates(5, [dict(update_skipped=1.0, grad_norm=np.nan)])


def test_rewards_failing_on_every_completion_stop_after_the_limit():
    class Scorer:
        first_failure = "ZeroDivisionError: checker bug #1"

    said = []
    guard = RunGuard.from_options(
        GuardOptions(max_skipped_updates=0, max_failure_steps=2), say=said.append, scorer=Scorer()
    )
    guard.check_rewards(1, n_failed=8, n_rows=8)  # all failed: 1 in a row
    guard.check_rewards(2, n_failed=7, n_rows=8)  # one scored: the count starts again
    assert guard.failed_steps_in_a_row == 0
    guard.check_rewards(3, n_failed=8, n_rows=8)
    with pytest.raises(
        TrainingFault, match=r"step 4: .* 2 steps in a row .*max_failure_steps=2.*bug #1"
    ):
        guard.check_rewards(4, n_failed=8, n_rows=8)
    never = RunGuard(max_skipped_updates=0, max_failure_steps=0, say=said.append)  # 0: never
    for step in range(1, 20):
        never.check_rewards(step, n_failed=4, n_rows=4)
        never.check_updates(step, dict(update_skipped=1.0, grad_norm=np.inf))
    assert never.failed_steps_in_a_row == 19 and never.skipped_in_a_row == 19
