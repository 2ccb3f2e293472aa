"""The loss: aggregation (Z), the w(p) policy-gradient surrogate, KL to the reference,
entropy bonus, and OPD distributional losses on logits.

ALIGNMENT. Every [B, T] per-token statistic is aligned with `tokens`:
`x[b, t]` is about `tokens[b, t]` given `tokens[b, :t]`. Model logits are not: `logits[:, t]`
predicts token t + 1. `token_logprobs`, `token_entropy` and the distillation losses do the
shift (logits at t - 1 predict token t) and put 0 in column 0, which is never a completion
token. `teacher_logits` are the teacher's raw output on the same tokens (unshifted, like
the student's `apply_fn` output).

The total loss, with `agg` the configured aggregation and m the completion mask:

    L = pg_coef      * agg(-sg(w * A) * exp(l - sg(l)))      # value -wA, grad -(1/Z) w A grad l
      + kl_coef      * agg(k(l - l_ref))                     # unless kl_in_reward
      - entropy_coef * agg(H)
      + distill_coef * agg(D(student, teacher))

Every aggregation is agg(x) = N(x) / Z, N additive over rows and Z a function of the mask
only, so gradient accumulation is exact: each microbatch's loss with the whole batch's Z
(`aggregation_denominator`, `loss_fn(denominator=)`) sums to the whole batch's loss.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.objectives.advantages import ADVANTAGES
from jaxrl_frontier.objectives.stats import OPTIONAL_FIELDS, TokenStats
from jaxrl_frontier.objectives.weights import WEIGHTS

Array = jax.Array
sg = jax.lax.stop_gradient

AGGREGATIONS = Registry("aggregation")
KL_ESTIMATORS = Registry("kl estimator")
DISTILL_LOSSES = Registry("distillation loss")


# ----------------------------------------------------------------------------- alignment


def _shift_right(x_bt: Array) -> Array:
    """Prepend a zero column and drop the last: position t - 1's value lands on column t."""
    pad = jnp.zeros_like(x_bt[:, :1])
    return jnp.concatenate([pad, x_bt[:, :-1]], axis=1)


def token_logprobs(logits_btv: Array, tokens_bt: Array) -> Array:
    """logp[b, t] = log p(tokens[b, t] | tokens[b, :t]) from logits[b, t - 1]; logp[:, 0] = 0.

    [B, T, V], [B, T] int -> [B, T] float32. Gathers the logit and subtracts the logsumexp,
    so no [B, T, V] log-softmax is materialised.
    """
    z = logits_btv[:, :-1].astype(jnp.float32)
    z_y = jnp.take_along_axis(z, tokens_bt[:, 1:, None], axis=-1)[..., 0]
    return _shift_right(jnp.pad(z_y - jax.nn.logsumexp(z, axis=-1), ((0, 0), (0, 1))))


def token_entropy(logits_btv: Array) -> Array:
    """H[b, t] = entropy of p(. | tokens[b, :t]) (from logits[b, t - 1]); H[:, 0] = 0. [B, T]."""
    l = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
    return _shift_right(-jnp.sum(jnp.exp(l) * l, axis=-1))


DEFAULT_LOGPROB_CHUNK = 256  # positions per chunk of the fused output layer (logits [chunk, V])


def token_stats_from_hidden(
    hidden_btd: Array,
    w_out_dv: Array,
    tokens_bt: Array,
    chunk: int = DEFAULT_LOGPROB_CHUNK,
    *,
    entropy: bool = False,
    entropy_grad: bool = True,
    start: int = 1,
) -> tuple[Array, Array | None]:
    """`token_logprobs` (and `token_entropy`) from final hidden states, never holding the
    [B, T, V] logits: the output layer, logsumexp and gather run over chunks of `chunk`
    positions (`lax.map`), each chunk under `jax.checkpoint`, so the backward pass recomputes
    one chunk's [chunk, V] logits at a time instead of storing all of them.

    hidden [B, T, D] (compute dtype), w_out [D, V], tokens [B, T] int -> (logp [B, T] f32,
    entropy [B, T] f32 or None), aligned with tokens like `token_logprobs` (column 0 is 0).
    Logits are accumulated in f32 as in `Transformer.logits`. `entropy_grad=False` holds the
    entropy constant (a metric only). Cost: the output matmul runs once more in the backward
    pass (8 instead of 6 * B * T * D * V FLOPs). start >= 1: only tokens [start, T) are
    scored, the columns before it are 0 (an RL batch's prompt, which the loss masks out).
    """
    logp, ent, _ = chunked_token_stats(
        hidden_btd,
        w_out_dv,
        tokens_bt,
        chunk,
        entropy=entropy,
        entropy_grad=entropy_grad,
        start=start,
    )
    return logp, ent


def chunked_token_stats(
    hidden_btd: Array,
    w_out_dv: Array,
    tokens_bt: Array,
    chunk: int = DEFAULT_LOGPROB_CHUNK,
    *,
    entropy: bool = False,
    entropy_grad: bool = True,
    start: int = 1,
    teacher_hidden: tuple[Array, Array] | None = None,
    distill: Callable[..., Array] | None = None,
) -> tuple[Array, Array | None, Array | None]:
    """`token_stats_from_hidden`, plus a distillation loss from the teacher's hidden states.

    teacher_hidden = (teacher final hidden [B, T, D_t], teacher output layer [D_t, V]) and
    distill = a per-position loss (`DISTILL_LOSSES.get(name).per_position` with its kwargs
    bound): each chunk computes the student's [chunk, V] and the teacher's [chunk, V] logits
    (the teacher's held constant) and the loss between them, so neither [B, T, V] exists.
    -> (logp [B, T], entropy [B, T] or None, distill [B, T] or None), all aligned with the
    tokens (column t scores token t; columns before `start` are 0).
    """
    b, t, d = hidden_btd.shape
    if not 1 <= start < t:
        raise ValueError(f"start = {start} must be in [1, {t}) for {t} positions")
    with_distill = distill is not None
    if with_distill and teacher_hidden is None:
        raise ValueError("chunked_token_stats: distill needs teacher_hidden")

    def positions(x_btx):  # positions t - 1 predict token t
        x = x_btx[:, start - 1 : -1]
        return x.reshape(-1, *x.shape[2:])

    h = positions(hidden_btd)
    y = tokens_bt[:, start:].reshape(-1)
    n = h.shape[0]
    chunk = max(1, min(chunk, n))
    pad = -n % chunk

    def chunked(x_n):
        x_n = jnp.pad(x_n, ((0, pad),) + ((0, 0),) * (x_n.ndim - 1))
        return x_n.reshape(-1, chunk, *x_n.shape[1:])

    w = w_out_dv.astype(hidden_btd.dtype)
    xs = (chunked(h), chunked(y))
    if with_distill:
        h_t, w_t = (sg(x) for x in teacher_hidden)
        xs += (chunked(positions(h_t)),)
        w_t = w_t.astype(h_t.dtype)

    @jax.checkpoint
    def one(args):
        h_cd, y_c = args[:2]
        z = jnp.einsum("cd,dv->cv", h_cd, w, preferred_element_type=jnp.float32)
        z = sharding.constrain_vocab(z, w)  # vocab-parallel: no device gathers w
        lse = jax.nn.logsumexp(z, axis=-1)
        logp = jnp.take_along_axis(z, y_c[:, None], axis=-1)[:, 0] - lse
        ent = jnp.zeros_like(logp)
        if entropy:
            zh, lh = (z, lse) if entropy_grad else (sg(z), sg(lse))
            ent = lh - jnp.sum(jnp.exp(zh - lh[:, None]) * zh, axis=-1)  # H = lse - E_p[z]
        dist = jnp.zeros_like(logp)
        if with_distill:
            z_t = jnp.einsum("cd,dv->cv", args[2], w_t, preferred_element_type=jnp.float32)
            z_t = sharding.constrain_vocab(z_t, w_t)
            dist = distill(z, z_t, y_c)
        return logp, ent, dist

    logp, ent, dist = jax.lax.map(one, xs)

    def aligned(x):
        x = x.reshape(-1)[:n].reshape(b, t - start)
        return jnp.pad(x, ((0, 0), (start, 0)))

    return (
        aligned(logp),
        aligned(ent) if entropy else None,
        aligned(dist) if with_distill else None,
    )


def token_logprobs_from_hidden(
    hidden_btd: Array,
    w_out_dv: Array,
    tokens_bt: Array,
    chunk: int = DEFAULT_LOGPROB_CHUNK,
    start: int = 1,
) -> Array:
    """[B, T] log-probs of `tokens` from hidden states and the output layer, chunked.

    Equals `token_logprobs(hidden @ w_out, tokens)` on columns >= start (0 before); see
    `token_stats_from_hidden`.
    """
    return token_stats_from_hidden(hidden_btd, w_out_dv, tokens_bt, chunk, start=start)[0]


# ----------------------------------------------------------------------------- aggregations
# Every aggregation is a ratio  agg(x) = N(x) / Z  with
#   N(x) = sum_{b,t} c[b,t] x[b,t]   additive over rows (c depends on row b's own mask only),
#   Z    = a function of the mask alone.
# The registered entry is fn(x_bt, mask_bt, **kwargs) -> N(x) / Z; `fn.numerator` and
# `fn.denominator(mask_bt, **kwargs)` are its two parts. Summing N over microbatches and
# dividing by the full batch's Z is then exactly the full-batch aggregate (and gradient),
# whatever token counts the microbatches hold: `aggregation_denominator`, `loss_fn(denominator=)`.
# "Rows" are rows with at least one valid token.


def register_aggregation(name: str, denominator: Callable[..., Array]) -> Callable:
    """Register `numerator(x_bt, mask_bt, **kw) -> scalar` (additive over rows) with its
    `denominator(mask_bt, **kw) -> scalar`; the entry is `fn(x, mask, **kw) = N / Z`."""

    def decorator(numerator: Callable[..., Array]) -> Callable[..., Array]:
        @functools.wraps(numerator)
        def aggregate(x_bt: Array, mask_bt: Array, **kwargs) -> Array:
            return numerator(x_bt, mask_bt, **kwargs) / denominator(mask_bt, **kwargs)

        aggregate.numerator = numerator
        aggregate.denominator = denominator
        return AGGREGATIONS.register(name)(aggregate)

    return decorator


def _valid_rows(mask_bt: Array, **_) -> Array:
    """Z = number of rows with a valid token (at least 1)."""
    return jnp.maximum(jnp.sum(jnp.sum(mask_bt, axis=1) > 0), 1).astype(jnp.float32)


def _valid_tokens(mask_bt: Array, **_) -> Array:
    """Z = number of valid tokens (at least 1)."""
    return jnp.maximum(jnp.sum(mask_bt), 1.0)


def _valid_rows_times_c(mask_bt: Array, max_completion_len: int | None = None) -> Array:
    """Z = rows * C, C = max_completion_len (None: the row width T, a constant too)."""
    C = mask_bt.shape[1] if max_completion_len is None else max_completion_len
    return _valid_rows(mask_bt) * C


@register_aggregation("token_mean", denominator=_valid_tokens)
def token_mean(x_bt: Array, mask_bt: Array) -> Array:
    """sum m*L / sum m: every valid token of the batch counts once (DAPO). Config keys: none.

    N = sum_{b,t} m L, Z = sum_{b,t} m.
    """
    return jnp.sum(mask_bt * x_bt)


@register_aggregation("seq_mean_token_mean", denominator=_valid_rows)
def seq_mean_token_mean(x_bt: Array, mask_bt: Array) -> Array:
    """mean_b (sum_t m*L / sum_t m): each sequence counts once (GRPO, GSPO). Config keys: none.

    N = sum_b (sum_t m L / sum_t m), Z = rows.
    """
    return jnp.sum(jnp.sum(mask_bt * x_bt, axis=1) / jnp.maximum(jnp.sum(mask_bt, axis=1), 1.0))


@register_aggregation("seq_mean_token_sum", denominator=_valid_rows)
def seq_mean_token_sum(x_bt: Array, mask_bt: Array) -> Array:
    """mean_b (sum_t m*L): longer sequences weigh more. Config keys: none.

    N = sum_{b,t} m L, Z = rows.
    """
    return jnp.sum(mask_bt * x_bt)


@register_aggregation("seq_mean_token_sum_norm", denominator=_valid_rows_times_c)
def seq_mean_token_sum_norm(
    x_bt: Array, mask_bt: Array, max_completion_len: int | None = None
) -> Array:
    """mean_b (sum_t m*L) / C, C a constant: the max completion length (Dr. GRPO).

    N = sum_{b,t} m L, Z = rows * C.
    Config keys: max_completion_len=None (None: the row width T, also a constant).
    Liu et al. 2025 (Understanding R1-Zero-Like Training: A Critical Perspective).
    """
    del max_completion_len  # only in Z
    return jnp.sum(mask_bt * x_bt)


def aggregation_denominator(cfg: Any, mask_bt: Array) -> Array:
    """Z of the configured aggregation for `mask_bt` [B, T] (a scalar, a function of the mask).

    Compute it over a whole minibatch and pass it to `loss_fn(..., denominator=Z)` for each
    of its microbatches: the sum of the microbatch losses (and gradients) is then exactly the
    minibatch's.
    """
    name = _get(cfg, "aggregation")
    entry = _lookup(AGGREGATIONS, "aggregation", name)
    return entry.denominator(mask_bt.astype(jnp.float32), **_get(cfg, "aggregation_kwargs"))


# ----------------------------------------------------------------------------- KL to reference
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


# ----------------------------------------------------------------------------- distillation
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
    return _shift_right(jnp.pad(per_pos_b_tm1, ((0, 0), (0, 1))))


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


# ----------------------------------------------------------------------------- config

# `config.objective`: every key and its default, defined here once (`config.base_config`
# builds its objective section from `default_config()`).
DEFAULTS: Mapping[str, Any] = {
    "weight": "ppo_clip",
    "weight_kwargs": {},
    "aggregation": "token_mean",
    "aggregation_kwargs": {},
    "pg_coef": 1.0,
    "kl_coef": 0.0,
    "kl_estimator": "k3",
    "kl_in_reward": False,
    "entropy_coef": 0.0,
    "distill": None,
    "distill_coef": 1.0,
    "distill_kwargs": {},
    # Read when computing advantages (`rl.credit`), not by the loss; validated here so one
    # check covers the section.
    "advantage": "grpo",
    "advantage_kwargs": {},
    "reward_weights": {},  # reward component -> weight; {} = the correctness reward only
}


def default_config():
    """A fresh `config.objective` ConfigDict with every key at its default."""
    from ml_collections import config_dict

    cfg = config_dict.ConfigDict({k: v for k, v in DEFAULTS.items() if v is not None})
    cfg.distill = config_dict.placeholder(str)  # None, but overridable from the command line
    return cfg


class ObjectiveConfigError(ValueError):
    """A bad `config.objective`: the message names the key and the allowed values."""


def entry_defaults(fn: Callable) -> dict[str, Any]:
    """The keyword defaults of a registry entry: {name: default} for each parameter of `fn`
    that has a default. These are the config keys its `*_kwargs` block accepts."""
    params = inspect.signature(fn).parameters.values()
    return {
        p.name: p.default
        for p in params
        if p.default is not inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def _get(cfg: Any, key: str) -> Any:
    """cfg[key] or its default; a `*_kwargs` block as a plain dict without None values
    (None = the entry's own default: command-line placeholders left unset)."""
    value = cfg[key] if key in cfg else DEFAULTS[key]
    if key.endswith("_kwargs"):
        value = {} if value is None else value
        value = value.to_dict() if hasattr(value, "to_dict") else value
        return {k: v for k, v in value.items() if v is not None}
    return value


def _lookup(registry: Registry, cfg_key: str, name: str) -> Callable:
    try:
        return registry.get(name)
    except KeyError as e:
        raise KeyError(f"config.objective.{cfg_key}: {e.args[0]}") from None


def _check_kwargs(fn: Callable, name: str, cfg_key: str, kwargs: Mapping[str, Any]) -> None:
    allowed = list(entry_defaults(fn))
    for key in kwargs:
        if key not in allowed:
            raise ObjectiveConfigError(
                f"config.objective.{cfg_key}: unknown key {key!r} for {name!r}; "
                f"allowed keys: {', '.join(allowed) or '(none)'}"
            )


def required_fields(cfg: Any) -> dict[str, tuple[str, ...]]:
    """Which optional inputs the configured objective needs: {'what needs it': fields}."""
    need: dict[str, tuple[str, ...]] = {}
    weight = _get(cfg, "weight")
    need[f"weight {weight!r}"] = getattr(WEIGHTS.get(weight), "requires", ())
    if _get(cfg, "kl_coef") and not _get(cfg, "kl_in_reward"):
        need["kl_coef > 0"] = ("ref_logp",)
    if _get(cfg, "distill"):
        need[f"distill {_get(cfg, 'distill')!r}"] = ("teacher_logits",)
    return need


def validate_objective_config(cfg: Any, available: Iterable[str] | None = None) -> None:
    """Check a `config.objective` (ConfigDict or mapping) before any tracing.

    Unknown top-level keys, unknown registry names (KeyError listing the known ones), kwargs
    an entry does not accept (naming the key and the allowed keys), and, when `available`
    (the batch keys / TokenStats fields at hand) is given, inputs the objective needs that
    are missing (naming the field and who needs it).
    """
    keys = cfg.keys() if hasattr(cfg, "keys") else cfg
    for key in keys:
        if key not in DEFAULTS:
            raise ObjectiveConfigError(
                f"config.objective: unknown key {key!r}; allowed keys: {', '.join(DEFAULTS)}"
            )
    for cfg_key, registry in (
        ("weight", WEIGHTS),
        ("aggregation", AGGREGATIONS),
        ("distill", DISTILL_LOSSES),
        ("advantage", ADVANTAGES),
    ):
        name = _get(cfg, cfg_key)
        if not name:  # distill None or '' (off)
            continue
        fn = _lookup(registry, cfg_key, name)
        kw_key = f"{cfg_key}_kwargs"
        _check_kwargs(fn, name, kw_key, _get(cfg, kw_key))
    _lookup(KL_ESTIMATORS, "kl_estimator", _get(cfg, "kl_estimator"))
    if available is not None:
        _check_available(cfg, set(available))


def _check_available(cfg: Any, present: set[str]) -> None:
    for who, fields in required_fields(cfg).items():
        for field in fields:
            if field not in present:
                raise ObjectiveConfigError(
                    f"config.objective: {who} needs {field!r}, which is missing "
                    f"(present: {', '.join(sorted(present))})"
                )


# ----------------------------------------------------------------------------- the loss


def _token_mean(x_bt: Array, mask_bt: Array) -> Array:
    return sg(token_mean(x_bt, mask_bt))


def objective_loss(
    stats: TokenStats,
    adv: Array,
    cfg: Any,
    *,
    logits: Array | None = None,
    teacher_logits: Array | None = None,
    tokens: Array | None = None,
    entropy: Array | None = None,
    distill_bt: Array | None = None,
    denominator: Array | float | None = None,
) -> tuple[Array, dict[str, Array]]:
    """The total objective from token statistics: (loss scalar, metrics dict of scalars).

    stats: TokenStats [B, T] (stats.logp differentiable); adv: [B, T] (a sequence advantage
    broadcast over tokens, or a token-level one); logits: student logits [B, T, V] (entropy,
    distillation); teacher_logits: [B, T, V]; tokens: [B, T] (needed by 'cr_opd');
    entropy: [B, T] token entropies (differentiable) when the logits are not at hand;
    distill_bt: the per-token distillation loss [B, T] when it was computed elsewhere (the
    chunked path of `loss_fn`), instead of logits and teacher_logits.
    denominator: Z for every aggregated term, agg(x) = N(x) / Z (see the aggregations
    section); None: Z of this batch's own mask. Pass the full batch's
    `aggregation_denominator` to each microbatch so their losses sum to the full batch's.
    See the module docstring for L. Metrics (token means over valid tokens of this batch):
    loss, pg_loss, kl_loss, entropy, distill_loss; clip_frac (w == 0: dropped by a clip or
    mask), ratio_clip_frac (token ratio r outside [1 - eps_low, 1 + eps_high], the weight's
    own values or 0.2 for weights without them), approx_kl (k3 of old vs new: r - 1 - log r),
    kl_ref, weight_mean, ratio_mean, adv_mean.
    """
    validate_objective_config(cfg)
    present = {f for f in OPTIONAL_FIELDS if getattr(stats, f) is not None}
    present |= {"logits"} if logits is not None else set()
    present |= {"teacher_logits"} if teacher_logits is not None or distill_bt is not None else set()
    _check_available(cfg, present | {"logp", "old_logp", "mask"})

    m = stats.mask.astype(jnp.float32)
    aggregate = AGGREGATIONS.get(_get(cfg, "aggregation"))
    agg_kwargs = _get(cfg, "aggregation_kwargs")
    Z = aggregate.denominator(m, **agg_kwargs) if denominator is None else denominator

    def agg(x_bt):  # N(x) / Z
        return aggregate.numerator(x_bt, m, **agg_kwargs) / Z

    # Policy gradient: w held constant; exp(l - sg(l)) is 1 in value and grad l in gradient,
    # so the value reads -w A and the gradient is exactly -(1/Z) w A grad l.
    weight_fn, weight_kwargs = WEIGHTS.get(_get(cfg, "weight")), _get(cfg, "weight_kwargs")
    w = sg(weight_fn(stats, adv, **weight_kwargs))
    wA = jnp.where(m > 0, w * adv, 0.0)
    pg_bt = -sg(wA) * jnp.exp(stats.logp - sg(stats.logp))
    pg_loss = agg(pg_bt)
    loss = _get(cfg, "pg_coef") * pg_loss
    metrics = {"pg_loss": pg_loss}

    if stats.ref_logp is not None:
        kl_bt = kl_to_ref(stats, _get(cfg, "kl_estimator"))
        metrics["kl_ref"] = _token_mean(kl_to_ref(stats, "k3"), m)
        if _get(cfg, "kl_coef") and not _get(cfg, "kl_in_reward"):
            kl_loss = agg(kl_bt)
            loss = loss + _get(cfg, "kl_coef") * kl_loss
            metrics["kl_loss"] = kl_loss

    if logits is not None or entropy is not None:
        ent_bt = token_entropy(logits) if entropy is None else entropy
        if _get(cfg, "entropy_coef"):
            ent = agg(ent_bt)
            loss = loss - _get(cfg, "entropy_coef") * ent
        metrics["entropy"] = _token_mean(ent_bt, m)

    distill = _get(cfg, "distill")
    if distill:
        if distill_bt is None:
            if logits is None:
                raise ObjectiveConfigError(
                    f"config.objective: distill {distill!r} needs the student logits"
                )
            if distill == "cr_opd" and tokens is None:
                raise ObjectiveConfigError("config.objective: distill 'cr_opd' needs `tokens`")
            distill_bt = DISTILL_LOSSES.get(distill)(
                logits, teacher_logits, tokens, **_get(cfg, "distill_kwargs")
            )
        distill_loss = agg(distill_bt)
        loss = loss + _get(cfg, "distill_coef") * distill_loss
        metrics["distill_loss"] = distill_loss

    # Diagnostics (constant): how far the policy moved, and how much the weight dropped.
    d = jnp.where(m > 0, sg(stats.logp) - stats.old_logp, 0.0)
    r = jnp.exp(d)
    hp = {**entry_defaults(weight_fn), **weight_kwargs}
    eps_low, eps_high = hp.get("eps_low", 0.2), hp.get("eps_high", 0.2)
    metrics.update(
        loss=loss,
        clip_frac=_token_mean((w == 0).astype(jnp.float32), m),
        ratio_clip_frac=_token_mean(
            ((r > 1 + eps_high) | (r < 1 - eps_low)).astype(jnp.float32), m
        ),
        approx_kl=_token_mean(r - 1.0 - d, m),
        weight_mean=_token_mean(w, m),
        ratio_mean=_token_mean(r, m),
        adv_mean=_token_mean(adv, m),
    )
    return loss, metrics


def loss_fn(
    params: Any,
    batch: Mapping[str, Array],
    cfg: Any,
    *,
    apply_fn: Callable[[Any, Array, Array], Array],
    apply_hidden_fn: Callable[[Any, Array, Array], tuple[Array, Array]] | None = None,
    logprob_chunk: int = DEFAULT_LOGPROB_CHUNK,
    first_scored: int = 1,
    teacher_hidden: tuple[Array, Array] | None = None,
    denominator: Array | float | None = None,
) -> tuple[Array, dict[str, Array]]:
    """The trainer's entry point: forward, token log-probs, then `objective_loss`.

    apply_fn(params, tokens [B, T], attention_mask [B, T]) -> logits [B, T, V].
    apply_hidden_fn (optional, same arguments) -> (final hidden [B, T, D], output layer
    [D, V]): when given, log-probs and entropy come from `token_stats_from_hidden` in chunks
    of `logprob_chunk` positions, and the [B, T, V] logits are never materialised (same
    values; less memory and traffic), unless a distillation loss is configured without
    `teacher_hidden`.
    teacher_hidden: (teacher final hidden [B, T, D_t], teacher output layer [D_t, V]), held
    constant: a configured distillation loss (forward_kl, reverse_kl, jsd, cr_opd) is then
    computed chunk by chunk from the student's and the teacher's [chunk, V] logits
    (`chunked_token_stats`), never from the whole batch's. Without apply_hidden_fn the
    teacher's logits are formed in full from it.
    batch: tokens, attention_mask, loss_mask, old_logp, advantages (all [B, T]); optional
    ref_logp, teacher_logp, sc_logp, sc_kl [B, T] and teacher_logits [B, T, V] (the full-logits
    path of a distillation loss).
    first_scored: on the chunked path, log-probs and entropy are computed from this
    position on (0 before it); the caller guarantees loss_mask is 0 there.
    denominator: see `objective_loss`; with the whole minibatch's
    `aggregation_denominator(cfg, loss_mask)`, the microbatch losses and gradients sum to
    the minibatch's exactly (gradient accumulation).
    """
    tokens = batch["tokens"]
    distill = _get(cfg, "distill")
    teacher_logits = batch.get("teacher_logits")
    distill_bt = None
    if apply_hidden_fn is not None and (not distill or teacher_hidden is not None):
        hidden, w_out = apply_hidden_fn(params, tokens, batch["attention_mask"])
        per_position = None
        if distill:
            per_position = functools.partial(
                _lookup(DISTILL_LOSSES, "distill", distill).per_position,
                **_get(cfg, "distill_kwargs"),
            )
        logp, entropy, distill_bt = chunked_token_stats(
            hidden,
            w_out,
            tokens,
            logprob_chunk,
            entropy=True,
            entropy_grad=bool(_get(cfg, "entropy_coef")),
            start=first_scored,
            teacher_hidden=teacher_hidden if distill else None,
            distill=per_position,
        )
        logits = None
    else:
        logits = apply_fn(params, tokens, batch["attention_mask"])
        logp, entropy = token_logprobs(logits, tokens), None
        if distill and teacher_hidden is not None:
            h_t, w_t = (sg(x) for x in teacher_hidden)
            teacher_logits = jnp.einsum(
                "btd,dv->btv", h_t, w_t.astype(h_t.dtype), preferred_element_type=jnp.float32
            )
    stats = TokenStats(
        logp=logp,
        old_logp=batch["old_logp"],
        mask=batch["loss_mask"],
        ref_logp=batch.get("ref_logp"),
        teacher_logp=batch.get("teacher_logp"),
        sc_logp=batch.get("sc_logp"),
        sc_kl=batch.get("sc_kl"),
    )
    return objective_loss(
        stats,
        batch["advantages"],
        cfg,
        logits=logits,
        teacher_logits=teacher_logits,
        tokens=tokens,
        entropy=entropy,
        distill_bt=distill_bt,
        denominator=denominator,
    )
