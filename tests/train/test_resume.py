"""Resume (train/resume.py) against a stand-in checkpointer and logs: the newest intact
checkpoint restored and every log cut back to its step, a fresh run's logs emptied, and the
logs fsynced before a save. (On real runs: tests/train/test_reliability.py.)"""

from jaxrl_frontier.train.resume import flush_logs, resume


class Log:
    """A JSONL log holding the steps of its rows."""

    def __init__(self, steps):
        self.steps, self.synced = list(steps), []

    def truncate_after(self, step: int) -> int:
        kept = [s for s in self.steps if s <= step]
        dropped, self.steps = len(self.steps) - len(kept), kept
        return dropped

    def flush(self, sync: bool = False):
        self.synced.append(sync)


class Checkpoints:
    directory = "/ckpt"

    def __init__(self, restored, warning=None):
        self.restored, self.warning = restored, warning

    def restore_latest(self, abstract_state, warn):
        if self.warning:
            warn(self.warning)
        return self.restored


def test_resume_restores_the_newest_intact_step_and_cuts_each_log_back_to_it():
    metrics, rollouts, said = Log([1, 2, 3, 4, 5]), Log([2, 4, 6]), []
    ckpt = Checkpoints(("state", {"seed": 0}, 3), warning="step 4 is damaged (file x)")
    assert resume(ckpt, None, [metrics, None, rollouts], said.append) == ("state", {"seed": 0})
    assert metrics.steps == [1, 2, 3] and rollouts.steps == [2]
    assert said == [
        "warning: step 4 is damaged (file x)",
        "resumed from step 3 (/ckpt); dropped 4 log rows written after it",
    ]


def test_a_run_without_a_checkpoint_starts_over_with_empty_logs():
    metrics, said = Log([1, 2]), []
    assert resume(Checkpoints(None), None, [metrics], said.append) is None
    assert metrics.steps == [] and "dropped 2 log rows" in said[0]
    said.clear()
    assert resume(Checkpoints(None), None, [Log([])], said.append) is None
    assert said == []  # nothing to drop: nothing said


def test_flush_logs_fsyncs_each_log_and_skips_the_absent_ones():
    a, b = Log([]), Log([])
    flush_logs(a, None, b)
    assert a.synced == [True] and b.synced == [True]
