"""Tasks: checkers on hand-checked cases, the safe parser, splits, determinism, the grain pipeline."""

import json
from fractions import Fraction

import numpy as np
import pytest

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.data.tasks import (
    REWARD_NAMES,
    TASKS,
    Task,
    eval_examples,
    make_prompt_iterator,
    make_task,
    unbatch,
)
from jaxrl_frontier.data.tasks.expression import ExpressionError, parse_expression
from jaxrl_frontier.data.tasks.jsonl_math import SAMPLE_MATH_PATH
from jaxrl_frontier.data.tasks.math_answer import extract_answer, normalize_answer
from jaxrl_frontier.models.tokenizer import CharTokenizer


def correct_format(task, example, completion):
    r = task.reward(example, completion)
    assert list(r) == list(REWARD_NAMES) == list(task.reward_names)
    assert 0.0 <= r["length"] <= 1.0
    return r["correctness"], r["format"]


def test_every_registered_task_is_a_task_and_a_typo_names_the_key():
    for name in TASKS:
        cls = TASKS.get(name)
        assert issubclass(cls, Task) and tuple(cls.reward_names)[0] == "correctness", name
    with pytest.raises(ConfigError, match=r"config key 'task.name': unknown task 'arithmetc'"):
        make_task("arithmetc")
    with pytest.raises(KeyError, match="Did you mean 'arithmetic'"):  # also a KeyError
        make_task("arithmetc")


# ---------------------------------------------------------------- arithmetic


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


# ---------------------------------------------------------------- column addition


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


# ---------------------------------------------------------------- countdown parser


@pytest.mark.parametrize(
    "text, value, numbers",
    [
        ("1+2*3", 7, (1, 2, 3)),
        ("(1+2)*3", 9, (1, 2, 3)),
        ("7/2*2", 7, (7, 2, 2)),
        ("10-4-3", 3, (10, 4, 3)),
        ("100/(5-3)/2", 25, (100, 5, 3, 2)),
        (" ( 25 - 5 ) / 4 ", 5, (25, 5, 4)),
        ("1/3", Fraction(1, 3), (1, 3)),
    ],
)
def test_parser_values(text, value, numbers):
    parsed = parse_expression(text)
    assert parsed.value == value and parsed.numbers == numbers


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os')",  # names and calls
        "abs(3)",
        "(3).real",  # attributes
        "2**3",  # exponent
        "2^3",
        "7//2",
        "7%2",
        "1.5*2",
        "-3+5",  # unary sign
        "3+",
        "(3+4",
        "3 4",
        "",
        "２+３",  # fullwidth digits
        "3＋4",
        "3\u200b+4",  # zero-width space
        "(" * 40 + "1" + ")" * 40,  # too deep
        "1+" * 200 + "1",  # too long
    ],
)
def test_parser_refuses(text):
    with pytest.raises(ExpressionError):
        parse_expression(text)


def test_parser_division_by_zero_is_wellformed_but_valueless():
    assert parse_expression("5/(3-3)").value is None


# ---------------------------------------------------------------- countdown task


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


# ---------------------------------------------------------------- jsonl_math


@pytest.mark.parametrize(
    "text, answer",
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{x^{2}+1}", "x^{2}+1"),
        ("work\n#### 1,000\nbye", "1,000"),
        ("\\boxed{7} and \\boxed{8", "7"),  # truncated last box: the earlier balanced one
        ("no answer here", None),
        ("####   ", None),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize(
    "raw, norm",
    [
        ("1,000", "1000"),
        ("3.0", "3"),
        ("$12", "12"),
        ("0.50", "1/2"),
        ("\\frac{1}{2}", "1/2"),
        ("-\\frac{3}{4}", "-3/4"),
        ("6/8", "3/4"),
        ("42.", "42"),
        ("  Seven  Apples ", "seven apples"),
        ("1/0", "1/0"),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


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


# ---------------------------------------------------------------- splits and determinism


@pytest.mark.parametrize("name", ["arithmetic", "countdown", "column_addition"])
def test_splits_disjoint_and_deterministic(name):
    kwargs = {"arithmetic": {"max_digits": 2}, "countdown": {"max_number": 12}}.get(name, {})
    task = make_task(name, seed=0, **kwargs)
    other_seed = make_task(name, seed=1, **kwargs)
    train = {task.split_key(task.example("train", i)) for i in range(2000)}
    eval_ = {task.split_key(other_seed.example("eval", i)) for i in range(1000)}
    assert train and eval_ and not train & eval_  # disjoint even across seeds
    again = make_task(name, seed=0, **kwargs)
    assert [task.example("train", i) for i in range(50)] == [
        again.example("train", i) for i in range(50)
    ]
    assert [task.example("train", i) for i in range(50)] != [
        other_seed.example("train", i) for i in range(50)
    ]


def test_jsonl_split_disjoint():
    task = make_task("jsonl_math", path=SAMPLE_MATH_PATH, eval_fraction=0.5)
    train = {task.example("train", i)["question"] for i in range(task.num_examples("train"))}
    eval_ = {task.example("eval", i)["question"] for i in range(task.num_examples("eval"))}
    assert train and eval_ and not train & eval_


def test_eval_examples_fixed_and_distinct():
    task = make_task("arithmetic", max_digits=1)
    a = eval_examples(task, 20, seed=0)
    assert a == eval_examples(task, 20, seed=0)
    assert len({ex["prompt"] for ex in a}) == 20
    assert all(task.split_of(ex) == "eval" for ex in a)
    with pytest.raises(ValueError, match="distinct eval examples"):
        eval_examples(make_task("arithmetic", max_digits=1, ops="+", eval_size=50), 40)


# ---------------------------------------------------------------- pipeline


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


# ---------------------------------------------------------------- prompt lengths, up front


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
