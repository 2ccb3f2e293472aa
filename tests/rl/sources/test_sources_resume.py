"""Each prompt source through the trainer: a short run of DAPO dynamic sampling, ADS and ZPPO
logging their metrics and continuing their stream after a restore, and method combinations
(ADS k-means + DRE + SC-GRPO, dynamic + GD^2PO, ZPPO + a teacher) resuming bitwise from their
checkpoints. (Each source alone: test_dynamic.py, test_ads.py, test_zppo.py,
test_clustering.py, test_teacher_answers.py.)"""

import json

import pytest
from conftest import assert_resumed_run_equal, small_rl_config

from jaxrl_frontier.run import trainer as tr


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
