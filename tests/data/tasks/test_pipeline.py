"""data/tasks/pipeline.py: fixed eval examples, the grain prompt iterator (batches,
determinism, sharding, state round trip, errors) and prompt lengths checked up front."""

import json

import numpy as np
import pytest

from jaxrl_frontier.data.tasks import (
    eval_examples,
    make_prompt_iterator,
    make_task,
    unbatch,
)
from jaxrl_frontier.data.tasks.jsonl_math import SAMPLE_MATH_PATH
from jaxrl_frontier.models.tokenizer import CharTokenizer


def test_eval_examples_fixed_and_distinct():
    task = make_task("arithmetic", max_digits=1)
    a = eval_examples(task, 20, seed=0)
    assert a == eval_examples(task, 20, seed=0)
    assert len({ex["prompt"] for ex in a}) == 20
    assert all(task.split_of(ex) == "eval" for ex in a)
    with pytest.raises(ValueError, match="distinct eval examples"):
        eval_examples(make_task("arithmetic", max_digits=1, ops="+", eval_size=50), 40)


def _take(it, n):
    return [next(it) for _ in range(n)]


def test_iterator_batches_and_determinism():
    task = make_task("countdown")
    it = make_prompt_iterator(
        task, split="train", batch_size=4, seed=5, process_index=0, process_count=1
    )
    batch = next(it)
    assert set(batch) >= {"prompt", "numbers", "target", "index"}
    assert batch["index"].dtype == np.int64 and batch["index"].shape == (4,)
    assert batch["prompt"] == [task.prompt(ex) for ex in unbatch(batch)]
    again = make_prompt_iterator(
        task, split="train", batch_size=4, seed=5, process_index=0, process_count=1
    )
    assert next(again)["prompt"] == batch["prompt"]
    other = make_prompt_iterator(
        task, split="train", batch_size=4, seed=6, process_index=0, process_count=1
    )
    assert next(other)["prompt"] != batch["prompt"]


def test_iterator_sharding_is_a_disjoint_cover_and_reshuffles_per_epoch():
    task = make_task("arithmetic", train_size=48)
    per_process = []
    for pi in range(3):
        it = make_prompt_iterator(
            task, split="train", batch_size=4, seed=0, process_index=pi, process_count=3
        )
        epochs = [np.concatenate([b["index"] for b in _take(it, 4)]) for _ in range(2)]
        assert sorted(epochs[0]) == sorted(epochs[1])  # 16 examples = one epoch per process
        assert list(epochs[0]) != list(epochs[1])  # reshuffled
        per_process.append(set(epochs[0].tolist()))
    assert sum(len(s) for s in per_process) == 48
    assert set().union(*per_process) == set(range(48))


def test_iterator_state_round_trip():
    task = make_task("arithmetic", train_size=30)
    make = lambda: make_prompt_iterator(
        task, split="train", batch_size=4, seed=1, process_index=0, process_count=1
    )
    it = make()
    _take(it, 5)
    state = it.get_state()
    expected = _take(it, 12)  # runs across the epoch boundary (30 examples)
    resumed = make()
    resumed.set_state(state)
    got = _take(resumed, 12)
    for a, b in zip(expected, got, strict=True):
        assert a["prompt"] == b["prompt"]
        np.testing.assert_array_equal(a["index"], b["index"])


def test_iterator_errors():
    task = make_task("jsonl_math", path=SAMPLE_MATH_PATH)
    with pytest.raises(ValueError, match="unknown split 'test'"):
        make_prompt_iterator(
            task, split="test", batch_size=2, seed=0, process_index=0, process_count=1
        )
    with pytest.raises(ValueError, match="process_index"):
        make_prompt_iterator(
            task, split="train", batch_size=2, seed=0, process_index=2, process_count=2
        )
    with pytest.raises(ValueError, match="fewer than the 64 processes"):
        make_prompt_iterator(
            task, split="eval", batch_size=2, seed=0, process_index=0, process_count=64
        )


def test_iterator_default_process_layout():
    it = make_prompt_iterator(make_task("arithmetic"), split="eval", batch_size=2, seed=0)
    assert len(next(it)["prompt"]) == 2


def _jsonl(path, questions):
    path.write_text("".join(json.dumps({"question": q, "answer": "1"}) + "\n" for q in questions))
    return path


def test_a_prompt_too_long_is_named_by_file_and_line_before_training(tmp_path):
    from jaxrl_frontier.core.errors import ConfigError
    from jaxrl_frontier.data.tasks import check_prompt_lengths

    path = _jsonl(tmp_path / "rows.jsonl", ["one", "two", "a much longer question", "x"])
    task = make_task("jsonl_math", path=str(path), eval_fraction=0.0)
    tok = CharTokenizer()
    # "{question}\n" + BOS: "a much longer question" is 22 + 1 + 1 = 24 tokens
    with pytest.raises(ConfigError) as e:
        check_prompt_lengths(task, tok, 23)
    assert str(e.value).startswith(f"{path}:3: prompt is 24 tokens (with BOS), longer than ")
    assert "'data.max_prompt_len' = 23" in str(e.value)
    assert check_prompt_lengths(task, tok, 24) is task  # fits: the task itself


def test_truncate_prompts_keeps_the_end_of_each_prompt(tmp_path):
    from jaxrl_frontier.data.tasks import check_prompt_lengths

    path = _jsonl(tmp_path / "rows.jsonl", ["short", "a much longer question"])
    task = make_task("jsonl_math", path=str(path), eval_fraction=0.0)
    tok = CharTokenizer()
    cut = check_prompt_lengths(task, tok, 10, truncate=True)
    prompts = [cut.prompt(cut.example("train", i)) for i in range(2)]
    assert prompts == ["short\n", "question\n"]  # 9 characters + BOS = 10 tokens
    assert all(len(tok.encode(p)) + 1 <= 10 for p in prompts)
    assert cut.reward_names == task.reward_names and cut.num_examples("train") == 2


def test_synthetic_tasks_are_sampled_not_drawn_whole():
    from jaxrl_frontier.data.tasks import check_prompt_lengths

    task = make_task("arithmetic", max_digits=3)
    tok = CharTokenizer()
    with pytest.raises(ValueError, match=r"task 'arithmetic' train example \d+: prompt is"):
        check_prompt_lengths(task, tok, 6)
