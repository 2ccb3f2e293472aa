"""The sampler a config's `rollout` section asks for (`make_sampler`): the trainer's one
entry point to `Sampler`, `SpeculativeSampler`, `ContinuousSampler` and `PartialSampler`."""

from __future__ import annotations

from collections.abc import Mapping

from jax.sharding import Mesh

from jaxrl_frontier.core import records
from jaxrl_frontier.core.capabilities import refusal
from jaxrl_frontier.models.multi_token import MultiTokenPredictor
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.sampling.continuous import ContinuousSampler
from jaxrl_frontier.sampling.partial import PartialSampler
from jaxrl_frontier.sampling.rollout_section import MTP_DRAFT, RolloutSection
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


def sampler_key(rollout: RolloutSection, cls: type[Sampler]) -> str:
    """The key that chose the sampler `cls`, as a refusal names it."""
    if cls is SpeculativeSampler:
        return f"rollout.speculative.draft = {rollout.speculative.draft!r}"
    return f"rollout.continuous_slots = {rollout.continuous_slots}"


def asked_of_sampler(r: RolloutSection, *, partial: bool, record_routing: bool) -> dict[str, str]:
    """{feature: the key that asks for it} of what the rollouts ask of the sampler itself
    (`core.capabilities.FEATURES`), each refused by a sampler class that lacks it."""
    # the eval sampler of a run with partial rollouts (not `partial`) carries nothing over
    partial_rows = r.partial_budget and (partial or not r.continuous_slots)
    asked = {
        "partial_rows": partial_rows and f"'rollout.partial_budget' = {r.partial_budget}",
        "dropout_masks": r.dropout_rate and f"'rollout.dropout_rate' = {r.dropout_rate}",
        "speculative_draft": r.speculative.draft is not None
        and f"'rollout.speculative.draft' = {r.speculative.draft}",
        "routing_record": record_routing and "'model.moe.routing_replay' = 'rollout'",
    }
    return {feature: key for feature, key in asked.items() if key}


def make_sampler(
    model: Transformer,
    rollout: RolloutSection | Mapping,
    *,
    pad_id: int,
    mesh: Mesh | None = None,
    partial: bool = False,
    record_routing: bool = False,
    mtp: MultiTokenPredictor | None = None,
):
    """The sampler config section `rollout` asks for: with `speculative.draft` set, a
    `SpeculativeSampler` (draft: the policy's first layers, or with 'mtp' the module `mtp`,
    `hf.load_mtp` of the policy's checkpoint); with `continuous_slots` > 0, a
    `ContinuousSampler` (continuous batching), or with `partial` and `partial_budget` > 0 a
    `PartialSampler` (the training rollouts' partial rollouts); else a `Sampler`.
    record_routing: an MoE policy's rollouts carry their experts (`Sampler`'s only). What
    the chosen class lacks of what the rollouts ask (`asked_of_sampler`) is a ValueError
    naming the keys, from the class's declared `capabilities`."""
    r = rollout_record(rollout)
    if record_routing and not model.cfg.num_experts:
        raise ValueError(
            "config key 'model.moe.routing_replay' = 'rollout' needs a mixture-of-experts "
            "policy (model.moe.num_experts > 0, or a Qwen3-MoE checkpoint); set it to 'none'"
        )
    cls = sampler_class(r, partial=partial)
    caps = cls.capabilities
    for feature, key in asked_of_sampler(r, partial=partial, record_routing=record_routing).items():
        if not caps.supports(feature):
            raise ValueError(refusal(key, [f"{sampler_key(r, cls)} ({caps.why_not(feature)})"]))
    kw = dict(pad_id=pad_id, mesh=mesh, cache_dtype=r.cache_dtype or None, dtype=r.dtype or None)
    if cls is PartialSampler:
        return PartialSampler(model, slots=r.continuous_slots, budget=r.partial_budget, **kw)
    if cls is ContinuousSampler:
        return ContinuousSampler(model, slots=r.continuous_slots, **kw)
    if cls is Sampler:
        return Sampler(model, decode_phases=r.decode_phases, record_routing=record_routing, **kw)
    draft = r.speculative.draft
    if draft == MTP_DRAFT:
        if mtp is None:
            raise ValueError(
                f"config key 'rollout.speculative.draft' = {MTP_DRAFT!r}: no multi-token-"
                "prediction module was loaded (it is read from the policy's checkpoint)"
            )
        draft = mtp
    return SpeculativeSampler(model, draft, k=r.speculative.k, **kw)
