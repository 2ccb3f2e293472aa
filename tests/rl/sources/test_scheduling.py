"""Loop-level prompt sources: DAPO dynamic sampling, ADS, ZPPO replay (hand-checked numbers),
each resuming exactly from its JSON state, and a short trainer run of each."""

import dataclasses
import json

import numpy as np
import pytest
from conftest import small_rl_config

from jaxrl_frontier.data.tasks import make_task
from jaxrl_frontier.rl.experience import PromptResult, RolloutRows, ScoredRows
from jaxrl_frontier.rl.sources.ads import ADSSource
from jaxrl_frontier.rl.sources.base import UniformSource
from jaxrl_frontier.rl.sources.dynamic import DynamicSource, signal_groups
from jaxrl_frontier.rl.sources.zppo import ZPPOSource
from jaxrl_frontier.run import trainer as tr

TASK = make_task("arithmetic", max_digits=1, ops="+", prompt_template="{a}{op}{b}=", train_size=64)


def _draw(indices, rewards, g=2) -> ScoredRows:
    """A scored draw of prompts `indices` with per-row rewards [P * G] (one component)."""
    b = len(indices) * g
    rows = RolloutRows(
        examples=tuple({"index": i} for i in indices),
        completion_tokens=np.arange(b)[:, None].repeat(3, 1),
        completion_mask=np.ones((b, 3), np.int32),
        policy_mask=np.ones((b, 3), np.int32),
        policy_logp=np.zeros((b, 3), np.float32),
        texts=tuple(f"t{i}" for i in range(b)),
    )
    z = np.zeros((b, 2), np.int32)
    return ScoredRows(rows, z, z, np.asarray(rewards, np.float32)[:, None], None, 1)


def _json(state):
    return json.loads(json.dumps(state))  # the checkpoint's metadata is JSON


# ============================================================================ dynamic sampling


def test_signal_groups_are_groups_with_unequal_rewards():
    r = np.asarray([[1, 0], [1, 0], [0, 0], [1, 0], [1, 1], [0, 1]], np.float32)  # G = 2
    np.testing.assert_array_equal(signal_groups(r, 2), [False, True, True])


def test_dynamic_sampling_refills_dropped_groups_from_more_draws():
    src = DynamicSource(None, max_draws=4)
    first = _draw([10, 11, 12, 13], [1, 1, 0, 1, 0, 0, 1, 0])  # signal: 11, 13
    second = _draw([20, 21, 22, 23], [0, 0, 1, 0, 1, 1, 0, 1])  # signal: 21, 23
    asked = []
    out, m = src.select(first, lambda i: asked.append(i) or second)
    assert asked == [1]  # one more draw filled the batch
    assert [e["index"] for e in out.rows.examples] == [11, 13, 21, 23]
    assert signal_groups(out.rewards, 2).all()  # no zero-variance group while prompts remain
    np.testing.assert_array_equal(out.rewards[:, 0], [0, 1, 1, 0, 1, 0, 0, 1])
    assert out.rows.texts == ("t2", "t3", "t6", "t7", "t2", "t3", "t6", "t7")
    assert out.n_failed == 2
    assert m["dynamic/draws"] == 2 and m["dynamic/signal_groups"] == 4
    assert m["dynamic/filled_zero_signal"] == 0


def test_dynamic_sampling_stops_at_the_draw_budget_and_reports_the_shortfall():
    src = DynamicSource(None, max_draws=2)
    first = _draw([10, 11, 12, 13], [1, 1, 0, 1, 0, 0, 1, 0])
    flat = _draw([20, 21, 22, 23], [0] * 8)
    calls = []
    out, m = src.select(first, lambda i: calls.append(i) or flat)
    assert calls == [1]  # the budget: 2 draws
    # the 2 signal groups, then zero-signal groups in draw order (10, 12), kept in draw order
    assert [e["index"] for e in out.rows.examples] == [10, 11, 12, 13]
    assert m["dynamic/filled_zero_signal"] == 2 and m["dynamic/signal_groups"] == 2


def test_dynamic_sampling_judges_signal_on_the_weighted_reward():
    # components (correctness, format): group 0 differs only in the unweighted format
    r = np.asarray([[1, 0], [1, 1], [0, 1], [1, 1]], np.float32)
    draw = dataclasses.replace(_draw([10, 11], r[:, 0]), rewards=r)
    src = DynamicSource(None, max_draws=1, weights=[1.0, 0.0])
    out, m = src.select(draw, None)
    assert m["dynamic/signal_groups"] == 1 and m["dynamic/filled_zero_signal"] == 1
    assert [e["index"] for e in out.rows.examples] == [10, 11]  # 11 has signal, 10 fills
    assert DynamicSource(None, max_draws=1).signal(draw).tolist() == [True, True]


def test_dynamic_builder_weighs_correctness_and_the_shaped_components():
    from jaxrl_frontier.rl.sources import make_source
    from jaxrl_frontier.run import config as config_lib
    from jaxrl_frontier.run import sections

    c = config_lib.base_config()
    c.data.source = "dynamic"
    c.rollout.overlong_cache = 2
    src = make_source(TASK, sections.source_options(c), batch_size=4)
    # the task's (correctness, format, length), then the shaper's overlong
    np.testing.assert_array_equal(src.weights, [1.0, 0.0, 0.0, 1.0])
    c.objective.reward_weights = dict(correctness=1.0, length=0.5)
    np.testing.assert_array_equal(
        make_source(TASK, sections.source_options(c), batch_size=4).weights, [1, 0, 0.5, 0]
    )


def test_dynamic_source_resumes_exactly():
    def make():
        return DynamicSource(UniformSource(TASK, batch_size=4, seed=3), max_draws=3)

    one = make()
    one.next_batch()
    saved = _json(one.state())
    want = [[e["index"] for e in one.next_batch()] for _ in range(2)]
    two = make()
    two.restore(saved)
    assert [[e["index"] for e in two.next_batch()] for _ in range(2)] == want
    assert two.draws_total == one.draws_total == 3


# ============================================================================ ADS


class _ClusterTask:
    """20 prompts, cluster 'a' (index < 10) or 'b'."""

    name, reward_names = "clusters", ("correctness",)

    def num_examples(self, split):
        return 20

    def example(self, split, index):
        return {"index": index, "kind": "a" if index < 10 else "b"}

    def prompt(self, ex):
        return f"q{ex['index']}"

    def cluster_key(self, ex):
        return ex["kind"]


def _result(index, correct, kind="a", g=4, texts=()):
    ex = {"index": index, "kind": kind}
    n = round(correct * g)
    rewards = np.asarray([[1.0]] * n + [[0.0]] * (g - n), np.float32)
    return PromptResult(index, ex, rewards, rewards[:, 0], correct, np.ones(g), tuple(texts))


def _ads(task=None, seed=0):
    task = task or _ClusterTask()
    return ADSSource(task, UniformSource(task, batch_size=4, seed=seed), seed=seed, pool=2)


def test_ads_moves_probability_toward_the_boundary_cluster():
    src = _ads()
    src.next_batch()  # both clusters seen: p = 1/2 each
    assert src.p == pytest.approx({"a": 0.5, "b": 0.5})
    src.observe([_result(0, 0.5, "a"), _result(15, 1.0, "b")])
    # s_a = .5 * .5 + .01 = .26, s_b = 0 + .01; p <- .7 p + .3 s / (s_a + s_b)
    assert src.p["a"] == pytest.approx(0.35 + 0.3 * 0.26 / 0.27)  # 0.638889
    assert src.p["b"] == pytest.approx(0.35 + 0.3 * 0.01 / 0.27)  # 0.361111
    src.observe([_result(1, 0.5, "a"), _result(16, 1.0, "b")])
    assert src.p["a"] == pytest.approx(0.7 * 0.638889 + 0.3 * 0.26 / 0.27, abs=1e-6)
    assert src.acc == {"a": 0.5, "b": 1.0}


def test_ads_leaves_a_cluster_that_has_not_run_where_it_entered():
    """Every measured accuracy 0: the unmeasured cluster gains nothing (a made-up accuracy
    of 0.5 would have given it the top score)."""
    src = _ads()
    src.observe([_result(0, 0.0, "a")])  # 'a' measured: p_a = 1
    src.add_cluster("b")  # seen in a pool, not run: p = the mean of the others, 1/2
    assert src.p == pytest.approx({"a": 0.5, "b": 0.5}) and "b" not in src.acc
    src.observe([_result(1, 0.0, "a")])
    # O = {a}, M = 1/2: p_a <- .7 (1/2) + .3 (1/2) s_a / s_a = 1/2; p_b untouched
    assert src.p == pytest.approx({"a": 0.5, "b": 0.5})
    assert "ads/acc/b" not in src.metrics()


def test_ads_prefers_boundary_prompts_inside_a_cluster():
    src = _ads()
    src.observe([_result(0, 0.5), _result(1, 1.0), _result(2, 0.66), _result(3, 0.25)])
    w = [src.prompt_weight({"index": i}) for i in (0, 1, 2, 3, 4)]
    assert w == [4.0, 0.25, 4.0, 0.25, 1.0]  # |sr - .5| <= .17: boundary; 4 never seen


def test_ads_draws_more_from_the_cluster_with_more_probability():
    src = _ads()
    src.next_batch()
    src.p = {"a": 0.95, "b": 0.05}
    kinds = [e["kind"] for _ in range(25) for e in src.next_batch()]
    assert kinds.count("a") > 80  # of 100; uniform would give ~50


def test_ads_resumes_exactly():
    one = _ads(seed=1)
    one.next_batch()
    one.observe([_result(0, 0.5), _result(12, 0.0, "b")])
    saved = _json(one.state())
    want = [[e["index"] for e in one.next_batch()] for _ in range(3)]
    two = _ads(seed=1)
    two.restore(saved)
    assert [[e["index"] for e in two.next_batch()] for _ in range(3)] == want
    assert two.p == one.p


# ============================================================================ ZPPO


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


# ============================================================================ through the trainer


@pytest.mark.parametrize("source", ["dynamic", "ads", "zppo"])
def test_each_source_runs_through_the_trainer_logs_its_metrics_and_resumes(tmp_path, source):
    c = small_rl_config()
    c.data.source = source
    c.data.max_prompt_len = 16 if source == "zppo" else 5  # BCQ / NCQ prompts are longer
    c.train.update(steps=2, log_every=1, eval_every=10**6, checkpoint_every=1)
    c.train.rollout_log_every = 1
    trainer = tr.Trainer(c, str(tmp_path))
    trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
    trainer.run()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    logged = {k for r in rows for k in r}
    want = {"dynamic": "dynamic/draws", "ads": "ads/boundary_share", "zppo": "zppo/buffer_size"}
    assert want[source] in logged and "diag/zero_signal_share" in logged
    if source == "dynamic":  # an untrained policy: most groups all-wrong, so it draws again
        assert max(r.get("dynamic/draws", 0) for r in rows) > 1
    if source == "zppo":  # step 2 replays step 1's failures first: the prompts it sampled on
        logged = [json.loads(line) for line in open(tmp_path / "rollouts.jsonl")]
        replayed = [r["prompt"] for r in logged if r["step"] == 2]
        assert replayed and all(";" in p for p in replayed[:1]), replayed
    # the saved source state resumes the stream: a fresh trainer continues it exactly
    want_next = [e["index"] for e in trainer.source.next_batch()]
    again = tr.Trainer(c, str(tmp_path))
    again.restore()
    assert [e["index"] for e in again.source.next_batch()] == want_next
