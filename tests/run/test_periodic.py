"""The trainer's hooks and watchdog built from a config (run/periodic.py), on a stand-in
trainer that records what the hooks call: the hooks' order and frequencies, the progress
line on process 0 of a solo run only, the export at the end with train.export = 'last',
and what each hook does at a step."""

import contextlib
import types

import pytest

from jaxrl_frontier.run import periodic
from jaxrl_frontier.run.config import base_config, resolve
from jaxrl_frontier.train import hooks as hooks_lib


class StandIn:
    """What `periodic.hooks` reads of a trainer; every call it makes is appended to `calls`."""

    def __init__(self, c, *, is_main=True, shared=None, lock="lock", step_hooks=()):
        self.calls: list = []
        self.config, self.is_main, self.shared = c, is_main, shared
        self.writer = types.SimpleNamespace(
            write_scalars=lambda step, scalars: self.calls.append(("write", step, dict(scalars)))
        )
        self.step = types.SimpleNamespace(
            tag="rl",
            shown={"loss": "train/loss"},
            evaluates_at_start=True,
            hooks=lambda: list(step_hooks),
        )
        self.stop_request = types.SimpleNamespace(agreed=lambda done: False)
        self.history = {"eval": []}
        self.ckpt = types.SimpleNamespace(wait=lambda: self.calls.append("wait"))
        self.watchdog = types.SimpleNamespace(after_step=lambda d: self.calls.append(("dog", d)))
        self.lock = lock and types.SimpleNamespace(
            after_step=lambda d: self.calls.append(("lock", d))
        )

    def say(self, msg):
        self.calls.append(("say", msg))

    def evaluate(self):
        self.calls.append("evaluate")
        return {"eval/pass@1_greedy": 0.5}

    def holding(self, phase):
        self.calls.append(("holding", phase))
        return contextlib.nullcontext()

    def save(self):
        self.calls.append("save")

    def export(self):
        self.calls.append("export")


def _config(**train):
    c = resolve(base_config())
    c.train.update(steps=6, log_every=2, eval_every=3, checkpoint_every=4, **train)
    return c


def test_the_hooks_run_in_the_documented_order_at_their_frequencies():
    stage = hooks_lib.BetweenSteps(lambda done: None)  # the RL step's own hook
    c = _config(stop_at_pass1=0.9)
    got = periodic.hooks(StandIn(c, step_hooks=[stage]), c)
    assert [type(h) for h in got] == [
        hooks_lib.WriteMetrics,
        hooks_lib.Progress,
        hooks_lib.StopOnSignal,
        hooks_lib.Evaluate,
        hooks_lib.Checkpoint,
        hooks_lib.Beats,
        hooks_lib.BetweenSteps,
        hooks_lib.AtEnd,  # train.export = 'last'
    ]
    write, progress, _, evaluate, checkpoint, beats, own, _ = got
    assert (write.every, progress.every, evaluate.every, checkpoint.every) == (2, 2, 3, 4)
    assert progress.shown == {"loss": "train/loss"}
    assert (evaluate.at_start, evaluate.stop_at) == (True, 0.9)
    assert len(beats.parts) == 2 and own is stage


@pytest.mark.parametrize(
    "is_main, shared, progress", [(True, None, True), (False, None, False), (True, "m0", False)]
)
def test_the_progress_line_is_process_0s_of_a_solo_run(is_main, shared, progress):
    c = _config()
    got = periodic.hooks(StandIn(c, is_main=is_main, shared=shared, lock=None), c)
    assert any(isinstance(h, hooks_lib.Progress) for h in got) == progress
    beats = next(h for h in got if isinstance(h, hooks_lib.Beats))
    assert len(beats.parts) == 1  # no lock (processes other than 0): the watchdog alone


def test_with_the_best_export_nothing_exports_at_the_end():
    c = _config(export="best")
    got = periodic.hooks(StandIn(c), c)
    assert not any(isinstance(h, hooks_lib.AtEnd) for h in got)
    assert isinstance(got[-1], hooks_lib.Beats)


def test_the_hooks_call_the_trainer_at_their_steps():
    """Steps 1 to 6 of 6 (log every 2, eval every 3, checkpoint every 4): the metrics at 2, 4,
    6; the eval (paused, its scalars written) at 3 and 6; checkpoints at 4 and 6; beats at
    every step; the export and the wait for the last save at the end."""
    c = _config()
    trainer = StandIn(c, is_main=False)  # no progress bar
    got = periodic.hooks(trainer, c)
    scalars = {"train/loss": 1.0}
    for h in got:
        h.begin(0)
    at_start = list(trainer.calls)
    trainer.calls.clear()
    for done in range(1, 7):
        end = hooks_lib.StepEnd(done=done, steps=6, scalars_fn=lambda: scalars)
        for h in got:
            h.after_step(end)
        assert end.stop is None
    by_step, pending = {}, []  # each step's calls end with the beats: watchdog, lock
    for call in trainer.calls:
        pending.append(call)
        if isinstance(call, tuple) and call[0] == "lock":
            by_step[call[1]], pending = pending, []
    assert pending == [] and sorted(by_step) == [1, 2, 3, 4, 5, 6]
    trainer.calls.clear()
    for h in got:
        h.end(None)
    ev = {"eval/pass@1_greedy": 0.5}
    assert at_start[:3] == [("holding", "eval"), "evaluate", ("write", 0, ev)]  # at_start
    assert trainer.history["eval"] == [
        dict(step=0, **ev), dict(step=3, **ev), dict(step=6, **ev)
    ]  # fmt: skip
    assert trainer.history["best"] == dict(step=0, value=0.5)  # the first of equal evals
    assert [k for k, calls in by_step.items() if ("write", k, scalars) in calls] == [2, 4, 6]
    assert [k for k, calls in by_step.items() if "evaluate" in calls] == [3, 6]
    assert [k for k, calls in by_step.items() if "save" in calls] == [4, 6]
    assert all(calls[-2:] == [("dog", k), ("lock", k)] for k, calls in by_step.items())
    assert trainer.calls == ["wait", "export"]


def test_the_watchdog_reads_its_timeouts_from_the_config(tmp_path):
    c = resolve(base_config())
    c.train.hang_timeout_s = 120.0
    c.distributed.update(heartbeat_timeout_s=30, shutdown_timeout_s=45)
    dog = periodic.watchdog(c, str(tmp_path))
    assert (dog.run_dir, dog.hang_timeout_s) == (str(tmp_path), 120.0)
    assert (dog.process_index, dog.process_count) == (0, 1)
    assert (dog.heartbeat_timeout_s, dog.end_timeout_s) == (30, 45)
