"""Each term is needed: every aggregation, distillation loss and KL estimator at its default
parameters against a NumPy transcription of its docstring formula, on inputs where leaving
out any one of its distinguishing terms (the *_TERMS tables) changes the result by far more
than the tolerance, so an entry without the term fails here."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.objectives import (
    AGGREGATIONS,
    DISTILL_LOSSES,
    KL_ESTIMATORS,
    TokenStats,
    kl_reward_penalty,
)
from jaxrl_frontier.objectives.distillation import kl_to_ref

MARGIN = 10  # an ablated formula must miss the full one by 10x the tolerance


def rel_gap(got, want):
    """max |got - want| / max |want|; a NaN where `want` is finite counts as infinitely far."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    d = np.where(np.isnan(got - want), np.inf, np.abs(got - want))
    return d.max() / max(np.abs(want).max(), 1e-30)


def check_term(fn_ref_pairs, ref, term, tol):
    """Each (got, ref-args) pair matches the full reference within `tol`; leaving `term` out
    of the reference misses it by more than MARGIN * tol on at least one of them."""
    gaps = []
    for got, args in fn_ref_pairs:
        full = ref(*args)
        assert rel_gap(got, full) < tol, (np.asarray(got), full)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            gaps.append(rel_gap(ref(*args, off={term}), full))
    assert max(gaps) > MARGIN * tol, f"no case on which {term!r} changes the result: {gaps}"


# ----------------------------------------------------------------------------- aggregations

B, T = 4, 5
# completion lengths 4, 2, 0 (an empty row), 1; "single": one valid token (where the floors
# max(Z, 1) meet Z = 1); "empty": no valid token at all
AGG_MASKS = {
    "ragged": np.array(
        [[0, 1, 1, 1, 1], [0, 1, 1, 0, 0], [0, 0, 0, 0, 0], [0, 1, 0, 0, 0]], np.float32
    ),
    "single": np.zeros((B, T), np.float32),
    "empty": np.zeros((B, T), np.float32),
}
AGG_MASKS["single"][1, 2] = 1.0
# positive, so no sum cancels: each aggregate is within 20 * eps_f32 = 2.4e-6 of its value
AGG_X = np.random.default_rng(0).uniform(0.5, 1.5, (B, T)).astype(np.float32)
AGG_TOL = 1e-5


def ref_aggregate(name, x, m, off=()):
    """N / Z from the docstring (C = T by default); `off` names terms to leave out."""
    x, m = np.asarray(x, np.float64), np.asarray(m, np.float64)
    mx = x if "mask" in off else m * x
    n_b = m.sum(1)
    rows = B if "valid_rows" in off else (n_b > 0).sum()
    if name == "token_mean":
        N, Z = mx.sum(), (m.size if "valid_tokens" in off else m.sum())
    elif name == "seq_mean_token_mean":
        row_len = T if "row_length" in off else n_b if "row_guard" in off else np.maximum(n_b, 1)
        N, Z = (mx.sum(1) / row_len).sum(), rows
    elif name == "seq_mean_token_sum":
        N, Z = mx.sum(), rows
    elif name == "seq_mean_token_sum_norm":
        N, Z = mx.sum(), rows * (1 if "C" in off else T)
    else:
        raise AssertionError(name)
    return N / (Z if "z_guard" in off else max(Z, 1))


AGG_TERMS = {
    "token_mean": ("mask", "valid_tokens", "z_guard"),
    "seq_mean_token_mean": ("mask", "row_length", "row_guard", "valid_rows", "z_guard"),
    "seq_mean_token_sum": ("mask", "valid_rows", "z_guard"),
    "seq_mean_token_sum_norm": ("mask", "valid_rows", "C", "z_guard"),
}


@pytest.mark.parametrize("name,term", [(n, t) for n, ts in AGG_TERMS.items() for t in ts])
def test_aggregation_needs_each_term_at_its_defaults(name, term):
    assert set(AGG_TERMS) == set(AGGREGATIONS.names())
    fn = AGGREGATIONS.get(name)
    pairs = [(fn(jnp.asarray(AGG_X), jnp.asarray(m)), (name, AGG_X, m)) for m in AGG_MASKS.values()]
    check_term(pairs, ref_aggregate, term, AGG_TOL)


# ----------------------------------------------------------------------------- distillation

V = 5


def np_log_softmax(z):
    z = np.asarray(z, np.float64)
    z = z - z.max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        return z - np.log(np.exp(z).sum(-1, keepdims=True))


def distill_case(kind, seed=0):
    """(student logits [B, T, V], teacher logits, tokens [B, T]); the tokens are the
    student's samples (never a token it gives no mass)."""
    rng = np.random.default_rng(seed)
    zs = rng.normal(0, 1.5, (B, T, V)).astype(np.float32)
    zt = rng.normal(0, 1.5, (B, T, V)).astype(np.float32)
    tokens = rng.integers(1, V, (B, T)).astype(np.int32)
    if kind == "teacher_zero":  # the teacher gives token V - 1 no mass (a padded vocabulary)
        zt[..., V - 1] = -np.inf
    if kind == "student_zero":
        zs[..., 0] = -np.inf
    if kind == "student_one_hot":  # all the student's mass on the next sampled token
        zs[:] = -np.inf
        nxt = np.concatenate([tokens[:, 1:], tokens[:, :1]], 1)
        np.put_along_axis(zs, nxt[..., None], 0.0, axis=-1)
    return zs, zt, tokens


def np_kl(la, lb, off):
    """KL(a || b) with 0 log 0 = 0 (unless 'zero_log_zero' is off)."""
    pa = np.exp(la)
    with np.errstate(invalid="ignore"):  # 0 * -inf where a has no mass
        terms = pa * (la - lb)
    return (terms if "zero_log_zero" in off else np.where(pa > 0, terms, 0.0)).sum()


def ref_position(name, zs, zt, y, off):
    ls, lt = np_log_softmax(zs), np_log_softmax(zt)
    if name == "forward_kl":
        return np_kl(ls, lt, off) if "direction" in off else np_kl(lt, ls, off)
    if name == "reverse_kl":
        return np_kl(lt, ls, off) if "direction" in off else np_kl(ls, lt, off)
    if name == "jsd":  # beta = 0.5
        w = 1.0 if "mixture_weights" in off else 0.5
        lm = np.logaddexp(np.log(w) + lt, np.log(w) + ls)
        return (0.0 if "teacher_half" in off else 0.5 * np_kl(lt, lm, off)) + (
            0.0 if "student_half" in off else 0.5 * np_kl(ls, lm, off)
        )
    if name == "cr_opd":  # eta = 1
        ps, pt = np.exp(ls), np.exp(lt)
        delta = max(ps[y] - (0.0 if "teacher_gap" in off else pt[y]), 0.0)
        score = pt.copy() if "routing" in off else np.sqrt(pt * ps)
        if "exclude_y" not in off:
            score[y] = 0.0
        if score.sum() == 0 and "no_target" not in off:
            delta = 0.0
        if delta == 0:
            return 0.0
        rho = score / score.sum() if score.sum() > 0 else score
        q = np.clip(ps - delta * np.eye(V)[y] + delta * rho, 0.0, 1.0)
        nz = q > 0
        return (q[nz] * (np.log(q[nz]) - ls[nz])).sum()
    raise AssertionError(name)


def ref_distill(name, zs, zt, tokens, off=()):
    """[B, T]: the logits at t - 1 score token t (column 0 is 0), or at t with 'alignment' off."""
    out = np.zeros((B, T))
    for b in range(B):
        for t in range(T):
            src = t if "alignment" in off else t - 1
            if src >= 0:
                out[b, t] = ref_position(name, zs[b, src], zt[b, src], tokens[b, t], off)
    return out


# Not listed: jsd's roles of student and teacher (beta = 0.5 makes it symmetric: swapping
# them is the same function; test_losses checks beta = 0.1), cr_opd's hinge max(., 0) (the
# final where(Delta > 0) already gives 0 wherever it would bind) and its clip of q to [0, 1]
# (q >= 0 exactly for eta <= 1).
DISTILL_TERMS = {
    "forward_kl": ("direction", "alignment", "zero_log_zero"),
    "reverse_kl": ("direction", "alignment", "zero_log_zero"),
    "jsd": ("teacher_half", "student_half", "mixture_weights", "alignment", "zero_log_zero"),
    "cr_opd": ("teacher_gap", "routing", "exclude_y", "no_target", "alignment"),
}
# the cases on which each loss is finite (forward KL is +inf where the student has no mass)
DISTILL_CASES = {
    "forward_kl": ("dense", "teacher_zero"),
    "reverse_kl": ("dense", "student_zero"),
    "jsd": ("dense", "teacher_zero", "student_zero"),
    "cr_opd": ("dense", "teacher_zero", "student_zero", "student_one_hot"),
}
# per position a sum over V = 5 terms of log-probs of size ~5: relative to the largest loss
# of the batch well under 1e-5 in float32
DISTILL_TOL = 1e-5


@pytest.mark.parametrize("name,term", [(n, t) for n, ts in DISTILL_TERMS.items() for t in ts])
def test_distill_loss_needs_each_term_at_its_defaults(name, term):
    assert set(DISTILL_TERMS) == set(DISTILL_LOSSES.names())
    fn = jax.jit(DISTILL_LOSSES.get(name))
    pairs = []
    for kind in DISTILL_CASES[name]:
        zs, zt, tokens = distill_case(kind)
        got = fn(jnp.asarray(zs), jnp.asarray(zt), jnp.asarray(tokens))
        pairs.append((got, (name, zs, zt, tokens)))
    check_term(pairs, ref_distill, term, DISTILL_TOL)


# ----------------------------------------------------------------------------- KL estimators

D = np.array([-np.inf, -100, -30, -5, -1, -0.1, 0, 0.5, 2, 30, 100, np.inf], np.float32)


def ref_k(name, d, off=()):
    d = np.asarray(d, np.float64)
    if name == "k2":
        return (1.0 if "half" in off else 0.5) * d**2
    nd = -d if "inner_clamp" in off else np.clip(-d, -20, 20)
    k = np.exp(nd) - (0.0 if "linear" in off else nd) - (0.0 if "minus_one" in off else 1.0)
    return k if "outer_clip" in off else np.clip(k, -10, 10)


KL_TERMS = {"k2": ("half",), "k3": ("linear", "minus_one", "inner_clamp", "outer_clip")}


@pytest.mark.parametrize("name,term", [(n, t) for n, ts in KL_TERMS.items() for t in ts])
def test_kl_estimator_needs_each_term(name, term):
    assert set(KL_TERMS) | {"k1"} == set(KL_ESTIMATORS.names())  # k1 = d: test_losses
    d = D if name == "k3" else D[np.isfinite(D)]  # k3 is clipped: finite for every d
    # elementwise: exp and a few adds, relative to the largest value
    check_term([(KL_ESTIMATORS.get(name)(jnp.asarray(d)), (name, d))], ref_k, term, 1e-6)


def test_k3_gradient_is_finite_and_zero_where_clipped():
    # without the clamp of -d, exp(100) overflows float32 and the clip's zero gradient times
    # the overflowed derivative is NaN
    d = D[np.isfinite(D)]
    g = np.asarray(jax.grad(lambda x: jnp.sum(KL_ESTIMATORS.get("k3")(x)))(jnp.asarray(d)))
    clipped = np.abs(ref_k("k3", d, off={"outer_clip"})) >= 10
    expected = np.where(clipped, 0.0, 1.0 - np.exp(-d.astype(np.float64).clip(-50, 50)))
    np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- KL helpers

KL_MASK = np.array([[0, 1, 1, 1], [0, 1, 1, 0]], np.float32)


def kl_stats():
    """logp, old_logp, ref_logp all different; the padded last column of row 1 has
    logp = ref_logp = -inf, so its d is NaN unless the mask is applied first."""
    rng = np.random.default_rng(3)
    f = lambda: np.log(rng.uniform(0.05, 0.95, KL_MASK.shape)).astype(np.float32)
    logp, old, ref = f(), f(), f()
    logp[1, 3] = ref[1, 3] = old[1, 3] = -np.inf
    return TokenStats(
        logp=jnp.asarray(logp),
        old_logp=jnp.asarray(old),
        mask=jnp.asarray(KL_MASK),
        ref_logp=jnp.asarray(ref),
    )


def ref_kl_helper(name, stats, off=()):
    """kl_to_ref: m k3(l - l_ref); kl_reward_penalty(beta=0.1): -0.1 m k1(l_rollout - l_ref)."""
    s = {k: np.asarray(v, np.float64) for k, v in vars(stats).items() if v is not None}
    m = s["mask"]
    policy = {"kl_to_ref": "logp", "kl_reward_penalty": "old_logp"}[name]
    if "policy" in off:  # the other one of logp / old_logp
        policy = {"logp": "old_logp", "old_logp": "logp"}[policy]
    with np.errstate(invalid="ignore"):
        d = s[policy] - s["ref_logp"]
    if "mask_guard" not in off:
        d = np.where(m > 0, d, 0.0)
    mm = 1.0 if "mask" in off else m
    if name == "kl_to_ref":
        return mm * ref_k("k3", d)
    return (1.0 if "sign" in off else -1.0) * 0.1 * mm * d


# Not listed: the product with the mask after the estimator (k(0) = 0 for k1, k2, k3, so with
# d already 0 off the mask it changes nothing for a 0 / 1 mask).
HELPER_TERMS = {
    "kl_to_ref": ("policy", "mask_guard"),
    "kl_reward_penalty": ("policy", "mask_guard", "sign"),
}


@pytest.mark.parametrize("name,term", [(n, t) for n, ts in HELPER_TERMS.items() for t in ts])
def test_kl_helper_needs_each_term_at_its_defaults(name, term):
    stats = kl_stats()
    got = kl_to_ref(stats) if name == "kl_to_ref" else kl_reward_penalty(stats, beta=0.1)
    check_term([(got, (name, stats))], ref_kl_helper, term, 1e-6)
