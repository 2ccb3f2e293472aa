"""data/rewards/shaping.py: the reward components the configured shapers append, and the
weights the advantages use when none are configured."""

from jaxrl_frontier.data.rewards.shaping import effective_reward_weights, shaper_reward_names


def test_shaper_reward_names_in_editor_order_once_each():
    assert shaper_reward_names([], 0) == []
    assert shaper_reward_names(["mask_truncated", "dre", "dre"], 0) == ["dre"]
    assert shaper_reward_names(["dre"], 8) == ["dre", "overlong"]
    assert shaper_reward_names(("mask_truncated",), 4) == ["overlong"]  # rollout.overlong_cache


def test_effective_weights_are_the_configured_ones_else_correctness_and_the_shaped():
    assert effective_reward_weights({"correctness": 1, "format": 0.5}, ["dre"]) == {
        "correctness": 1.0,
        "format": 0.5,
    }
    assert effective_reward_weights({}, ["dre", "overlong"]) == {
        "correctness": 1.0,
        "dre": 1.0,
        "overlong": 1.0,
    }
    assert effective_reward_weights({}, []) == {}  # the task's own default weighting
