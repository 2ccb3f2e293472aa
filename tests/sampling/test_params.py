"""sampling/params.py: SamplingParams' checks and stop ids, and its split into the static
Plan and the traced Knobs."""

import numpy as np
import pytest

from jaxrl_frontier.sampling import FinishReason, Knobs, Plan, SamplingParams


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("max_new_tokens", 0, ">= 1"),
        ("n", 0, ">= 1"),
        ("temperature", 0.0, r"> 0 \(or greedy=True\)"),
        ("top_k", -1, ">= 0"),
        ("top_p", 1.5, r"in \(0, 1\]"),
        ("min_p", 1.0, r"in \[0, 1\)"),
        ("dropout_rate", 1.0, r"in \[0, 1\)"),
    ],
)
def test_each_setting_is_checked(field, value, allowed):
    kwargs = {"max_new_tokens": 4, field: value}
    with pytest.raises(ValueError, match=rf"SamplingParams.{field}={value!r}; must be {allowed}"):
        SamplingParams(**kwargs)


def test_stop_ids_plan_and_knobs():
    assert SamplingParams(max_new_tokens=1, temperature=0.0, greedy=True).greedy  # T unused
    p = SamplingParams(
        max_new_tokens=8, n=2, temperature=0.5, top_p=0.9, eos_ids=[np.int64(2)],
        stop_ids=(9, 2, 5, 7, 11),
    )  # fmt: skip
    assert p.eos_ids == (2,) and type(p.eos_ids[0]) is int
    assert p.all_stop_ids == (2, 5, 7, 9, 11) and p.stop_id_slots == 8  # 5 ids -> 8 slots
    assert SamplingParams(max_new_tokens=1).stop_id_slots == 4
    assert Plan.of(p) == Plan(2, 8, False, 0, True, False, 8, False)
    knobs = Knobs.of(p, first_row=6)
    assert knobs.stop_ids.tolist() == [2, 5, 7, 9, 11, -1, -1, -1]
    assert (knobs.temperature, knobs.top_p, knobs.first_row) == (0.5, np.float32(0.9), 6)
    assert knobs.top_p.dtype == np.float32 and knobs.stop_ids.dtype == np.int32
    # the knobs are traced: another temperature or top_p is the same plan
    assert Plan.of(p) == Plan.of(SamplingParams(**{**vars(p), "temperature": 1.0, "top_p": 0.5}))
    assert [r.name for r in FinishReason] == ["STOP", "LENGTH"]
