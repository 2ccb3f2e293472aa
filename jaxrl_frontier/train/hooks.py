"""Periodic work around the training loop, as hooks that own their frequency.

The loop (run/trainer.py) is

    for hook in hooks: hook.begin(start)
    for step in range(start, steps):
        scalars = train_step()
        end = StepEnd(done=step + 1, last=..., scalars=scalars)
        for hook in hooks: hook.after_step(end)        # in order; may set end.stop
        if end.stop: break
    for hook in hooks: hook.end(end.stop)

as in levanter's trainer. The order of the list is the order of the work after a step:
metrics are written, a stop signal is noted, the evaluation runs (and may decide
the run is done), the checkpoint is saved (always when the run stops), the next stage is
entered. A hook is an object with any of `begin`, `after_step` and `end` (the `Hook` base
class gives each a no-op).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from jaxrl_frontier.train import collapse


@dataclasses.dataclass
class StepEnd:
    """What the hooks see after step `done` (1-based) of a run of `steps` steps.

    scalars(): the step's train scalars (computed on first call: a device-to-host copy);
    stop: None to go on, "signal" (SIGTERM/SIGINT: save and return) or "target" (pass@1
    reached `train.stop_at_pass1`, or the eval curve collapsed: save, export, finish).
    """

    done: int
    steps: int
    scalars_fn: Callable[[], dict[str, float]]
    stop: str | None = None
    _scalars: dict[str, float] | None = None

    @property
    def last(self) -> bool:
        return self.done == self.steps

    def scalars(self) -> dict[str, float]:
        if self._scalars is None:
            self._scalars = self.scalars_fn()
        return self._scalars

    def due(self, every: int) -> bool:
        """Whether work done every `every` steps (and at the last step) is due now."""
        return self.done % every == 0 or self.last


class Hook:
    """A hook's three moments; each a no-op unless overridden."""

    def begin(self, start: int) -> None:
        """Before the first step of this process's run (`start`: the step resumed from)."""

    def after_step(self, end: StepEnd) -> None:
        """After every step, in the hooks' order."""

    def end(self, stop: str | None) -> None:
        """After the last step, or after the step that stopped the run (`stop`)."""


class StopOnSignal(Hook):
    """SIGTERM / SIGINT on any process stops every process after the same step
    (`request()`: a `train.stopping.StopAgreement`, asked after every step); the checkpoint
    hook then saves it."""

    def __init__(self, request: Callable[[], Any], say: Callable[[str], None]):
        self.request, self.say, self.at = request, say, None

    def after_step(self, end: StepEnd) -> None:
        if self.request().agreed(end.done):  # the same answer on every process
            end.stop, self.at = "signal", end.done

    def end(self, stop: str | None) -> None:
        if stop == "signal":
            name = self.request().signal_name
            self.say(f"stopped by {name} at step {self.at}; checkpoint saved")


class WriteMetrics(Hook):
    """The step's train scalars to the metrics writers every `every` steps."""

    def __init__(self, writer, every: int):
        self.writer, self.every = writer, every

    def after_step(self, end: StepEnd) -> None:
        if end.due(self.every):
            self.writer.write_scalars(end.done, end.scalars())


class Progress(Hook):
    """The console progress line (process 0), updated when metrics are written; `shown`:
    {label: scalar name}."""

    def __init__(self, make_bar: Callable[[int], Any], every: int, shown: dict[str, str]):
        self.make_bar, self.every, self.shown, self.bar = make_bar, every, shown, None

    def begin(self, start: int) -> None:
        self.bar = self.make_bar(start)

    def after_step(self, end: StepEnd) -> None:
        if end.due(self.every):
            scalars = end.scalars()
            self.bar.update(end.done, {k: scalars[v] for k, v in self.shown.items()})

    def end(self, stop: str | None) -> None:
        if stop != "signal":
            self.bar.close()


class Evaluate(Hook):
    """The held-out evaluation every `every` steps (and at step 0 with `at_start`):
    `evaluate()` with no batch being produced meanwhile (`paused()`; batches in flight stay
    queued, so an eval leaves the lag alone), recorded in `history['eval']` and the
    metrics; `after_eval(ev, step)` then applies the best-export and collapse rules. A
    greedy pass@1 at or above `stop_at` (> 0), or a collapse found at this step, stops the
    run ("target")."""

    def __init__(
        self,
        evaluate: Callable[[], dict[str, float]],
        every: int,
        *,
        at_start: bool,
        stop_at: float,
        history: dict[str, Any],
        writer,
        paused: Callable[[], Any],
        after_eval: Callable[[dict, int], None],
        say: Callable[[str], None],
    ):
        self.evaluate, self.every, self.at_start, self.stop_at = evaluate, every, at_start, stop_at
        self.history, self.writer, self.paused = history, writer, paused
        self.after_eval, self.say = after_eval, say

    def record(self, step: int) -> dict[str, float]:
        with self.paused():  # the evaluation's sampler may be the rollouts'
            ev = self.evaluate()
        self.history["eval"].append(dict(step=step, **ev))
        self.writer.write_scalars(step, ev)
        self.after_eval(ev, step)
        self.say(f"step {step}: " + fmt(ev))
        return ev

    def begin(self, start: int) -> None:
        if start == 0 and self.at_start:
            self.record(0)

    def after_step(self, end: StepEnd) -> None:
        if not end.due(self.every):
            return
        ev = self.record(end.done)
        if self.stop_at > 0 and ev["eval/pass@1_greedy"] >= self.stop_at and end.stop is None:
            self.history["target_reached_at"] = end.done
            self.say(f"pass@1 reached train.stop_at_pass1={self.stop_at}: done")
            end.stop = "target"
        if end.stop is None:  # the eval curve collapsed at this step
            end.stop = collapse.collapse_outcome(self.history, end.done)


def fmt(d: dict) -> str:
    """key=value pairs on one line (floats to 4 decimals)."""
    return "  ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items())


class Checkpoint(Hook):
    """`save()` every `every` steps, at the last step and whenever the run stops;
    `wait()` for the save in flight at the end."""

    def __init__(self, save: Callable[[], None], wait: Callable[[], None], every: int):
        self.save, self.wait, self.every = save, wait, every

    def after_step(self, end: StepEnd) -> None:
        if end.due(self.every) or end.stop:
            self.save()

    def end(self, stop: str | None) -> None:
        if stop != "signal":
            self.wait()


class Beats(Hook):
    """Parts that beat after every step (`after_step(step)`: the watchdog's deadline, the
    workdir lock's heartbeat); None entries (the lock on processes other than 0) skipped."""

    def __init__(self, *parts):
        self.parts = [p for p in parts if p is not None]

    def after_step(self, end: StepEnd) -> None:
        for part in self.parts:
            part.after_step(end.done)


class AtEnd(Hook):
    """`fn()` once the run has finished (not when a signal stopped it): the export."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn

    def end(self, stop: str | None) -> None:
        if stop != "signal":
            self.fn()


class BetweenSteps(Hook):
    """`fn(done)` after every step the run goes on from (a stage switch)."""

    def __init__(self, fn: Callable[[int], None]):
        self.fn = fn

    def after_step(self, end: StepEnd) -> None:
        if end.stop is None and not end.last:
            self.fn(end.done)
