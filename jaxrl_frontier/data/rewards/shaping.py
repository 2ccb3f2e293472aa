"""Reward shaping, as the config sees it: which reward components the configured shapers
append after the task's, and the weights the sequence reward gives them."""

from __future__ import annotations

from collections.abc import Sequence

from jaxrl_frontier.data.rewards import judge, reward_model

# the learned reward terms, by the config section that turns each on, in the order they
# are appended: a reward model's score, then a judge's
LEARNED_REWARDS = (reward_model.REWARD_NAME, judge.REWARD_NAME)

# the reward components each shaper adds, by the config that turns it on (for config checks)
SHAPER_REWARDS = {"dre": ("dre",), "overlong": ("overlong",)}


def shaper_reward_names(editors, overlong_cache: int, learned: Sequence[str] = ()) -> list[str]:
    """The reward components the configured shapers append (after the task's):
    `rollout.editors` (names), `rollout.overlong_cache`, then the learned terms in `learned`
    (LEARNED_REWARDS names: a reward model's, a judge's)."""
    names = [n for e in dict.fromkeys(editors) for n in SHAPER_REWARDS.get(e, ())]
    names += list(SHAPER_REWARDS["overlong"]) if overlong_cache else []
    return names + [n for n in LEARNED_REWARDS if n in learned]


def effective_reward_weights(reward_weights, shaped: list[str]) -> dict[str, float]:
    """The weights the advantages use: `objective.reward_weights`, or when that is empty the
    correctness reward and every shaped component (`shaped`) at weight 1."""
    if reward_weights:
        return {k: float(v) for k, v in dict(reward_weights).items()}
    return {"correctness": 1.0, **dict.fromkeys(shaped, 1.0)} if shaped else {}
