"""objectives/distillation.py: the KL-to-reference estimators and helpers and the
distillation losses. Each term is needed: every distillation loss and KL estimator at its
default parameters against a NumPy transcription of its docstring formula, on inputs where
leaving out any one of its distinguishing terms (the *_TERMS tables) changes the result by far
more than the tolerance, so an entry without the term fails here. Then the estimators and the
losses with other parameters (top-k, beta, eta) against NumPy, and CR-OPD's routed gradient."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.objectives import (
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


B, T = 4, 5


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
# them is the same function; test_distill_losses_match_numpy checks beta = 0.1), cr_opd's hinge max(., 0) (the
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
    assert set(KL_TERMS) | {"k1"} == set(KL_ESTIMATORS.names())  # k1 = d: test_kl_estimators
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


# ----------------------------------------------------------------------------- against NumPy

NB, NT, NV = 3, 6, 7


def numpy_case(seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 1.5, (NB, NT, NV)).astype(np.float32)
    teacher = rng.normal(0, 1.5, (NB, NT, NV)).astype(np.float32)
    tokens = rng.integers(0, NV, (NB, NT)).astype(np.int32)
    return logits, teacher, tokens


def test_kl_estimators():
    d = np.array([-30.0, -1.0, -0.1, 0.0, 0.5, 2.0, 30.0], np.float32)
    k = {n: np.asarray(KL_ESTIMATORS.get(n)(jnp.asarray(d))) for n in ("k1", "k2", "k3")}
    np.testing.assert_allclose(k["k1"], d)
    np.testing.assert_allclose(k["k2"], d**2 / 2)
    ref = [min(max(math.exp(min(max(-v, -20), 20)) + v - 1, -10), 10) for v in d]
    np.testing.assert_allclose(k["k3"], ref, rtol=1e-5, atol=1e-6)
    assert k["k3"][0] == 10.0 and np.all(k["k3"] >= 0)


def test_kl_in_reward_penalty():
    old = jnp.log(jnp.array([[0.5, 0.5, 0.2]]))
    ref = jnp.log(jnp.array([[0.5, 0.25, 0.4]]))
    stats = TokenStats(logp=old, old_logp=old, mask=jnp.array([[0.0, 1.0, 1.0]]), ref_logp=ref)
    pen = kl_reward_penalty(stats, beta=0.1)
    np.testing.assert_allclose(pen, [[0.0, -0.1 * math.log(2), -0.1 * math.log(0.5)]], rtol=1e-5)


def np_lumped(l, idx):
    top = l[idx]
    return np.concatenate([top, [np.log(max(1 - np.exp(top).sum(), 1e-20))]])


def np_kl_dense(la, lb):
    pa = np.exp(la)
    return float((pa * (la - lb)).sum())


def np_distill(name, z_s, z_t, y, beta=0.5, top_k=None):
    ls, lt = np_log_softmax(z_s), np_log_softmax(z_t)
    if top_k is not None:
        idx = np.argsort(-lt)[:top_k]
        ls, lt = np_lumped(ls, idx), np_lumped(lt, idx)
    if name == "forward_kl" or (name == "jsd" and beta == 0.0):
        return np_kl_dense(lt, ls)
    if name == "reverse_kl" or (name == "jsd" and beta == 1.0):
        return np_kl_dense(ls, lt)
    if name == "jsd":
        m = beta * np.exp(lt) + (1 - beta) * np.exp(ls)
        return beta * np_kl_dense(lt, np.log(m)) + (1 - beta) * np_kl_dense(ls, np.log(m))
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name,kw",
    [
        ("forward_kl", {}),
        ("reverse_kl", {}),
        ("jsd", {"beta": 0.5}),
        ("jsd", {"beta": 0.1}),
        ("jsd", {"beta": 0.0}),
        ("jsd", {"beta": 1.0}),
        ("forward_kl", {"top_k": 3}),
        ("reverse_kl", {"top_k": 3}),
        ("jsd", {"beta": 0.3, "top_k": 2}),
    ],
)
def test_distill_losses_match_numpy(name, kw):
    logits, teacher, tokens = numpy_case(2)
    got = np.asarray(
        DISTILL_LOSSES.get(name)(
            jnp.asarray(logits), jnp.asarray(teacher), jnp.asarray(tokens), **kw
        )
    )
    assert np.all(got[:, 0] == 0.0)
    for b in range(NB):
        for t in range(1, NT):
            ref = np_distill(name, logits[b, t - 1], teacher[b, t - 1], tokens[b, t], **kw)
            np.testing.assert_allclose(got[b, t], ref, rtol=1e-4, atol=1e-6)


def test_distill_losses_vanish_when_student_equals_teacher():
    logits, _, tokens = numpy_case(3)
    for name in DISTILL_LOSSES.names():
        got = DISTILL_LOSSES.get(name)(
            jnp.asarray(logits), jnp.asarray(logits), jnp.asarray(tokens)
        )
        np.testing.assert_allclose(got, 0.0, atol=1e-5, err_msg=name)


def np_cr_opd(z_s, z_t, y, eta=1.0, top_k=None):
    """Returns (loss, target q, logit gradient Delta (e_y - rho))."""
    ps, pt = np.exp(np_log_softmax(z_s)), np.exp(np_log_softmax(z_t))
    delta = eta * max(ps[y] - pt[y], 0.0)
    score = np.sqrt(pt * ps)
    score[y] = 0.0
    if top_k is not None:
        support = np.zeros(len(ps), bool)
        support[np.argsort(-pt)[:top_k]] = True
        score = score * support
    rho = score / score.sum() if score.sum() > 0 else np.zeros_like(score)
    e_y = np.eye(len(ps))[y]
    q = ps - delta * e_y + delta * rho
    nz = q > 0
    loss = float((q[nz] * (np.log(q[nz]) - np.log(ps[nz]))).sum())
    return loss, q, delta * (e_y - rho)


@pytest.mark.parametrize("kw", [{}, {"eta": 0.5}, {"top_k": 3}])
def test_cr_opd_value_and_routed_gradient(kw):
    logits, teacher, tokens = numpy_case(4)
    fn = DISTILL_LOSSES.get("cr_opd")
    got = np.asarray(fn(jnp.asarray(logits), jnp.asarray(teacher), jnp.asarray(tokens), **kw))
    # the gradient of the summed loss w.r.t. the logits at t - 1 is Delta (e_y - rho)
    grad = np.asarray(
        jax.grad(lambda z: jnp.sum(fn(z, jnp.asarray(teacher), jnp.asarray(tokens), **kw)))(
            jnp.asarray(logits)
        )
    )
    n_routed = n_still = 0
    for b in range(NB):
        for t in range(1, NT):
            loss, q, g = np_cr_opd(logits[b, t - 1], teacher[b, t - 1], tokens[b, t], **kw)
            np.testing.assert_allclose(got[b, t], loss, rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(grad[b, t - 1], g, rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(q.sum(), 1.0, rtol=1e-9)
            y = tokens[b, t]
            p_s, p_t = (
                np.exp(np_log_softmax(logits[b, t - 1])),
                np.exp(np_log_softmax(teacher[b, t - 1])),
            )
            if p_t[y] >= p_s[y]:  # positively scored: no routing, no gradient
                assert np.all(grad[b, t - 1] == 0.0)
                n_still += 1
            else:  # the sampled token is pushed down, its mass goes to the alternatives
                assert grad[b, t - 1, y] > 0 and np.all(np.delete(grad[b, t - 1], y) <= 1e-7)
                n_routed += 1
    assert n_routed > 0 and n_still > 0
    np.testing.assert_allclose(grad[:, -1], 0.0)
