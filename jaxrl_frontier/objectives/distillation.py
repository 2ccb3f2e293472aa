"""Divergences: KL-to-reference estimators (`objective.kl_estimator`: k1, k2, k3) on sampled
tokens, and the OPD distributional losses on logits (`objective.distill`: forward / reverse
KL, JSD, CR-OPD), each [B, T] aligned with `tokens`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.objectives.logprobs import shift_right
from jaxrl_frontier.objectives.stats import TokenStats

Array = jax.Array
sg = jax.lax.stop_gradient

KL_ESTIMATORS = Registry("kl estimator", key="objective.kl_estimator")
DISTILL_LOSSES = Registry("distillation loss", key="objective.distill")


# fn(d_bt) -> k_bt with d = l - l_ref (masked to 0 by the caller).


@KL_ESTIMATORS.register("k1")
def k1(d_bt: Array) -> Array:
    """k1 = d (unbiased for KL(pi || ref), high variance, can be negative). Schulman 2020."""
    return d_bt


@KL_ESTIMATORS.register("k2")
def k2(d_bt: Array) -> Array:
    """k2 = d^2 / 2 (biased, low variance; its gradient is the true KL's). Schulman 2020."""
    return 0.5 * d_bt**2


@KL_ESTIMATORS.register("k3")
def k3(d_bt: Array) -> Array:
    """k3 = exp(-d) + d - 1 (unbiased, >= 0), with -d clamped to [-20, 20] and the result
    to [-10, 10] (GRPO's low-variance KL). Schulman 2020; Shao et al. 2024."""
    neg_d = jnp.clip(-d_bt, -20.0, 20.0)
    return jnp.clip(jnp.exp(neg_d) - neg_d - 1.0, -10.0, 10.0)


def kl_to_ref(stats: TokenStats, estimator: str = "k3") -> Array:
    """Per-token KL estimate to the reference, [B, T], 0 on masked positions."""
    d = jnp.where(stats.mask > 0, stats.logp - stats.ref_logp, 0.0)
    return stats.mask * KL_ESTIMATORS.get(estimator)(d)


def kl_reward_penalty(stats: TokenStats, beta: float, estimator: str = "k1") -> Array:
    """The KL folded into the reward: R_t -= beta * k(l_rollout - l_ref), [B, T] (to add).

    Uses old_logp (the rollout policy) and is constant (no gradient): add it to per-token
    rewards before the return / advantage estimate, and set `kl_in_reward=True`.
    """
    d = jnp.where(stats.mask > 0, stats.old_logp - stats.ref_logp, 0.0)
    return -beta * stats.mask * sg(KL_ESTIMATORS.get(estimator)(d))


# An entry is written per position: fn.per_position(logits_s [..., V], logits_t [..., V],
# next_tokens [...], **kwargs) -> loss [...] for the distribution that predicts next_tokens.
# The registered entry is its [B, T] form: fn(logits_btv, teacher_logits_btv, tokens_bt,
# **kwargs) -> per-token loss [B, T], aligned with the tokens (logits at t - 1 score token t,
# column 0 is 0). The chunked path (`loss_fn(teacher_hidden=)`) calls `per_position` on chunks.


def register_distill(name: str) -> Callable:
    """Register a per-position distillation loss under `name` (see the section comment)."""

    def decorator(per_position: Callable[..., Array]) -> Callable[..., Array]:
        @functools.wraps(per_position)
        def per_token(
            logits_btv: Array, teacher_logits_btv: Array, tokens_bt: Array | None, **kwargs
        ) -> Array:
            next_tokens = None if tokens_bt is None else tokens_bt[:, 1:]
            loss = per_position(
                _predictive(logits_btv), _predictive(teacher_logits_btv), next_tokens, **kwargs
            )
            return _aligned(loss)

        per_token.per_position = per_position
        return DISTILL_LOSSES.register(name)(per_token)

    return decorator


def _kl(la: Array, lb: Array) -> Array:
    """KL(a || b) over the last axis from log-probs; 0 * log 0 = 0."""
    pa = jnp.exp(la)
    return jnp.sum(jnp.where(pa > 0, pa * (la - lb), 0.0), axis=-1)


def _support(logits_s: Array, logits_t: Array, top_k: int | None) -> tuple[Array, Array]:
    """Student and teacher log-probs on the full vocabulary, or on the teacher's top-k
    support plus one bucket holding the rest of the mass ([..., k + 1])."""
    ls = jax.nn.log_softmax(logits_s.astype(jnp.float32), axis=-1)
    lt = jax.nn.log_softmax(logits_t.astype(jnp.float32), axis=-1)
    if top_k is None:
        return ls, lt
    _, idx = jax.lax.top_k(lt, top_k)

    def lump(l):
        top = jnp.take_along_axis(l, idx, axis=-1)
        rest = jnp.log(jnp.clip(1.0 - jnp.sum(jnp.exp(top), axis=-1, keepdims=True), 1e-20, 1.0))
        return jnp.concatenate([top, rest], axis=-1)

    return lump(ls), lump(lt)


def _predictive(logits_btv: Array) -> Array:
    """Positions that predict a token: logits[:, :-1] (their loss lands on column t + 1)."""
    return logits_btv[:, :-1]


def _aligned(per_pos_b_tm1: Array) -> Array:
    return shift_right(jnp.pad(per_pos_b_tm1, ((0, 0), (0, 1))))


@register_distill("forward_kl")
def forward_kl(
    logits_s: Array, logits_t: Array, next_tokens: Array | None, top_k: int | None = None
) -> Array:
    """Forward KL(p_T || p_S) per position (mode covering; supervised KD on student states).

    Config keys: top_k=None (teacher's top-k support, rest lumped into one bucket).
    Hinton et al. 2015 (Distilling the Knowledge in a Neural Network); Agarwal et al. 2024
    (On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes, GKD).
    """
    del next_tokens
    ls, lt = _support(logits_s, logits_t, top_k)
    return _kl(lt, ls)


@register_distill("reverse_kl")
def reverse_kl(
    logits_s: Array, logits_t: Array, next_tokens: Array | None, top_k: int | None = None
) -> Array:
    """Reverse KL(p_S || p_T) per position (mode seeking), the full-vocabulary form of OPD.

    Config keys: top_k=None.  Gu et al. 2024 (MiniLLM: Knowledge Distillation of Large
    Language Models); Agarwal et al. 2024 (GKD).
    """
    del next_tokens
    ls, lt = _support(logits_s, logits_t, top_k)
    return _kl(ls, lt)


@register_distill("jsd")
def jsd(
    logits_s: Array,
    logits_t: Array,
    next_tokens: Array | None,
    beta: float = 0.5,
    top_k: int | None = None,
) -> Array:
    """Generalised JSD(beta): M = beta p_T + (1 - beta) p_S,
    JSD = beta KL(p_T || M) + (1 - beta) KL(p_S || M); beta = 0 is forward KL and beta = 1
    reverse KL by convention (the formula itself vanishes there).
    Config keys: beta=0.5, top_k=None.  Agarwal et al. 2024 (GKD).
    """
    if beta == 0.0:
        return forward_kl.per_position(logits_s, logits_t, next_tokens, top_k=top_k)
    if beta == 1.0:
        return reverse_kl.per_position(logits_s, logits_t, next_tokens, top_k=top_k)
    ls, lt = _support(logits_s, logits_t, top_k)
    lm = jnp.logaddexp(jnp.log(beta) + lt, jnp.log1p(-beta) + ls)
    return beta * _kl(lt, lm) + (1.0 - beta) * _kl(ls, lm)


@register_distill("cr_opd")
def cr_opd(
    logits_s: Array,
    logits_t: Array,
    next_tokens: Array,
    eta: float = 1.0,
    top_k: int | None = None,
) -> Array:
    """CR-OPD, counterfactual routed OPD: route the mass a negatively scored sampled token
    loses toward teacher-supported alternatives the student can reach.

    Chosen form (the survey leaves it open). At each position, with y the sampled token and
    p_S (held constant), p_T the student and teacher distributions:
      removed mass   Delta = eta * max(p_S(y) - p_T(y), 0)       (> 0 iff a_t = l_T - l_S < 0)
      routing        rho(v) ∝ sqrt(p_T(v) p_S(v)) for v != y      (0 if the teacher gives v no
                     mass or the student cannot reach it; only the teacher's top-k if top_k)
      target         q = p_S - Delta e_y + Delta rho               (a distribution, constant)
      loss           KL(q || p_S^theta)
    Its logit gradient is p_S - q = Delta (e_y - rho): y is pushed down by exactly Delta and
    that mass goes to rho, not spread over the whole vocabulary in proportion to p_S as the
    sampled-token OPD gradient does. Positively scored tokens (Delta = 0) contribute 0, so
    combine with the `opd` advantage surrogate for their signal.
    Config keys: eta=1.0 (fraction of the gap moved), top_k=None.  Needs the tokens.
    Zhang 2026 (A Formula-Driven Survey and Research Agenda for On-Policy Distillation).
    """
    ls = jax.nn.log_softmax(logits_s.astype(jnp.float32), axis=-1)
    lt = jax.nn.log_softmax(logits_t.astype(jnp.float32), axis=-1)
    ps, pt = sg(jnp.exp(ls)), jnp.exp(lt)
    onehot_y = jax.nn.one_hot(next_tokens, ls.shape[-1], dtype=ps.dtype)
    ps_y, pt_y = jnp.sum(ps * onehot_y, -1), jnp.sum(pt * onehot_y, -1)
    delta = eta * jnp.maximum(ps_y - pt_y, 0.0)
    score = jnp.sqrt(pt * ps) * (1.0 - onehot_y)
    if top_k is not None:
        kth = jax.lax.top_k(lt, top_k)[0][..., -1:]
        score = score * (lt >= kth)
    total = jnp.sum(score, -1, keepdims=True)
    rho = score / jnp.maximum(total, 1e-30)
    delta = jnp.where(total[..., 0] > 0, delta, 0.0)[..., None]
    q = sg(jnp.clip(ps - delta * onehot_y + delta * rho, 0.0, 1.0))
    lq = jnp.log(jnp.maximum(q, 1e-30))
    kl = jnp.sum(jnp.where(q > 0, q * (lq - ls), 0.0), axis=-1)
    # where no mass is routed q = p_S: the loss and its gradient are 0, exactly not up to rounding
    return jnp.where(delta[..., 0] > 0, kl, 0.0)
