"""One rollout's production as a record: what a batch is sampled with, fixed when it is set up.

    production = Production(producer, weights, version, sampling, source)
    job, finish = production.job(key)
    experience, info = finish(job(examples))

A rollout produced ahead of the learner (rl/ahead.py) keeps its own `Production` (the
weights and the version of when it started, the sampling values of its step) while the
learner moves on. With a process-local producer (asynchronous rollouts on several
processes, `RolloutProducer.local`), `job` is the producer's `draw` (a background thread may
run it on every host) and `finish` its `finish` (collectives: the main loop runs it);
otherwise `job` is the whole `produce` and `finish` hands its result on.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

Job = Callable[[Sequence[Any]], Any]  # examples -> the job's result
Finish = Callable[[Any], tuple[Any, dict[str, Any]]]  # the job's result -> (Experience, info)


@dataclasses.dataclass(frozen=True)
class Production:
    """producer: a RolloutProducer or an environment's producer; weights: role -> params
    ('policy' samples; 'reference', 'teacher' for the log-prob passes); version: the
    policy's version those weights are; sampling: {SamplingParams field: value} of the moving
    rollout keys at the batch's step ({}: none move), reported in info['knobs']; source: the
    PromptSource a dynamic producer draws more prompts from."""

    producer: Any
    weights: dict[str, Any]
    version: int
    sampling: dict[str, float]
    source: Any = None

    def job(self, key) -> tuple[Job, Finish]:
        """(job(examples), finish(job's result) -> (Experience, info)) sampling with `key`."""
        if self.producer.local:
            return functools.partial(self._draw, key), self._finish
        return functools.partial(self._produce, key), _handed_on

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = dict(version=self.version, source=self.source)
        if self.sampling:
            options["sampling"] = self.sampling
        return options

    def _draw(self, key, examples):
        return self.producer.draw(examples, self.weights, key, **self._options())

    def _finish(self, drawn) -> tuple[Any, dict[str, Any]]:
        return self._with_knobs(self.producer.finish(drawn, self.weights))

    def _produce(self, key, examples) -> tuple[Any, dict[str, Any]]:
        return self._with_knobs(
            self.producer.produce(examples, self.weights, key, **self._options())
        )

    def _with_knobs(self, out) -> tuple[Any, dict[str, Any]]:
        experience, info = out
        return experience, {**info, "knobs": self.sampling}


def _handed_on(out):
    return out
