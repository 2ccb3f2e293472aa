"""A scripted environment: fixed per-turn rewards whatever the policy does.

For tests of everything around an environment (batches, budgets, rollout producers, credit):
turn k's reward is `rewards[k]`, the observation after it `observations[k]` (default
"obs k+1"), and the episode ends after `len(rewards)` turns, a success when `success`.
The actions received are kept in `actions` so a test can check which episode got which.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from jaxrl_frontier.data.envs.base import ENVS, StepResult, TextEnv


@ENVS.register("scripted")
class ScriptedEnv(TextEnv):
    """reset(seed) -> "start {seed}"; step k -> (observations[k], rewards[k], k == n-1, info).

    Args:
      rewards: the reward of each turn; the episode lasts len(rewards) turns.
      observations: the observation after each turn (default "obs 1", "obs 2", ...).
      success: info["success"] on the last turn.
    """

    name = "scripted"

    def __init__(
        self,
        rewards: Sequence[float] = (0.0, 0.0, 1.0),
        observations: Sequence[str] | None = None,
        success: bool = True,
    ):
        super().__init__()
        if not rewards:
            raise ValueError("scripted: rewards must hold at least one turn")
        if observations is not None and len(observations) != len(rewards):
            raise ValueError(
                f"scripted: {len(observations)} observations for {len(rewards)} rewards"
            )
        self.rewards = [float(r) for r in rewards]
        self.observations = (
            list(observations)
            if observations is not None
            else [f"obs {k + 1}" for k in range(len(rewards))]
        )
        self.success = bool(success)
        self.actions: list[str] = []
        self.seed = 0
        self.turn = 0

    def _reset(self, seed: int) -> str:
        self.seed, self.turn, self.actions = seed, 0, []
        return f"start {seed}"

    def _step(self, action: str) -> StepResult:
        k = self.turn
        self.actions.append(action)
        self.turn += 1
        done = self.turn == len(self.rewards)
        info = {"success": done and self.success, "state": self.state_key(), "invalid": False}
        return self.observations[k], self.rewards[k], done, info

    def state_key(self) -> Hashable:
        return (self.seed, self.turn)
