"""data/tasks/arithmetic.py: the checker on hand-checked completions, generation settings."""

import pytest

from jaxrl_frontier.data.tasks import REWARD_NAMES, make_task


def correct_format(task, example, completion):
    r = task.reward(example, completion)
    assert list(r) == list(REWARD_NAMES) == list(task.reward_names)
    assert 0.0 <= r["length"] <= 1.0
    return r["correctness"], r["format"]


def test_arithmetic_checker():
    task = make_task("arithmetic")
    ex = {"a": 123, "b": 45, "op": "+", "answer": 168, "index": 0}
    assert task.prompt(ex) == "123+45="
    assert task.demonstration(ex) == "168"
    assert correct_format(task, ex, "168") == (1.0, 1.0)
    assert correct_format(task, ex, " 168 ") == (1.0, 1.0)
    assert correct_format(task, ex, "169") == (0.0, 1.0)
    assert correct_format(task, ex, "168 apples") == (0.0, 0.0)
    assert correct_format(task, ex, "") == (0.0, 0.0)
    assert correct_format(task, ex, "１６８") == (0.0, 0.0)  # fullwidth digits are not ASCII ints
    assert task.reward(ex, "168")["length"] == pytest.approx(1 - 3 / 16)
    assert task.reward(ex, "1" * 100)["length"] == 0.0
    neg = {"a": 3, "b": 10, "op": "-", "answer": -7, "index": 0}
    assert correct_format(task, neg, "-7") == (1.0, 1.0)


def test_arithmetic_generation_respects_settings():
    task = make_task("arithmetic", max_digits=2, ops="*", seed=3)
    for i in range(300):
        ex = task.example("train", i)
        assert ex["op"] == "*" and 0 <= ex["a"] < 100 and 0 <= ex["b"] < 100
        assert ex["answer"] == ex["a"] * ex["b"]
    sub = make_task("arithmetic", ops="-")
    assert all(sub.example("train", i)["answer"] >= 0 for i in range(300))
    with pytest.raises(ValueError, match=r"unsupported \['/'\].*allowed"):
        make_task("arithmetic", ops="+/")
