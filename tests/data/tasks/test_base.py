"""data/tasks/base.py: the task registry, the split hash and the length score, and
SyntheticTask's seeded, disjoint splits and argument checks."""

import gzip

import pytest

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.data.tasks import REWARD_NAMES, TASKS, SyntheticTask, Task, make_task
from jaxrl_frontier.data.tasks.base import (
    check_split,
    hash_unit,
    length_score,
    read_jsonl,
    reward_vector,
    task_defaults,
    task_parameters,
)


def test_every_registered_task_is_a_task_and_a_typo_names_the_key():
    for name in TASKS:
        cls = TASKS.get(name)
        assert issubclass(cls, Task) and tuple(cls.reward_names)[0] == "correctness", name
    with pytest.raises(ConfigError, match=r"config key 'task.name': unknown task 'arithmetc'"):
        make_task("arithmetc")
    with pytest.raises(KeyError, match="Did you mean 'arithmetic'"):  # also a KeyError
        make_task("arithmetc")


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


class Coin(SyntheticTask):
    """A toy instance space: `sides` instances, one per side."""

    name = "coin_test_task"
    MAX_DRAWS = 50

    def __init__(self, *, sides: int = 2, max_completion_chars: int = 8, label=None, **kwargs):
        super().__init__(max_completion_chars=max_completion_chars, **kwargs)
        self.sides = sides

    def _generate(self, rng):
        return {"side": rng.randrange(self.sides)}

    def split_key(self, example):
        return str(example["side"])


def test_hash_unit_length_score_and_the_reward_vector():
    assert hash_unit("abc") == int("d8bb14d833d59559", 16) / 2**64  # blake2b-64 of "abc"
    assert 0.0 <= hash_unit("") < 1.0 and hash_unit("abd") != hash_unit("abc")
    assert [length_score(c, 4) for c in ("", "a", "abc", "abcd", "abcdefgh")] == [
        1.0, 0.75, 0.25, 0.0, 0.0,
    ]  # fmt: skip
    r = reward_vector(True, False, "ab", 8)
    assert list(r) == list(REWARD_NAMES) and list(r.values()) == [1.0, 0.0, 0.75]
    assert check_split("eval") == "eval"
    with pytest.raises(ValueError, match="unknown split 'test'; allowed: train, eval"):
        check_split("test")


def test_synthetic_task_checks_its_arguments_and_its_indices():
    for kwargs, match in [
        ({"eval_fraction": 0.0}, r"coin_test_task: eval_fraction must be in \(0, 1\), got 0.0"),
        ({"eval_size": 0}, "train_size and eval_size must be >= 1, got 1000000, 0"),
        ({"max_completion_chars": 0}, "max_completion_chars must be >= 1, got 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            Coin(**kwargs)
    task = Coin(train_size=3, eval_size=2, eval_fraction=0.5)
    assert (task.num_examples("train"), task.num_examples("eval")) == (3, 2)
    for split in ("train", "eval"):
        for i in range(task.num_examples(split)):
            ex = task.example(split, i)
            assert ex["index"] == i and task.split_of(ex) == split
            assert split == ("eval" if hash_unit(f"coin_test_task|{ex['side']}") < 0.5 else "train")
    with pytest.raises(IndexError, match=r"index 3 outside \[0, 3\) of train"):
        task.example("train", 3)
    one = Coin(sides=1, eval_fraction=0.5)  # one instance: one split has none
    empty = "train" if one.split_of({"side": 0}) == "eval" else "eval"
    with pytest.raises(RuntimeError, match=f"no {empty} instance in 50 draws"):
        one.example(empty, 0)


def test_task_defaults_take_the_subclass_default_and_leave_out_none():
    TASKS.register("coin_test_task")(Coin)
    try:
        names = [p.name for _, p in task_parameters("coin_test_task")]
        base = ["seed", "train_size", "eval_size", "eval_fraction", "max_completion_chars"]
        assert names == base + ["sides", "max_completion_chars", "label"]  # base class first
        assert task_defaults("coin_test_task") == dict(
            seed=0, train_size=1_000_000, eval_size=10_000, eval_fraction=0.1,
            max_completion_chars=8, sides=2,
        )  # fmt: skip
    finally:
        TASKS.unregister("coin_test_task")


def test_read_jsonl_yields_objects_and_names_the_bad_line(tmp_path):
    text = '{"a": 1}\n\n{"a": 2}\n'
    plain, packed = tmp_path / "rows.jsonl", tmp_path / "rows.jsonl.gz"
    plain.write_text(text)
    packed.write_bytes(gzip.compress(text.encode()))
    for path in (plain, packed):
        assert list(read_jsonl(path, "toy")) == [
            (1, f"{path}:1", {"a": 1}),
            (3, f"{path}:3", {"a": 2}),  # blank line 2 skipped, numbering kept
        ]
    for bad, message in (("{oops\n", "invalid JSON"), ("[1, 2]\n", "expected a JSON object")):
        plain.write_text('{"a": 1}\n' + bad)
        with pytest.raises(ValueError, match=f"rows.jsonl:2: {message}"):
            list(read_jsonl(plain, "toy"))
    with pytest.raises(FileNotFoundError, match="toy: no such file"):
        list(read_jsonl(tmp_path / "absent.jsonl", "toy"))
