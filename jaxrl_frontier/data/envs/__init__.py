"""Environments for multi-turn agents: the API, the registry, batches with budgets, and the
built-in environments (a scripted one for tests, a multi-agent frozen-lake grid world, a
calculator tool for word problems). Importing this package registers them."""

from jaxrl_frontier.data.envs import calculator, gridworld, scripted  # noqa: F401  (registers)
from jaxrl_frontier.data.envs.base import (
    ENVS,
    Environment,
    StepResult,
    TextEnv,
    env_from_config,
    load_env_module,
    make_env,
    split_seeds,
)
from jaxrl_frontier.data.envs.batch import CUT_REASONS, Episode, EpisodeBatch

__all__ = [
    "CUT_REASONS",
    "ENVS",
    "Environment",
    "Episode",
    "EpisodeBatch",
    "StepResult",
    "TextEnv",
    "env_from_config",
    "load_env_module",
    "make_env",
    "split_seeds",
]
