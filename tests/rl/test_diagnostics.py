"""Diagnostics: the per-step signal metrics by hand, p*(G), the reward components' conflict
share and its run, and the collapse early stop (train/collapse.py) through the trainer, whose
first rows hold the diag/ metrics."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import small_rl_config

from jaxrl_frontier.rl import diagnostics as dg
from jaxrl_frontier.run import trainer as tr


def test_p_star_is_where_half_the_groups_are_all_equal():
    p = dg.p_star(8)
    assert p == pytest.approx(0.0830, abs=1e-4)  # the paper's p*(8) = 0.083
    assert p**8 + (1 - p) ** 8 == pytest.approx(0.5, abs=1e-9)
    assert dg.p_star(4) == pytest.approx(1 - 0.5**0.25, abs=1e-3)  # 0.159 (p^4 adds ~6e-4)


def test_expected_advantage_variance_matches_sampled_bernoulli_groups():
    rng = np.random.default_rng(0)
    for p, g in [(0.3, 8), (0.5, 4), (0.1, 16)]:
        r = (rng.random((200_000, g)) < p).astype(np.float64)
        measured = np.mean(np.mean((r - r.mean(1, keepdims=True)) ** 2, axis=1))
        want = dg.expected_advantage_variance(p, g)
        assert measured == pytest.approx(want, rel=0.01)
    assert dg.expected_advantage_variance(0.75, 4) == pytest.approx(0.140625)


def test_rollout_diagnostics_by_hand():
    old_logp = jnp.asarray([[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]])
    mask = jnp.asarray([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    r_pg = jnp.asarray([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    d = {k: float(v) for k, v in dg.rollout_diagnostics(old_logp, mask, r_pg, r_pg > 0).items()}
    assert d["diag/entropy"] == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    assert d["diag/pass_rate"] == pytest.approx(0.75)
    assert d["diag/expected_adv_var"] == pytest.approx(0.75 * 0.25 * 3 / 4)
    assert d["diag/adv_var"] == pytest.approx((0.25 + 0.0) / 2)
    assert d["diag/zero_signal_share"] == 0.5
    assert d["diag/p_star_alarm"] == 0.0
    low = jnp.zeros((4, 4)).at[0, 0].set(1.0)  # p = 1/16 < p*(4)
    d = dg.rollout_diagnostics(jnp.zeros((16, 3)), jnp.ones((16, 3)), low, low.reshape(-1) > 0)
    assert float(d["diag/p_star_alarm"]) == 1.0 and float(d["diag/zero_signal_share"]) == 0.75


def test_collapse_early_stop_through_the_trainer_exports_the_peak(tmp_path):
    c = small_rl_config()
    c.train.update(steps=8, log_every=1, eval_every=1, checkpoint_every=10**6, export="best")
    c.train.collapse.update(stop=True, rise=0.05, drop=0.05, patience=2)
    trainer = tr.Trainer(c, str(tmp_path))
    curve = iter([0.1, 0.3, 0.5, 0.3, 0.2, 0.9, 0.9, 0.9])
    trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": next(curve)}
    exports = []
    trainer.export = lambda path=None: exports.append(int(trainer.state.step))
    out = trainer.run()
    assert out["step"] == 5 and exports == [1, 2, 3]  # stopped at the collapse; peak at 3
    assert out["history"]["collapse"] == dict(collapse_at=5, peak_step=3, peak=0.5, next_budget=6)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert {"diag/entropy", "diag/expected_adv_var", "diag/zero_signal_share"} <= set(rows[0])
    # the same command again trains no further (the history says it collapsed)
    again = tr.Trainer(c, str(tmp_path))
    again.evaluate = trainer.evaluate
    assert again.run()["step"] == 5


def test_conflict_share_by_hand():
    # one group of G = 3, components (correctness, brevity), weights (1, 0.5)
    r = jnp.asarray([[[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]])
    # centred: correctness (2/3, -1/3, -1/3), brevity (-2/3, 1/3, 1/3): every row disagrees
    assert float(dg.conflict_share(r, jnp.asarray([1.0, 0.5]))) == 1.0
    agree = jnp.asarray([[[1.0, 1.0], [0.0, 0.0], [0.0, 1.0]]])
    # centred: (2/3, -1/3, -1/3), (1/3, -2/3, 1/3): row 2 disagrees -> 1/3
    assert float(dg.conflict_share(agree, jnp.asarray([1.0, 0.5]))) == pytest.approx(1 / 3)
    assert float(dg.conflict_share(r, jnp.asarray([1.0, 0.0]))) == 0.0  # one weighted reward


def test_conflict_share_is_the_share_of_rows_gd2po_hard_masking_zeroes():
    """On binary correctness x graded brevity rewards (no constant group), the rows
    gd2po(mode='hard') sets to 0 are exactly the conflicting ones diag/conflict_share counts."""
    from jaxrl_frontier.objectives.advantages import ADVANTAGES

    rng = np.random.default_rng(0)
    correct = rng.integers(0, 2, (16, 8)).astype(np.float32)
    correct[:, 0], correct[:, 1] = 1.0, 0.0  # every group has signal on correctness
    brevity = rng.uniform(0, 1, (16, 8)).astype(np.float32)
    r = jnp.asarray(np.stack([correct, brevity], -1))
    adv = np.asarray(ADVANTAGES.get("gd2po")(r, reward_weights=(1.0, 0.5), mode="hard"))
    share = float(dg.conflict_share(r, jnp.asarray([1.0, 0.5])))
    assert 0.2 < share < 0.8  # both kinds of rows present
    assert np.mean(adv == 0.0) == pytest.approx(share)


def test_gd2po_run_logs_per_component_rewards_and_the_conflict_share(tmp_path):
    c = small_rl_config()
    c.objective.update(advantage="gd2po")
    c.objective.reward_weights = dict(correctness=1.0, length=0.5)
    c.train.update(steps=2, log_every=1, eval_every=10**6, checkpoint_every=10**6)
    trainer = tr.Trainer(c, str(tmp_path))
    trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
    trainer.run()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    want = {"reward/correctness", "reward/length", "diag/conflict_share"}
    assert all(want <= set(r) for r in rows if "train/loss" in r)
    assert all(0.0 <= r["diag/conflict_share"] <= 1.0 for r in rows if "train/loss" in r)
