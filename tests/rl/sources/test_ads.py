"""ADS (rl/sources/ads.py), hand-checked: probability moves toward the boundary cluster, a
cluster that has not run stays where it entered, boundary prompts are preferred inside a
cluster, draws follow the probabilities, and an exact resume from its JSON state. (Its
k-means clusters: test_clustering.py; through the trainer: test_sources_resume.py.)"""

import json

import numpy as np
import pytest

from jaxrl_frontier.rl.experience import PromptResult
from jaxrl_frontier.rl.sources.ads import ADSSource
from jaxrl_frontier.rl.sources.base import UniformSource


def _json(state):
    return json.loads(json.dumps(state))  # the checkpoint's metadata is JSON


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
