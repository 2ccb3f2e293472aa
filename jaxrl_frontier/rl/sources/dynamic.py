"""DAPO dynamic sampling as a prompt source (`data.source = 'dynamic'`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_frontier.core.capabilities import Capabilities
from jaxrl_frontier.core.distributed import sum_over_processes
from jaxrl_frontier.data.tasks.base import Example, Task
from jaxrl_frontier.rl.experience import PromptResult
from jaxrl_frontier.rl.sources.base import (
    SOURCES,
    PromptSource,
    SourceOptions,
    UniformSource,
    uniform,
)


def signal_groups(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """bool [P]: the groups whose reward vectors are not all equal (rewards [P * G, K]).

    A group of equal rewards has zero group-relative advantage under every group baseline:
    it carries no policy-gradient signal.
    """
    r = np.asarray(rewards).reshape(-1, group_size, np.shape(rewards)[-1])
    return np.ptp(r, axis=1).max(axis=-1) > 0


class DynamicSource(PromptSource):
    """DAPO dynamic sampling ("DAPO: An Open-Source LLM Reinforcement Learning System at
    Scale"): groups whose rewards are all equal are dropped and fresh prompts drawn until the
    batch holds `prompt_batch` groups with signal, at most `max_draws` draws per step.

    The prompts come from the uniform stream. The source is also the producer's group
    selector (`select(draw, more)`): after the first draw it asks for more while any process
    lacks signal groups (a global count, so every process draws the same number of times),
    then keeps, per process, its first P_l signal groups in draw order, topped up with
    zero-signal groups only when the draw budget is spent. Shapes stay static: the
    Experience always has P groups. Metrics: `dynamic/draws` (this step),
    `dynamic/signal_groups` (found, all processes), `dynamic/filled_zero_signal` (groups
    without signal kept because the budget ran out) and `dynamic/draws_total`.
    """

    capabilities = Capabilities.all_but(
        partial_rows="it draws more prompts within a step",
        process_local="its draws agree across hosts",
        free_running="it reads the results as it draws",
        keeps_rows_in_flight="it draws more prompts within a step",
        environment="it draws task prompts, not an environment's episodes",
    )

    resizable = True  # its uniform stream's batches

    def __init__(self, fresh: UniformSource, *, max_draws: int, weights=None):
        if max_draws < 1:
            raise ValueError(f"config key 'data.dynamic.max_draws' must be >= 1, got {max_draws}")
        self.fresh, self.max_draws = fresh, int(max_draws)
        self.weights = None if weights is None else np.asarray(weights, np.float32)
        self.draws_total = 0

    def signal(self, draw) -> np.ndarray:
        """bool [P]: groups whose weighted sequence rewards sum_k w_k r_k are not all equal
        (all reward components when no weights are given)."""
        r = draw.rewards if self.weights is None else draw.rewards @ self.weights[:, None]
        return signal_groups(r, draw.rows.group_size)

    def next_batch(self) -> list[Example]:
        self.draws_total += 1
        return self.fresh.next_batch()

    def observe(self, results: Sequence[PromptResult]) -> None:
        del results  # the filter acts inside the step (select)

    def resize(self, batch_size: int) -> None:
        self.fresh.resize(batch_size)

    def select(self, draw, more):
        """(ScoredRows of the first draw's prompt count, metrics); see the class docstring."""
        p = len(draw.rows.examples)
        parts = [draw]
        found = int(self.signal(draw).sum())
        while len(parts) < self.max_draws and sum_over_processes(max(0, p - found)) > 0:
            parts.append(more(len(parts)))
            found += int(self.signal(parts[-1]).sum())
        every = type(draw).concat(parts) if len(parts) > 1 else draw
        signal = self.signal(every)
        order = np.concatenate([np.flatnonzero(signal), np.flatnonzero(~signal)])[:p]
        metrics = {
            "dynamic/draws": float(len(parts)),
            "dynamic/signal_groups": sum_over_processes(found),
            "dynamic/filled_zero_signal": sum_over_processes(max(0, p - found)),
            "dynamic/draws_total": float(self.draws_total),
        }
        return every.take_groups(np.sort(order)), metrics

    def state(self) -> dict[str, Any]:
        return {"fresh": self.fresh.state(), "draws_total": self.draws_total}

    def restore(self, state: dict[str, Any]) -> None:
        self.fresh.restore(state["fresh"])
        self.draws_total = int(state["draws_total"])


@SOURCES.register("dynamic", part=DynamicSource)
def dynamic(
    task: Task, options: SourceOptions, *, batch_size: int, process_index: int, process_count: int
):
    """`data.source = 'dynamic'`: DAPO dynamic sampling (`data.dynamic.max_draws`); signal is
    judged on the weighted reward the advantages use (`options.reward_weights`: the
    effective `objective.reward_weights`, with the rollout shapers' components)."""
    fresh = uniform(
        task,
        options,
        batch_size=batch_size,
        process_index=process_index,
        process_count=process_count,
    )
    w = dict(options.reward_weights)
    names = list(task.reward_names) + list(options.shaped)
    vector = [w.get(n, 0.0) for n in names] if w else [float(n == "correctness") for n in names]
    return DynamicSource(fresh, max_draws=options.dynamic.max_draws, weights=vector)
