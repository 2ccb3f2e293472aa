"""Helpers the prompt sources share: JSON all-gathers over processes, a process's slice of a
global batch, a JSON-able random generator state, and the text a prompt is rolled out on."""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxrl_frontier.data.tasks.base import Example, Task


def _allgather_json(obj: Any) -> list[Any]:
    """Every process's `obj` (JSON-able), in process order (a collective: all processes call)."""
    import jax

    if jax.process_count() == 1:
        return [obj]
    import json

    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    n = multihost_utils.process_allgather(np.asarray([data.size], np.int64)).reshape(-1)
    buf = np.zeros(int(n.max()), np.uint8)
    buf[: data.size] = data
    every = multihost_utils.process_allgather(buf).reshape(len(n), -1)
    return [json.loads(bytes(every[i, : n[i]]).decode()) for i in range(len(n))]


def _sum_over_processes(x: float) -> float:
    return float(sum(_allgather_json(float(x))))


def _slice(items: list, process_index: int, process_count: int) -> list:
    per = len(items) // process_count
    return items[process_index * per : (process_index + 1) * per]


def _rng_state(rng: np.random.Generator) -> dict:
    return rng.bit_generator.state


def _rng_from(state: dict) -> np.random.Generator:
    bg = np.random.PCG64()
    bg.state = state
    return np.random.Generator(bg)


def prompt_text(task: Task, example: Example) -> str:
    """The prompt an example is rolled out on: `example['prompt']` when a source set one
    (ZPPO's BCQ / NCQ prompts), else the task's own."""
    return example.get("prompt") or task.prompt(example)
