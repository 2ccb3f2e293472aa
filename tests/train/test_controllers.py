"""Controllers as pure functions (train/controllers.py): every controller rule against
hand-computed updates; the entropy controller on a scripted entropy sequence and in closed
loop with a toy plant, where it brings the entropy into its band and keeps it there; the
state round trip and the errors naming the key."""

import json
import math

import pytest

from jaxrl_frontier.core.errors import ConfigError, UnknownNameError
from jaxrl_frontier.train.controllers import CONTROLLERS, Controller


def test_an_unknown_controller_is_an_unknown_name_error():
    with pytest.raises(UnknownNameError, match="controllers.objective.kl_coef.*adaptive_kl"):
        Controller("controllers.objective.kl_coef", "adaptive(0.1)", 0.1)


# ----------------------------------------------------------------------------- controllers


def feed(ctl: Controller, observed, metric=None) -> list[float]:
    """The values after each observation."""
    return [ctl.observe({metric or ctl.metric: y}) for y in observed]


def test_adaptive_kl_is_zieglers_rule():
    """beta <- beta (1 + 0.1 clip(KL / 0.01 - 1, -0.2, 0.2))."""
    assert CONTROLLERS.names() == ["adaptive_kl", "clip_fraction", "entropy"]
    ctl = Controller("controllers.objective.kl_coef", "adaptive_kl(target=0.01)", 0.1)
    assert ctl.metric == "train/kl_ref" and ctl.value == 0.1
    got = feed(ctl, [0.02, 0.011, 0.0, 0.01])
    want = [0.1 * 1.02]  # KL twice the target: e clipped to 0.2
    want.append(want[-1] * (1 + 0.1 * (0.011 / 0.01 - 1)))  # e = 0.1
    want.append(want[-1] * (1 - 0.1 * 0.2))  # KL 0: e = -1 clipped to -0.2
    want.append(want[-1])  # on target
    assert got == pytest.approx(want, rel=1e-15)
    assert ctl.updates == 4


def test_clip_fraction_widens_the_clip_range_while_too_much_is_clipped():
    ctl = Controller(
        "controllers.objective.weight_kwargs.eps_high",
        "clip_fraction(target=0.1, rate=0.5, ceiling=0.3)",
        0.2,
    )
    assert ctl.metric == "train/clip_frac"
    got = feed(ctl, [0.2, 0.15, 0.05, 0.0])
    # e = 1 -> 0.2 * 1.5 = 0.3 (the ceiling); e = 0.5 -> 0.375 clipped to 0.3;
    # e = -0.5 -> 0.3 * 0.75; e = -1 -> * 0.5
    assert got == pytest.approx([0.3, 0.3, 0.225, 0.1125], rel=1e-15)


def test_entropy_controller_on_a_scripted_sequence():
    """Band [0.9, 1.1]: below it the bonus rises by `step`, above it it falls, inside it holds;
    the floor (0) is never crossed; a non-finite entropy leaves the value."""
    ctl = Controller(
        "controllers.objective.entropy_coef", "entropy(target=1.0, band=0.1, step=0.01)", 0.02
    )
    assert ctl.metric == "train/entropy"
    got = feed(ctl, [0.5, 0.8, 0.95, 1.05, 1.2, 1.5, 1.0, math.nan, 2.0, 2.0, 2.0])
    want = [0.03, 0.04, 0.04, 0.04, 0.03, 0.02, 0.02, 0.02, 0.01, 0.0, 0.0]
    assert got == pytest.approx(want, abs=1e-15)


def test_entropy_controller_brings_the_entropy_into_its_band_and_keeps_it_there():
    """A toy plant whose entropy rises with the bonus, H = h0 + 10 v, with h0 dropping from
    0.5 to 0.2 at step 30 (the policy sharpens). Target 1.0, band 0.1, step 0.01: from v = 0
    the entropy enters the band after 4 steps (H = 0.5, 0.6, 0.7, 0.8, then 0.9) and stays;
    after the drop (H = 0.6) it is back after 3 steps. Outside those transients it is in the band."""
    ctl = Controller(
        "controllers.objective.entropy_coef", "entropy(target=1.0, band=0.1, step=0.01)", 0.0
    )
    entropies = []
    for s in range(60):
        h = (0.5 if s < 30 else 0.2) + 10.0 * ctl.value
        entropies.append(h)
        ctl.observe({"train/entropy": h})
    inside = [0.9 - 1e-9 <= h <= 1.1 + 1e-9 for h in entropies]
    outside = [s for s, ok in enumerate(inside) if not ok]
    assert outside == [0, 1, 2, 3, 30, 31, 32], outside
    # a start above the band comes down into it too
    ctl = Controller(
        "controllers.objective.entropy_coef", "entropy(target=1.0, band=0.1, step=0.01)", 0.2
    )
    hs = []
    for _ in range(40):
        hs.append(0.5 + 10.0 * ctl.value)
        ctl.observe({"train/entropy": hs[-1]})
    assert hs[0] == pytest.approx(2.5) and all(0.9 - 1e-9 <= h <= 1.1 + 1e-9 for h in hs[14:])
    assert not 0.9 <= hs[13] <= 1.1 + 1e-9  # 14 steps of -0.01 from 0.2 reach 0.06


def test_controller_state_round_trips_and_a_missing_metric_names_the_key():
    spec = {"kind": "adaptive_kl", "target": 0.02, "init": 0.05, "floor": 0.01, "ceiling": 0.2}
    ctl = Controller("controllers.objective.kl_coef", spec, 0.0)
    assert ctl.value == 0.05  # init from the spec wins over the configured value
    feed(ctl, [0.05, 0.05])
    other = Controller("controllers.objective.kl_coef", spec, 0.0)
    other.restore(json.loads(json.dumps(ctl.state())))
    assert other.state() == ctl.state() and other.value == 0.05 * 1.02 * 1.02
    assert json.loads(json.dumps(ctl.describe())) == ctl.describe()
    with pytest.raises(
        ConfigError, match="controllers.objective.kl_coef.*'train/kl_ref'.*train/loss"
    ):
        ctl.observe({"train/loss": 1.0})
    with pytest.raises(ConfigError, match="init = 0.5 outside"):
        Controller("controllers.objective.kl_coef", {**spec, "init": 0.5}, 0.0)
    with pytest.raises(ConfigError, match="target = 0"):
        Controller("controllers.objective.kl_coef", "adaptive_kl(target=0.0)", 0.1)
    with pytest.raises(ConfigError, match="no configured value"):
        Controller("controllers.objective.weight_kwargs.eps_high", "clip_fraction(0.1)", None)
