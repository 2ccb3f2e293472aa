"""The environment contract, the environment registry, and loading user environments.

An environment is a text game played over several turns:

    reset(seed) -> observation                         str, the first message of the episode
    step(action) -> (observation, reward, done, info)  str, float, bool, dict

`action` is the text the policy produced in one turn (decoded, without the turn's stop
token). `reward` is the reward of that turn alone (an episode's return is their sum);
`done` ends the episode. The same seed and the same actions give the same episode, so the
G rollouts of one group start from the same state and differ only by what the policy does.

`info` keys every built-in environment fills (others may add their own):

    success  bool      the episode reached its goal (the outcome a success rate counts)
    state    hashable  the environment state after the step: steps from equal states are
                       compared by the turn-level baselines (`rl.step_credit`)
    invalid  bool      the action could not be parsed (the step changed nothing)

`state_key()` gives the current state the same way (the state before the next action).
Budgets (turns, tokens) are the batch's job (`envs.batch.EpisodeBatch`), not the
environment's.

Environments are entries of `ENVS` (`@ENVS.register("name")` on the class);
`make_env(name, **kwargs)` builds one. A user environment lives in any module: name it in
the config (`env.module`, a dotted name on sys.path or a .py file) and `load_env_module`
imports it, which registers it.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, ClassVar, Protocol, runtime_checkable

from jaxrl_frontier.core.registry import Registry, import_user_module

ENVS = Registry("environment", key="env.name")

StepResult = tuple[str, float, bool, dict[str, Any]]


@runtime_checkable
class Environment(Protocol):
    """What the rollout loop may call on an environment (see the module docstring)."""

    def reset(self, seed: int) -> str: ...

    def step(self, action: str) -> StepResult: ...

    def state_key(self) -> Hashable: ...


class TextEnv:
    """Optional base class: holds `name`, checks `step` is not called before `reset` or after
    the end. Subclasses implement `_reset(seed) -> str`, `_step(action) -> StepResult` and
    `state_key()`."""

    name: ClassVar[str] = ""

    def __init__(self) -> None:
        self._live = False

    def reset(self, seed: int) -> str:
        obs = self._reset(int(seed))
        self._live = True
        return obs

    def step(self, action: str) -> StepResult:
        if not self._live:
            raise RuntimeError(
                f"environment {self.name!r}: step() before reset() or after the episode ended"
            )
        obs, reward, done, info = self._step(str(action))
        if done:
            self._live = False
        return obs, float(reward), bool(done), info

    def state_key(self) -> Hashable:
        raise NotImplementedError

    def _reset(self, seed: int) -> str:
        raise NotImplementedError

    def _step(self, action: str) -> StepResult:
        raise NotImplementedError


def make_env(name: str, **kwargs: Any) -> Environment:
    """The environment registered as `name`, built from keyword arguments (`env.kwargs`)."""
    return ENVS.get(name)(**kwargs)


def load_env_module(module: str) -> None:
    """Import `module` (a dotted name on sys.path, or a path to a .py file) so the environments
    it registers (`@ENVS.register("name")`) can be named in the config (`env.module`, then
    `env.name`). Importing twice is a no-op (the module is cached in sys.modules)."""
    import_user_module(module, key="env.module")


def env_from_config(section: Any) -> Environment:
    """The environment an `env` config block names: `module` (imported first, so a user
    environment it registers can be named), `name`, `kwargs` (a mapping). Errors name the
    key: 'env.module' for an import, 'env.name' for an unknown name."""
    get = section.get if hasattr(section, "get") else lambda k, d=None: getattr(section, k, d)
    load_env_module(get("module", "") or "")
    name = get("name", "")
    kwargs = get("kwargs", None) or {}
    if hasattr(kwargs, "to_dict"):
        kwargs = kwargs.to_dict()
    cls = ENVS.get(name)
    return cls(**dict(kwargs))


def split_seeds(name: str, split: str, n: int, eval_fraction: float = 0.1, start: int = 0):
    """The first `n` seeds (counting from `start`) of environment `name` that belong to
    `split` ('train' or 'eval'): a seed is eval iff a stable hash of (name, seed) falls below
    `eval_fraction`, as task instances are split (`tasks.base`), so training never meets an
    evaluation episode, for any run seed."""
    from jaxrl_frontier.data.tasks.base import check_split, hash_unit

    check_split(split)
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"split_seeds: eval_fraction must be in (0, 1), got {eval_fraction}")
    out, seed = [], int(start)
    while len(out) < n:
        if (hash_unit(f"env|{name}|{seed}") < eval_fraction) == (split == "eval"):
            out.append(seed)
        seed += 1
    return out
