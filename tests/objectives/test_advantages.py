"""Advantage estimators: group baselines against hand numbers and NumPy loops over groups,
token-level OPD / progress estimators against slow loops, and the zero-variance count."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.objectives import (
    ADVANTAGES,
    TokenStats,
    advantage_level,
    sequence_to_tokens,
    step_scores,
    zero_variance_groups,
)
from jaxrl_frontier.objectives.advantages import group_advantage_names, token_advantage_names

REWARDS = np.array(
    [
        [1.0, 0.0, 0.0, 1.0],
        [1.0, 1.0, 1.0, 1.0],  # zero-variance group
        [0.0, 0.0, 0.0, 1.0],
        [0.2, 0.7, 0.4, 0.1],
    ],
    np.float32,
)
P, G = REWARDS.shape

# ----------------------------------------------------------------------------- NumPy references


def np_std(x):
    x = np.asarray(x, np.float64)
    return math.sqrt(sum((v - x.mean()) ** 2 for v in x) / (len(x) - 1))


def ref_group(name, R, **kw):
    R = np.asarray(R, np.float64)
    out = np.zeros_like(R)
    for g in range(R.shape[0]):
        r = R[g]
        mean = sum(r) / len(r)
        for i in range(len(r)):
            if name == "grpo":
                out[g, i] = (r[i] - mean) / (np_std(r) + 1e-6)
            elif name == "dr_grpo":
                out[g, i] = r[i] - mean
            elif name == "rloo":
                out[g, i] = r[i] - (sum(r) - r[i]) / (len(r) - 1)
            elif name == "reinforce":
                out[g, i] = r[i] - R.mean()
            elif name == "reinforce_pp":
                out[g, i] = r[i] - mean
    if name == "reinforce_pp":
        n = np.ones_like(R) if kw.get("lengths") is None else np.asarray(kw["lengths"], np.float64)
        mu = (n * out).sum() / n.sum()
        var = (n * (out - mu) ** 2).sum() / (n.sum() - 1)
        out = (out - mu) / math.sqrt(var + 1e-8)
        out[np.all(R == R[:, :1], axis=1)] = 0.0
    return out


def ref_components(R_pgk):
    A = np.zeros_like(R_pgk, np.float64)
    for g in range(R_pgk.shape[0]):
        for k in range(R_pgk.shape[2]):
            r = R_pgk[g, :, k].astype(np.float64)
            A[g, :, k] = (r - r.mean()) / (np_std(r) + 1e-4)
    return A


def ref_gdpo(R_pgk, w):
    x = (ref_components(R_pgk) * np.asarray(w)).sum(-1)
    flat = x.reshape(-1)
    out = (x - flat.mean()) / (np_std(flat) + 1e-4)
    out[np.all(R_pgk == R_pgk[:, :1], axis=(1, 2))] = 0.0
    return out


def ref_gd2po(R_pgk, w, mode="hard", tau=0.2, off=(), lengths=None):
    A = ref_components(R_pgk) * np.asarray(w)
    Pn, Gn, K = A.shape
    keep = np.ones((Pn, Gn))
    for g in range(Pn):
        for i in range(Gn):
            a = A[g, i]
            conflict = any(a[k] > 1e-8 and a[j] < -1e-8 for k in range(K) for j in range(K))
            if mode == "soft":
                s = a.sum() / (np.abs(a).sum() + 1e-6)
                conflict = conflict and abs(s) < tau
            keep[g, i] = 0.0 if conflict and "conflict_mask" not in off else 1.0
    rho = 1.0 if "query_reweight" in off else keep.mean(1, keepdims=True)
    x = A.sum(-1) * rho * keep
    n = keep * (1.0 if lengths is None else np.asarray(lengths, np.float64))  # tokens per row
    mean = (n * x).sum() / n.sum()
    std = math.sqrt((n * (x - mean) ** 2).sum() / (n.sum() - 1))
    out = np.where(keep > 0, (x - mean) / (std + 1e-4), 0.0)
    const = np.all(R_pgk == R_pgk[:, :1], axis=(1, 2))
    out[const] = 0.0
    return out


# ----------------------------------------------------------------------------- group baselines


def test_registry_kinds():
    assert set(group_advantage_names()) == {
        "grpo",
        "dr_grpo",
        "rloo",
        "reinforce",
        "reinforce_pp",
        "gdpo",
        "gd2po",
        "gae",
    }
    assert set(token_advantage_names()) == {"opd", "opd_hybrid", "progress"}
    assert advantage_level("opd") == "token" and advantage_level("grpo") == "group"


def test_grpo_hand_numbers():
    # group [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3) -> +-0.5 * sqrt(3) = +-0.8660
    A = np.asarray(ADVANTAGES.get("grpo")(REWARDS))
    np.testing.assert_allclose(A[0], [0.866025, -0.866025, -0.866025, 0.866025], rtol=1e-5)
    # group [0, 0, 0, 1]: mean 0.25, std 0.5 -> -0.5, -0.5, -0.5, 1.5
    np.testing.assert_allclose(A[2], [-0.5, -0.5, -0.5, 1.5], rtol=1e-5)
    np.testing.assert_allclose(
        ADVANTAGES.get("rloo")(REWARDS)[2], [-1 / 3, -1 / 3, -1 / 3, 1.0], rtol=1e-6
    )
    np.testing.assert_allclose(ADVANTAGES.get("dr_grpo")(REWARDS)[2], [-0.25, -0.25, -0.25, 0.75])


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce", "reinforce_pp"])
def test_group_baseline_matches_numpy_loop(name):
    A = np.asarray(ADVANTAGES.get(name)(jnp.asarray(REWARDS)))
    np.testing.assert_allclose(A, ref_group(name, REWARDS), rtol=1e-5, atol=1e-6)


def test_reinforce_pp_token_weighted_whitening():
    lengths = np.array([[3, 1, 2, 5], [4, 4, 4, 4], [1, 2, 3, 4], [2, 2, 1, 1]], np.float32)
    A = ADVANTAGES.get("reinforce_pp")(REWARDS, lengths=jnp.asarray(lengths))
    np.testing.assert_allclose(A, ref_group("reinforce_pp", REWARDS, lengths=lengths), rtol=1e-5)


def test_grpo_scales():
    R = jnp.asarray(REWARDS)
    centred = REWARDS - REWARDS.mean(1, keepdims=True)
    np.testing.assert_allclose(ADVANTAGES.get("grpo")(R, scale="none"), centred, atol=1e-6)
    batch_std = np.std(REWARDS.astype(np.float64), ddof=1)
    np.testing.assert_allclose(
        ADVANTAGES.get("grpo")(R, scale="batch"), centred / (batch_std + 1e-6), rtol=1e-5, atol=1e-6
    )
    with pytest.raises(ValueError, match="scale"):
        ADVANTAGES.get("grpo")(R, scale="row")


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp", "gdpo", "gd2po"])
def test_equal_rewards_give_zero_advantage(name):
    A = np.asarray(ADVANTAGES.get(name)(jnp.asarray(REWARDS)))
    assert np.all(A[1] == 0.0)
    assert np.all(np.isfinite(A))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp", "gdpo", "gd2po"])
def test_equal_unrepresentable_rewards_give_exactly_zero(name):
    # 0.9 is not a float32: the plain group mean rounds, and (R - mean) / (std + 1e-6) gave
    # about +-0.1 on a group with no signal at all. Beside a group with signal (whitening).
    R = np.full((2, 7), 0.9, np.float32)
    R[1] = [0.1, 0.9, 0.3, 0.3, 0.7, 0.2, 0.9]
    A = np.asarray(jax.jit(ADVANTAGES.get(name))(jnp.asarray(R)))
    assert np.all(A[0] == 0.0), A[0]
    assert np.all(A[1] != 0.0)
    for scale in ("batch", "none"):
        if name == "grpo":
            assert np.all(np.asarray(ADVANTAGES.get(name)(R, scale=scale))[0] == 0.0)


@pytest.mark.parametrize("name", ["gdpo", "gd2po"])
def test_constant_component_contributes_nothing_whatever_its_weight(name):
    # component 1 is 0.9 everywhere: its decoupled advantage must be exactly 0, so its weight
    # cannot matter (and gd2po must not see sign conflicts in its rounding residue)
    R = np.full((2, 7, 2), 0.9, np.float32)
    R[:, :, 0] = [[1, 0, 0, 1, 1, 0, 1], [0, 0, 1, 0, 0, 0, 1]]
    fn = ADVANTAGES.get(name)
    only_first = np.asarray(fn(R, reward_weights=(1.0, 0.0)))
    np.testing.assert_array_equal(np.asarray(fn(R, reward_weights=(1.0, 5.0))), only_first)
    np.testing.assert_allclose(only_first, ref_gdpo(R[..., :1], (1.0,)), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_vmapped_equals_python_loop_over_groups(name):
    fn = ADVANTAGES.get(name)
    batched = np.asarray(jax.jit(fn)(jnp.asarray(REWARDS)))
    looped = np.concatenate([np.asarray(fn(jnp.asarray(REWARDS[g : g + 1]))) for g in range(P)])
    np.testing.assert_allclose(batched, looped, rtol=1e-6, atol=1e-7)


def test_rloo_identity():
    R = np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32)
    A = np.asarray(ADVANTAGES.get("rloo")(R))
    np.testing.assert_allclose(A, 6 / 5 * (R - R.mean(1, keepdims=True)), rtol=1e-5, atol=1e-6)


def test_dr_grpo_does_not_divide_by_std():
    R = jnp.asarray(REWARDS)
    np.testing.assert_allclose(
        ADVANTAGES.get("dr_grpo")(10 * R), 10 * ADVANTAGES.get("dr_grpo")(R), rtol=1e-5
    )
    np.testing.assert_allclose(
        ADVANTAGES.get("grpo")(10 * R), ADVANTAGES.get("grpo")(R), rtol=1e-4, atol=1e-6
    )


def test_binary_reward_advantage_variance_monte_carlo():
    p, g, n_groups = 0.3, 8, 40_000
    R = jax.random.bernoulli(jax.random.key(0), p, (n_groups, g)).astype(jnp.float32)
    A = ADVANTAGES.get("dr_grpo")(R)
    # E[A^2] = Var(R_i - mean_g) = p (1 - p) (g - 1) / g; MC error ~ 1e-3 here
    np.testing.assert_allclose(float(jnp.mean(A**2)), p * (1 - p) * (g - 1) / g, rtol=0.02)


def test_multi_component_rewards_combine_with_weights():
    R = np.random.default_rng(1).normal(size=(3, 4, 2)).astype(np.float32)
    A = ADVANTAGES.get("grpo")(R, reward_weights=(1.0, 0.5))
    np.testing.assert_allclose(
        A, ref_group("grpo", R[..., 0] + 0.5 * R[..., 1]), rtol=1e-5, atol=1e-6
    )
    with pytest.raises(ValueError, match="reward_weights"):
        ADVANTAGES.get("grpo")(R, reward_weights=(1.0,))


MULTI = np.array(
    [
        [[1, 0], [0, 1], [1, 1], [0, 0]],  # rows 0, 1 conflict
        [[1, 1], [1, 1], [1, 1], [1, 1]],  # zero variance
        [[1, 0.2], [0, 0.9], [1, 0.5], [1, 0.4]],
    ],
    np.float32,
)


def test_gdpo_matches_numpy():
    A = ADVANTAGES.get("gdpo")(MULTI, reward_weights=(1.0, 2.0))
    np.testing.assert_allclose(A, ref_gdpo(MULTI, (1.0, 2.0)), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("term", ["conflict_mask", "query_reweight"])
def test_gd2po_needs_each_term_at_its_defaults(term):
    """On these rewards leaving either term out changes the advantages, and the entry at its
    defaults (hard mode) equals the full formula: an entry without the term fails here."""
    full = ref_gd2po(MULTI, (1.0, 1.0))
    assert np.abs(full - ref_gd2po(MULTI, (1.0, 1.0), off={term})).max() > 1e-2
    np.testing.assert_allclose(ADVANTAGES.get("gd2po")(MULTI), full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode,tau", [("hard", 0.2), ("soft", 0.2), ("soft", 0.9)])
def test_gd2po_matches_numpy(mode, tau):
    A = np.asarray(ADVANTAGES.get("gd2po")(MULTI, mode=mode, tau=tau))
    np.testing.assert_allclose(A, ref_gd2po(MULTI, (1.0, 1.0), mode, tau), rtol=1e-4, atol=1e-5)
    if mode == "hard":  # the two conflicting rollouts of group 0 are dropped
        assert A[0, 0] == 0.0 and A[0, 1] == 0.0 and A[0, 2] != 0.0


def test_zero_variance_groups():
    assert int(zero_variance_groups(jnp.asarray(REWARDS))) == 1
    assert int(zero_variance_groups(jnp.asarray(MULTI))) == 1
    assert int(jax.jit(zero_variance_groups)(jnp.zeros((3, 4)))) == 3


def test_sequence_to_tokens_prompt_major():
    mask = jnp.ones((P * G, 3))
    A = sequence_to_tokens(jnp.asarray(REWARDS), mask)
    assert A.shape == (P * G, 3)
    np.testing.assert_array_equal(A[1 * G + 3], [REWARDS[1, 3]] * 3)


def test_group_of_one_is_rejected():
    with pytest.raises(ValueError, match="G >= 2"):
        ADVANTAGES.get("grpo")(jnp.ones((3, 1)))


# ----------------------------------------------------------------------------- token level

MASK = np.array(
    [
        [0, 1, 1, 1, 1],
        [0, 1, 1, 0, 0],
        [0, 1, 1, 1, 0],
        [0, 1, 1, 1, 1],
    ],
    np.float32,
)


def token_stats(seed=0):
    rng = np.random.default_rng(seed)
    old = np.log(rng.uniform(0.1, 0.9, MASK.shape)).astype(np.float32)
    return TokenStats(
        logp=jnp.asarray(old),
        old_logp=jnp.asarray(old),
        mask=jnp.asarray(MASK),
        teacher_logp=jnp.asarray(np.log(rng.uniform(0.1, 0.9, MASK.shape)).astype(np.float32)),
        ref_logp=jnp.asarray(np.log(rng.uniform(0.1, 0.9, MASK.shape)).astype(np.float32)),
    )


def ref_returns(a, mask, gamma):
    out = np.zeros_like(a, np.float64)
    for b in range(a.shape[0]):
        valid = [t for t in range(a.shape[1]) if mask[b, t] > 0]
        for i, t in enumerate(valid):
            out[b, t] = sum(gamma ** (j - i) * a[b, valid[j]] for j in range(i, len(valid)))
    return out


def ref_gae(a, mask, gamma, lam, group_size):
    Bn, Tn = a.shape
    ret = ref_returns(a, mask, gamma)
    V = np.zeros_like(ret)
    for b in range(Bn):
        g0 = (b // group_size) * group_size
        for t in range(Tn):
            if mask[b, t] > 0:
                rows = [c for c in range(g0, g0 + group_size) if mask[c, t] > 0]
                V[b, t] = sum(ret[c, t] for c in rows) / len(rows)
    delta = np.zeros_like(ret)
    for b in range(Bn):
        for t in range(Tn):
            if mask[b, t] > 0:
                v_next = V[b, t + 1] if t + 1 < Tn and mask[b, t + 1] > 0 else 0.0
                delta[b, t] = a[b, t] + gamma * v_next - V[b, t]
    return ref_returns(delta, mask, gamma * lam), ret, V


def test_opd_estimators_match_numpy():
    stats = token_stats()
    a = np.asarray(stats.teacher_logp - stats.old_logp, np.float64) * MASK
    opd = ADVANTAGES.get("opd")
    np.testing.assert_allclose(opd(stats), a, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
        opd(stats, estimator="return_to_go"), ref_returns(a, MASK, 1.0), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        opd(stats, estimator="discounted", gamma=0.9),
        ref_returns(a, MASK, 0.9),
        rtol=1e-5,
        atol=1e-6,
    )
    for lam in (0.0, 0.7, 1.0):
        gae, ret, V = ref_gae(a, MASK, 0.9, lam, group_size=2)
        got = jax.jit(lambda s, lam=lam: opd(s, estimator="gae", gamma=0.9, lam=lam, group_size=2))(
            stats
        )
        np.testing.assert_allclose(got, gae, rtol=1e-5, atol=1e-6)
        if lam == 1.0:  # telescopes to the discounted return minus the baseline
            np.testing.assert_allclose(got, (ret - V) * MASK, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="estimator"):
        opd(stats, estimator="td")


def test_opd_reward_expectation_is_reverse_kl_monte_carlo():
    V, n = 6, 50_000

    @jax.jit
    def mc(key):
        k_s, k_t, k_y = jax.random.split(key, 3)
        ls = jax.nn.log_softmax(jax.random.normal(k_s, (V,)))
        lt = jax.nn.log_softmax(jax.random.normal(k_t, (V,)))
        y = jax.random.categorical(k_y, ls, shape=(n,))
        stats = TokenStats(
            logp=ls[y][:, None],
            old_logp=ls[y][:, None],
            mask=jnp.ones((n, 1)),
            teacher_logp=lt[y][:, None],
        )
        a = ADVANTAGES.get("opd")(stats)  # a = l_teacher - l_student on the sampled token
        return -jnp.mean(a), jnp.sum(jnp.exp(ls) * (ls - lt))

    estimate, reverse_kl = mc(jax.random.key(0))
    np.testing.assert_allclose(float(estimate), float(reverse_kl), rtol=0.03)


def test_opd_hybrid_and_progress():
    stats = token_stats(1)
    a = np.asarray(stats.teacher_logp - stats.old_logp) * MASK
    seq = jnp.array([1.0, -1.0, 0.5, 0.0])
    A = ADVANTAGES.get("opd_hybrid")(stats, seq_adv=seq, coef=0.3)
    np.testing.assert_allclose(A, MASK * (np.asarray(seq)[:, None] + 0.3 * a), rtol=1e-5, atol=1e-6)
    prog = ADVANTAGES.get("progress")(stats, beta=0.5)
    np.testing.assert_allclose(
        prog, 0.5 * MASK * np.asarray(stats.old_logp - stats.ref_logp), rtol=1e-6
    )
    step_ids = jnp.array(
        [[-1, 0, 0, 1, 1], [-1, 0, 1, -1, -1], [-1, 0, 0, 0, -1], [-1, 1, 1, 1, 1]]
    )
    scores = np.asarray(step_scores(prog, step_ids, num_steps=2))
    p = np.asarray(prog)
    np.testing.assert_allclose(scores[0], [p[0, 1] + p[0, 2], p[0, 3] + p[0, 4]], rtol=1e-6)
    np.testing.assert_allclose(scores[3], [0.0, p[3, 1:].sum()], rtol=1e-6, atol=1e-7)


def test_gd2po_whitens_over_kept_tokens_when_given_lengths():
    """With completion lengths the whitening weighs each kept row by its tokens (mean and
    unbiased variance over tokens), as the numpy reference does; the weighting moves the
    advantages by more than the tolerance."""
    lengths = np.array([[3, 5, 2, 7], [4, 4, 4, 4], [1, 9, 2, 6]], np.float32)
    A = np.asarray(ADVANTAGES.get("gd2po")(MULTI, lengths=jnp.asarray(lengths)))
    want = ref_gd2po(MULTI, (1.0, 1.0), lengths=lengths)
    np.testing.assert_allclose(A, want, rtol=1e-4, atol=1e-5)
    assert np.abs(want - ref_gd2po(MULTI, (1.0, 1.0))).max() > 1e-2


def test_groups_of_two_are_allowed():
    """G = 2 is the smallest group a baseline needs: rewards (0, 1) centre to -/+0.5, whose
    unbiased std is sqrt(0.5), so GRPO gives -/+ sqrt(0.5) (eps 1e-6 aside)."""
    A = np.asarray(ADVANTAGES.get("grpo")(np.array([[0.0, 1.0]], np.float32)))
    np.testing.assert_allclose(A, [[-math.sqrt(0.5), math.sqrt(0.5)]], rtol=1e-5)
    with pytest.raises(ValueError, match="G >= 2"):
        ADVANTAGES.get("grpo")(np.array([[1.0]], np.float32))


def test_sequence_advantages_reach_only_the_completion_tokens():
    """[P, G] -> [B, T]: each row's advantage on its mask's tokens, exactly 0 elsewhere."""
    adv = jnp.asarray([[0.5, -2.0]])
    mask = jnp.asarray([[0, 1, 1, 0], [1, 1, 0, 0]], jnp.float32)
    out = np.asarray(sequence_to_tokens(adv, mask))
    np.testing.assert_array_equal(out, [[0.0, 0.5, 0.5, 0.0], [-2.0, -2.0, 0.0, 0.0]])
