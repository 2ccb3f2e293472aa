"""The SFT warm start's batch (train/sft.py): demonstrations in the rollout layout by hand,
the too-long demonstration's error, and the loss normaliser. (The loss against the plain
logits path: tests/rl/learn/test_perf_paths.py; SFT runs: tests/run/config/test_stages.py.)"""

import numpy as np
import pytest

from jaxrl_frontier.models.tokenizer import CharTokenizer
from jaxrl_frontier.train.sft import encode_demonstrations, token_count


def test_demonstrations_in_the_rollout_layout():
    tok = CharTokenizer("ab")  # <pad> 0, <bos> 1, <eos> 2, a 4, b 5
    batch = encode_demonstrations(tok, ["a", "ab"], ["b", ""], max_prompt_len=4, max_new_tokens=3)
    np.testing.assert_array_equal(batch["tokens"], [[0, 0, 1, 4, 5, 2, 0], [0, 1, 4, 5, 2, 0, 0]])
    np.testing.assert_array_equal(
        batch["attention_mask"], [[0, 0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 0, 0]]
    )
    np.testing.assert_array_equal(
        batch["loss_mask"], [[0, 0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 0, 0]]
    )  # the completion and its EOS only
    assert batch["tokens"].dtype == np.int32 and batch["loss_mask"].dtype == np.float32
    assert float(token_count(batch)) == 3.0
    assert float(token_count({"loss_mask": np.zeros((2, 3), np.float32)})) == 1.0  # never 0


def test_a_demonstration_longer_than_the_rollout_is_refused():
    with pytest.raises(ValueError, match=r"'abb' is 4 tokens with EOS; rollout.max_new_tokens=3"):
        encode_demonstrations(CharTokenizer("ab"), ["a"], ["abb"], 4, 3)
