"""Rollouts: `Sampler`, `SpeculativeSampler`, `ContinuousSampler`, their records (`Rollout`)
and pure sampling ops; one file per job (params, ops, records, sampler, speculative,
continuous, factory: `make_sampler`; docs/sampling.md)."""
# ruff: noqa: F401  (the package's public names)

from jaxrl_frontier.sampling.continuous import ContinuousSampler
from jaxrl_frontier.sampling.factory import make_sampler
from jaxrl_frontier.sampling.ops import mlp_dropout_mask, sample_logits, truncate_logits
from jaxrl_frontier.sampling.params import FinishReason, Knobs, Plan, SamplingParams
from jaxrl_frontier.sampling.records import (
    DEFAULT_PROMPT_BUCKETS,
    Rollout,
    Sequences,
    left_pad_prompts,
)
from jaxrl_frontier.sampling.sampler import DecodeState, Sampler
from jaxrl_frontier.sampling.speculative import SpeculativeSampler, shallow_draft
