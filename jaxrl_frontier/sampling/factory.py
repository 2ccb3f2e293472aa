"""The sampler a config's `rollout` section asks for (`make_sampler`): the trainer's one
entry point to `Sampler`, `SpeculativeSampler`, `ContinuousSampler` and `PartialSampler`."""

from __future__ import annotations

from collections.abc import Mapping

from jax.sharding import Mesh

from jaxrl_frontier.core import records
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.sampling.continuous import ContinuousSampler
from jaxrl_frontier.sampling.partial import PartialSampler
from jaxrl_frontier.sampling.rollout_section import RolloutSection
from jaxrl_frontier.sampling.sampler import Sampler
from jaxrl_frontier.sampling.speculative import SpeculativeSampler


def rollout_record(rollout: RolloutSection | Mapping) -> RolloutSection:
    """The `rollout` section as its record (a mapping, e.g. a notebook's dict of the keys it
    sets, is built into one: the keys not given at their defaults)."""
    if isinstance(rollout, RolloutSection):
        return rollout
    return records.build(RolloutSection, rollout, "rollout")


def sampler_class(rollout: RolloutSection | Mapping, *, partial: bool = False) -> type[Sampler]:
    """The class `make_sampler` builds for the `rollout` section (no instance): what run/
    reads a sampler's declared `capabilities` from."""
    r = rollout_record(rollout)
    if r.continuous_slots:
        return PartialSampler if r.partial_budget and partial else ContinuousSampler
    return Sampler if r.speculative.draft is None else SpeculativeSampler


def make_sampler(
    model: Transformer,
    rollout: RolloutSection | Mapping,
    *,
    pad_id: int,
    mesh: Mesh | None = None,
    partial: bool = False,
    record_routing: bool = False,
):
    """The sampler config section `rollout` asks for: with `speculative.draft` set, a
    `SpeculativeSampler` (draft: the policy's first layers); with `continuous_slots` > 0, a
    `ContinuousSampler` (continuous batching), or with `partial` and `partial_budget` > 0 a
    `PartialSampler` (the training rollouts' partial rollouts); else a `Sampler`.
    record_routing: an MoE policy's rollouts carry their experts (`Sampler`'s only)."""
    r = rollout_record(rollout)
    draft, slots, budget = r.speculative.draft, r.continuous_slots, r.partial_budget
    if record_routing and not model.cfg.num_experts:
        raise ValueError(
            "config key 'model.moe.routing_replay' = 'rollout' needs a mixture-of-experts "
            "policy (model.moe.num_experts > 0, or a Qwen3-MoE checkpoint); set it to 'none'"
        )
    if record_routing and (slots or draft is not None):
        raise ValueError(
            "config key 'model.moe.routing_replay' = 'rollout' records the experts in the "
            "plain sampler only: set rollout.continuous_slots = 0 and rollout.speculative.draft "
            "= None, or model.moe.routing_replay = 'none'"
        )
    kw = dict(pad_id=pad_id, mesh=mesh, cache_dtype=r.cache_dtype or None)
    if slots and draft is not None:
        raise ValueError(
            "config keys 'rollout.continuous_slots' and 'rollout.speculative.draft' are "
            "exclusive: set one of them"
        )
    if slots and r.dropout_rate:
        raise ValueError(
            "config key 'rollout.continuous_slots' > 0 takes no Dropout-GRPO masks "
            "('rollout.dropout_rate' > 0: each row's prompt cache differs)"
        )
    if budget and not slots:
        raise ValueError(
            f"config key 'rollout.partial_budget' = {budget} starts the next batch's rows in "
            "the slots of continuous batching: set 'rollout.continuous_slots' > 0"
        )
    if slots and budget and partial:
        return PartialSampler(model, slots=slots, budget=budget, **kw)
    if slots:
        return ContinuousSampler(model, slots=slots, **kw)
    if draft is None:
        return Sampler(model, decode_phases=r.decode_phases, record_routing=record_routing, **kw)
    return SpeculativeSampler(model, draft, k=r.speculative.k, **kw)
