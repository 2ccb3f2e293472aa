"""data/tasks/jsonl_math.py: the sample file, the checker, bad lines named by file and
line, a disjoint split."""

import json

import pytest

from jaxrl_frontier.data.tasks import REWARD_NAMES, make_task
from jaxrl_frontier.data.tasks.jsonl_math import SAMPLE_MATH_PATH
from jaxrl_frontier.models.tokenizer import CharTokenizer


def correct_format(task, example, completion):
    r = task.reward(example, completion)
    assert list(r) == list(REWARD_NAMES) == list(task.reward_names)
    assert 0.0 <= r["length"] <= 1.0
    return r["correctness"], r["format"]


def test_jsonl_math_sample_file():
    task = make_task("jsonl_math", path=SAMPLE_MATH_PATH)
    n_train, n_eval = task.num_examples("train"), task.num_examples("eval")
    assert n_train + n_eval >= 20 and n_eval >= 1
    tok = CharTokenizer()
    for split, n in (("train", n_train), ("eval", n_eval)):
        for i in range(n):
            ex = task.example(split, i)
            tok.encode(task.prompt(ex) + task.demonstration(ex))  # the sample fits the alphabet
            assert correct_format(task, ex, task.demonstration(ex)) == (1.0, 1.0)


def test_jsonl_math_checker(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"q": "2 + 2?", "a": "4"}) + "\n")
    task = make_task("jsonl_math", path=path, eval_path=path, prompt_field="q", answer_field="a")
    ex = task.example("train", 0)
    assert task.prompt(ex) == "2 + 2?\n" and task.demonstration(ex) == "#### 4"
    assert correct_format(task, ex, "so \\boxed{4.0}") == (1.0, 1.0)
    assert correct_format(task, ex, "2+2 = 4\n#### 4") == (1.0, 1.0)
    assert correct_format(task, ex, "#### 5") == (0.0, 1.0)
    assert correct_format(task, ex, "the answer is 4") == (0.0, 0.0)
    assert correct_format(task, ex, "\\boxed{4") == (0.0, 0.0)  # unbalanced
    assert correct_format(task, ex, "\\boxed{４}") == (0.0, 1.0)  # unicode junk, not 4


@pytest.mark.parametrize(
    "lines, match",
    [
        (
            ['{"question": "a", "answer": "1"}', '{"question": "b", "answer": 2', ""],
            r":2: invalid JSON",
        ),
        (
            ['{"question": "a", "answer": "1"}', "", '{"question": "b"}'],
            r":3: missing field 'answer'",
        ),
        (
            ['{"prompt": "a", "answer": "1"}'],
            r":1: missing field 'question'.*fields present: prompt",
        ),
        (["[1, 2]"], r":1: expected a JSON object"),
        (['{"question": ["a"], "answer": "1"}'], r":1: field 'question' must be a string"),
    ],
)
def test_jsonl_errors_name_file_and_line(tmp_path, lines, match):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl" + match):
        make_task("jsonl_math", path=path)


def test_jsonl_split_disjoint():
    task = make_task("jsonl_math", path=SAMPLE_MATH_PATH, eval_fraction=0.5)
    train = {task.example("train", i)["question"] for i in range(task.num_examples("train"))}
    eval_ = {task.example("eval", i)["question"] for i in range(task.num_examples("eval"))}
    assert train and eval_ and not train & eval_
