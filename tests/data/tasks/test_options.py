"""data/tasks/options.py: TaskOptions refuses a max_prompt_len no prompt fits."""

import pytest

from jaxrl_frontier.data.tasks import TaskOptions


def test_max_prompt_len_must_be_positive():
    assert TaskOptions(max_prompt_len=1).max_prompt_len == 1
    with pytest.raises(ValueError, match="'data.max_prompt_len' = 0 must be positive"):
        TaskOptions(max_prompt_len=0)
