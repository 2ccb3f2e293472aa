"""The training loop's hooks (train/hooks.py) driven by hand with fakes, no trainer: when each
hook's work is due, the stops an evaluation or a signal sets, and what each does at the end."""

import contextlib

from jaxrl_frontier.train import hooks


class Writer:
    def __init__(self):
        self.rows = []

    def write_scalars(self, step, scalars):
        self.rows.append((step, dict(scalars)))


def loop(hook_list, steps, start=0, scalars=lambda s: {"train/loss": float(s)}):
    """run/trainer.py's loop: the stop (or None) it ended with."""
    for h in hook_list:
        h.begin(start)
    stop = None
    for step in range(start, steps):
        end = hooks.StepEnd(done=step + 1, steps=steps, scalars_fn=lambda s=step: scalars(s))
        for h in hook_list:
            h.after_step(end)
        stop = end.stop
        if stop:
            break
    for h in hook_list:
        h.end(stop)
    return stop


def test_step_end_is_due_every_n_steps_and_at_the_last_and_reads_scalars_once():
    calls = []
    end = hooks.StepEnd(done=6, steps=10, scalars_fn=lambda: calls.append(1) or {"a": 1.0})
    assert end.due(3) and not end.due(4) and not end.last
    assert end.scalars() == end.scalars() == {"a": 1.0} and calls == [1]
    last = hooks.StepEnd(done=10, steps=10, scalars_fn=dict)
    assert last.last and last.due(4)
    assert hooks.fmt({"a": 0.123456, "n": 3}) == "a=0.1235  n=3"


def test_metrics_and_checkpoints_are_written_when_due():
    writer, saved, waited = Writer(), [], []
    step = {"n": 0}

    def save():
        saved.append(step["n"])

    class Count(hooks.Hook):
        def after_step(self, end):
            step["n"] = end.done

    every = [
        Count(),
        hooks.WriteMetrics(writer, 2),
        hooks.Checkpoint(save, lambda: waited.append(1), 3),
    ]
    assert loop(every, 7) is None
    assert [s for s, _ in writer.rows] == [2, 4, 6, 7]
    assert writer.rows[0] == (2, {"train/loss": 1.0})  # step 2's scalars (0-based step 1)
    assert saved == [3, 6, 7] and waited == [1]


class Stop:
    """A StopAgreement stand-in: agreed from step `at` on."""

    def __init__(self, at):
        self.at, self.signal_name = at, "SIGTERM on process 1"

    def agreed(self, step):
        return step >= self.at


def test_a_signal_stops_after_the_step_saves_and_skips_the_export_and_the_wait():
    said, saved, waited, exported, between = [], [], [], [], []
    stop = Stop(2)
    hook_list = [
        hooks.StopOnSignal(lambda: stop, said.append),
        hooks.Checkpoint(lambda: saved.append(1), lambda: waited.append(1), 10),
        hooks.AtEnd(lambda: exported.append(1)),
        hooks.BetweenSteps(between.append),
    ]
    assert loop(hook_list, 5) == "signal"
    assert said == ["stopped by SIGTERM on process 1 at step 2; checkpoint saved"]
    assert saved == [1] and waited == [] and exported == [] and between == [1]


def test_a_finished_run_exports_and_steps_between_all_but_the_last():
    exported, between = [], []
    hook_list = [hooks.AtEnd(lambda: exported.append(1)), hooks.BetweenSteps(between.append)]
    assert loop(hook_list, 4) is None
    assert exported == [1] and between == [1, 2, 3]


def evaluate_hook(values, *, at_start=False, stop_at=0.0, history=None, after=None):
    history = {"eval": []} if history is None else history
    writer, said, paused = Writer(), [], []

    @contextlib.contextmanager
    def pause():
        paused.append("in")
        yield
        paused.append("out")

    it = iter(values)
    hook = hooks.Evaluate(
        lambda: {"eval/pass@1_greedy": next(it)},
        2,
        at_start=at_start,
        stop_at=stop_at,
        history=history,
        writer=writer,
        paused=pause,
        after_eval=after or (lambda ev, step: None),
        say=said.append,
    )
    return hook, history, writer, said, paused


def test_evaluation_every_n_steps_and_at_the_start():
    hook, history, writer, said, paused = evaluate_hook([0.1, 0.2, 0.3, 0.4], at_start=True)
    assert loop([hook], 5) is None
    assert [e["step"] for e in history["eval"]] == [0, 2, 4, 5]
    assert writer.rows[1] == (2, {"eval/pass@1_greedy": 0.2})
    assert said[0] == "step 0: eval/pass@1_greedy=0.1000" and paused == ["in", "out"] * 4
    resumed, history, _, _, _ = evaluate_hook([0.5], at_start=True)
    resumed.begin(3)  # a resumed run does not evaluate its start again
    assert history["eval"] == []


def test_the_target_pass1_or_a_collapse_stops_the_run():
    hook, history, _, said, _ = evaluate_hook([0.3, 0.8, 0.9], stop_at=0.75)
    assert loop([hook], 9) == "target"
    assert history["target_reached_at"] == 4 and len(history["eval"]) == 2
    assert said[-1] == "pass@1 reached train.stop_at_pass1=0.75: done"

    def collapsed_at_4(ev, step):
        if step == 4:
            history2["collapse"] = {"collapse_at": 4}

    history2 = {"eval": []}
    hook, _, _, _, _ = evaluate_hook([0.3, 0.1, 0.0], history=history2, after=collapsed_at_4)
    assert loop([hook], 9) == "target" and len(history2["eval"]) == 2
    assert "target_reached_at" not in history2


def test_progress_and_beats():
    bars, beats = [], []

    class Bar:
        def __init__(self, start):
            self.updates, self.closed = [], False
            bars.append((start, self))

        def update(self, step, shown):
            self.updates.append((step, shown))

        def close(self):
            self.closed = True

    class Part:
        def after_step(self, step):
            beats.append(step)

    progress = hooks.Progress(Bar, 2, {"loss": "train/loss"})
    loop([progress, hooks.Beats(Part(), None)], 3, start=1)
    ((start, bar),) = bars
    assert start == 1 and bar.updates == [(2, {"loss": 1.0}), (3, {"loss": 2.0})] and bar.closed
    assert beats == [2, 3]
