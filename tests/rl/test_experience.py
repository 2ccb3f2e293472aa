"""The rollout's host records (rl/experience.py) by hand: whole groups' row indices, taking
groups of scored rows and concatenating draws."""

import numpy as np

from jaxrl_frontier.rl.experience import RolloutRows, ScoredRows, group_rows


def scored(first_index, n_prompts, g=2, failed=0):
    b = n_prompts * g
    rows = RolloutRows(
        examples=tuple({"index": first_index + i} for i in range(n_prompts)),
        completion_tokens=np.arange(b)[:, None].repeat(2, 1) + 10 * first_index,
        completion_mask=np.ones((b, 2), np.int32),
        policy_mask=np.ones((b, 2), np.int32),
        policy_logp=np.zeros((b, 2), np.float32),
        texts=tuple(f"{first_index}.{r}" for r in range(b)),
    )
    prompts = np.arange(b)[:, None].repeat(3, 1)
    rewards = np.arange(b, dtype=np.float32)[:, None] + first_index
    return ScoredRows(rows, prompts, np.ones((b, 3), np.int32), rewards, None, failed)


def test_group_rows_are_whole_groups_prompt_major():
    np.testing.assert_array_equal(group_rows([2, 0], 3), [6, 7, 8, 0, 1, 2])
    assert group_rows([], 4).tolist() == []


def test_taking_groups_keeps_each_groups_rows_together():
    s = scored(0, 3)
    assert s.rows.group_size == 2
    part = s.take_groups([2, 0])
    assert [e["index"] for e in part.rows.examples] == [2, 0]
    assert part.rows.texts == ("0.4", "0.5", "0.0", "0.1")
    np.testing.assert_array_equal(part.rewards[:, 0], [4, 5, 0, 1])
    np.testing.assert_array_equal(part.prompt_tokens[:, 0], [4, 5, 0, 1])
    np.testing.assert_array_equal(part.rows.completion_tokens[:, 0], [4, 5, 0, 1])


def test_draws_concatenate_in_draw_order_with_their_failures_summed():
    both = ScoredRows.concat([scored(0, 1, failed=1), scored(5, 2, failed=2)])
    assert [e["index"] for e in both.rows.examples] == [0, 5, 6]
    assert both.rows.texts == ("0.0", "0.1", "5.0", "5.1", "5.2", "5.3")
    np.testing.assert_array_equal(both.rewards[:, 0], [0, 1, 5, 6, 7, 8])
    assert both.n_failed == 3 and both.dropout_keys is None and both.routing is None
    assert both.rows.token_version is None
