"""The loss, assembled from the w(p) policy-gradient surrogate, KL to the reference, the
entropy bonus and the OPD distributional losses (aggregation.py, distillation.py; per-token
statistics: logprobs.py; its `config.objective` section: schema.py).
`teacher_logits` are the teacher's raw output on the same tokens (unshifted, like the
student's `apply_fn` output).

The total loss, with `agg` the configured aggregation and m the completion mask:

    L = pg_coef      * agg(-sg(w * A) * exp(l - sg(l)))      # value -wA, grad -(1/Z) w A grad l
      + kl_coef      * agg(k(l - l_ref))                     # unless kl_in_reward
      - entropy_coef * agg(H)
      + distill_coef * agg(D(student, teacher))

Every aggregation is agg(x) = N(x) / Z, N additive over rows and Z a function of the mask
only, so gradient accumulation is exact (`loss_fn(denominator=)`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_frontier.core.errors import ObjectiveConfigError
from jaxrl_frontier.objectives.aggregation import AGGREGATIONS, token_mean
from jaxrl_frontier.objectives.distillation import DISTILL_LOSSES, kl_to_ref
from jaxrl_frontier.objectives.logprobs import (
    DEFAULT_LOGPROB_CHUNK,
    chunked_token_stats,
    output_logits,
    select_teacher,
    teacher_pairs,
    token_entropy,
    token_logprobs,
)

# The objective's section (schema.py); its names stay importable from here as well, since
# the learner, the config and users' notebooks read them as `losses.<name>`.
from jaxrl_frontier.objectives.schema import (  # noqa: F401
    CHOICES,
    DEFAULTS,
    RANGES,
    REGISTRIES,
    TRACED_KEYS,
    ObjectiveSection,
    check_available,
    default_config,
    entry_defaults,
    objective_of,
    required_fields,
    setting,
    term_on,
    traced_keys,
    validate_objective_config,
    value_of,
    with_values,
)
from jaxrl_frontier.objectives.stats import OPTIONAL_FIELDS, TokenStats
from jaxrl_frontier.objectives.weights import WEIGHTS

Array = jax.Array
sg = jax.lax.stop_gradient


def aggregation_denominator(cfg: ObjectiveSection | Mapping[str, Any], mask_bt: Array) -> Array:
    """Z of the configured aggregation for `mask_bt` [B, T] (a scalar, a function of the mask).

    Compute it over a whole minibatch and pass it to `loss_fn(..., denominator=Z)` for each
    of its microbatches: the sum of the microbatch losses (and gradients) is then exactly the
    minibatch's.
    """
    cfg = objective_of(cfg)
    name = cfg.aggregation
    entry = AGGREGATIONS.get(name)
    return entry.denominator(mask_bt.astype(jnp.float32), **cfg.aggregation_kwargs)


# ----------------------------------------------------------------------------- the loss


def _token_mean(x_bt: Array, mask_bt: Array) -> Array:
    return sg(token_mean(x_bt, mask_bt))


def objective_loss(
    stats: TokenStats,
    adv: Array,
    cfg: ObjectiveSection | Mapping[str, Any],
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
    cfg = objective_of(cfg)
    validate_objective_config(cfg)
    present = {f for f in OPTIONAL_FIELDS if getattr(stats, f) is not None}
    present |= {"logits"} if logits is not None else set()
    present |= {"teacher_logits"} if teacher_logits is not None or distill_bt is not None else set()
    check_available(cfg, present | {"logp", "old_logp", "mask"})

    m = stats.mask.astype(jnp.float32)
    aggregate = AGGREGATIONS.get(cfg.aggregation)
    agg_kwargs = cfg.aggregation_kwargs
    Z = aggregate.denominator(m, **agg_kwargs) if denominator is None else denominator

    def agg(x_bt):  # N(x) / Z
        return aggregate.numerator(x_bt, m, **agg_kwargs) / Z

    # Policy gradient: w held constant; exp(l - sg(l)) is 1 in value and grad l in gradient,
    # so the value reads -w A and the gradient is exactly -(1/Z) w A grad l.
    weight_fn, weight_kwargs = WEIGHTS.get(cfg.weight), cfg.weight_kwargs
    w = sg(weight_fn(stats, adv, **weight_kwargs))
    wA = jnp.where(m > 0, w * adv, 0.0)
    pg_bt = -sg(wA) * jnp.exp(stats.logp - sg(stats.logp))
    pg_loss = agg(pg_bt)
    loss = cfg.pg_coef * pg_loss
    metrics = {"pg_loss": pg_loss}
    loss = _add_kl(loss, metrics, stats, cfg, agg)
    loss = _add_entropy(loss, metrics, cfg, agg, m, logits, entropy)
    loss = _add_distill(loss, metrics, cfg, agg, (logits, teacher_logits, tokens, distill_bt))
    hp = {**entry_defaults(weight_fn), **weight_kwargs}
    metrics.update(loss=loss, **_diagnostics(stats, w, adv, m, hp))
    return loss, metrics


def _add_kl(loss, metrics: dict, stats: TokenStats, cfg, agg):
    """loss + kl_coef * agg(KL to the reference) (not with kl_in_reward); metrics kl_ref,
    kl_loss."""
    if stats.ref_logp is None:
        return loss
    m = stats.mask.astype(jnp.float32)
    kl_bt = kl_to_ref(stats, cfg.kl_estimator)
    metrics["kl_ref"] = _token_mean(kl_to_ref(stats, "k3"), m)
    if term_on(cfg, "kl_coef") and not cfg.kl_in_reward:
        kl_loss = agg(kl_bt)
        loss = loss + cfg.kl_coef * kl_loss
        metrics["kl_loss"] = kl_loss
    return loss


def _add_entropy(loss, metrics: dict, cfg, agg, m, logits, entropy):
    """loss - entropy_coef * agg(token entropy), from the logits or the given entropies."""
    if logits is None and entropy is None:
        return loss
    ent_bt = token_entropy(logits) if entropy is None else entropy
    if term_on(cfg, "entropy_coef"):
        ent = agg(ent_bt)
        loss = loss - cfg.entropy_coef * ent
    metrics["entropy"] = _token_mean(ent_bt, m)
    return loss


def _add_distill(loss, metrics: dict, cfg, agg, inputs):
    """loss + distill_coef * agg(the distillation loss); inputs: (student logits, teacher
    logits, tokens, the per-token loss when computed elsewhere)."""
    distill = cfg.distill
    if not distill:
        return loss
    logits, teacher_logits, tokens, distill_bt = inputs
    if distill_bt is None:
        if logits is None:
            raise ObjectiveConfigError(
                f"config.objective: distill {distill!r} needs the student logits"
            )
        if distill == "cr_opd" and tokens is None:
            raise ObjectiveConfigError("config.objective: distill 'cr_opd' needs `tokens`")
        distill_bt = DISTILL_LOSSES.get(distill)(
            logits, teacher_logits, tokens, **cfg.distill_kwargs
        )
    distill_loss = agg(distill_bt)
    metrics["distill_loss"] = distill_loss
    return loss + cfg.distill_coef * distill_loss


def _diagnostics(stats: TokenStats, w, adv, m, hp: dict) -> dict[str, Array]:
    """Constant diagnostics: how far the policy moved, and how much the weight dropped."""
    d = jnp.where(m > 0, sg(stats.logp) - stats.old_logp, 0.0)
    r = jnp.exp(d)
    eps_low, eps_high = hp.get("eps_low", 0.2), hp.get("eps_high", 0.2)
    return dict(
        clip_frac=_token_mean((w == 0).astype(jnp.float32), m),
        ratio_clip_frac=_token_mean(
            ((r > 1 + eps_high) | (r < 1 - eps_low)).astype(jnp.float32), m
        ),
        approx_kl=_token_mean(r - 1.0 - d, m),
        weight_mean=_token_mean(w, m),
        ratio_mean=_token_mean(r, m),
        adv_mean=_token_mean(adv, m),
    )


def _unpacked(unpack, first_scored: int, t: int, *xs):
    """Packed-slot statistics [R, N] back on the rows [B, T] (None stays None), 0 before
    `first_scored` as on padded rows."""
    scored = jnp.arange(t) >= first_scored
    return tuple(None if x is None else jnp.where(scored, unpack(x), 0.0) for x in xs)


def _chunked_stats(params, batch, cfg, apply_hidden_fn, chunking, teachers, packed):
    """(logp, entropy, the per-token distillation loss or None), each [B, T], from the final
    hidden states in chunks of positions (`chunked_token_stats`); chunking: (logprob_chunk,
    first_scored); teachers: (teacher_hidden, teacher_index); packed rows: computed over the
    slots, then unpacked. See `loss_fn`."""
    teacher_hidden, teacher_index = teachers
    logprob_chunk, first_scored = chunking
    tokens, distill = batch["tokens"], cfg.distill
    stat_tokens = tokens if packed is None else packed[0]
    hidden, w_out = apply_hidden_fn(params, stat_tokens, batch["attention_mask"])
    per_position = None
    if distill:
        per_position = functools.partial(
            DISTILL_LOSSES.get(distill).per_position,
            **cfg.distill_kwargs,
        )
    logp, entropy, distill_bt = chunked_token_stats(
        hidden,
        w_out,
        stat_tokens,
        logprob_chunk,
        entropy=True,
        entropy_grad=term_on(cfg, "entropy_coef"),
        start=first_scored if packed is None else 1,
        teacher_hidden=teacher_hidden if distill else None,
        distill=per_position,
        teacher_index=teacher_index,
    )
    if packed is not None:
        t = tokens.shape[1]
        return _unpacked(packed[1], first_scored, t, logp, entropy, distill_bt)
    return logp, entropy, distill_bt


def _teacher_logits(teacher_hidden, teacher_index) -> Array:
    """The teacher's [B, T, V] logits from its (hidden, output layer), held constant; several
    teachers': each position's own teacher's (`logprobs.select_teacher` by teacher_index)."""
    pairs = teacher_pairs(teacher_hidden)
    every = [output_logits(sg(h), sg(w), "btd,dv->btv") for h, w in pairs]
    return select_teacher(every, teacher_index if len(pairs) > 1 else None)


def loss_fn(
    params: Any,
    batch: Mapping[str, Array],
    cfg: ObjectiveSection | Mapping[str, Any],
    *,
    apply_fn: Callable[[Any, Array, Array], Array],
    apply_hidden_fn: Callable[[Any, Array, Array], tuple[Array, Array]] | None = None,
    logprob_chunk: int = DEFAULT_LOGPROB_CHUNK,
    first_scored: int = 1,
    teacher_hidden: tuple | None = None,
    denominator: Array | float | None = None,
    packed: tuple[Array, Callable[[Array], Array]] | None = None,
    teacher_index: Array | None = None,
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
    (`chunked_token_stats`), never from the whole batch's (without apply_hidden_fn: in full).
    Several teachers (`teacher.by_tag`, one vocabulary): K such pairs, and teacher_index
    each position's k, laid out as the hidden states: D(student, teacher_{index[b, t]}).
    batch: tokens, attention_mask, loss_mask, old_logp, advantages (all [B, T]); optional
    ref_logp, teacher_logp, sc_logp, sc_kl [B, T] and teacher_logits [B, T, V] (the full-logits
    path of a distillation loss).
    first_scored: on the chunked path, log-probs and entropy are computed from this
    position on (0 before it); the caller guarantees loss_mask is 0 there.
    denominator: see `objective_loss`; with the whole minibatch's
    `aggregation_denominator(cfg, loss_mask)`, the microbatch losses and gradients sum to
    the minibatch's exactly (gradient accumulation).
    packed: (tokens [R, N], unpack [R, N] -> [B, T]) for packed rows: hidden states (and
    `teacher_hidden`) are [R, N, D], the statistics are computed over the slots and unpacked.
    """
    cfg = objective_of(cfg)
    tokens = batch["tokens"]
    distill = cfg.distill
    teacher_logits = batch.get("teacher_logits")
    distill_bt = None
    if apply_hidden_fn is not None and (not distill or teacher_hidden is not None):
        logp, entropy, distill_bt = _chunked_stats(
            params,
            batch,
            cfg,
            apply_hidden_fn,
            (logprob_chunk, first_scored),
            (teacher_hidden, teacher_index),
            packed,
        )
        logits = None
    else:
        logits = apply_fn(params, tokens, batch["attention_mask"])
        logp, entropy = token_logprobs(logits, tokens), None
        if distill and teacher_hidden is not None:
            teacher_logits = _teacher_logits(teacher_hidden, teacher_index)
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
