"""ZPPO replay (rl/sources/zppo.py), hand-checked: the buffer admits hard prompts, evicts
FIFO and graduates solved ones, replays alternate BCQ and NCQ prompts, a BCQ reference is the
teacher's verified answer else the task's, and an exact resume from its JSON state. (Through
the trainer: test_sources_resume.py.)"""

import json

import numpy as np

from jaxrl_frontier.data.tasks import make_task
from jaxrl_frontier.rl.experience import PromptResult
from jaxrl_frontier.rl.sources.base import UniformSource
from jaxrl_frontier.rl.sources.zppo import ZPPOSource

TASK = make_task("arithmetic", max_digits=1, ops="+", prompt_template="{a}{op}{b}=", train_size=64)
TASK2 = make_task(
    "arithmetic", max_digits=2, ops="+-", prompt_template="{a}{op}{b}=", train_size=64
)


def _json(state):
    return json.loads(json.dumps(state))  # the checkpoint's metadata is JSON


def _result(index, correct, kind="a", g=4, texts=()):
    ex = {"index": index, "kind": kind}
    n = round(correct * g)
    rewards = np.asarray([[1.0]] * n + [[0.0]] * (g - n), np.float32)
    return PromptResult(index, ex, rewards, rewards[:, 0], correct, np.ones(g), tuple(texts))


def _zppo(capacity=2, fraction=0.5):
    return ZPPOSource(
        TASK,
        UniformSource(TASK, batch_size=4, seed=0),
        seed=0,
        capacity=capacity,
        replay_fraction=fraction,
    )


def test_zppo_buffer_admits_hard_prompts_evicts_fifo_and_graduates():
    src = _zppo(capacity=2)
    wrong = ("7", "8", "9")
    src.observe([_result(1, 0.25, texts=("x",) + wrong), _result(2, 0.0, texts=("1",) * 4)])
    src.observe([_result(3, 0.25, texts=("5", "6", "6", "6")), _result(4, 0.5, texts=("1",) * 4)])
    assert [e["index"] for e in src.buffer] == [2, 3]  # 1 evicted (FIFO), 4 not hard
    assert src.evictions == 1 and src.graduations == 0
    src.observe([_result(2, 0.5)])  # accuracy >= 0.5: graduates
    assert [e["index"] for e in src.buffer] == [3] and src.graduations == 1
    src.observe([_result(3, 0.25, texts=("1",) * 4)])  # still hard: stays, not re-added
    assert [e["index"] for e in src.buffer] == [3]
    assert src.metrics() == {
        "zppo/buffer_size": 1.0,
        "zppo/graduations": 1.0,
        "zppo/evictions": 1.0,
        "zppo/replayed": 0.0,
    }


def test_zppo_replays_alternate_bcq_and_ncq_prompts():
    src = _zppo(capacity=4, fraction=0.25)
    # the completions of prompt 3: one correct (its first row), three wrong
    ex = TASK.example("train", 3)
    answer = str(ex["answer"])
    texts = (answer, "77", "78", "79")
    r = PromptResult(
        3, ex, np.asarray([[1.0, 1, 1]] + [[0.0, 1, 1]] * 3), np.zeros(4), 0.25, np.ones(4), texts
    )
    src.observe([r])
    assert src.buffer == [dict(index=3, wrong=["77", "78", "79"], replays=0)]
    first = src.next_batch()
    question = TASK.prompt(ex)
    assert first[0]["index"] == 3 and first[0]["zppo"] == "bcq"
    cands, q = first[0]["prompt"].split(";")
    assert q == question and sorted(cands.split(",")) == sorted([answer, "77"])
    assert [e.get("zppo") for e in first[1:]] == [None] * 3  # the rest: fresh prompts
    second = src.next_batch()
    assert second[0]["prompt"] == f"not 77,78,79;{question}" and second[0]["zppo"] == "ncq"
    assert src.metrics()["zppo/replayed"] == 1.0


def test_zppo_resumes_exactly():
    one = _zppo(capacity=3)
    one.observe([_result(5, 0.0, texts=("1", "2", "3", "4"))])
    one.next_batch()
    saved = _json(one.state())
    want = [[(e["index"], e.get("prompt")) for e in one.next_batch()] for _ in range(3)]
    two = _zppo(capacity=3)
    two.restore(saved)
    assert [[(e["index"], e.get("prompt")) for e in two.next_batch()] for _ in range(3)] == want


# ============================================================================ BCQ references


def _result_of(ex, correct, g=4, texts=None):
    n = round(correct * g)
    rewards = np.asarray([[1.0, 1, 1]] * n + [[0.0, 1, 1]] * (g - n), np.float32)
    texts = texts or tuple(str(ex["answer"]) if i < n else f"9{i}" for i in range(g))
    return PromptResult(ex["index"], ex, rewards, rewards[:, 0], correct, np.ones(g), texts)


def _zppo_two_digit():
    return ZPPOSource(
        TASK2, UniformSource(TASK2, batch_size=4, seed=0), seed=0, capacity=4, replay_fraction=0.5
    )


def test_zppo_bcq_reference_is_the_teachers_verified_answer_else_the_tasks():
    asked = []

    def teacher(examples):  # verified for prompt 3 only
        asked.append([e["index"] for e in examples])
        return ["TEACHER" if e["index"] == 3 else None for e in examples]

    src = _zppo_two_digit()
    src.use_teacher(teacher)
    ex3, ex5 = TASK2.example("train", 3), TASK2.example("train", 5)
    src.observe(
        [_result_of(ex3, 0.0), _result_of(ex5, 0.25), _result_of(TASK2.example("train", 6), 0.5)]
    )
    assert asked == [[3, 5]]  # once, for the admitted (hard) prompts only
    assert [e.get("reference") for e in src.buffer] == ["TEACHER", None]
    batch = src.next_batch()
    cands = {e["index"]: e["prompt"].split(";")[0].split(",") for e in batch[:2]}
    assert sorted(cands[3]) == sorted(["TEACHER", "90"])
    assert sorted(cands[5]) == sorted([TASK2.demonstration(ex5), "91"])  # task's fallback
    assert src.metrics()["zppo/teacher_references"] == 1.0
    # the reference is part of the saved state: a resumed source needs no teacher for it
    saved = _json(src.state())
    want = [[(e["index"], e.get("prompt")) for e in src.next_batch()] for _ in range(3)]
    two = _zppo_two_digit()
    two.restore(saved)
    assert [[(e["index"], e.get("prompt")) for e in two.next_batch()] for _ in range(3)] == want
    assert two.teacher_references == 1
