"""Prompt clusters (rl/sources/clustering.py): prompt features and k-means by hand, and ADS's
k-means clusters: seeded, checkpointed and resumed exactly, separating prompts that differ
only in the operator, and the clusters key's error."""

import json

import numpy as np
import pytest
from conftest import small_rl_config

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.data.tasks import make_task
from jaxrl_frontier.rl.experience import PromptResult
from jaxrl_frontier.rl.sources import make_source
from jaxrl_frontier.rl.sources.clustering import KMeansClusters, kmeans, prompt_features
from jaxrl_frontier.run.config import sections

TASK = make_task("arithmetic", max_digits=2, ops="+-", prompt_template="{a}{op}{b}=", train_size=64)


def _json(x):
    return json.loads(json.dumps(x))


def _result(ex, correct, g=4, texts=None):
    n = round(correct * g)
    rewards = np.asarray([[1.0, 1, 1]] * n + [[0.0, 1, 1]] * (g - n), np.float32)
    texts = texts or tuple(str(ex["answer"]) if i < n else f"9{i}" for i in range(g))
    return PromptResult(ex["index"], ex, rewards, rewards[:, 0], correct, np.ones(g), texts)


def test_prompt_features_by_hand():
    f = prompt_features("12+345=")
    head = [np.log1p(7), np.log1p(1), 5 / 7, 0, 0, np.log1p(2), np.log1p(3)]
    np.testing.assert_allclose(f[:7], head, rtol=1e-6)
    symbols = dict(zip("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", f[7:]))
    assert symbols["+"] == 1 and symbols["="] == 1 and sum(f[7:]) == 2


def test_kmeans_finds_two_obvious_clusters_and_is_seeded():
    x = np.asarray([[0, 0], [0, 1], [10, 10], [10, 11], [0, 2]], np.float32)
    c = kmeans(x, 2, seed=3)
    np.testing.assert_allclose(sorted(c.tolist()), [[0, 1], [10, 10.5]], atol=1e-6)
    np.testing.assert_array_equal(kmeans(x, 2, seed=3), c)  # the same seed, the same result
    assert len(kmeans(x[:1].repeat(3, 0), 2, seed=0)) == 1  # k capped at the distinct points


def _ads_config(clusters="kmeans", seed=0, k=3):
    c = small_rl_config()
    c.seed = seed
    c.data.source = "ads"
    c.data.ads.update(clusters=clusters, kmeans_k=k, kmeans_sample=64, pool=2)
    return c


def _source(**kwargs):
    return sections.source_options(_ads_config(**kwargs))


def test_ads_kmeans_clusters_are_seeded_checkpointed_and_resume_exactly():
    one = make_source(TASK, _source(), batch_size=4)
    assert isinstance(one.clusters, KMeansClusters)
    keys = {one.clusters.key(TASK.example("train", i)) for i in range(64)}
    assert keys <= {"k0", "k1", "k2"} and len(keys) > 1
    again = make_source(TASK, _source(), batch_size=4)  # same seed: same centroids
    np.testing.assert_array_equal(again.clusters.centroids, one.clusters.centroids)
    batch = one.next_batch()
    one.observe([_result(e, 0.5) for e in batch[:2]] + [_result(e, 1.0) for e in batch[2:]])
    saved = _json(one.state())
    assert saved["clusters"]["centroids"] == one.clusters.centroids.tolist()
    want = [[e["index"] for e in one.next_batch()] for _ in range(3)]
    two = make_source(TASK, _source(), batch_size=4)
    two.clusters.centroids = two.clusters.centroids[::-1] * 0  # the restore must set them
    two.restore(saved)
    np.testing.assert_array_equal(two.clusters.centroids, one.clusters.centroids)
    assert [[e["index"] for e in two.next_batch()] for _ in range(3)] == want
    assert two.p == one.p


def test_ads_kmeans_separates_prompts_that_differ_only_in_the_operator():
    """k = 2 on one-digit '+' / '-' prompts ('a+b=': every other feature is constant, so
    standardised to 0): each cluster holds exactly one operator."""
    task = make_task("arithmetic", max_digits=1, ops="+-", prompt_template="{a}{op}{b}=")
    src = make_source(task, _source(k=2), batch_size=4)
    by_op = {}
    for i in range(64):
        ex = task.example("train", i)
        by_op.setdefault(ex["op"], set()).add(src.clusters.key(ex))
    assert by_op["+"].isdisjoint(by_op["-"]) and all(len(v) == 1 for v in by_op.values())


def test_ads_clusters_key_names_the_allowed_values():
    with pytest.raises(ConfigError, match=r"'data.ads.clusters'.*spectral.*kmeans, task"):
        make_source(TASK, _source(clusters="spectral"), batch_size=4)
