"""Safe reward scoring: vector layout, group alignment, failures zeroed and counted."""

import logging

import numpy as np
import pytest

from jaxrl_frontier.data.rewards.scorer import InProcessScorer, score_completions
from jaxrl_frontier.data.tasks import REWARD_NAMES, make_prompt_iterator, make_task
from jaxrl_frontier.data.tasks.base import Task


class Flaky(Task):
    """Raises on completions containing 'boom'; wrong keys on 'keys'; NaN on 'nan'."""

    name = "flaky"

    def reward(self, example, completion):
        if "boom" in completion:
            raise RuntimeError("checker exploded")
        if "keys" in completion:
            return {"correctness": 1.0}
        if "nan" in completion:
            return {"correctness": float("nan"), "format": 1.0, "length": 0.5}
        return {"length": 0.25, "correctness": 1.0, "format": 0.5}  # order-independent


def test_scores_in_reward_names_order():
    task = make_task("arithmetic")
    ex = {"a": 2, "b": 3, "op": "*", "answer": 6, "index": 0}
    rewards, n_failed = score_completions(task, [ex, ex, ex], ["6", "7", "six"])
    assert rewards.dtype == np.float32 and rewards.shape == (3, len(REWARD_NAMES))
    assert n_failed == 0
    np.testing.assert_allclose(rewards[:, 0], [1, 0, 0])  # correctness
    np.testing.assert_allclose(rewards[:, 1], [1, 1, 0])  # format
    np.testing.assert_allclose(rewards[:, 2], [1 - 1 / 16, 1 - 1 / 16, 1 - 3 / 16])


def test_group_alignment_and_batches():
    task = make_task("arithmetic")
    it = make_prompt_iterator(
        task, split="train", batch_size=2, seed=0, process_index=0, process_count=1
    )
    batch = next(it)
    answers = [str(a) for a in batch["answer"]]
    # P=2 prompts, G=3 completions each, prompt-major.
    completions = [answers[0], "x", answers[0], answers[1], answers[1], "-1"]
    rewards, n_failed = score_completions(task, batch, completions)
    assert n_failed == 0
    np.testing.assert_allclose(rewards[:, 0], [1, 0, 1, 1, 1, 0])
    with pytest.raises(ValueError, match="5 completions for 2 examples"):
        score_completions(task, batch, completions[:5])


def test_failures_zeroed_counted_and_logged_once(caplog):
    task = Flaky()
    examples = [{"index": i} for i in range(5)]
    completions = ["ok", "boom", "keys", "nan", "boom again"]
    with caplog.at_level(logging.WARNING, logger="jaxrl_frontier.data.rewards.scorer"):
        rewards, n_failed = score_completions(task, examples, completions)
    assert n_failed == 4
    np.testing.assert_array_equal(rewards[0], [1.0, 0.5, 0.25])
    np.testing.assert_array_equal(rewards[1:], np.zeros((4, 3)))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "checker exploded" in warnings[0].getMessage()


def test_in_process_scorer_warns_once_over_its_lifetime(caplog):
    scorer = InProcessScorer(Flaky())
    assert scorer.reward_names == REWARD_NAMES
    with caplog.at_level(logging.WARNING, logger="jaxrl_frontier.data.rewards.scorer"):
        for _ in range(3):
            rewards, n_failed = scorer([{"index": 0}], ["boom"])
            assert n_failed == 1 and not rewards.any()
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
