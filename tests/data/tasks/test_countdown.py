"""data/tasks/countdown.py: the checker on hand-checked expressions; every instance is
solved by its demonstration."""

from jaxrl_frontier.data.tasks import REWARD_NAMES, make_task


def correct_format(task, example, completion):
    r = task.reward(example, completion)
    assert list(r) == list(REWARD_NAMES) == list(task.reward_names)
    assert 0.0 <= r["length"] <= 1.0
    return r["correctness"], r["format"]


def test_countdown_checker():
    task = make_task("countdown")
    ex = {"numbers": [3, 7, 25, 50], "target": 81, "solution": "(50-25)*3+7-1", "index": 0}
    assert task.prompt(ex) == "use 3, 7, 25, 50 to make 81:"
    assert correct_format(task, ex, "25*3+7-(50/50)") == (0.0, 1.0)  # 50 reused
    assert correct_format(task, ex, "(50-25)*3+7") == (0.0, 1.0)  # 82
    assert correct_format(task, ex, "50+25+7-3") == (0.0, 1.0)  # 79
    assert correct_format(task, ex, "3*25+7") == (0.0, 1.0)  # 82
    assert correct_format(task, ex, "(50+25)+(7-3)+2") == (0.0, 1.0)  # 2 not given
    assert correct_format(task, ex, "50+25+3+3") == (0.0, 1.0)  # 3 twice, given once
    assert correct_format(task, ex, "(50/25+7)*(3*3)") == (0.0, 1.0)  # 3 reused
    assert correct_format(task, ex, "(7-25/25)*...") == (0.0, 0.0)
    assert correct_format(task, ex, "3*7/(25-25)") == (0.0, 1.0)  # division by zero
    assert correct_format(task, ex, "the answer is 81") == (0.0, 0.0)
    ex2 = {"numbers": [2, 3, 7, 7], "target": 56, "solution": "", "index": 0}
    assert correct_format(task, ex2, "7*7+7") == (0.0, 1.0)  # 7 given twice, used 3 times
    assert correct_format(task, ex2, "(7+7)*2*2") == (0.0, 1.0)
    assert correct_format(task, ex2, "7*(7+3-2)") == (1.0, 1.0)  # each given number once
    ex3 = {"numbers": [3, 4, 6, 12], "target": 21, "solution": "", "index": 0}
    assert correct_format(task, ex3, "(12*(6+3)-3*0+4*3)/4") == (0.0, 1.0)
    assert correct_format(task, ex3, "12/4*6+3") == (1.0, 1.0)  # exact Fraction arithmetic
    assert correct_format(task, ex3, "6/4*12+3") == (1.0, 1.0)  # 1.5 * 12 + 3 = 21


def test_countdown_instances_are_solvable():
    task = make_task("countdown", seed=7)
    for split in ("train", "eval"):
        for i in range(300):
            ex = task.example(split, i)
            assert len(ex["numbers"]) == 4 and 1 <= ex["target"] <= 500
            assert task.reward(ex, task.demonstration(ex))["correctness"] == 1.0, ex
