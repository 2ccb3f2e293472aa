"""A batch of episodes stepped together, each with a turn budget and a token budget.

The rollout loop holds one `EpisodeBatch` of N environments (N = prompts x group size):
`reset(seeds)` starts every episode, then each turn it samples an action for every live
episode and calls `step(actions)` with None for the finished ones. Episodes are independent:
each has its own environment object, RNG and counters, and a finished episode is never
stepped again.

Budgets, per episode:
  max_turns   the episode is cut once it has taken this many turns without ending;
  max_tokens  tokens spent so far = the first observation + every action + every later
              observation (as the policy's context holds them); the episode is cut once it
              reaches the budget (no room left for another turn). 0 = no token budget.
A cut episode is `done` with `cut` = "turns" or "tokens" (`truncated` True): its return is
the rewards it received, and a learner may mask it or bootstrap its value (`rl.critic.gae`'s
`last_value`) rather than read its end as a failure.

Token counts: `count_tokens(text)` counts observations (the producer passes the length of
the observation as it will be appended, chat markup included); actions are counted with
`action_tokens` when given (the exact sampled count), else with `count_tokens`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from jaxrl_frontier.data.envs.base import Environment, make_env

CUT_REASONS = ("turns", "tokens")


@dataclasses.dataclass
class Episode:
    """One episode's record.

    observations[0] is reset's, observations[k + 1] follows action k; states[k] is the
    environment state before action k (states[-1] the last state); rewards[k] and infos[k]
    are turn k's.
    """

    seed: int
    group: int
    observations: list[str] = dataclasses.field(default_factory=list)
    actions: list[str] = dataclasses.field(default_factory=list)
    rewards: list[float] = dataclasses.field(default_factory=list)
    infos: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    states: list[Hashable] = dataclasses.field(default_factory=list)
    tokens: int = 0
    done: bool = False
    cut: str | None = None  # None | "turns" | "tokens"

    @property
    def turns(self) -> int:
        return len(self.actions)

    @property
    def truncated(self) -> bool:
        return self.cut is not None

    @property
    def episode_return(self) -> float:
        return float(sum(self.rewards))

    @property
    def success(self) -> bool:
        return bool(self.infos and self.infos[-1].get("success", False))


class EpisodeBatch:
    """N independent episodes with per-episode turn and token budgets (module docstring).

    Args:
      envs: N environment objects (distinct objects: an episode owns its environment).
      max_turns: turn budget per episode (>= 1).
      max_tokens: token budget per episode; 0 = none.
      count_tokens: text -> token count (default `len`: one token per character, as the
        character tokenizer).
    """

    def __init__(
        self,
        envs: Sequence[Environment],
        *,
        max_turns: int,
        max_tokens: int = 0,
        count_tokens: Callable[[str], int] = len,
    ):
        if not envs:
            raise ValueError("EpisodeBatch: no environments")
        if len({id(e) for e in envs}) != len(envs):
            raise ValueError("EpisodeBatch: the same environment object appears twice")
        if max_turns < 1:
            raise ValueError(f"EpisodeBatch: max_turns must be >= 1, got {max_turns}")
        if max_tokens < 0:
            raise ValueError(f"EpisodeBatch: max_tokens must be >= 0, got {max_tokens}")
        self.envs = list(envs)
        self.max_turns = int(max_turns)
        self.max_tokens = int(max_tokens)
        self.count_tokens = count_tokens
        self.episodes: list[Episode] = []

    @classmethod
    def make(cls, name: str, n: int, env_kwargs: dict | None = None, **budgets) -> EpisodeBatch:
        """n fresh environments `make_env(name, **env_kwargs)` in one batch."""
        return cls([make_env(name, **(env_kwargs or {})) for _ in range(n)], **budgets)

    def __len__(self) -> int:
        return len(self.envs)

    def reset(self, seeds: Sequence[int], groups: Sequence[int] | None = None) -> list[str]:
        """Start every episode; `seeds[i]` for environment i. `groups[i]` (default: the rank of
        the seed among the distinct seeds) names the episodes started from the same state.
        Returns the N first observations."""
        if len(seeds) != len(self.envs):
            raise ValueError(f"EpisodeBatch.reset: {len(seeds)} seeds for {len(self.envs)} envs")
        if groups is None:
            rank = {s: i for i, s in enumerate(dict.fromkeys(int(s) for s in seeds))}
            groups = [rank[int(s)] for s in seeds]
        self.episodes = []
        observations = []
        for env, seed, group in zip(self.envs, seeds, groups):
            obs = env.reset(int(seed))
            ep = Episode(seed=int(seed), group=int(group), observations=[obs])
            ep.states.append(env.state_key())
            ep.tokens = self.count_tokens(obs)
            if self.max_tokens and ep.tokens >= self.max_tokens:
                ep.done, ep.cut = True, "tokens"
            self.episodes.append(ep)
            observations.append(obs)
        return observations

    @property
    def live(self) -> np.ndarray:
        """bool [N]: episodes still running."""
        return np.asarray([not ep.done for ep in self.episodes], bool)

    @property
    def all_done(self) -> bool:
        return bool(self.episodes) and not self.live.any()

    def remaining_tokens(self, i: int) -> int | None:
        """Tokens episode i may still spend (None without a token budget): the producer's cap
        on the next turn's length."""
        return None if not self.max_tokens else max(self.max_tokens - self.episodes[i].tokens, 0)

    def step(
        self,
        actions: Sequence[str | None],
        action_tokens: Sequence[int | None] | None = None,
    ) -> list[tuple[str, float, bool, dict[str, Any]] | None]:
        """Step every live episode with its action (None for the finished ones, which are not
        stepped). Returns, per episode, (observation, reward, done, info) or None; `done` is
        also True for an episode cut by a budget now (`info["cut"]` says which)."""
        if not self.episodes:
            raise RuntimeError("EpisodeBatch.step before reset")
        if len(actions) != len(self.envs):
            raise ValueError(f"EpisodeBatch.step: {len(actions)} actions for {len(self.envs)}")
        out: list[tuple[str, float, bool, dict[str, Any]] | None] = []
        for i, (env, ep, action) in enumerate(zip(self.envs, self.episodes, actions)):
            if ep.done:
                if action is not None:
                    raise ValueError(f"EpisodeBatch.step: episode {i} has ended; pass None")
                out.append(None)
                continue
            if action is None:
                raise ValueError(f"EpisodeBatch.step: episode {i} is live and got no action")
            obs, reward, done, info = env.step(action)
            info = dict(info)
            n_act = action_tokens[i] if action_tokens is not None else None
            ep.tokens += self.count_tokens(action) if n_act is None else int(n_act)
            ep.actions.append(action)
            ep.rewards.append(float(reward))
            ep.states.append(env.state_key())
            if not done:
                ep.tokens += self.count_tokens(obs)
                if ep.turns >= self.max_turns:
                    ep.cut = "turns"
                elif self.max_tokens and ep.tokens >= self.max_tokens:
                    ep.cut = "tokens"
            info["cut"] = ep.cut
            ep.infos.append(info)
            ep.observations.append(obs)
            ep.done = bool(done) or ep.cut is not None
            out.append((obs, float(reward), ep.done, info))
        return out

    # -------------------------------------------------------------- summaries

    def returns(self) -> np.ndarray:
        """float32 [N]: each episode's summed reward."""
        return np.asarray([ep.episode_return for ep in self.episodes], np.float32)

    def successes(self) -> np.ndarray:
        """bool [N]: episodes that reached their goal."""
        return np.asarray([ep.success for ep in self.episodes], bool)

    def cut(self) -> np.ndarray:
        """bool [N]: episodes cut by a budget."""
        return np.asarray([ep.truncated for ep in self.episodes], bool)

    def turn_rewards(self) -> np.ndarray:
        """float32 [N, max_turns]: reward of each turn, 0 after an episode's end."""
        r = np.zeros((len(self.episodes), self.max_turns), np.float32)
        for i, ep in enumerate(self.episodes):
            r[i, : ep.turns] = ep.rewards
        return r
