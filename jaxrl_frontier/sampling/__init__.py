"""Rollouts: `Sampler` (a jitted prefill and one while-loop decode over a KV cache),
`SpeculativeSampler` (a draft proposes, the policy verifies), their records and pure ops.

    params.py       SamplingParams, FinishReason; Plan (static) and Knobs (traced)
    ops.py          truncation, the exact draw, log-probs, Dropout-GRPO masks
    rollout.py      Rollout, Sequences, prompt padding
    sampler.py      Sampler, DecodeState
    speculative.py  SpeculativeSampler, shallow_draft; make_sampler (the sampler a `rollout`
                    config section asks for)
"""
# ruff: noqa: F401  (the package's public names)

from jaxrl_frontier.sampling.ops import mlp_dropout_mask, sample_logits, truncate_logits
from jaxrl_frontier.sampling.params import FinishReason, Knobs, Plan, SamplingParams
from jaxrl_frontier.sampling.rollout import (
    DEFAULT_PROMPT_BUCKETS,
    Rollout,
    Sequences,
    left_pad_prompts,
)
from jaxrl_frontier.sampling.sampler import DecodeState, Sampler
from jaxrl_frontier.sampling.speculative import SpeculativeSampler, make_sampler, shallow_draft
