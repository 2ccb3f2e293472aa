"""Scoring completions with a task's reward function, safely.

A reward function is Python run on untrusted model output: one that raises (a checker bug, a
pathological completion) must not kill a multi-hour run. Here a raising or malformed reward
scores 0 on every component for that completion, is counted in `n_failed` (log it as a
metric), and the step goes on. The first failure is logged with its exception.

`RewardScorer` is the interface the trainer calls. `InProcessScorer` runs the task's reward
in this process (checkers of final answers: no model-written code runs). `SandboxedScorer`
runs each completion as a program in a locked-down subprocess (`data/rewards/sandbox.py`) for tasks whose
reward executes model-written code (`data/tasks/code.py`). `make_scorer` picks one from
`rewards.scorer` ('auto': the task's `scorer` attribute). Each keeps `first_failure`, the
first error of the run in one line, for the stop rule `rewards.max_failure_steps`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from jaxrl_frontier.core import records
from jaxrl_frontier.core.records import key
from jaxrl_frontier.data.tasks.base import Example, Task
from jaxrl_frontier.data.tasks.pipeline import unbatch

log = logging.getLogger(__name__)


class RewardScorer(Protocol):
    """Scores completions: (examples, completions) -> (rewards float32 [N, K], n_failed)."""

    reward_names: tuple[str, ...]

    def __call__(
        self, examples: Sequence[Example] | Mapping[str, Any], completions: Sequence[str]
    ) -> tuple[np.ndarray, int]: ...

    def close(self) -> None:
        """End the scorer's workers, if it has any."""


def _align(
    examples: Sequence[Example] | Mapping[str, Any], completions: Sequence[str]
) -> list[Example]:
    """One example per completion.

    Accepts a list of examples or a pipeline batch (dict of lists). With P examples and P*G
    completions, each example is repeated G times: rows are prompt-major, rows p*G..p*G+G-1
    are the G completions of prompt p (the rollout layout).
    """
    if isinstance(examples, Mapping):
        examples = unbatch(examples)
    p, n = len(examples), len(completions)
    if p == 0 or n % p:
        raise ValueError(
            f"score_completions: {n} completions for {p} examples; need N = P * G (prompt-major)"
        )
    g = n // p
    return [ex for ex in examples for _ in range(g)]


def _score_one(task: Task, example: Example, completion: str) -> list[float]:
    """The reward vector in `task.reward_names` order; raises if the reward is malformed."""
    out = task.reward(example, completion)
    if set(out) != set(task.reward_names):
        raise ValueError(
            f"{type(task).__name__}.reward returned keys {sorted(out)}, "
            f"expected {list(task.reward_names)}"
        )
    values = [float(out[k]) for k in task.reward_names]
    bad = [k for k, v in zip(task.reward_names, values, strict=True) if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{type(task).__name__}.reward returned non-finite {bad}")
    return values


def score_completions(
    task: Task,
    examples: Sequence[Example] | Mapping[str, Any],
    completions: Sequence[str],
    *,
    warn: bool = True,
) -> tuple[np.ndarray, int]:
    """Rewards float32 [N, K] (columns in `task.reward_names` order) and the failure count.

    N = len(completions); `examples` has N or N / G entries (see `_align`). A completion whose
    reward raises or returns wrong keys / non-finite values gets 0.0 on every component and is
    counted in `n_failed`; with `warn`, the first such failure of this call is logged.
    """
    rewards, n_failed, _ = _score_all(task, examples, completions, warn=warn)
    return rewards, n_failed


def _score_all(task, examples, completions, *, warn: bool, score_one=None):
    """(rewards [N, K], n_failed, the first exception or None); see `score_completions`."""
    score_one = score_one or _score_one
    rows = _align(examples, completions)
    k = len(task.reward_names)
    rewards = np.zeros((len(completions), k), dtype=np.float32)
    n_failed, first = 0, None
    for i, (ex, completion) in enumerate(zip(rows, completions, strict=True)):
        try:
            rewards[i] = score_one(task, ex, completion)
        except Exception as e:  # any checker failure is contained, by design
            first = first or e
            if n_failed == 0 and warn:
                log.warning(
                    "reward of task %r raised on completion %d (%r...): %r; scoring it 0 and "
                    "counting failures (later ones are not logged)",
                    getattr(task, "name", type(task).__name__),
                    i,
                    completion[:80],
                    e,
                    exc_info=e,
                )
            n_failed += 1
    return rewards, n_failed, first


class InProcessScorer:
    """`RewardScorer` running the task's reward in this process, with failures contained.

    Logs the first failure over its lifetime (a persistently broken checker would otherwise
    flood the log every step); the per-call `n_failed` is what belongs in the metrics.
    Share one scorer between training and evaluation so that holds over the whole run.
    """

    def __init__(self, task: Task):
        self.task = task
        self.reward_names = tuple(task.reward_names)
        self.first_failure: str | None = None  # "ExcType: message" of the run's first failure

    def __call__(
        self, examples: Sequence[Example] | Mapping[str, Any], completions: Sequence[str]
    ) -> tuple[np.ndarray, int]:
        rewards, n_failed, first = _score_all(
            self.task, examples, completions, warn=self.first_failure is None
        )
        if first is not None and self.first_failure is None:
            self.first_failure = f"{type(first).__name__}: {first}"
        return rewards, n_failed

    def close(self) -> None:
        """Nothing to end: the reward ran in this process."""


SCORERS = ("auto", "in_process", "sandboxed")


@dataclasses.dataclass(frozen=True)
class RewardOptions:
    """`rewards`: how completions are scored: in process or sandboxed (each completion run
    as a program in a locked-down subprocess: data/rewards/sandbox.py), the sandbox's
    workers and per-completion limits, and when failing rewards stop a run (a reward that
    fails on every completion for max_failure_steps steps in a row; train/guards.py)."""

    scorer: str = key("auto", "auto (the task's choice) | in_process | sandboxed", choices=SCORERS)
    max_failure_steps: int = key(
        3, "steps in a row a reward may fail everywhere (0: never stop)", low=0
    )
    workers: int = key(4, "completions run in parallel", low=0, low_open=True)
    cpu_seconds: float = key(2.0, "a completion's CPU time", low=0, low_open=True)
    wall_seconds: float = key(5.0, "a completion's wall time", low=0, low_open=True)
    memory_mb: int = key(512, "a completion's memory", low=0, low_open=True)
    max_output_bytes: int = key(65536, "a completion's output kept", low=0, low_open=True)

    def __post_init__(self):
        if self.scorer not in SCORERS:
            import difflib

            from jaxrl_frontier.core.errors import ConfigError

            close = difflib.get_close_matches(str(self.scorer), SCORERS, n=1)
            raise ConfigError(
                f"config key 'rewards.scorer' = {self.scorer!r}; allowed: {', '.join(SCORERS)}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
            )
        records.check(self, "rewards")


def make_scorer(options: RewardOptions, task: Task) -> RewardScorer:
    """The scorer `rewards.scorer` names; 'auto' takes the task's `scorer` attribute
    ('in_process' unless the task runs model-written code)."""
    kind = options.scorer
    if kind == "auto":
        kind = getattr(task, "scorer", "in_process")
    if kind == "in_process":
        if getattr(task, "scorer", "in_process") == "sandboxed":
            raise ValueError(
                f"config key 'rewards.scorer' = 'in_process', but task "
                f"{getattr(task, 'name', '')!r} runs model-written code; allowed: 'sandboxed', "
                "'auto'"
            )
        return InProcessScorer(task)
    if kind == "sandboxed":
        from jaxrl_frontier.data.rewards.sandbox import Limits

        r = options
        limits = Limits(
            cpu_s=r.cpu_seconds,
            wall_s=r.wall_seconds,
            memory_mb=r.memory_mb,
            output_bytes=r.max_output_bytes,
        )
        return SandboxedScorer(task, workers=r.workers, limits=limits)
    raise ValueError(f"config key 'rewards.scorer' = {kind!r}; allowed: {', '.join(SCORERS)}")


class SandboxedScorer:
    """`RewardScorer` for tasks whose reward runs model-written code: each completion's
    program (`task.program(example, completion)`) runs in a fresh sandboxed subprocess
    (`sandbox.Sandbox`: no network, its own root with a fresh directory, an empty environment,
    CPU / wall / memory / output / process limits), `workers` at a time, and
    `task.score(example, completion, result)` turns the result into rewards here.

    A program that loops, forks, allocates, floods its output, reads outside its directory,
    opens a socket or signals its parent only ends its own process: its completion scores 0
    (a fair 0, not a failure). `n_failed` counts completions whose scoring itself broke (the
    sandbox could not start, `task.score` raised). Each completion has its own process, so a
    dead one costs nothing but its own score; the thread pool itself runs no model code.
    """

    def __init__(self, task: Task, *, workers: int = 4, limits=None):
        from concurrent.futures import ThreadPoolExecutor

        from jaxrl_frontier.data.rewards.sandbox import Limits, Sandbox

        for method in ("program", "score"):
            if not callable(getattr(task, method, None)):
                raise ValueError(
                    f"rewards.scorer='sandboxed' needs a task with {method}(); "
                    f"{type(task).__name__} has none (see data/tasks/code.py)"
                )
        self.task = task
        self.reward_names = tuple(task.reward_names)
        self.first_failure: str | None = None
        self.sandbox = Sandbox(limits or Limits())
        self.workers = workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="sandbox")
        self.last_results: list = []  # the latest call's SandboxResults (metrics, tests)
        if self.sandbox.isolation != "namespaces":
            log.warning(
                "sandboxed scorer: no Linux namespaces here (unshare missing or refused); "
                "programs run with rlimits and a Python guard only, which is not a security "
                "boundary (docs/reliability.md)"
            )

    def _one(self, slot_and_row):
        slot, ex, completion = slot_and_row
        result = self.sandbox.run(self.task.program(ex, completion), slot=slot)
        if result.status == "sandbox_error":
            raise RuntimeError(f"the sandbox failed to start: {result.output}")
        return result, _score_one(_Scored(self.task, result), ex, completion)

    def __call__(
        self, examples: Sequence[Example] | Mapping[str, Any], completions: Sequence[str]
    ) -> tuple[np.ndarray, int]:
        rows = _align(examples, completions)
        jobs = [(i % self.workers, ex, c) for i, (ex, c) in enumerate(zip(rows, completions))]
        futures = [self._pool.submit(self._one, job) for job in jobs]
        rewards = np.zeros((len(completions), len(self.reward_names)), dtype=np.float32)
        n_failed, results = 0, []
        for i, fut in enumerate(futures):
            try:
                result, rewards[i] = fut.result()
                results.append(result)
            except Exception as e:  # scoring broke (not the program): 0, counted
                results.append(None)
                if self.first_failure is None:
                    self.first_failure = f"{type(e).__name__}: {e}"
                    log.warning(
                        "sandboxed reward of task %r failed on completion %d: %r; scoring it 0 "
                        "and counting failures (later ones are not logged)",
                        getattr(self.task, "name", type(self.task).__name__),
                        i,
                        e,
                        exc_info=e,
                    )
                n_failed += 1
        self.last_results = results
        return rewards, n_failed

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class _Scored:
    """`task.reward` replaced by `task.score` on a known sandbox result (for `_score_one`'s
    key and finiteness checks)."""

    def __init__(self, task, result):
        self._task, self._result = task, result
        self.reward_names = task.reward_names

    def reward(self, example, completion):
        return self._task.score(example, completion, self._result)
