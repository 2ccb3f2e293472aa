"""data/tasks/code.py: examples and prompts, the program the sandbox runs (inputs only),
the score read from the harness's lines (the expected values stay here), the file of
problems. The sandboxed runs themselves: tests/data/rewards/test_sandbox.py."""

import json

import pytest

from jaxrl_frontier.data.tasks import make_task
from jaxrl_frontier.data.tasks.code import EXPRESSIONS, RESULT_TAG

TASK = make_task("code", expressions=["a+b"])
EXAMPLE = TASK.example("train", 0)


def test_a_bad_code_problems_file_names_the_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "def f(a):", "entry": "f", "solution": " a"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:1: missing fields \['tests'\]"):
        make_task("code_problems", path=str(path))


def test_the_expected_values_never_enter_the_sandbox():
    forged = dict(
        EXAMPLE, tests=[[args, 10**6 + i] for i, (args, _) in enumerate(EXAMPLE["tests"])]
    )
    assert TASK.program(forged, " a+b") == TASK.program(EXAMPLE, " a+b")  # inputs only
    result = type("R", (), dict(status="ok", output=""))()
    fake = "".join(f'@@jaxrl-result {{"value": {e}}}\n' for _, e in EXAMPLE["tests"])
    result.output = fake  # printing the right lines means computing them: solving the task
    assert TASK.score(EXAMPLE, "", result)["correctness"] == 1.0  # (the protocol, as data)


def result(status: str, lines: list[str]):
    return type("Result", (), dict(status=status, output="".join(s + "\n" for s in lines)))()


def test_examples_prompts_and_demonstrations():
    task = make_task("code", expressions=["a*b+a", "a-b*b"], num_tests=3, max_value=2)
    for i in range(20):
        ex = task.example("train", i)
        fn = EXPRESSIONS[ex["expr"]]
        assert ex["expr"] in ("a*b+a", "a-b*b") and len(ex["tests"]) == 3
        assert all(v == fn(*args) and max(map(abs, args)) <= 2 for args, v in ex["tests"])
    ex = {"expr": "a*b+a", "entry": "f", "shown": [[2, -3], -4], "tests": [[[1, 1], 2]]}
    assert task.prompt(ex) == "def f(a, b):\n    # a*b+a, e.g. f(2, -3) = -4\n    return"
    assert task.demonstration(ex) == " a*b+a"
    assert task.program(ex, " a*b+a").startswith(task.prompt(ex) + " a*b+a\n")
    with pytest.raises(RuntimeError, match="only computed by the sandboxed scorer"):
        task.reward(ex, " a*b+a")
    with pytest.raises(ValueError, match=r"unknown expressions \['a/b'\]"):
        make_task("code", expressions=["a/b"])
    with pytest.raises(ValueError, match="max_value and num_tests must be >= 1, got 9, 0"):
        make_task("code", num_tests=0)


def test_score_reads_the_tagged_lines_and_counts_the_type():
    ex = {"expr": "a+b", "entry": "f", "shown": [[0, 0], 0], "tests": [[[1, 2], 3], [[0, 0], 0]]}
    tag = lambda v: RESULT_TAG + json.dumps(v)
    score = lambda status, lines: TASK.score(ex, " a+b", result(status, lines))
    ok = score("ok", ["noise", tag({"value": 3}), "more noise", tag({"value": 0})])
    assert ok == {"correctness": 1.0, "format": 1.0, "length": 1 - 4 / 32}
    wrong = score("ok", [tag({"value": 3}), tag({"value": 1})])
    assert (wrong["correctness"], wrong["format"]) == (0.0, 1.0)
    as_bool = score("ok", [tag({"value": 3}), tag({"value": False})])  # False == 0, not an int
    assert (as_bool["correctness"], as_bool["format"]) == (0.0, 1.0)
    raised = score("ok", [tag({"value": 3}), tag({"error": "TypeError"})])
    assert (raised["correctness"], raised["format"]) == (0.0, 0.0)
    short = score("ok", [tag({"value": 3})])
    assert (short["correctness"], short["format"]) == (0.0, 0.0)
    garbled = score("ok", [tag({"value": 3}), RESULT_TAG + "{not json"])
    assert (garbled["correctness"], garbled["format"]) == (0.0, 0.0)
    timed_out = score("timeout", [tag({"value": 3}), tag({"value": 0})])
    assert (timed_out["correctness"], timed_out["format"]) == (0.0, 0.0)
