"""The `rollout` section's record (sampling/rollout_section.py): its nested sections and unset
keys as the config has them, its checks with the config's wording, and the traced keys the
sampler's `Knobs` take."""

import dataclasses

import pytest

from jaxrl_frontier.core import records
from jaxrl_frontier.sampling.params import Knobs
from jaxrl_frontier.sampling.rollout_section import TRACED_ROLLOUT_KEYS, RolloutSection


def test_a_section_given_in_part_keeps_the_other_defaults():
    r = records.build(RolloutSection, {"speculative": {"draft": 1}, "editors": ["dre"]}, "rollout")
    assert (r.speculative.draft, r.speculative.k, r.editors) == (1, 4, ("dre",))
    assert (r.group_size, r.mesh.data, r.cache_dtype) == (8, -1, None)


@pytest.mark.parametrize(
    "given, message",
    [
        ({"top_p": 0.0}, r"'rollout.top_p' = 0.0 must be in \(0, 1\]"),
        ({"min_p": 1.0}, r"'rollout.min_p' = 1.0 must be in \[0, 1\)"),
        ({"speculative": {"k": 0}}, "'rollout.speculative.k' = 0 must be > 0"),
        ({"cache_dtype": "float16"}, "'rollout.cache_dtype' = 'float16'; allowed"),
        ({"dtype": "float16"}, "'rollout.dtype' = 'float16'; allowed"),
        ({"temprature": 0.5}, "unknown config key 'rollout.temprature'.*'rollout.temperature'"),
    ],
)
def test_bad_values_are_named_by_their_keys(given, message):
    with pytest.raises(ValueError, match=message):
        records.build(RolloutSection, given, "rollout")


def test_the_traced_keys_are_the_sampler_knobs():
    knobs = {f.name for f in dataclasses.fields(Knobs)}
    assert set(TRACED_ROLLOUT_KEYS) <= knobs
    assert set(TRACED_ROLLOUT_KEYS) <= set(records.defaults(RolloutSection))
