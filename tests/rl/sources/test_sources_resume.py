"""ADS's k-means clusters and ZPPO's teacher references (hand-checked), and exact resumes of
the sources that hold them from their JSON state."""

import json

import numpy as np
import pytest
from conftest import SMALL_MODEL, assert_resumed_run_equal, random_model, small_rl_config

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.data.tasks import make_task
from jaxrl_frontier.models.layers import ModelConfig
from jaxrl_frontier.models.tokenizer import CharTokenizer
from jaxrl_frontier.rl.experience import PromptResult
from jaxrl_frontier.rl.sources import make_source
from jaxrl_frontier.rl.sources.base import UniformSource
from jaxrl_frontier.rl.sources.clustering import KMeansClusters, kmeans, prompt_features
from jaxrl_frontier.rl.sources.zppo import ZPPOSource
from jaxrl_frontier.run import sections

TASK = make_task("arithmetic", max_digits=2, ops="+-", prompt_template="{a}{op}{b}=", train_size=64)


def _json(x):
    return json.loads(json.dumps(x))


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


# ============================================================================ ZPPO


def _result(ex, correct, g=4, texts=None):
    n = round(correct * g)
    rewards = np.asarray([[1.0, 1, 1]] * n + [[0.0, 1, 1]] * (g - n), np.float32)
    texts = texts or tuple(str(ex["answer"]) if i < n else f"9{i}" for i in range(g))
    return PromptResult(ex["index"], ex, rewards, rewards[:, 0], correct, np.ones(g), texts)


def _zppo():
    return ZPPOSource(
        TASK, UniformSource(TASK, batch_size=4, seed=0), seed=0, capacity=4, replay_fraction=0.5
    )


def test_zppo_bcq_reference_is_the_teachers_verified_answer_else_the_tasks():
    asked = []

    def teacher(examples):  # verified for prompt 3 only
        asked.append([e["index"] for e in examples])
        return ["TEACHER" if e["index"] == 3 else None for e in examples]

    src = _zppo()
    src.use_teacher(teacher)
    ex3, ex5 = TASK.example("train", 3), TASK.example("train", 5)
    src.observe([_result(ex3, 0.0), _result(ex5, 0.25), _result(TASK.example("train", 6), 0.5)])
    assert asked == [[3, 5]]  # once, for the admitted (hard) prompts only
    assert [e.get("reference") for e in src.buffer] == ["TEACHER", None]
    batch = src.next_batch()
    cands = {e["index"]: e["prompt"].split(";")[0].split(",") for e in batch[:2]}
    assert sorted(cands[3]) == sorted(["TEACHER", "90"])
    assert sorted(cands[5]) == sorted([TASK.demonstration(ex5), "91"])  # task's fallback
    assert src.metrics()["zppo/teacher_references"] == 1.0
    # the reference is part of the saved state: a resumed source needs no teacher for it
    saved = _json(src.state())
    want = [[(e["index"], e.get("prompt")) for e in src.next_batch()] for _ in range(3)]
    two = _zppo()
    two.restore(saved)
    assert [[(e["index"], e.get("prompt")) for e in two.next_batch()] for _ in range(3)] == want
    assert two.teacher_references == 1


def test_teacher_answers_keep_only_verified_greedy_answers():
    """The teacher's greedy completions decoded and scored: the one the scorer accepts is
    returned (stripped), the other None."""
    import jax

    from jaxrl_frontier.models.text import decode
    from jaxrl_frontier.rl.sources.teacher_answers import TeacherAnswers
    from jaxrl_frontier.sampling import Sampler, SamplingParams

    tok = CharTokenizer()
    model = random_model(ModelConfig(vocab_size=tok.vocab_size, **SMALL_MODEL))

    class FirstOnly:
        reward_names = ("correctness",)

        def __call__(self, examples, texts):
            return np.asarray([[1.0]] + [[0.0]] * (len(texts) - 1)), 0

    task = make_task("arithmetic", max_digits=1, ops="+", prompt_template="{a}{op}{b}=")
    examples = [task.example("train", i) for i in (0, 1)]
    answers = TeacherAnswers(model, tok, task, FirstOnly(), max_prompt_len=5, max_new_tokens=3)
    got = answers(examples)
    from jaxrl_frontier.models.text import encode_prompts

    t, m = encode_prompts(tok, [task.prompt(e) for e in examples], 5)
    params = SamplingParams(greedy=True, n=1, max_new_tokens=3, eos_ids=(tok.eos_id,))
    ro = Sampler(model, pad_id=tok.pad_id).generate(t, m, params, jax.random.key(0))
    texts = decode(tok, np.asarray(ro.completion_tokens), np.asarray(ro.completion_mask))
    assert got == [texts[0].strip() or None, None]


# ============================================================================ through the trainer

METHODS = {
    # ADS over k-means clusters, DRE editing, overlong shaping, SC-GRPO's pass and weight
    "ads_kmeans+dre+sc_grpo": {
        "data.source": "ads",
        "data.ads.clusters": "kmeans",
        "data.ads.kmeans_k": 3,
        "data.ads.kmeans_sample": 64,
        "rollout.editors": ("dre",),
        "rollout.overlong_cache": 2,
        "objective.weight": "sc_grpo",
    },
    # DAPO dynamic sampling (its draws) on GD^2PO's conflicting rewards
    "dynamic+gd2po": {
        "data.source": "dynamic",
        "objective.advantage": "gd2po",
        "objective.reward_weights": {"correctness": 1.0, "length": 0.5},
    },
    # ZPPO's replay with BCQ references asked of a teacher model; DAPO's truncation mask
    "zppo+teacher": {
        "data.source": "zppo",
        "data.max_prompt_len": 16,
        "teacher.init": "scratch",
        "rollout.mask_truncated": True,
    },
}


def _trainer(tmp_path, overrides, steps):
    from jaxrl_frontier.run import trainer as tr

    c = small_rl_config()
    for key, value in overrides.items():
        section, name = key.rsplit(".", 1)
        c[section][name] = value
    c.optimizer.update(lr=1e-2, warmup_steps=0)
    c.train.update(steps=steps, log_every=1, eval_every=10**6, checkpoint_every=1)
    trainer = tr.Trainer(c, str(tmp_path))
    trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
    return trainer


@pytest.mark.parametrize("method", list(METHODS))
def test_each_method_resumes_bitwise_from_its_checkpoint(tmp_path, method):
    """3 uninterrupted steps == 2 steps, a new trainer on the same workdir, 1 more step:
    the same parameters and the same logged numbers for step 3 (the source's state, the
    editors and the passes all come back from the checkpoint)."""

    full = _trainer(tmp_path / "full", METHODS[method], 3)
    full.run()
    _trainer(tmp_path / "cut", METHODS[method], 2).run()
    resumed = _trainer(tmp_path / "cut", METHODS[method], 3)
    resumed.run()
    row = assert_resumed_run_equal(full, resumed, tmp_path / "full", tmp_path / "cut", step=3)
    own = {
        "ads_kmeans+dre+sc_grpo": ("ads/p/k0", "dre/edited"),
        "zppo+teacher": ("zppo/buffer_size", "zppo/teacher_references"),
        "dynamic+gd2po": ("dynamic/draws", "diag/conflict_share"),
    }
    assert all(k in row for k in own[method]), sorted(row)
