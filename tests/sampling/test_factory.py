"""The sampler factory (sampling/factory.py): the class each `rollout` section asks for,
`make_sampler` building exactly that class (what run/ reads capabilities from), and every
combination it refuses named by its keys. Nothing is compiled: samplers trace on first use."""

import pytest
from tiny_sampler import PAD, make_model

from jaxrl_frontier.sampling import (
    ContinuousSampler,
    Sampler,
    SpeculativeSampler,
    make_sampler,
)
from jaxrl_frontier.sampling.factory import sampler_class
from jaxrl_frontier.sampling.partial import PartialSampler

PLAIN = dict(continuous_slots=0, partial_budget=0, speculative=dict(draft=None, k=4))
CASES = [  # (rollout section, partial, the class)
    (PLAIN, False, Sampler),
    ({**PLAIN, "speculative": dict(draft=1, k=3)}, False, SpeculativeSampler),
    ({**PLAIN, "continuous_slots": 2}, False, ContinuousSampler),
    ({**PLAIN, "continuous_slots": 2, "partial_budget": 4}, True, PartialSampler),
    # the eval sampler of a run with partial rollouts: continuous, nothing carried over
    ({**PLAIN, "continuous_slots": 2, "partial_budget": 4}, False, ContinuousSampler),
]


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.mark.parametrize("rollout,partial,cls", CASES)
def test_make_sampler_builds_the_class_sampler_class_names(model, rollout, partial, cls):
    assert sampler_class(rollout, partial=partial) is cls
    sampler = make_sampler(model, rollout, pad_id=PAD, partial=partial)
    assert type(sampler) is cls
    if cls is SpeculativeSampler:
        assert sampler.k == 3
    if cls in (ContinuousSampler, PartialSampler):
        assert sampler.slots == 2


@pytest.mark.parametrize("rollout,partial,cls", CASES)
def test_rollout_dtype_reaches_every_sampler_class(model, rollout, partial, cls):
    """`rollout.dtype`: each class computes in it (a shallow draft too); the model is kept."""
    sampler = make_sampler(model, {**rollout, "dtype": "bfloat16"}, pad_id=PAD, partial=partial)
    assert sampler.cfg.dtype == "bfloat16" and model.cfg.dtype == "float32"
    if cls is SpeculativeSampler:
        assert sampler.proposer.cfg.dtype == "bfloat16"


@pytest.mark.parametrize(
    "rollout,match",
    [
        ({**PLAIN, "continuous_slots": 2, "speculative": dict(draft=1)}, "are exclusive"),
        ({**PLAIN, "continuous_slots": 2, "dropout_rate": 0.1}, "rollout.dropout_rate"),
        # the plain sampler's declaration (run/config/parts.py refuses the config alike)
        ({**PLAIN, "partial_budget": 4}, r"continuous_slots = 0 \(the rows start in its idle"),
    ],
)
def test_combinations_it_cannot_build_name_their_keys(model, rollout, match):
    with pytest.raises(ValueError, match=match):
        make_sampler(model, rollout, pad_id=PAD, partial=True)


def test_routing_replay_needs_experts_and_the_plain_sampler(model):
    with pytest.raises(ValueError, match="needs a mixture-of-experts policy"):
        make_sampler(model, PLAIN, pad_id=PAD, record_routing=True)
