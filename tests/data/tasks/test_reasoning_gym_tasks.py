"""data/tasks/reasoning_gym_tasks.py: reasoning-gym's items as examples, a disjoint and
deterministic split, a weighted mix, rewards from reasoning-gym's own checker on hand-written
completions, the errors for an unknown dataset or a refused config."""

import pickle

import pytest

from jaxrl_frontier.data.tasks import REWARD_NAMES, make_task
from jaxrl_frontier.data.tasks.base import hash_unit
from jaxrl_frontier.data.tasks.reasoning_gym_tasks import INSTRUCTIONS

pytest.importorskip("reasoning_gym")  # the optional extra .[models]

# two one-digit terms: cheap items, answers checkable by hand
SMALL = {"basic_arithmetic": dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)}
TASK = make_task("reasoning_gym", datasets="basic_arithmetic", dataset_kwargs=SMALL)
EXAMPLE = TASK.example("train", 0)


def scored(task, completion, example=EXAMPLE):
    r = task.reward(example, completion)
    assert list(r) == list(REWARD_NAMES)
    return r["correctness"], r["format"]


def test_examples_hold_the_entry_and_its_reference_answer():
    assert set(EXAMPLE) == {"dataset", "question", "answer", "metadata", "position", "index"}
    assert (
        EXAMPLE["dataset"] == "basic_arithmetic" and TASK.cluster_key(EXAMPLE) == "basic_arithmetic"
    )
    for i in range(20):
        ex = TASK.example("train", i)
        expression = ex["metadata"]["expression"]  # e.g. "2 - 5": two terms of one digit
        assert ex["metadata"]["num_terms"] == 2 and ex["question"].startswith("Calculate ")
        assert ex["answer"] == str(eval(expression.replace("/", "//")))  # basic_arithmetic's rule
    assert TASK.prompt(EXAMPLE) == EXAMPLE["question"] + "\n\n" + INSTRUCTIONS["tags"]
    assert TASK.demonstration(EXAMPLE) == f"<answer>{EXAMPLE['answer']}</answer>"
    assert pickle.loads(pickle.dumps(TASK)).example("eval", 3) == TASK.example("eval", 3)


def test_train_and_eval_are_disjoint_and_deterministic():
    train = [TASK.example("train", i) for i in range(300)]
    held = [TASK.example("eval", i) for i in range(300)]
    key = lambda ex: hash_unit(f"reasoning_gym|basic_arithmetic|{ex['question']}")
    assert all(key(ex) >= 0.1 for ex in train) and all(key(ex) < 0.1 for ex in held)
    assert not {ex["question"] for ex in train} & {ex["question"] for ex in held}
    again = make_task("reasoning_gym", datasets="basic_arithmetic", dataset_kwargs=SMALL)
    assert [again.example("train", i) for i in range(300)] == train
    other = make_task("reasoning_gym", dataset_kwargs=SMALL, seed=1)
    assert [other.example("train", i)["question"] for i in range(20)] != [
        ex["question"] for ex in train[:20]
    ]


def test_the_mix_follows_its_weights():
    mix = make_task(
        "reasoning_gym", datasets={"basic_arithmetic": 3, "chain_sum": 1}, dataset_kwargs=SMALL
    )
    assert mix.weights == {"basic_arithmetic": 0.75, "chain_sum": 0.25}
    names = [mix.example("train", i)["dataset"] for i in range(200)]
    # 200 draws at p = 0.25: mean 50, sd sqrt(200 * 0.25 * 0.75) = 6.1; allow 4 sd
    assert abs(names.count("chain_sum") - 50) <= 25
    assert names.count("basic_arithmetic") + names.count("chain_sum") == 200


def test_rewards_on_hand_written_completions():
    assert EXAMPLE["answer"] == "-3"  # "Calculate 2 - 5." (seed 0, reasoning-gym 0.1.25)
    assert scored(TASK, "2 - 5 = -3\n<answer>-3</answer>") == (1.0, 1.0)
    assert scored(TASK, "<answer> -3 </answer>") == (1.0, 1.0)  # stripped
    assert scored(TASK, "<answer>4</answer>") == (0.0, 1.0)
    assert scored(TASK, "the answer is -3") == (0.0, 0.0)  # no tags, no fallback
    assert scored(TASK, "<answer></answer>") == (0.0, 0.0)
    assert scored(TASK, "<answer>4</answer><answer>-3</answer>") == (1.0, 0.0)  # the last counts
    # reasoning-gym's default checker: partial credit len("-3") / len("x = -3") = 2/6, kept
    assert scored(TASK, "<answer>x = -3</answer>") == (pytest.approx(1 / 3), 1.0)
    assert TASK.reward(EXAMPLE, "<answer>-3</answer>")["length"] == 1 - 19 / 1024
    fallback = make_task("reasoning_gym", dataset_kwargs=SMALL, fallback="last_number")
    assert scored(fallback, "2 - 5 is -3") == (1.0, 0.0)
    assert scored(fallback, "2 - 5 is -4") == (0.0, 0.0)
    boxed = make_task("reasoning_gym", dataset_kwargs=SMALL, answer_format="boxed")
    assert boxed.demonstration(EXAMPLE) == "\\boxed{-3}"
    assert scored(boxed, "so \\boxed{-3}") == (1.0, 1.0)
    assert scored(boxed, "<answer>-3</answer>") == (0.0, 0.0)


def test_unknown_names_and_refused_configs_are_errors():
    with pytest.raises(
        ValueError, match="unknown dataset 'basic_arithmatic'; did you mean 'basic_arithmetic'"
    ):
        make_task("reasoning_gym", datasets="basic_arithmatic")
    with pytest.raises(
        ValueError, match=r"unknown fields \['max_term'\]; .* has: min_terms, max_terms"
    ):
        make_task("reasoning_gym", dataset_kwargs={"basic_arithmetic": {"max_term": 3}})
    with pytest.raises(
        ValueError, match="refused by BasicArithmeticDatasetConfig: min_terms must be"
    ):
        make_task("reasoning_gym", dataset_kwargs={"basic_arithmetic": {"min_terms": 0}})
    with pytest.raises(ValueError, match=r"dataset_kwargs names \['chain_sum'\]"):
        make_task("reasoning_gym", dataset_kwargs={"chain_sum": {}})
    with pytest.raises(ValueError, match="answer_format 'xml'; allowed: tags, boxed"):
        make_task("reasoning_gym", answer_format="xml")
    with pytest.raises(ValueError, match=r"datasets\['chain_sum'\] = -1"):
        make_task("reasoning_gym", datasets={"basic_arithmetic": 1, "chain_sum": -1})
