"""The w(p) registry: every policy-gradient method as a stop-gradient token weight.

The surrogate is always (docs/objectives.md)

    grad L = -(1/Z) * sum_{b,t} m[b,t] * w[b,t] * A[b,t] * grad logp[b,t]

with `w` held constant. An entry is called as

    w_bt = WEIGHTS.get(name)(stats, adv_bt, **hparams)     # [B, T], stop_gradient applied

where `stats` is a `TokenStats` ([B, T] fields) and `adv_bt` the advantage broadcast over
tokens. Notation: `l = logp`, `lo = old_logp`, `d = l - lo`, `r = exp(d)`,
`p = exp(l)`, `mu = exp(lo)`, `m = mask`. Entries that need an optional statistic declare it
in `fn.requires` (checked by `validate_objective_config` and by the loss).

Weights are not masked: the loss multiplies by `m`. They are finite on masked positions.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.objectives.stats import TokenStats

Array = jax.Array
sg = jax.lax.stop_gradient

WEIGHTS = Registry("weight function", key="objective.weight")


def register_weight(name: str, requires: tuple[str, ...] = ()) -> Callable:
    """Register `fn(stats, adv, **hparams) -> w [B, T]` under `name`.

    `requires` names the optional `TokenStats` fields the weight reads (e.g. 'teacher_logp');
    a config choosing it without them fails at validation with a message naming the field.
    """

    def decorator(fn):
        fn.requires = tuple(requires)
        return WEIGHTS.register(name)(fn)

    return decorator


def required_stats(name: str) -> tuple[str, ...]:
    """Optional TokenStats fields the weight `name` needs."""
    return getattr(WEIGHTS.get(name), "requires", ())


# ----------------------------------------------------------------------------- helpers


def _log_ratio(stats: TokenStats) -> Array:
    """d = l - lo, [B, T]; masked positions set to 0 so exp() stays finite there."""
    return jnp.where(stats.mask > 0, stats.logp - stats.old_logp, 0.0)


def _clipped_in_adv_direction(r: Array, adv: Array, eps_low: float, eps_high: float) -> Array:
    """PPO's clipped set: the ratio left the trust region in the direction A pushes it."""
    return ((adv > 0) & (r > 1.0 + eps_high)) | ((adv < 0) & (r < 1.0 - eps_low))


def completion_positions(mask_bt: Array) -> tuple[Array, Array]:
    """(k_bt, n_b1): 0-based index of each completion token within its row, row lengths.

    k is only meaningful where mask = 1. n is [B, 1] (kept >= 0).
    """
    m = mask_bt.astype(jnp.float32)
    k_bt = jnp.cumsum(m, axis=1) - 1.0
    n_b1 = jnp.sum(m, axis=1, keepdims=True)
    return k_bt, n_b1


def exclusive_cumsum(x_bt: Array) -> Array:
    """sum_{s<t} x[b, s] along T."""
    return jnp.cumsum(x_bt, axis=1) - x_bt


def masked_quantile(x_bt: Array, mask_bt: Array, q: float) -> Array:
    """q-quantile of x over mask = 1 entries, linear interpolation (numpy's default)."""
    flat = jnp.where(mask_bt > 0, x_bt, jnp.inf).reshape(-1)
    xs = jnp.sort(flat)
    n = jnp.maximum(jnp.sum(mask_bt > 0), 1)
    pos = q * (n - 1).astype(jnp.float32)
    lo = jnp.floor(pos).astype(jnp.int32)
    hi = jnp.minimum(lo + 1, n - 1)
    frac = pos - lo
    return xs[lo] * (1.0 - frac) + xs[hi] * frac


# ----------------------------------------------------------------------------- entries


@register_weight("pg")
def pg(stats: TokenStats, adv: Array) -> Array:
    """Vanilla policy gradient (REINFORCE / on-policy GRPO, RLOO, Dr. GRPO).

    w = 1.   Config keys: none.
    Williams 1992; GRPO (Shao et al. 2024, DeepSeekMath) in its on-policy form.
    """
    del adv
    return sg(jnp.ones_like(stats.logp))


@register_weight("ppo_clip")
def ppo_clip(stats: TokenStats, adv: Array, eps_low: float = 0.2, eps_high: float = 0.2) -> Array:
    """PPO clipped surrogate (and DAPO clip-higher).

    w = r, or 0 where clipped in A's direction: (A > 0 and r > 1 + eps_high) or
    (A < 0 and r < 1 - eps_low).  This is grad of -min(r A, clip(r, 1-eps_low, 1+eps_high) A).
    Config keys: eps_low=0.2, eps_high=0.2 (DAPO: eps_high=0.28).
    Schulman et al. 2017 (PPO); Yu et al. 2025 (DAPO, decoupled clip).
    """
    r = jnp.exp(_log_ratio(stats))
    clipped = _clipped_in_adv_direction(r, adv, eps_low, eps_high)
    return sg(jnp.where(clipped, 0.0, r))


@register_weight("dual_clip")
def dual_clip(
    stats: TokenStats, adv: Array, eps_low: float = 0.2, eps_high: float = 0.2, c: float = 3.0
) -> Array:
    """Dual-clip PPO.

    As ppo_clip, and for A < 0 with r > c the loss is the constant -c*A, so w = 0 there:
    w = r * 1[not ppo-clipped] * 1[not (A < 0 and r > c)].
    Config keys: eps_low=0.2, eps_high=0.2, c=3.0 (c > 1).
    Ye et al. 2020 (Mastering Complex Control in MOBA Games with Deep RL).
    """
    r = jnp.exp(_log_ratio(stats))
    clipped = _clipped_in_adv_direction(r, adv, eps_low, eps_high) | ((adv < 0) & (r > c))
    return sg(jnp.where(clipped, 0.0, r))


@register_weight("gspo")
def gspo(stats: TokenStats, adv: Array, eps_low: float = 3e-4, eps_high: float = 4e-4) -> Array:
    """GSPO: one length-normalised sequence ratio per row.

    s_b = exp(sum_t m d / |y_b|); every token of row b gets w = s_b, or 0 when s_b is clipped
    in A's direction (A > 0 and s_b > 1 + eps_high, or A < 0 and s_b < 1 - eps_low).
    Aggregate with seq_mean_token_mean so the 1/|y_b| of grad s_b is in Z.
    Config keys: eps_low=3e-4, eps_high=4e-4.
    Zheng et al. 2025 (Group Sequence Policy Optimization).
    """
    m = stats.mask
    d = _log_ratio(stats)
    s_b1 = jnp.exp(
        jnp.sum(m * d, axis=1, keepdims=True) / jnp.maximum(jnp.sum(m, 1, keepdims=True), 1)
    )
    s_bt = jnp.broadcast_to(s_b1, d.shape)
    clipped = _clipped_in_adv_direction(s_bt, adv, eps_low, eps_high)
    return sg(jnp.where(clipped, 0.0, s_bt))


@register_weight("cispo")
def cispo(stats: TokenStats, adv: Array, eps_low: float = 1.0, eps_high: float = 0.28) -> Array:
    """CISPO: clip the importance weight, never the gradient.

    w = clip(r, 1 - eps_low, 1 + eps_high); no token loses its gradient (w > 0 whenever
    1 - eps_low > 0 or r > 0).
    Config keys: eps_low=1.0 (no lower bound, as in MiniMax-M1), eps_high=0.28.
    MiniMax 2025 (MiniMax-M1, CISPO).
    """
    del adv
    r = jnp.exp(_log_ratio(stats))
    return sg(jnp.clip(r, 1.0 - eps_low, 1.0 + eps_high))


@register_weight("tis")
def tis(stats: TokenStats, adv: Array, cap: float = 2.0) -> Array:
    """Truncated importance sampling for the sampler/trainer mismatch.

    w = min(exp(l_trainer - l_sampler), cap) with l_trainer = logp and l_sampler = old_logp
    (pass the sampler's log-probs as `old_logp`).
    Config keys: cap=2.0.
    Yao et al. 2025 (Your Efficient RL Framework Secretly Brings You Off-Policy RL Training).
    """
    del adv
    return sg(jnp.minimum(jnp.exp(_log_ratio(stats)), cap))


@register_weight("dppo")
def dppo(
    stats: TokenStats,
    adv: Array,
    delta_low: float = 0.15,
    delta_high: float = 0.15,
    ratio_cap: float = 20.0,
) -> Array:
    """DPPO: a total-variation trust region on the sampled token's probability.

    keep unless (A > 0 and p - mu > delta_high) or (A < 0 and p - mu < -delta_low);
    w = min(r, ratio_cap) * keep.
    Config keys: delta_low=0.15, delta_high=0.15, ratio_cap=20.0.
    DPPO (divergence-based trust region replacing ratio clipping; see the DRPO abstract,
    "Rethinking the Divergence Regularization in LLM RL").
    """
    d = _log_ratio(stats)
    r = jnp.exp(d)
    shift = jnp.exp(jnp.where(stats.mask > 0, stats.logp, 0.0)) - jnp.exp(
        jnp.where(stats.mask > 0, stats.old_logp, 0.0)
    )
    outside = ((adv > 0) & (shift > delta_high)) | ((adv < 0) & (shift < -delta_low))
    return sg(jnp.where(outside, 0.0, jnp.minimum(r, ratio_cap)))


@register_weight("drpo")
def drpo(stats: TokenStats, adv: Array, eps: float = 12.5) -> Array:
    """DRPO: DPPO's trust region as a smooth advantage-weighted quadratic penalty.

    Per-token loss -A r + |A| mu (r - 1)^2 / (2 eps); its gradient in l gives
    w = r * (1 - sign(A) * mu * (r - 1) / eps)   (= r (1 - sign(A) (p - mu) / eps)),
    continuous, and negative past the boundary (a corrective signal).
    Config keys: eps=12.5.
    Yao et al. 2026 (Rethinking the Divergence Regularization in LLM RL).
    """
    d = _log_ratio(stats)
    r = jnp.exp(d)
    mu = jnp.exp(jnp.where(stats.mask > 0, stats.old_logp, 0.0))
    return sg(r * (1.0 - jnp.sign(adv) * mu * (r - 1.0) / eps))


@register_weight("cppo")
def cppo(
    stats: TokenStats,
    adv: Array,
    delta: float = 0.2,
    w_min: float = 0.8,
    delta_b_q: float = 0.9,
    delta_b_min: float = 0.02,
    delta_b_max: float = 0.04,
) -> Array:
    """CPPO: position-weighted threshold plus a cumulative prefix-divergence budget.

    Per row of completion length T, with t = 1..T the completion position:
      D_t = |p_t - mu_t|,  w_t = 1 - (1 - w_min) (t - 1) / max(T - 1, 1),  Z_t = w_t D_t,
      S_{t-1} = sum_{s<t} Z_s,  W_{t-1} = sum_{s<t} w_s,
      delta_b = clip(quantile_{delta_b_q}(D over the batch's valid tokens), delta_b_min, delta_b_max),
      c_t = min(delta, delta + delta_b W_{t-1} - S_{t-1});
    keep when A (r - 1) <= 0 or Z_t <= c_t;  w = r * keep.
    Config keys: delta=0.2, w_min=0.8, delta_b_q=0.9, delta_b_min=0.02, delta_b_max=0.04.
    Mao et al. 2026 (CPPO: Beyond Uniform Token-Level Trust Region in LLM RL).
    """
    m = stats.mask.astype(jnp.float32)
    r = jnp.exp(_log_ratio(stats))
    p = jnp.exp(jnp.where(m > 0, stats.logp, 0.0))
    mu = jnp.exp(jnp.where(m > 0, stats.old_logp, 0.0))
    D = m * jnp.abs(p - mu)
    k, n = completion_positions(m)  # k = t - 1
    pos_w = m * (1.0 - (1.0 - w_min) * k / jnp.maximum(n - 1.0, 1.0))
    Z = pos_w * D
    S_prev, W_prev = exclusive_cumsum(Z), exclusive_cumsum(pos_w)
    delta_b = jnp.clip(masked_quantile(D, m, delta_b_q), delta_b_min, delta_b_max)
    c = jnp.minimum(delta, delta + delta_b * W_prev - S_prev)
    keep = (adv * (r - 1.0) <= 0) | (Z <= c)
    return sg(jnp.where(keep, r, 0.0))


@register_weight("iw_opd", requires=("teacher_logp",))
def iw_opd(stats: TokenStats, adv: Array, gamma: float = 0.5) -> Array:
    """IW-OPD: weight by the discrepancy not yet accumulated along the row.

    a_t = l_teacher - l_rollout (held constant; l_rollout = old_logp),
    P_t = sum_{s<t} m|a_s|,  S = max(sum_s m|a_s|, 1e-8),  w_t = 1 + gamma (1 - P_t / S)
    (early tokens get up to 1 + gamma, late ones down to ~1). Use with the `opd` advantage.
    Config keys: gamma=0.5.  Needs: teacher_logp.
    Xie et al. 2026 (On the Position Bias of On-Policy Distillation).
    """
    del adv
    m = stats.mask
    a_abs = m * jnp.abs(stats.teacher_logp - stats.old_logp)
    P = exclusive_cumsum(a_abs)
    S = jnp.maximum(jnp.sum(a_abs, axis=1, keepdims=True), 1e-8)
    return sg(1.0 + gamma * (1.0 - P / S))


@register_weight("position_window")
def position_window(stats: TokenStats, adv: Array, start: float = 0.0, end: float = 0.3) -> Array:
    """Train only on a window of relative completion positions.

    w = 1 where k / |y| lies in [start, end) (k = 0-based completion index), else 0.
    The default keeps the first 30% of each completion.
    Config keys: start=0.0, end=0.3.
    Xie et al. 2026 (On the Position Bias of On-Policy Distillation), the position ablation.
    """
    del adv
    k, n = completion_positions(stats.mask)
    rel = k / jnp.maximum(n, 1.0)
    return sg(((rel >= start) & (rel < end)).astype(stats.logp.dtype))


@register_weight("sc_grpo", requires=("sc_logp",))
def sc_grpo(
    stats: TokenStats, adv: Array, coef: float = 1.0, max_kl: float = 10.0, relative: bool = False
) -> Array:
    """SC-GRPO: the self-conditioning KL as a multiplicative credit on the GRPO gradient.

        KL_t = KL( pi(. | x, y<t) || pi(. | x, s, y<t) ),  s a verified own solution to x,
        k_t  = min(KL_t, max_kl),
        w_t  = 1 + coef * k_t                                   relative=False
             = max(0, 1 + coef * (k_t / mean_row(k) - 1))       relative=True

    (mean_row over the row's masked tokens; a row whose mean is ~0, e.g. a prompt with no
    verified solution, keeps w = 1). KL_t is `sc_kl`, the exact sum over the vocabulary
    from the self-conditioned pass. Given only `sc_logp` (no `sc_kl`: a caller with
    sampled-token log-probs alone), KL_t is its single-sample k3 estimate on the sampled
    token, u = sc_logp - old_logp, exp(u) - 1 - u (>= 0, unbiased for the same KL since
    y_t ~ pi).
    Chosen form (the paper leaves it open): "1 +" keeps plain GRPO credit on tokens the own
    solution does not change and on rows of prompts with no verified solution (KL = 0
    there); tokens whose distribution moves most under self-conditioning (pivotal steps)
    get more. relative=True keeps each row's mean weight at 1 and moves credit between its
    tokens only: for a policy that reads the solution context off its training
    distribution, KL_t has a large common part that the plain form would turn into a
    larger step size. max_kl bounds a copy-dominated token.
    Config keys: coef=1.0, max_kl=10.0, relative=False.  Needs: sc_logp (sc_kl when present).
    Shan et al. 2026 (Learning from Own Solutions: Self-Conditioned Credit Assignment for RLVR).
    """
    del adv
    m = stats.mask > 0
    if stats.sc_kl is not None:
        kl = jnp.where(m, stats.sc_kl, 0.0)
    else:
        u = jnp.clip(jnp.where(m, stats.sc_logp - stats.old_logp, 0.0), -20.0, 20.0)
        kl = jnp.exp(u) - 1.0 - u
    k = jnp.clip(kl, 0.0, max_kl)
    if not relative:
        return sg(1.0 + coef * k)
    n = jnp.maximum(jnp.sum(m, axis=1, keepdims=True), 1)
    mean = jnp.sum(jnp.where(m, k, 0.0), axis=1, keepdims=True) / n
    ratio = k / jnp.maximum(mean, 1e-6)
    w = jnp.maximum(0.0, 1.0 + coef * (ratio - 1.0))
    return sg(jnp.where(mean > 1e-6, w, 1.0))


@register_weight("prob_power")
def prob_power(stats: TokenStats, adv: Array, alpha: float = 1.0) -> Array:
    """Probability-power token weight.

    w = p^alpha = exp(alpha * l), held constant (alpha > 0 down-weights low-probability
    tokens, alpha < 0 up-weights them).
    Config keys: alpha=1.0.
    A common family of probability-aware token reweightings for RLVR.
    """
    del adv
    return sg(jnp.exp(alpha * jnp.where(stats.mask > 0, stats.logp, 0.0)))
