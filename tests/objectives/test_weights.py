"""The w(p) registry: each entry against a slow NumPy loop, and the gradient contract
grad_logp L = -m w A / Z for every weight and every aggregation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.objectives import AGGREGATIONS, WEIGHTS, TokenStats, objective_loss
from jaxrl_frontier.objectives.weights import masked_quantile, required_stats

B, T = 4, 7
# prompt in columns 0-1 (left-padded), completions of lengths 5, 4, 2, 5.
MASK = np.array(
    [
        [0, 0, 1, 1, 1, 1, 1],
        [0, 0, 1, 1, 1, 1, 0],
        [0, 0, 1, 1, 0, 0, 0],
        [0, 0, 1, 1, 1, 1, 1],
    ],
    np.float32,
)
ADV_B = np.array([1.0, -1.0, 0.5, -2.0], np.float32)


def make_stats(seed=0, spread=0.6, low=0.05):
    rng = np.random.default_rng(seed)
    old = np.log(rng.uniform(low, 0.95, (B, T))).astype(np.float32)
    logp = (old + rng.normal(0, spread, (B, T))).clip(-8, 0).astype(np.float32)
    teacher = np.log(rng.uniform(0.05, 0.95, (B, T))).astype(np.float32)
    sc = (old + rng.normal(0, 0.5, (B, T))).astype(np.float32)
    ref = np.log(rng.uniform(0.05, 0.95, (B, T))).astype(np.float32)
    stats = TokenStats(
        logp=jnp.asarray(logp),
        old_logp=jnp.asarray(old),
        mask=jnp.asarray(MASK),
        ref_logp=jnp.asarray(ref),
        teacher_logp=jnp.asarray(teacher),
        sc_logp=jnp.asarray(sc),
    )
    adv = np.broadcast_to(ADV_B[:, None], (B, T)).astype(np.float32)
    return stats, jnp.asarray(adv)


def np_fields(stats):
    return {k: np.asarray(v, np.float64) for k, v in vars(stats).items() if v is not None}


# ----------------------------------------------------------------------------- NumPy references
# Independent slow loops over rows and tokens, written from the formulas in docs/objectives.md.


def ref_weight(name, s, A, off=(), **kw):
    """The weight `name` from its formula; `off` names terms to leave out (TERMS below)."""
    m = s["mask"]
    w = np.zeros((B, T))
    for b in range(B):
        valid = [t for t in range(T) if m[b, t] > 0]
        n = len(valid)
        if name == "gspo":
            el, eh = kw.get("eps_low", 3e-4), kw.get("eps_high", 4e-4)
            sb = math.exp(sum(s["logp"][b, t] - s["old_logp"][b, t] for t in valid) / n)
        if name == "cppo":
            P = dict(delta=0.2, w_min=0.8, delta_b_q=0.9, delta_b_min=0.02, delta_b_max=0.04)
            P.update(kw)
            allD = [
                abs(math.exp(s["logp"][c, t]) - math.exp(s["old_logp"][c, t]))
                for c in range(B)
                for t in range(T)
                if m[c, t] > 0
            ]
            db = min(max(np.quantile(allD, P["delta_b_q"]), P["delta_b_min"]), P["delta_b_max"])
            S_prev = W_prev = 0.0
        if name == "iw_opd":
            a = [abs(s["teacher_logp"][b, t] - s["old_logp"][b, t]) for t in valid]
            S, P_acc = max(sum(a), 1e-8), 0.0
        for i, t in enumerate(valid):
            l, lo, a_t = s["logp"][b, t], s["old_logp"][b, t], A[b, t]
            r, p, mu = math.exp(l - lo), math.exp(l), math.exp(lo)
            if name == "pg":
                w[b, t] = 1.0
            elif name in ("ppo_clip", "dual_clip"):
                el, eh = kw.get("eps_low", 0.2), kw.get("eps_high", 0.2)
                high = a_t > 0 and r > 1 + eh and "clip_high" not in off
                clipped = high or (a_t < 0 and r < 1 - el and "clip_low" not in off)
                if name == "dual_clip" and a_t < 0 and r > kw.get("c", 3.0) and "dual" not in off:
                    clipped = True
                w[b, t] = 0.0 if clipped else r
            elif name == "gspo":
                rs = r if "sequence_ratio" in off else sb
                clipped = (a_t > 0 and rs > 1 + eh) or (a_t < 0 and rs < 1 - el)
                w[b, t] = rs if clipped and "clip" in off else (0.0 if clipped else rs)
            elif name == "cispo":
                lo_c = -math.inf if "clip_low" in off else 1 - kw.get("eps_low", 1.0)
                hi_c = math.inf if "clip_high" in off else 1 + kw.get("eps_high", 0.28)
                w[b, t] = min(max(r, lo_c), hi_c)
            elif name == "tis":
                w[b, t] = r if "cap" in off else min(r, kw.get("cap", 2.0))
            elif name == "dppo":
                dl, dh = kw.get("delta_low", 0.15), kw.get("delta_high", 0.15)
                if "mask_direction" in off:  # the advantage's sign ignored
                    drop = p - mu > dh or p - mu < -dl
                else:
                    drop = (a_t > 0 and p - mu > dh) or (a_t < 0 and p - mu < -dl)
                cap = math.inf if "ratio_cap" in off else kw.get("ratio_cap", 20.0)
                w[b, t] = 0.0 if drop else min(r, cap)
            elif name == "drpo":
                corr = 0.0 if "correction" in off else mu * (r - 1) / kw.get("eps", 12.5)
                w[b, t] = r * (1 - np.sign(a_t) * corr)
            elif name == "cppo":
                wt = 1.0 if "position_weight" in off else 1 - (1 - P["w_min"]) * i / max(n - 1, 1)
                Z = wt * abs(p - mu)
                budget = P["delta"] + db * W_prev - S_prev
                c = P["delta"] if "prefix_budget" in off else min(P["delta"], budget)
                keep = ("sign" not in off and a_t * (r - 1) <= 0) or Z <= c
                w[b, t] = r if keep else 0.0
                S_prev, W_prev = S_prev + Z, W_prev + wt
            elif name == "iw_opd":
                acc = 0.0 if "accumulated" in off else P_acc / S
                w[b, t] = 1 + kw.get("gamma", 0.5) * (1 - acc)
                P_acc += a[i]
            elif name == "position_window":
                inside = kw.get("start", 0.0) <= i / n < kw.get("end", 0.3)
                w[b, t] = 1.0 if "window" in off else float(inside)
            elif name == "sc_grpo":
                u = s["sc_logp"][b, t] - lo
                bonus = 0.0 if "bonus" in off else min(max(math.exp(u) - 1 - u, 0), 10)
                w[b, t] = 1 + kw.get("coef", 1.0) * bonus
            elif name == "prob_power":
                w[b, t] = 1.0 if "power" in off else p ** kw.get("alpha", 1.0)
            else:
                raise AssertionError(name)
    return w


CASES = [
    ("pg", {}),
    ("ppo_clip", {}),
    ("ppo_clip", {"eps_low": 0.2, "eps_high": 0.28}),
    ("dual_clip", {"c": 1.5}),
    ("gspo", {}),
    ("gspo", {"eps_low": 0.5, "eps_high": 0.5}),
    ("cispo", {}),
    ("cispo", {"eps_low": 0.2, "eps_high": 0.2}),
    ("tis", {"cap": 1.5}),
    ("dppo", {"delta_low": 0.1, "delta_high": 0.1}),
    ("drpo", {"eps": 0.5}),
    ("cppo", {}),
    ("cppo", {"delta": 0.05, "delta_b_min": 0.0, "delta_b_max": 1.0}),
    ("iw_opd", {"gamma": 0.5}),
    ("position_window", {}),
    ("position_window", {"start": 0.3, "end": 0.7}),
    ("sc_grpo", {"coef": 0.5}),
    ("prob_power", {"alpha": 0.5}),
]


# The terms that make each weight what it is. Each test below finds inputs on which leaving
# the term out changes the weight at the entry's default parameters, and checks the entry
# against the full formula there: an implementation without the term fails.
TERMS = {
    "ppo_clip": ("clip_high", "clip_low"),
    "dual_clip": ("clip_high", "clip_low", "dual"),
    "gspo": ("sequence_ratio", "clip"),
    "cispo": ("clip_high",),  # eps_low = 1.0 by default: the lower clip at 0 never binds
    "tis": ("cap",),
    "dppo": ("mask_direction", "ratio_cap"),
    "drpo": ("correction",),
    "cppo": ("prefix_budget", "position_weight", "sign"),
    "iw_opd": ("accumulated",),
    "position_window": ("window",),
    "sc_grpo": ("bonus",),
    "prob_power": ("power",),
}


@pytest.mark.parametrize("name,term", [(n, t) for n, ts in TERMS.items() for t in ts])
def test_each_term_changes_the_weight_at_its_defaults(name, term):
    for seed in range(200):
        spread = (0.3, 0.6, 1.2, 2.5)[seed % 4]
        stats, adv = make_stats(seed, spread, low=0.05 if seed < 100 else 1e-4)  # r up to 1e4
        s, A = np_fields(stats), np.asarray(adv, np.float64)
        full, ablated = ref_weight(name, s, A), ref_weight(name, s, A, off={term})
        if np.abs(full - ablated).max() > 1e-3:
            break
    else:
        pytest.fail(f"{name}: no input in 200 draws on which {term!r} matters")
    w = np.asarray(jax.jit(WEIGHTS.get(name))(stats, adv)) * MASK
    np.testing.assert_allclose(w, full, rtol=1e-5, atol=1e-6)


def test_cases_cover_every_weight():
    assert {n for n, _ in CASES} == set(WEIGHTS.names())


@pytest.mark.parametrize("name,kw", CASES)
def test_weight_matches_numpy_loop(name, kw):
    """Also: jit- and vmap-friendly, finite, and stop-gradient (d sum(w) / d logp = 0)."""
    stats, adv = make_stats()
    fn = lambda s, a: WEIGHTS.get(name)(s, a, **kw)
    w = np.asarray(jax.jit(fn)(stats, adv))
    expected = ref_weight(name, np_fields(stats), np.asarray(adv, np.float64), **kw)
    np.testing.assert_allclose(w * MASK, expected, rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(w))
    g = jax.jit(jax.grad(lambda l: jnp.sum(fn(stats.replace(logp=l), adv))))(stats.logp)
    assert np.all(np.asarray(g) == 0.0)
    if name != "cppo":  # cppo's budget quantile is over the batch, so rows are coupled
        rows = jax.tree.map(lambda x: x[:, None], (stats, adv))
        batched = jax.jit(jax.vmap(fn))(*rows)[:, 0]
        np.testing.assert_allclose(batched, w, rtol=1e-6)


def test_hand_computed_numbers():
    """A few values worked out by hand (one row, tokens in columns 1..3)."""
    mask = jnp.array([[0.0, 1.0, 1.0, 1.0]])
    old = jnp.log(jnp.array([[1.0, 0.5, 0.5, 0.2]]))
    new = jnp.log(jnp.array([[1.0, 0.75, 0.25, 0.2]]))  # r = 1.5, 0.5, 1.0
    stats = TokenStats(logp=new, old_logp=old, mask=mask)
    pos, neg = jnp.ones((1, 4)), -jnp.ones((1, 4))
    # ppo: A>0 clips r=1.5 only; A<0 clips r=0.5 only.
    np.testing.assert_allclose(WEIGHTS.get("ppo_clip")(stats, pos)[0, 1:], [0.0, 0.5, 1.0])
    np.testing.assert_allclose(WEIGHTS.get("ppo_clip")(stats, neg)[0, 1:], [1.5, 0.0, 1.0])
    # cispo(0.2, 0.2): clip(r) = 1.2, 0.8, 1.0 whatever A is.
    w = WEIGHTS.get("cispo")(stats, neg, eps_low=0.2, eps_high=0.2)
    np.testing.assert_allclose(w[0, 1:], [1.2, 0.8, 1.0], rtol=1e-6)
    # dppo: p - mu = +0.25, -0.25, 0 -> A>0 drops the first, A<0 the second.
    np.testing.assert_allclose(WEIGHTS.get("dppo")(stats, pos)[0, 1:], [0.0, 0.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(WEIGHTS.get("dppo")(stats, neg)[0, 1:], [1.5, 0.0, 1.0], rtol=1e-6)
    # drpo(eps=1), A>0: r (1 - mu (r - 1)) = 1.5 (1 - 0.25) = 1.125, 0.5 (1 + 0.25) = 0.625, 1.
    w = WEIGHTS.get("drpo")(stats, pos, eps=1.0)
    np.testing.assert_allclose(w[0, 1:], [1.125, 0.625, 1.0], rtol=1e-6)
    # gspo: s = exp(mean log r) = (1.5 * 0.5 * 1) ** (1/3) on every token.
    s = (0.75) ** (1 / 3)
    w = WEIGHTS.get("gspo")(stats, pos, eps_low=0.5, eps_high=0.5)
    np.testing.assert_allclose(w[0, 1:], [s, s, s], rtol=1e-6)
    # position_window [0, 0.3) of 3 tokens: k/n = 0, 1/3, 2/3 -> only the first.
    np.testing.assert_allclose(WEIGHTS.get("position_window")(stats, pos)[0, 1:], [1, 0, 0])
    # prob_power(alpha=2): p^2.
    w = WEIGHTS.get("prob_power")(stats, pos, alpha=2.0)
    np.testing.assert_allclose(w[0, 1:], [0.5625, 0.0625, 0.04], rtol=1e-6)
    # iw_opd(gamma=0.5), |a| = 1, 2, 1 -> P = 0, 1, 3, S = 4 -> 1.5, 1.375, 1.125.
    teacher = old + jnp.array([[0.0, 1.0, -2.0, 1.0]])
    st = TokenStats(logp=new, old_logp=old, mask=mask, teacher_logp=teacher)
    np.testing.assert_allclose(WEIGHTS.get("iw_opd")(st, pos)[0, 1:], [1.5, 1.375, 1.125])


# ----------------------------------------------------------------------------- gradient contract


def _Z(aggregation, mask, C=None):
    n_b = mask.sum(1, keepdims=True)
    rows = (n_b > 0).sum()
    return {
        "token_mean": np.full_like(mask, mask.sum()),
        "seq_mean_token_mean": np.broadcast_to(np.maximum(n_b, 1) * rows, mask.shape),
        "seq_mean_token_sum": np.full_like(mask, rows),
        "seq_mean_token_sum_norm": np.full_like(mask, rows * C),
    }[aggregation]


AGGREGATION_NAMES = (
    "token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
)


@pytest.mark.parametrize("name,kw", CASES)
def test_grad_is_minus_w_A_over_Z(name, kw):
    assert set(AGGREGATION_NAMES) == set(AGGREGATIONS.names())
    stats, adv = make_stats(seed=1)

    def surrogate(logp, aggregation):
        agg_kw = {"max_completion_len": 5} if aggregation.endswith("norm") else {}
        cfg = {
            "weight": name,
            "weight_kwargs": kw,
            "aggregation": aggregation,
            "aggregation_kwargs": agg_kw,
        }
        return objective_loss(stats.replace(logp=logp), adv, cfg)[0]

    grads = jax.jit(lambda l: [jax.grad(surrogate)(l, a) for a in AGGREGATION_NAMES])(stats.logp)
    w = np.asarray(WEIGHTS.get(name)(stats, adv, **kw))
    for aggregation, grad in zip(AGGREGATION_NAMES, grads):
        expected = -MASK * w * np.asarray(adv) / _Z(aggregation, MASK, C=5)
        np.testing.assert_allclose(grad, expected, rtol=1e-6, atol=1e-8, err_msg=aggregation)


# ----------------------------------------------------------------------------- method properties


def _grad_pg(stats, adv, weight, **kw):
    cfg = {"weight": weight, "weight_kwargs": kw}
    return np.asarray(
        jax.grad(lambda l: objective_loss(stats.replace(logp=l), adv, cfg)[0])(stats.logp)
    )


def _ratio_stats(ratios):
    """One row per ratio, one completion token each (column 1)."""
    r = jnp.asarray(ratios, jnp.float32)
    old = jnp.full((r.shape[0], 2), math.log(0.3))
    new = old.at[:, 1].add(jnp.log(r))
    mask = jnp.zeros_like(old).at[:, 1].set(1.0)
    return TokenStats(logp=new, old_logp=old, mask=mask)


RATIOS = [0.5, 0.79, 0.9, 1.0, 1.1, 1.21, 2.0, 4.0]


def test_ppo_clip_zero_gradient_exactly_where_clipped():
    stats = _ratio_stats(RATIOS)
    r = np.array(RATIOS)
    for sign in (1.0, -1.0):
        adv = jnp.full(stats.mask.shape, sign)
        g = _grad_pg(stats, adv, "ppo_clip")[:, 1]
        clipped = (r > 1.2) if sign > 0 else (r < 0.8)
        assert np.all(g[clipped] == 0.0)
        assert np.all(g[~clipped] != 0.0)
        np.testing.assert_allclose(g[~clipped], -sign * r[~clipped] / len(r), rtol=1e-6)


def test_dual_clip_bounds_negative_advantage_tokens():
    stats = _ratio_stats(RATIOS)
    r = np.array(RATIOS)
    adv = jnp.full(stats.mask.shape, -1.0)
    g = _grad_pg(stats, adv, "dual_clip", c=3.0)[:, 1]
    assert np.all(g[r > 3.0] == 0.0)  # beyond c the loss is the constant -c*A
    assert np.all(g[(r >= 0.8) & (r <= 3.0)] != 0.0)
    # the per-token gradient coefficient |w A| never exceeds c |A| for A < 0
    w = np.asarray(WEIGHTS.get("dual_clip")(stats, adv, c=3.0))[:, 1]
    assert np.all(w <= 3.0)
    # for A > 0 dual clip is plain PPO
    pos = jnp.ones_like(adv)
    np.testing.assert_array_equal(
        WEIGHTS.get("dual_clip")(stats, pos), WEIGHTS.get("ppo_clip")(stats, pos)
    )


def test_gspo_uses_the_sequence_ratio():
    stats, adv = make_stats(seed=4, spread=0.01)
    d = np.asarray(stats.logp - stats.old_logp) * MASK
    s_b = np.exp(d.sum(1) / MASK.sum(1))
    w = np.asarray(WEIGHTS.get("gspo")(stats, adv, eps_low=1.0, eps_high=10.0))
    np.testing.assert_allclose(w, np.broadcast_to(s_b[:, None], (B, T)), rtol=1e-5)
    # a row whose sequence ratio leaves the region in A's direction loses every token
    shift_b1 = np.array([[0.01], [0.0], [2e-4], [-0.01]], np.float32)
    moved = stats.replace(logp=stats.old_logp + shift_b1 * MASK)  # s_b = exp(shift_b)
    w_pos = np.asarray(WEIGHTS.get("gspo")(moved, jnp.ones((B, T))))
    w_neg = np.asarray(WEIGHTS.get("gspo")(moved, -jnp.ones((B, T))))
    np.testing.assert_array_equal((w_pos == 0).all(1), [True, False, False, False])
    np.testing.assert_array_equal((w_neg == 0).all(1), [False, False, False, True])
    np.testing.assert_allclose(w_pos[1:3, 2], np.exp(shift_b1[1:3, 0]), rtol=1e-6)


def test_cispo_keeps_every_token_gradient():
    stats = _ratio_stats(RATIOS)
    for sign in (1.0, -1.0):
        adv = jnp.full(stats.mask.shape, sign)
        g = _grad_pg(stats, adv, "cispo", eps_low=0.2, eps_high=0.2)[:, 1]
        assert np.all(g != 0.0)
        np.testing.assert_allclose(np.abs(g) * len(RATIOS), np.clip(RATIOS, 0.8, 1.2), rtol=1e-6)


def test_required_stats_are_declared():
    assert required_stats("iw_opd") == ("teacher_logp",)
    assert required_stats("sc_grpo") == ("sc_logp",)
    assert required_stats("ppo_clip") == ()


# ----------------------------------------------------------------------------- mutants
# Each test below fails on a mutant of weights.py that the tests above let live
# (scripts/mutants.py): they pin pieces that the entries' defaults hide.


@pytest.mark.parametrize("q", [0.0, 0.3, 0.5, 0.9, 1.0])
def test_masked_quantile_is_numpys_linear_quantile_of_the_valid_tokens(q):
    """CPPO's delta_b estimator: at its defaults the clip to [0.02, 0.04] can hide it."""
    x = np.random.default_rng(5).normal(size=(B, T)).astype(np.float32)
    got = float(masked_quantile(jnp.asarray(x), jnp.asarray(MASK), q))
    np.testing.assert_allclose(got, np.quantile(x[MASK > 0], q), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("coef", [0.5, 2.0])
def test_sc_grpo_relative_moves_credit_within_each_row(coef):
    """relative=True: k_t = clip(KL_t, 0, max_kl), w_t = max(0, 1 + coef (k_t / mean_row k
    - 1)) (1 on a row whose mean k is ~0): each row's mean weight stays 1 for coef <= 1."""
    stats, adv = make_stats(3)
    s = np_fields(stats)
    w = np.asarray(WEIGHTS.get("sc_grpo")(stats, adv, coef=coef, relative=True)) * MASK
    want = np.zeros((B, T))
    for b in range(B):
        valid = [t for t in range(T) if MASK[b, t] > 0]
        u = [min(max(s["sc_logp"][b, t] - s["old_logp"][b, t], -20), 20) for t in valid]
        k = [min(max(math.exp(x) - 1 - x, 0.0), 10.0) for x in u]
        mean = sum(k) / len(k)
        for t, k_t in zip(valid, k):
            want[b, t] = max(0.0, 1 + coef * (k_t / mean - 1)) if mean > 1e-6 else 1.0
    np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-6)
    if coef <= 1:
        np.testing.assert_allclose(w.sum(1) / MASK.sum(1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("name", sorted({n for n, _ in CASES}))
def test_extreme_values_under_the_mask_leave_every_weight_finite(name):
    """Positions off the completion mask may hold anything (padding's log-probs): a weight
    must not read them, so a log-ratio of +/-1e4 there changes no valid token's weight and
    leaves every weight finite (exp(1e4) would be inf)."""
    stats, adv = make_stats(1)
    wild = np.where(MASK > 0, 0.0, 1e4).astype(np.float32)
    moved = stats.replace(logp=stats.logp + wild, old_logp=stats.old_logp - wild)
    w0 = np.asarray(WEIGHTS.get(name)(stats, adv))
    w1 = np.asarray(WEIGHTS.get(name)(moved, adv))
    assert np.all(np.isfinite(w1))
    np.testing.assert_allclose(w1 * MASK, w0 * MASK, rtol=1e-6, atol=1e-7)


def test_cppo_position_weights_decide_tokens_against_numpy():
    """CPPO with a strong position decay (w_min = 0.5) and no batch budget, so that which
    tokens stay is decided by Z_t = w_t D_t against the prefix budget: 20 draws against the
    numpy loop, on which the exact w_t = 1 - (1 - w_min) (t - 1) / (T - 1) matters."""
    kw = dict(delta=0.4, w_min=0.5, delta_b_q=0.9, delta_b_min=0.0, delta_b_max=0.0)
    mattered = 0
    for seed in range(20):
        stats, adv = make_stats(seed, spread=0.3)
        s, A = np_fields(stats), np.asarray(adv, np.float64)
        want = ref_weight("cppo", s, A, **kw)
        w = np.asarray(WEIGHTS.get("cppo")(stats, adv, **kw)) * MASK
        np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-6, err_msg=f"seed {seed}")
        flat = ref_weight("cppo", s, A, off={"position_weight"}, **kw)
        mattered += int(np.abs(flat - want).max() > 1e-3)
    assert mattered >= 10  # 13 of these 20 draws
