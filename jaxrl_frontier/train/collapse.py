"""What the loop does after an eval (`after_eval`): track the best value of
`train.collapse.metric`, export the best policy (`train.export = 'best'`), and stop on the
rise-and-collapse of "Self-Improvement Can Self-Regress: The Rise-and-Collapse Failure Mode of
LLM Self-Training" (`train.collapse.*`), its early-stop rule (ES): stop at a collapse, roll
forward the peak checkpoint, next budget = peak step + 3.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_frontier.core.records import key


@dataclasses.dataclass(frozen=True)
class CollapseDetector:
    """Rise-then-collapse on an eval curve [(step, value), ...].

    Fires at the latest point when the curve rose (peak - first >= rise) and its last
    `patience` values all lie at least `drop` below the peak (after it). A monotone curve
    never falls below its peak; a flat curve whose noise stays under `rise` never rises.
    """

    rise: float = 0.05
    drop: float = 0.05
    patience: int = 2

    def check(self, curve: Sequence[tuple[int, float]]) -> dict[str, Any] | None:
        """None, or {collapse_at, peak_step, peak, next_budget = peak_step + 3}."""
        if len(curve) < 2:
            return None
        steps = [int(s) for s, _ in curve]
        values = np.asarray([float(v) for _, v in curve])
        i = int(np.argmax(values))  # the first peak
        tail = values[i + 1 :][-self.patience :]
        rose = values[i] - values[0] >= self.rise
        fell = len(tail) >= self.patience and bool(np.all(tail <= values[i] - self.drop))
        if not (rose and fell):
            return None
        return dict(
            collapse_at=steps[-1],
            peak_step=steps[i],
            peak=float(values[i]),
            next_budget=steps[i] + 3,
        )


@dataclasses.dataclass(frozen=True)
class CollapseSection:
    """`train.collapse`: the rise-and-collapse early stop (rl/diagnostics.py) on the eval
    curve of `metric`, and the metric whose best eval `train.export = 'best'` exports."""

    stop: bool = key(False, "stop the run on a rise and collapse")
    metric: str = key("eval/pass@1_greedy", "the eval metric watched")
    rise: float = key(0.05, "a rise: the peak at least this above the first eval")
    drop: float = key(0.05, "a collapse: the last evals at least this below the peak")
    patience: int = key(2, "the last evals that must lie below the peak")


@dataclasses.dataclass(frozen=True)
class PeakOptions:
    """What the loop does after an eval (`train.export`, `train.collapse`): export the best
    policy ('best') or the last ('last'), and stop on a rise and collapse."""

    export: str
    collapse: CollapseSection


def after_eval(
    history: dict[str, Any], ev: dict[str, float], step: int, options: PeakOptions, export, say
):
    """The loop's decisions after an eval at `step` (history['eval'] already holds it).

    Tracks history['best'] = {step, value} of `train.collapse.metric`; under
    `train.export = 'best'` calls export() at each new best, so the export is the peak
    policy. Under `train.collapse.stop`, runs the `CollapseDetector` on the eval curve and on
    a collapse records history['collapse'] = {collapse_at, peak_step, peak, next_budget}:
    the run stops (`collapse_outcome`), its export is the peak (rolled forward to the next
    campaign), whose budget is peak_step + 3.
    """
    t, export_best = options.collapse, options.export == "best"
    key = t.metric
    if key not in ev:
        if export_best or t.stop:
            raise KeyError(
                f"config key 'train.collapse.metric' = {key!r} is not an eval metric; the "
                f"eval's: {', '.join(sorted(ev))}"
            )
        return
    value = float(ev[key])
    best = history.get("best")
    if best is None or value > best["value"]:
        history["best"] = dict(step=int(step), value=value)
        if export_best:
            export()
    if t.stop and "collapse" not in history:
        det = CollapseDetector(t.rise, t.drop, t.patience)
        found = det.check([(e["step"], e[key]) for e in history["eval"] if key in e])
        if found is not None:
            history["collapse"] = found
            say(
                f"collapse: {key} peaked at {found['peak']:.4f} (step {found['peak_step']}) and "
                f"fell; stopping, the export is the peak, next budget {found['next_budget']}"
            )


def collapse_outcome(history: dict[str, Any], step: int) -> str | None:
    """ "target" (stop, as at a reached target) when the collapse was found at `step`."""
    return "target" if history.get("collapse", {}).get("collapse_at") == step else None


def finished(history: dict[str, Any]) -> bool:
    """A run whose history says it is done (target reached, or collapsed) trains no further."""
    return "target_reached_at" in history or "collapse" in history
