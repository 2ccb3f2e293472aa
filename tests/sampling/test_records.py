"""sampling/records.py: prompts left-padded into the smallest bucket (batch padding repeats
prompt 0, errors name the broken contract), and a rollout's rows, names and full sequences."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.sampling.records import (
    DEFAULT_PROMPT_BUCKETS,
    bucket,
    left_pad_prompts,
    make_rollout,
)

PAD = 9


def test_left_pad_prompts_into_the_smallest_bucket():
    tokens = np.array([[0, 0, 5, 6], [0, 7, 8, 4]])
    mask = np.array([[0, 0, 1, 1], [0, 1, 1, 1]])
    t, m = left_pad_prompts(tokens, mask, pad_id=PAD, prompt_buckets=(2, 5, 8), num_rows=3)
    assert t.dtype == m.dtype == np.int32
    assert t.tolist() == [[9, 9, 9, 5, 6], [9, 9, 7, 8, 4], [9, 9, 9, 5, 6]]  # row 2: prompt 0
    assert m.tolist() == [[0, 0, 0, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 1, 1]]
    assert bucket(5, (8, 5), "x", "o", "S") == 5
    with pytest.raises(ValueError, match=r"prompt length 3 is .* largest bucket 2; .*Sampler\("):
        left_pad_prompts(tokens, mask, pad_id=PAD, prompt_buckets=(2,))
    with pytest.raises(ValueError, match=r"prompts must be left-padded; rows \[1\]"):
        left_pad_prompts(
            tokens, np.array([[0, 0, 1, 1], [1, 1, 0, 0]]), pad_id=PAD, prompt_buckets=(8,)
        )
    with pytest.raises(ValueError, match=r"prompts \[0\] are empty"):
        left_pad_prompts(
            tokens, np.array([[0, 0, 0, 0], [0, 1, 1, 1]]), pad_id=PAD, prompt_buckets=(8,)
        )
    with pytest.raises(ValueError, match=r"must both be \[P, T\]"):
        left_pad_prompts(tokens[0], mask[0], pad_id=PAD, prompt_buckets=(8,))


def test_default_prompt_buckets_leave_at_most_a_third_padding():
    """From 33 tokens on, a prompt fills more than two thirds of its bucket (powers of two
    alone leave up to half: 65 tokens in 128); every bucket a multiple of 16."""
    assert all(b % 16 == 0 for b in DEFAULT_PROMPT_BUCKETS)
    widths = {n: bucket(n, DEFAULT_PROMPT_BUCKETS, "x", "o", "S") for n in range(33, 8193)}
    assert all(3 * n > 2 * w for n, w in widths.items())
    assert (widths[84], widths[65], widths[97], widths[8192]) == (96, 96, 128, 8192)


def test_a_rollout_as_rows_names_and_sequences():
    prompts, prompt_mask = jnp.asarray([[0, 3], [4, 5]]), jnp.asarray([[0, 1], [1, 1]])
    tokens = jnp.asarray([[6, 2, PAD], [7, 7, 7], [2, PAD, PAD], [8, 8, 8]])
    logp = -jnp.arange(1.0, 13.0).reshape(4, 3) * (tokens != PAD)
    ro = make_rollout(
        prompts, prompt_mask, (tokens, logp, logp), jnp.asarray([2, 3, 1, 3]),
        jnp.asarray([True, False, True, False]), n=2, version=jnp.int32(4), dropout_keys=None,
    )  # fmt: skip
    assert ro.num_prompts == 2 and ro.finish_reason_names() == ["stop", "length", "stop", "length"]
    assert ro.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]]
    assert ro.prompt_tokens.tolist() == [[0, 3], [0, 3], [4, 5], [4, 5]]  # prompt-major
    assert ro.policy_version.tolist() == [4] * 4
    seq = ro.sequences()
    assert seq.tokens.tolist()[0] == [0, 3, 6, 2, PAD]
    assert seq.attention_mask.tolist()[2] == [1, 1, 1, 0, 0]
    assert seq.loss_mask.tolist()[0] == [0, 0, 1, 1, 0]
    assert seq.old_logp.tolist()[1] == [0, 0, -4, -5, -6]
    first = ro.take_rows(2)
    assert first.completion_tokens.shape == (2, 3) and first.num_prompts == 1
    assert ro.take_rows(4) is ro
