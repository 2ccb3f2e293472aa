"""The sampler a config's `rollout` section asks for (`make_sampler`): the trainer's one
entry point to `Sampler`, `SpeculativeSampler`, `ContinuousSampler` and `PartialSampler`."""

from __future__ import annotations

from jax.sharding import Mesh

from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.sampling.continuous import ContinuousSampler
from jaxrl_frontier.sampling.partial import PartialSampler
from jaxrl_frontier.sampling.sampler import Sampler
from jaxrl_frontier.sampling.speculative import SpeculativeSampler


def sampler_class(rollout, *, partial: bool = False) -> type[Sampler]:
    """The class `make_sampler` builds for the `rollout` section (no instance): what run/
    reads a sampler's declared `capabilities` from."""
    slots = int(rollout.get("continuous_slots") or 0)
    if slots:
        budget = int(rollout.get("partial_budget") or 0)
        return PartialSampler if budget and partial else ContinuousSampler
    spec = rollout.get("speculative") or {}
    return Sampler if spec.get("draft") is None else SpeculativeSampler


def make_sampler(
    model: Transformer,
    rollout,
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
    spec = rollout.get("speculative") or {}
    if record_routing and not model.cfg.num_experts:
        raise ValueError(
            "config key 'model.moe.routing_replay' = 'rollout' needs a mixture-of-experts "
            "policy (model.moe.num_experts > 0, or a Qwen3-MoE checkpoint); set it to 'none'"
        )
    if record_routing and (rollout.get("continuous_slots") or spec.get("draft") is not None):
        raise ValueError(
            "config key 'model.moe.routing_replay' = 'rollout' records the experts in the "
            "plain sampler only: set rollout.continuous_slots = 0 and rollout.speculative.draft "
            "= None, or model.moe.routing_replay = 'none'"
        )
    kw = dict(pad_id=pad_id, mesh=mesh, cache_dtype=rollout.get("cache_dtype") or None)
    slots = int(rollout.get("continuous_slots") or 0)
    if slots and spec.get("draft") is not None:
        raise ValueError(
            "config keys 'rollout.continuous_slots' and 'rollout.speculative.draft' are "
            "exclusive: set one of them"
        )
    if slots and rollout.get("dropout_rate"):
        raise ValueError(
            "config key 'rollout.continuous_slots' > 0 takes no Dropout-GRPO masks "
            "('rollout.dropout_rate' > 0: each row's prompt cache differs)"
        )
    budget = int(rollout.get("partial_budget") or 0)
    if budget and not slots:
        raise ValueError(
            f"config key 'rollout.partial_budget' = {budget} starts the next batch's rows in "
            "the slots of continuous batching: set 'rollout.continuous_slots' > 0"
        )
    if slots and budget and partial:
        return PartialSampler(model, slots=slots, budget=budget, **kw)
    if slots:
        return ContinuousSampler(model, slots=slots, **kw)
    if spec.get("draft") is None:
        phases = int(rollout.get("decode_phases") or 1)
        return Sampler(model, decode_phases=phases, record_routing=record_routing, **kw)
    return SpeculativeSampler(model, int(spec["draft"]), k=int(spec.get("k", 4)), **kw)
