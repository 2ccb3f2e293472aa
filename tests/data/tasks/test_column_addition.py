"""data/tasks/column_addition.py: the worked sum, the checker, the examples."""

import pytest

from jaxrl_frontier.data.tasks import REWARD_NAMES, make_task


def correct_format(task, example, completion):
    r = task.reward(example, completion)
    assert list(r) == list(REWARD_NAMES) == list(task.reward_names)
    assert 0.0 <= r["length"] <= 1.0
    return r["correctness"], r["format"]


def test_column_addition_worked_sum_and_checker():
    task = make_task("column_addition")
    ex = {"a": 123, "b": 459, "answer": 582, "index": 0}
    assert task.prompt(ex) == "123+459="
    # right to left: 3+9 = 12 (carry 1), 2+5+1 = 08, 1+4+0 = 05; then the 4-digit sum
    assert task.demonstration(ex) == "3+9+0=12,2+5+1=08,1+4+0=05,0582"
    assert correct_format(task, ex, "3+9+0=12,2+5+1=08,1+4+0=05,0582") == (1.0, 1.0)
    # wrong columns, right answer: correct (only the final number is checked), well formed
    assert correct_format(task, ex, "3+9+0=11,2+5+1=08,1+4+0=05,582") == (1.0, 1.0)
    assert correct_format(task, ex, "3+9+0=12,2+5+1=08,1+4+0=05,0583") == (0.0, 1.0)
    assert correct_format(task, ex, "3+9+0=12,2+5+1=08,0582") == (0.0, 0.0)  # a column short
    assert correct_format(task, ex, "582") == (0.0, 0.0)
    assert correct_format(task, ex, "3+9+2=14,2+5+1=08,1+4+0=05,0582") == (0.0, 0.0)  # carry 2
    nine = {"a": 999, "b": 1, "answer": 1000, "index": 0}
    assert task.demonstration(nine) == "9+1+0=10,9+0+1=10,9+0+1=10,1000"
    assert len(task.demonstration(nine)) == 31
    two = make_task("column_addition", digits=2)
    assert two.demonstration({"a": 7, "b": 5, "answer": 12}) == "7+5+0=12,0+0+1=01,012"
    assert two.prompt({"a": 7, "b": 5}) == "07+05="
    with pytest.raises(ValueError, match=r"digits must be in \[1, 9\]"):
        make_task("column_addition", digits=0)


def test_column_addition_examples_are_sums_in_range():
    task = make_task("column_addition", seed=2)
    for i in range(300):
        ex = task.example("train", i)
        assert 0 <= ex["a"] < 1000 and 0 <= ex["b"] < 1000 and ex["answer"] == ex["a"] + ex["b"]
        assert task.reward(ex, task.demonstration(ex))["correctness"] == 1.0
