"""Each term is needed: every advantage entry at its default parameters against a NumPy
transcription of its docstring formula, on inputs where leaving out any one of its
distinguishing terms (listed in GROUP_TERMS / TOKEN_TERMS) changes the result by far more
than the tolerance, so an entry without the term fails here. gd2po: test_advantages.py."""

import inspect

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.objectives import ADVANTAGES, TokenStats
from jaxrl_frontier.objectives.advantages import group_advantage_names, token_advantage_names

# Errors are measured relative to the largest |value| of the reference (the outputs' scale).
# Group entries reduce over at most P*G = 16 float32 values (mean, then squared deviations):
# about 16 * 2 * eps_f32 = 4e-6 of the scale; token entries are elementwise (a few eps_f32).
GROUP_TOL, TOKEN_TOL = 2e-5, 2e-6
MARGIN = 10  # an ablated formula must miss the full one by 10x the tolerance


def rel_gap(got, want):
    """max |got - want| / max |want|; a NaN where `want` is finite counts as infinitely far."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    d = np.where(np.isnan(got - want), np.inf, np.abs(got - want))
    return d.max() / max(np.abs(want).max(), 1e-30)


def assert_needed(term, gaps, tol):
    assert max(gaps) > MARGIN * tol, f"no case on which {term!r} changes the result: {gaps}"


# ----------------------------------------------------------------------------- group entries

UNIT = np.array(
    [
        [1.0, 0.0, 0.0, 1.0],
        [0.9, 0.9, 0.9, 0.9],  # constant, and 0.9 is not a float32
        [0.0, 0.0, 0.0, 1.0],  # another mean and another std than group 0
        [0.2, 0.7, 0.4, 0.1],
    ],
    np.float32,
)
LENGTHS = np.array([[3, 1, 2, 5], [4, 2, 4, 1], [1, 2, 3, 4], [2, 6, 1, 1]], np.float32)
MULTI = np.array(  # [P, G, K=2]: components of unequal spread, one constant in group 2
    [
        [[1, 0], [0, 1], [1, 1], [0, 0]],
        [[1, 1], [1, 1], [1, 1], [1, 1]],
        [[1, 0.9], [0, 0.9], [1, 0.9], [1, 0.9]],
        [[1, 0.2], [0, 0.9], [1, 0.5], [1, 0.4]],
    ],
    np.float32,
)
# name: (rewards, lengths). "tiny" rewards (spread 1e-6) are where the eps terms bind:
# grpo's 1e-6 against std_g ~ 5e-7, reinforce_pp's 1e-8 against var ~ 1e-13, gdpo's 1e-4.
# The trainer hands reinforce_pp and gd2po the completion lengths (rl.credit): "lengths".
GROUP_CASES = {
    "unit": (UNIT, None),
    "lengths": (UNIT, LENGTHS),
    "tiny": (UNIT * np.float32(1e-6), None),
    "multi": (MULTI, None),
    "multi_tiny": (MULTI * np.float32(1e-6), None),
}


def _whiten(x, n, eps, sqrt_var, off):
    """(x - mean) / (std + eps) or / sqrt(var + eps), n-weighted, var unbiased (N - 1)."""
    N = n.sum()
    mu = 0.0 if "whiten_mean" in off else (n * x).sum() / N
    var = (n * (x - mu) ** 2).sum() / (N if "ddof" in off else N - 1)
    eps = 0.0 if "whiten_eps" in off else eps
    if "whiten_std" in off:
        return x - mu
    return (x - mu) / (np.sqrt(var + eps) if sqrt_var else np.sqrt(var) + eps)


@np.errstate(invalid="ignore", divide="ignore")  # 0 / 0 on a constant group, eps left out
def ref_group(name, rewards, lengths=None, off=()):
    """The entry's docstring formula in float64; `off` names terms to leave out."""
    r = np.asarray(rewards, np.float64)
    const = np.all(r == r[:, :1], axis=tuple(range(1, r.ndim)))
    ddof = 0 if "ddof" in off else 1
    if name == "gdpo":
        r = r if r.ndim == 3 else r[..., None]
        if "decoupled" in off:  # normalise the summed reward instead of each component
            r = r.sum(-1, keepdims=True)
        c = r - r.mean(1, keepdims=True)
        eps = 0.0 if "component_eps" in off else 1e-4
        A = c if "component_std" in off else c / (r.std(1, ddof=1, keepdims=True) + eps)
        out = _whiten(A.sum(-1), np.ones(const.shape + r.shape[1:2]), 1e-4, False, off)
        return np.where(const[:, None], 0.0, out)
    if r.ndim == 3:  # sum_k w_k r_k, w_k = 1 by default
        r = r[..., 0] if "components" in off else r.sum(-1)
    G = r.shape[1]
    mean_g = r.mean(1, keepdims=True)
    if name == "grpo":
        c = r if "centre" in off else r - mean_g
        if "std" in off:
            return c
        std = r.std(ddof=ddof) if "per_group" in off else r.std(1, ddof=ddof, keepdims=True)
        return c / (std + (0.0 if "eps" in off else 1e-6))
    if name == "dr_grpo":
        return r - (0.0 if "baseline" in off else r.mean() if "per_group" in off else mean_g)
    if name == "rloo":  # R_i - mean_{j != i} R_j
        loo = mean_g if "leave_one_out" in off else (r.sum(1, keepdims=True) - r) / (G - 1)
        return r - loo
    if name == "reinforce":
        return r - (0.0 if "baseline" in off else mean_g if "batch" in off else r.mean())
    if name == "gae":
        return r
    if name == "reinforce_pp":
        x = r if "centre" in off else r - mean_g
        n = np.ones_like(r) if lengths is None or "token_weights" in off else lengths
        out = _whiten(x, np.asarray(n, np.float64), 1e-8, True, off)
        return out if "constant_groups" in off else np.where(const[:, None], 0.0, out)
    raise AssertionError(name)


# The terms that make each group entry what it is (see ref_group). Not listed, because at the
# defaults they change nothing beyond rounding: gdpo's batch mean and its zeroing of constant
# groups (each component's group-centred advantages sum to 0 per group, so the batch mean of
# x is 0 by construction; exactness: test_advantages' unrepresentable-rewards test), the
# ddof of gdpo's per-component std (a common factor that the batch whitening divides out),
# reinforce_pp's batch mean without lengths (0 for the same reason).
GROUP_TERMS = {
    "grpo": ("centre", "std", "ddof", "eps", "per_group", "components"),
    "dr_grpo": ("baseline", "per_group", "components"),
    "rloo": ("leave_one_out", "components"),
    "reinforce": ("baseline", "batch", "components"),
    "gae": ("components",),
    "reinforce_pp": (
        "centre",
        "whiten_mean",
        "whiten_std",
        "ddof",
        "whiten_eps",
        "token_weights",
        "constant_groups",
        "components",
    ),
    "gdpo": ("decoupled", "component_std", "component_eps", "whiten_std", "whiten_eps", "ddof"),
}


def test_terms_cover_every_entry():
    assert set(GROUP_TERMS) | {"gd2po"} == set(group_advantage_names())
    assert set(TOKEN_TERMS) == set(token_advantage_names())


@pytest.mark.parametrize("name,term", [(n, t) for n, ts in GROUP_TERMS.items() for t in ts])
def test_group_entry_needs_each_term_at_its_defaults(name, term):
    fn = ADVANTAGES.get(name)
    gaps = []
    for case, (rewards, lengths) in GROUP_CASES.items():
        if lengths is not None and "lengths" not in inspect.signature(fn).parameters:
            continue
        kw = {} if lengths is None else {"lengths": jnp.asarray(lengths)}
        full = ref_group(name, rewards, lengths)
        got = np.asarray(fn(jnp.asarray(rewards), **kw))
        assert rel_gap(got, full) < GROUP_TOL, (case, got, full)
        gaps.append(rel_gap(ref_group(name, rewards, lengths, off={term}), full))
    assert_needed(term, gaps, GROUP_TOL)


def test_group_hand_numbers():
    """Worked by hand on R = [[0, 0, 0, 1], [1, 1, 1, 1]]."""
    R = jnp.array([[0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    # reinforce: batch mean 5/8
    np.testing.assert_allclose(
        ADVANTAGES.get("reinforce")(R), [[-5 / 8] * 3 + [3 / 8], [3 / 8] * 4], rtol=1e-6
    )
    # reinforce_pp: centred group 0 = (-1/4, -1/4, -1/4, 3/4), group 1 = 0; over the 8 rows
    # mean 0, var = (3/16 + 9/16) / 7 = 3/28 -> x / sqrt(3/28 + 1e-8); the constant group 0
    s = np.sqrt(3 / 28 + 1e-8)
    np.testing.assert_allclose(
        ADVANTAGES.get("reinforce_pp")(R), [[-0.25 / s] * 3 + [0.75 / s], [0.0] * 4], rtol=1e-5
    )
    # gdpo, K = 1: A = grpo with eps 1e-4: (-0.5, -0.5, -0.5, 1.5) * 0.5 / (0.5 + 1e-4); over
    # the 8 rows mean 0, std = sqrt(3 a^2 / 7) with a = 1.5 * 0.5 / (0.5 + 1e-4)
    a = 0.5 / (0.5 + 1e-4)
    std = np.sqrt((3 * 0.25 + 2.25) * a**2 / 7)
    np.testing.assert_allclose(
        ADVANTAGES.get("gdpo")(R[..., None]),
        [[-0.5 * a / (std + 1e-4)] * 3 + [1.5 * a / (std + 1e-4)], [0.0] * 4],
        rtol=1e-5,
    )


# ----------------------------------------------------------------------------- token entries

# prompt in column 0; row 1 ends early, row 2 has a masked gap (a tool's output) in column 2.
MASK = np.array(
    [[0, 1, 1, 1, 1], [0, 1, 1, 0, 0], [0, 1, 0, 1, 1], [0, 1, 1, 1, 0]],
    np.float32,
)
SEQ_ADV = np.array([[1.0, -1.0], [0.5, 0.0]], np.float32)  # [P, G], rows g * G + i


def token_stats(seed=0):
    """Every field differs from the others everywhere, masked positions included."""
    rng = np.random.default_rng(seed)
    f = lambda: jnp.asarray(np.log(rng.uniform(0.05, 0.95, MASK.shape)).astype(np.float32))
    return TokenStats(
        logp=f(), old_logp=f(), mask=jnp.asarray(MASK), ref_logp=f(), teacher_logp=f()
    )


def ref_token(name, stats, token_reward=None, off=()):
    """The entry's docstring formula (immediate estimator); `off` names terms to leave out."""
    s = {k: np.asarray(v, np.float64) for k, v in vars(stats).items() if v is not None}
    m = np.ones_like(s["mask"]) if "mask" in off else s["mask"]
    policy = s["logp"] if "rollout" in off else s["old_logp"]  # l_rollout is old_logp
    tr = 0.0 if token_reward is None or "token_reward" in off else token_reward
    if name == "progress":  # a = beta (l_rollout - l_ref), beta = 1
        return m * (policy - (0.0 if "ref" in off else s["ref_logp"]) + tr)
    a = (0.0 if "teacher" in off else s["teacher_logp"]) - policy
    if name == "opd":
        return m * (a + tr)
    if name == "opd_hybrid":  # A_task + coef a, coef = 1
        task = SEQ_ADV.T if "prompt_major" in off else SEQ_ADV
        task = 0.0 if "task" in off else task.reshape(-1, 1)
        return m * (task + (0.0 if "opd" in off else a))
    raise AssertionError(name)


TOKEN_TERMS = {
    "opd": ("teacher", "rollout", "mask", "token_reward"),
    "opd_hybrid": ("task", "prompt_major", "opd", "rollout", "mask"),
    "progress": ("ref", "rollout", "mask", "token_reward"),
}


@pytest.mark.parametrize("name,term", [(n, t) for n, ts in TOKEN_TERMS.items() for t in ts])
def test_token_entry_needs_each_term_at_its_defaults(name, term):
    stats = token_stats()
    fn = ADVANTAGES.get(name)
    token_reward = np.random.default_rng(1).normal(size=MASK.shape).astype(np.float32)
    gaps = []
    for tr in (None, token_reward):
        if tr is not None and "token_reward" not in inspect.signature(fn).parameters:
            continue  # opd_hybrid: the KL is already in its sequence reward (rl.credit)
        kw = {"seq_adv": jnp.asarray(SEQ_ADV)} if name == "opd_hybrid" else {}
        if tr is not None:
            kw["token_reward"] = jnp.asarray(tr)
        full = ref_token(name, stats, tr)
        assert rel_gap(fn(stats, **kw), full) < TOKEN_TOL
        gaps.append(rel_gap(ref_token(name, stats, tr, off={term}), full))
    assert_needed(term, gaps, TOKEN_TOL)


def ref_discounted(a, mask, gamma):
    """sum_{s >= t} gamma^(steps from t to s) a_s, steps counted over completion tokens only."""
    out = np.zeros_like(a, np.float64)
    for b in range(a.shape[0]):
        valid = np.flatnonzero(mask[b])
        for i, t in enumerate(valid):
            out[b, t] = sum(gamma**j * a[b, s] for j, s in enumerate(valid[i:]))
    return out


@pytest.mark.parametrize("estimator,gamma", [("return_to_go", 1.0), ("discounted", 0.5)])
def test_opd_returns_discount_completion_steps_across_a_masked_gap(estimator, gamma):
    # row 2: column 1's return is a_1 + gamma a_3 + gamma^2 a_4 (column 2 is no step); a
    # discount per column would give gamma^2 and gamma^3.
    stats = token_stats(2)
    a = np.asarray(stats.teacher_logp - stats.old_logp, np.float64) * MASK
    got = ADVANTAGES.get("opd")(stats, estimator=estimator, gamma=gamma)
    np.testing.assert_allclose(got, ref_discounted(a, MASK, gamma), rtol=1e-5, atol=1e-6)
    per_column = a[2, 1] + gamma**2 * a[2, 3] + gamma**3 * a[2, 4]
    if gamma != 1.0:
        assert abs(float(got[2, 1]) - per_column) > 1e-2
