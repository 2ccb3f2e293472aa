"""Helpers the prompt sources share: a process's slice of a global batch, a JSON-able random generator state, and the text a prompt is rolled out on."""

from __future__ import annotations

import numpy as np

from jaxrl_frontier.data.tasks.base import Example, Task


def process_slice(items: list, process_index: int, process_count: int) -> list:
    per = len(items) // process_count
    return items[process_index * per : (process_index + 1) * per]


def rng_state(rng: np.random.Generator) -> dict:
    return rng.bit_generator.state


def rng_from(state: dict) -> np.random.Generator:
    bg = np.random.PCG64()
    bg.state = state
    return np.random.Generator(bg)


def prompt_text(task: Task, example: Example) -> str:
    """The prompt an example is rolled out on: `example['prompt']` when a source set one
    (ZPPO's BCQ / NCQ prompts), else the task's own."""
    return example.get("prompt") or task.prompt(example)
