"""Reward shaping, as the config sees it: which reward components the configured shapers
append after the task's, and the weights the sequence reward gives them."""

from __future__ import annotations

from jaxrl_frontier.data.rewards.reward_model import REWARD_NAME

# the reward components each shaper adds, by the config that turns it on (for config checks)
SHAPER_REWARDS = {"dre": ("dre",), "overlong": ("overlong",)}


def shaper_reward_names(editors, overlong_cache: int, reward_model: bool = False) -> list[str]:
    """The reward components the configured shapers append (after the task's):
    `rollout.editors` (names), `rollout.overlong_cache`, then a reward model's
    (`reward_model.init`: data/rewards/reward_model.py)."""
    names = [n for e in dict.fromkeys(editors) for n in SHAPER_REWARDS.get(e, ())]
    names += list(SHAPER_REWARDS["overlong"]) if overlong_cache else []
    return names + ([REWARD_NAME] if reward_model else [])


def effective_reward_weights(reward_weights, shaped: list[str]) -> dict[str, float]:
    """The weights the advantages use: `objective.reward_weights`, or when that is empty the
    correctness reward and every shaped component (`shaped`) at weight 1."""
    if reward_weights:
        return {k: float(v) for k, v in dict(reward_weights).items()}
    return {"correctness": 1.0, **dict.fromkeys(shaped, 1.0)} if shaped else {}
