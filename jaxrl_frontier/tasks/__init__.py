"""Tasks: prompts, demonstrations and named reward vectors; one file per task.

`TASKS` maps a config name to a task class; build one with `make_task(name, **kwargs)`.
Importing this package registers every task below.
"""

from jaxrl_frontier.tasks import arithmetic, countdown, jsonl_math  # noqa: F401  (registers)
from jaxrl_frontier.tasks.base import (
    REWARD_NAMES,
    SPLITS,
    TASKS,
    Example,
    SyntheticTask,
    Task,
    length_score,
)
from jaxrl_frontier.tasks.pipeline import eval_examples, make_prompt_iterator, unbatch


def make_task(name: str, **kwargs) -> Task:
    """The task registered as `name`, built from keyword arguments (e.g. a config's task block)."""
    return TASKS.get(name)(**kwargs)


__all__ = [
    "REWARD_NAMES",
    "SPLITS",
    "TASKS",
    "Example",
    "SyntheticTask",
    "Task",
    "eval_examples",
    "length_score",
    "make_prompt_iterator",
    "make_task",
    "unbatch",
]
