"""The producers' finishing step (rl/produce/advantages_and_metrics.py): GRPO advantages on the
loss tokens, the rollout's metrics and the per-prompt results, on a hand-made batch of two
prompts with two completions each."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.objectives.schema import objective_of
from jaxrl_frontier.rl.experience import Experience
from jaxrl_frontier.rl.produce.advantages_and_metrics import (
    advantages_and_metrics,
    correct_column,
    prompt_results,
)

NAMES = ("format", "correctness")
# rows 0-1: prompt 0 (one right, one wrong); rows 2-3: prompt 1 (both right: no signal)
REWARDS = np.array([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0], [0.5, 1.0]], np.float32)
LOSS_MASK = np.array([[0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 0, 0], [0, 1, 1, 1]], np.float32)


def _experience():
    b, t = LOSS_MASK.shape
    zeros = jnp.zeros((b, t), jnp.float32)
    return Experience(
        tokens=jnp.zeros((b, t), jnp.int32),
        attention_mask=jnp.ones((b, t), jnp.int32),
        loss_mask=jnp.asarray(LOSS_MASK),
        old_logp=-jnp.asarray(LOSS_MASK),  # -1 per completion token: entropy estimate 1
        advantages=zeros,
        rewards=jnp.asarray(REWARDS),
        prompt_index=jnp.asarray([0, 0, 1, 1]),
        group_id=jnp.asarray([0, 0, 1, 1]),
        policy_version=jnp.zeros((b,), jnp.int32),
        turn_index=jnp.zeros((b, t), jnp.int32),
    )


def test_correctness_is_found_by_name():
    assert correct_column(("format", "correctness")) == 1
    assert correct_column(("steps", "success")) == 1
    assert correct_column(("format",)) == 0  # none named: the first reward


def test_grpo_advantages_and_the_rollout_metrics_by_hand():
    objective = objective_of({"advantage": "grpo"})  # correctness reward alone
    adv, r, m = advantages_and_metrics(_experience(), objective, NAMES, 2)
    # group 0: rewards (1, 0), mean 1/2, unbiased std 1/sqrt(2): A = +-1/sqrt(2); group 1: 0
    a = 1 / np.sqrt(2)
    want = np.array([[a], [-a], [0.0], [0.0]]) * LOSS_MASK
    np.testing.assert_allclose(np.asarray(adv) * LOSS_MASK, want, atol=1e-5)
    np.testing.assert_allclose(np.asarray(r), [1.0, 0.0, 1.0, 1.0])
    assert float(m["reward/correctness"]) == pytest.approx(0.75)
    assert float(m["reward/format"]) == pytest.approx(2.5 / 4)
    assert float(m["reward/total"]) == pytest.approx(0.75)
    assert float(m["rollout/zero_variance_groups"]) == 1.0
    assert float(m["rollout/response_length"]) == pytest.approx((2 + 3 + 1 + 3) / 4)
    assert float(m["rollout/response_length_max"]) == 3.0
    assert float(m["rollout/tokens"]) == 9.0
    assert float(m["diag/entropy"]) == pytest.approx(1.0)
    assert float(m["diag/pass_rate"]) == pytest.approx(0.75)
    assert "diag/conflict_share" not in m and "opd/reverse_kl" not in m


def test_prompt_results_group_the_rows_of_each_prompt():
    examples = [{"index": 7}, {"index": 3}]
    out = prompt_results(
        examples, REWARDS, REWARDS[:, 1], LOSS_MASK.sum(1), ["a", "b", "c", "d"], NAMES
    )
    assert [p.index for p in out] == [7, 3]
    assert [p.correct for p in out] == [0.5, 1.0]
    assert out[1].texts == ("c", "d") and out[1].lengths.tolist() == [1.0, 3.0]
    np.testing.assert_array_equal(out[0].rewards, REWARDS[:2])
