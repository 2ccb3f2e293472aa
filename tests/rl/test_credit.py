"""rl.credit.compute_advantages: reward weights, kl_in_reward, group vs token entries,
opd_hybrid and group_size injection, against hand-computed numbers."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.objectives import ADVANTAGES, TokenStats
from jaxrl_frontier.objectives.distillation import KL_ESTIMATORS
from jaxrl_frontier.rl import credit

NAMES = ("correctness", "format")
# P = 1 prompt, G = 4 completions, K = 2 components
R_PGK = np.array([[[1, 1], [0, 1], [1, 0], [0, 0]]], np.float32)
MASK = np.array([[0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 1], [0, 1, 1, 0]], np.float32)
OLD = np.log(np.array([[1, 0.5, 0.5, 1], [1, 0.2, 1, 1], [1, 0.9, 0.3, 0.6], [1, 0.4, 0.8, 1]]))
REF = np.log(np.array([[1, 0.25, 0.5, 1], [1, 0.4, 1, 1], [1, 0.9, 0.6, 0.3], [1, 0.5, 0.2, 1]]))
TEACHER = OLD + np.array([[0, -0.3, 0.2, 0], [0, 0.1, 0, 0], [0, -1, 0.5, 0.4], [0, 0, -0.2, 0]])


def stats(mask=MASK, old=OLD, ref=REF, teacher=TEACHER):
    f = lambda x: None if x is None else jnp.asarray(x * mask, jnp.float32)
    return TokenStats(
        logp=f(old),
        old_logp=f(old),
        mask=jnp.asarray(mask),
        ref_logp=f(ref),
        teacher_logp=f(teacher),
    )


def run(objective, rewards=R_PGK, names=NAMES, st=None):
    st = stats() if st is None else st
    fn = jax.jit(lambda r, s: credit.compute_advantages(objective, r, names, s))
    adv, r_pg = fn(jnp.asarray(rewards), st)
    return np.asarray(adv), np.asarray(r_pg)


def k(name, d):
    return np.asarray(KL_ESTIMATORS.get(name)(jnp.asarray(d, jnp.float32)))


def test_reward_weights_empty_means_correctness_only():
    adv, r_pg = run({"advantage": "dr_grpo", "reward_weights": {}})
    np.testing.assert_allclose(r_pg, [[1, 0, 1, 0]])
    np.testing.assert_allclose(adv, np.array([0.5, -0.5, 0.5, -0.5])[:, None] * MASK)
    adv, r_pg = run({"advantage": "dr_grpo", "reward_weights": {"correctness": 1.0, "format": 0.5}})
    np.testing.assert_allclose(r_pg, [[1.5, 0.5, 1.0, 0.0]])  # mean 0.75
    np.testing.assert_allclose(adv, np.array([0.75, -0.25, 0.25, -0.75])[:, None] * MASK)


@pytest.mark.parametrize("name", ["gdpo", "gd2po"])
def test_multi_component_advantages_weigh_correctness_only_by_default(name):
    # correctness [1, 0, 1, 0]: a = 0.5 / (std 1/sqrt(3) + 1e-4), then whitened over the
    # batch: +-a / (a * sqrt(4/3) + 1e-4); no conflicts with a zero-weight format component
    # (gd2po whitens over tokens: lengths 2, 1, 3, 2, mean a/4, var 15/14 a^2)
    a = 0.5 / (1 / math.sqrt(3) + 1e-4)
    x = np.array([1, -1, 1, -1]) * a
    if name == "gdpo":
        expected = x / (a * math.sqrt(4 / 3) + 1e-4)
    else:
        expected = (x - a / 4) / (a * math.sqrt(15 / 14) + 1e-4)
    adv, _ = run({"advantage": name, "reward_weights": {}})
    np.testing.assert_allclose(adv[:, 1], expected, rtol=1e-5)
    both, _ = run({"advantage": name, "reward_weights": {"correctness": 1.0, "format": 1.0}})
    assert np.abs(both - adv).max() > 0.1  # the old behaviour: every component by 1


def test_kl_in_reward_k1_sequence_sum_for_group_advantages():
    obj = {"advantage": "dr_grpo", "kl_in_reward": True, "kl_coef": 0.1, "kl_estimator": "k1"}
    adv, r_pg = run(obj)
    d = (OLD - REF) * MASK  # rows: log 2; log 0.5; log 0.5 + log 2; log 0.8 + log 4
    kl_seq = np.array([math.log(2), math.log(0.5), 0.0, math.log(0.8) + math.log(4)])
    np.testing.assert_allclose(d.sum(1), kl_seq, atol=1e-6)
    np.testing.assert_allclose(r_pg[0], [1, 0, 1, 0] - 0.1 * kl_seq, rtol=1e-5)
    np.testing.assert_allclose(adv[:, 1], r_pg[0] - r_pg[0].mean(), rtol=1e-5, atol=1e-7)


def test_kl_in_reward_uses_the_configured_estimator():
    obj = {"advantage": "dr_grpo", "kl_in_reward": True, "kl_coef": 0.2, "kl_estimator": "k3"}
    _, r_pg = run(obj)
    d = (OLD - REF) * MASK
    k3 = np.where(MASK > 0, np.exp(-d) + d - 1, 0.0)  # k3 = exp(-d) + d - 1
    np.testing.assert_allclose(r_pg[0], [1, 0, 1, 0] - 0.2 * k3.sum(1), rtol=1e-5)


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_kl_in_reward_applies_to_every_advantage(name):
    off = {"advantage": name, "reward_weights": {"correctness": 1.0}}
    on = {**off, "kl_in_reward": True, "kl_coef": 0.3, "kl_estimator": "k2"}
    adv_off, r_off = run(off)
    adv_on, r_on = run(on)
    k2 = np.where(MASK > 0, k("k2", (OLD - REF) * MASK), 0.0)
    np.testing.assert_allclose(r_on - r_off, [-0.3 * k2.sum(1)], rtol=1e-5, atol=1e-7)
    assert np.abs(adv_on - adv_off).max() > 1e-3, name
    assert np.all(adv_on[MASK == 0] == 0.0)


def test_kl_in_reward_per_token_for_opd():
    obj = {"advantage": "opd", "kl_in_reward": True, "kl_coef": 0.5, "kl_estimator": "k1"}
    adv, _ = run(obj)
    a = (TEACHER - OLD) * MASK  # immediate: A_t = a_t - beta * k1_t
    np.testing.assert_allclose(adv, (a - 0.5 * (OLD - REF)) * MASK, rtol=1e-5, atol=1e-6)
    obj["advantage_kwargs"] = {"estimator": "return_to_go"}
    adv, _ = run(obj)
    x = (a - 0.5 * (OLD - REF)) * MASK
    rtg = np.cumsum(x[:, ::-1], axis=1)[:, ::-1] * MASK
    np.testing.assert_allclose(adv, rtg, rtol=1e-5, atol=1e-6)


def test_opd_hybrid_is_grpo_on_the_sequence_reward_plus_opd():
    adv, _ = run({"advantage": "opd_hybrid", "advantage_kwargs": {"coef": 0.5}})
    g = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # grpo of [1, 0, 1, 0]
    task = np.array([g, -g, g, -g])[:, None]
    np.testing.assert_allclose(adv, (task + 0.5 * (TEACHER - OLD)) * MASK, rtol=1e-5, atol=1e-6)


def test_group_size_is_g_for_token_estimators():
    # two prompts of G = 2: gae's baseline averages over a group, not over the whole batch
    r = R_PGK.reshape(2, 2, 2)
    obj = {"advantage": "opd", "advantage_kwargs": {"estimator": "gae", "gamma": 1.0, "lam": 0.5}}
    adv, _ = run(obj, rewards=r)
    st = stats()
    per_group = ADVANTAGES.get("opd")(st, estimator="gae", lam=0.5, group_size=2)
    whole = ADVANTAGES.get("opd")(st, estimator="gae", lam=0.5, group_size=4)
    np.testing.assert_allclose(adv, per_group, rtol=1e-6, atol=1e-7)
    assert np.abs(np.asarray(per_group) - np.asarray(whole)).max() > 1e-3


def test_reinforce_pp_whitens_over_tokens():
    adv, r_pg = run({"advantage": "reinforce_pp"})
    c = np.array([0.5, -0.5, 0.5, -0.5])  # R - mean_g, weighted by lengths 2, 1, 3, 2
    n = MASK.sum(1)
    mu = (n * c).sum() / n.sum()
    var = (n * (c - mu) ** 2).sum() / (n.sum() - 1)
    np.testing.assert_allclose(adv[:, 1], (c - mu) / math.sqrt(var + 1e-8), rtol=1e-5)


@pytest.mark.parametrize("name", ["grpo", "rloo", "dr_grpo", "reinforce_pp", "gdpo", "gd2po"])
def test_constant_unrepresentable_group_gives_exactly_zero(name):
    r = np.full((2, 7, 2), 0.9, np.float32)
    r[1, :, 0] = [1, 0, 0, 1, 1, 0, 1]
    mask = np.ones((14, 3), np.float32)
    mask[:, 0] = 0
    st = TokenStats(logp=jnp.zeros((14, 3)), old_logp=jnp.zeros((14, 3)), mask=jnp.asarray(mask))
    adv, _ = run({"advantage": name}, rewards=r, st=st)
    assert np.all(adv[:7] == 0.0)
    assert np.all(adv[7:, 1:] != 0.0)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="correctnes.*correctness, format"):
        run({"reward_weights": {"correctnes": 1.0}})
    with pytest.raises(ValueError, match="no 'correctness' reward"):
        run({}, rewards=R_PGK, names=("accuracy", "format"))
    with pytest.raises(ValueError, match="ref_logp"):
        run({"kl_in_reward": True, "kl_coef": 0.1}, st=stats(ref=None))


def test_zero_variance_groups():
    r = jnp.asarray([[1.0, 1.0], [0.0, 1.0], [0.9, 0.9]])
    assert int(jax.jit(credit.zero_variance_groups)(r)) == 2
