"""The RL loss over the policy (`rl_loss`): what the Learner's update differentiates.

The loss is `losses.loss_fn` over the policy: log-probs from the fused, chunked output layer,
the rollout's Dropout-GRPO masks applied (the update runs the sub-network that sampled each
row), and, for a full-vocabulary distillation loss, the teacher's hidden states computed per
microbatch inside the update (never a [B, T, V] teacher tensor on the host). Several
teachers sharing the policy's vocabulary (`teacher.by_tag`): every teacher runs on every
row of the microbatch (K teacher forwards, K teacher [chunk, V] logit blocks per chunk) and
each row's loss reads its own teacher's logits, selected by the batch's `teacher_index`
(rl/experience.TEACHER_INDEX): D(student, teacher_{index[b]}) at each position of row b.
Packed rows
(`packed_loss`), an MoE router's terms and replayed routing (`add_router_terms`), LoRA's
frozen base (`with_base`) are parts of it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_frontier.models import lora, moe
from jaxrl_frontier.objectives import logprobs, losses
from jaxrl_frontier.rl.experience import TEACHER_INDEX
from jaxrl_frontier.rl.learn import packing
from jaxrl_frontier.rl.learn.forward import (
    apply_hidden,
    apply_logits,
    apply_packed_hidden,
    first_scored,
)
from jaxrl_frontier.sampling import mlp_dropout_mask

sg = jax.lax.stop_gradient


def dropout_masks(model_cfg, dropout_rate: float, keys_data):
    """The rollout's Dropout-GRPO masks [L, B, F] rebuilt from its row keys [B, 2]."""
    keys = jax.random.wrap_key_data(keys_data)
    return mlp_dropout_mask(
        keys,
        dropout_rate,
        model_cfg.num_layers,
        model_cfg.intermediate_size,
        model_cfg.compute_dtype,
    )


def objective_at(objective, frozen):
    """The objective with this step's scheduled or controlled values (`frozen['knobs']`, traced
    arguments of the update: `losses.with_values`), or as configured."""
    if frozen is not None and "knobs" in frozen:
        return losses.with_values(objective, frozen["knobs"])
    return objective


def rl_loss(
    graphdef,
    objective_cfg,
    logprob_chunk: int | None = logprobs.DEFAULT_LOGPROB_CHUNK,
    *,
    group_size: int = 1,
    completion_len: int = 0,
    dropout_rate: float = 0.0,
    model_cfg=None,
    teacher_graphdef=None,
    capture_hidden: bool = False,
):
    """`loss_of(params, batch, denominator=None, frozen=None) -> (loss, metrics)`:
    `losses.loss_fn` over the policy.

    A batch with a 'pack' entry (one microbatch's maps, `packing.plan_packing`) runs on
    packed rows (`packed_loss`): the same loss, of the rows that microbatch holds.

    completion_len > 0: log-probs only over the last `completion_len` positions (the loss
    mask is 0 on the prompt); with group_size > 1 each group's prompt runs once. Both need
    prompt-major groups of [prompt | completion] rows. dropout_rate > 0: the batch carries
    `dropout_keys` [B, 2] and every policy forward runs under those rows' masks
    (`model_cfg` gives their shape). teacher_graphdef: `frozen['teacher']` holds its
    weights, and a distillation loss reads its hidden states (no gradient); several
    teachers: a tuple of graphdefs, `frozen['teacher']` a tuple of their weights in the same
    order, and the batch's `teacher_index` [B, T] each row's (module docstring).
    capture_hidden: metrics['hidden'] holds the policy's final hidden states [B, T, D] of the
    loss's own forward (a value head reads them: `rl.ppo`), when that forward computes them.
    An MoE policy (`model_cfg.num_experts`; group_size 1): + `add_router_terms`; a batch's
    `routing` [B, T, L, k] replays those experts.
    `frozen['knobs']` (when present): {objective key: f32 []} replacing those keys of
    `objective_cfg` (`losses.with_values`): schedules and controllers move them step by step
    as arguments of the one compiled update.
    """
    objective_cfg = losses.objective_of(objective_cfg)
    logits_fn = apply_logits(graphdef, group_size, completion_len)
    routed = bool(model_cfg is not None and model_cfg.num_experts)  # MoE: the router's stats
    hidden_fn = None
    if logprob_chunk is not None or routed:
        hidden_fn = apply_hidden(graphdef, group_size, completion_len, router=routed)
    teacher_hidden_fn = None if teacher_graphdef is None else teachers_fn(teacher_graphdef)
    packed_loss_of = packed_loss(graphdef, logprob_chunk, completion_len, teacher_graphdef)

    def loss_of(params, batch, denominator=None, frozen=None):
        batch = dict(batch)
        cfg = objective_at(objective_cfg, frozen)
        if "pack" in batch:
            return packed_loss_of(params, batch, cfg, denominator, frozen)
        routing, keys = batch.pop("routing", None), batch.pop("dropout_keys", None)
        mlp_mask = dropout_masks(model_cfg, dropout_rate, keys) if dropout_rate > 0 else None
        kwargs = _loss_kwargs(batch, denominator, frozen, teacher_hidden_fn)
        seen = {}

        def hidden_of(p, t, m):
            out = hidden_fn(p, t, m, mlp_mask, *((routing,) if routed else ()))
            seen["hidden"], w_out, seen["router"] = *out[:2], out[2:]
            return seen["hidden"], w_out

        logits_of = lambda p, t, m: nnx.merge(graphdef, p).logits(hidden_of(p, t, m)[0])
        apply_fn = logits_of if routed else lambda p, t, m: logits_fn(p, t, m, mlp_mask)
        loss, metrics = losses.loss_fn(
            params,
            batch,
            cfg,
            apply_fn=apply_fn,
            apply_hidden_fn=None if hidden_fn is None else hidden_of,
            logprob_chunk=logprob_chunk or logprobs.DEFAULT_LOGPROB_CHUNK,
            first_scored=first_scored(batch["tokens"], completion_len),
            **kwargs,
        )
        if capture_hidden and "hidden" in seen:
            metrics = {**metrics, "hidden": seen["hidden"]}
        if seen.get("router"):  # an MoE policy: the router's terms and metrics
            loss, metrics = add_router_terms(
                loss, metrics, seen["router"][0], routing, cfg, batch["loss_mask"], denominator
            )
        return loss, metrics

    return loss_of


def teachers_fn(teacher_graphdef, apply=apply_hidden):
    """(weights, *inputs) -> the teacher's `apply(graphdef)` output (final hidden, output
    layer); several teachers (a tuple of graphdefs): (a tuple of weights, *inputs) -> a
    tuple of every teacher's, in order."""
    if not isinstance(teacher_graphdef, tuple):
        return apply(teacher_graphdef)
    fns = tuple(apply(g) for g in teacher_graphdef)
    return lambda weights, *inputs: tuple(f(w, *inputs) for f, w in zip(fns, weights))


def _loss_kwargs(batch, denominator, frozen, teacher_hidden_fn) -> dict[str, Any]:
    """`losses.loss_fn`'s optional arguments: the minibatch's denominator, the teacher's
    final hidden states (held constant; several teachers: each's, and each row's index)."""
    kwargs: dict[str, Any] = {}
    if denominator is not None:
        kwargs["denominator"] = denominator
    if teacher_hidden_fn is not None and frozen is not None:
        kwargs["teacher_hidden"] = sg(
            teacher_hidden_fn(frozen["teacher"], batch["tokens"], batch["attention_mask"])
        )
        if isinstance(frozen["teacher"], tuple):
            kwargs["teacher_index"] = batch[TEACHER_INDEX]
    return kwargs


def packed_loss(graphdef, logprob_chunk, completion_len: int, teacher_graphdef=None):
    """(params, batch with 'pack', cfg, denominator, frozen) -> (loss, metrics): `loss_fn` of
    the rows one microbatch of packed rows holds (`rl.learn.packing`).

    The forward runs on the packed slots; log-probs, entropy and distillation terms are
    computed there and unpacked to [B, T]. The rows of the minibatch this microbatch does
    not hold read as all-masked rows (every float [B, T] input 0 there, as on a prompt), so
    they add nothing to any aggregation's numerator. Full logits (logprob_chunk None) are
    unpacked to [B, T, V]."""
    hidden_fn = apply_packed_hidden(graphdef)
    teacher_fn = None
    if teacher_graphdef is not None:
        teacher_fn = teachers_fn(teacher_graphdef, apply_packed_hidden)

    def loss_of(params, batch, cfg, denominator, frozen):
        batch = dict(batch)
        pk = batch.pop("pack")
        tokens = batch["tokens"]
        dst = packing.destinations(pk["start"], batch["attention_mask"], pk["src"].size)
        here = packing.present(dst, pk["src"].size)
        for k, v in batch.items():
            if v.shape == here.shape and jnp.issubdtype(v.dtype, jnp.floating):
                batch[k] = jnp.where(here, v, 0.0)
        unpack = lambda x: packing.unpack(x, dst)

        def apply_fn(p, t, m):  # the full-logits path: [B, T, V]
            hidden, _ = hidden_fn(p, tokens, pk)
            return unpack(nnx.merge(graphdef, p).logits(hidden))

        kwargs: dict[str, Any] = {}
        if denominator is not None:
            kwargs["denominator"] = denominator
        if teacher_fn is not None and frozen is not None:
            kwargs.update(_packed_teachers(teacher_fn(frozen["teacher"], tokens, pk), batch,
                                           pk, unpack if logprob_chunk is None else None))  # fmt: skip
        return losses.loss_fn(
            params,
            batch,
            cfg,
            apply_fn=apply_fn,
            apply_hidden_fn=None
            if logprob_chunk is None
            else (lambda p, t, m: hidden_fn(p, tokens, pk)),
            logprob_chunk=logprob_chunk or logprobs.DEFAULT_LOGPROB_CHUNK,
            first_scored=first_scored(tokens, completion_len),
            packed=(packing.gather_packed(tokens, pk["src"]), unpack),
            **kwargs,
        )

    return loss_of


def _packed_teachers(out, batch, pk, unpack) -> dict[str, Any]:
    """`loss_fn`'s teacher arguments on packed rows from the teachers' packed forward `out`
    ((hidden [R, N, D_t], output layer), or several teachers' tuple of them): the hidden
    states on the slots, or (`unpack` given: the full-logits path) on the rows [B, T, D_t],
    and with several teachers each slot's (or row's) teacher index."""
    several = isinstance(out[0], tuple)
    pairs = out if several else (out,)
    if unpack is not None:
        pairs = tuple((unpack(h), w) for h, w in pairs)
    kwargs: dict[str, Any] = {"teacher_hidden": sg(pairs if several else pairs[0])}
    if several:
        index = batch[TEACHER_INDEX]
        kwargs["teacher_index"] = index if unpack else packing.gather_packed(index, pk["src"])
    return kwargs


def router_terms(stats, objective) -> tuple[jax.Array, dict]:
    """(router_aux_coef x the load-balancing loss + router_z_coef x the z-loss, the routing
    metrics) of an MoE forward's stacked `moe.RouterStats`; objective: the objective section
    (its coefficients possibly traced: scheduled)."""
    terms = moe.router_losses(stats)
    aux, z = (
        losses.value_of(objective, "router_aux_coef"),
        losses.value_of(objective, "router_z_coef"),
    )
    metrics = {
        **moe.router_metrics(stats),
        "moe/load_balance_loss": terms["load_balance"],
        "moe/z_loss": terms["z"],
    }
    return aux * terms["load_balance"] + z * terms["z"], metrics


def add_router_terms(loss, metrics, stats, routing, objective, loss_mask, denominator):
    """(loss + this microbatch's share of `router_terms`, metrics + the routing metrics,
    with routing [B, T, L, k] replayed `moe/routing_diff_share`, and `moe.LOAD_METRIC`: the
    layers' loads [L, E] for the update's balancing step, `train_step.balanced`). The share is the
    microbatch's aggregation count over the minibatch's denominator (1 without one), so the
    microbatches' terms add up to the minibatch's."""
    share = 1.0
    if denominator is not None:
        share = losses.aggregation_denominator(objective, loss_mask) / denominator
    extra, router_metrics = router_terms(stats, objective)
    # the per-layer load [L, E] the update's balancing step reads (and takes out of the metrics)
    metrics = {**metrics, **router_metrics, moe.LOAD_METRIC: stats.load}
    if routing is not None:  # the rollout's experts against the update's router
        metrics["moe/routing_diff_share"] = replay_difference(stats, routing)
    return loss + share * extra, metrics


def replay_difference(stats, routing) -> jax.Array:
    """The share of recorded (token, layer) pairs whose recorded experts (routing
    [B, T, L, k], -1: none) differ from the update's own top-k (`stats.own` [L, B, T, k]):
    the prompt's tokens and every fed completion token."""
    counted = jnp.all(routing >= 0, axis=(-2, -1))
    return moe.routing_difference_share(jnp.moveaxis(stats.own, 0, 2), routing, counted)


def with_base(loss_of):
    """`loss_of` over adapters: (adapters, batch, denominator, frozen) -> loss_of(base +
    adapters, ...) with the base from `frozen['base']`, so the gradient is the adapters'."""

    def adapters_loss(adapters, batch, denominator=None, frozen=None):
        params = lora.combine(frozen["base"], adapters)
        return loss_of(params, batch, denominator=denominator, frozen=frozen)

    return adapters_loss
