"""Schedules and controllers as pure functions (train/schedules.py, train/controllers.py):
every schedule against its formula at hand-computed steps, the spec forms (a call string, a
dict, a number) and their errors naming the key; every controller rule against hand-computed
updates; the entropy controller on a scripted entropy sequence and in closed loop with a toy
plant, where it brings the entropy into its band and keeps it there."""

import json
import math

import pytest

from jaxrl_frontier.core.errors import ConfigError, UnknownNameError
from jaxrl_frontier.train.controllers import CONTROLLERS, Controller
from jaxrl_frontier.train.schedules import SCHEDULES, Schedule

KEY = "schedules.objective.kl_coef"


def values(spec, horizon=4, steps=range(5)):
    schedule = Schedule(KEY, spec, horizon)
    return [schedule(s) for s in steps]


def test_every_schedule_follows_its_formula():
    assert SCHEDULES.names() == ["constant", "cosine", "linear", "periodic", "piecewise", "warmup"]
    assert values("constant(0.3)") == [0.3] * 5
    assert values(0.3) == [0.3] * 5  # a bare number: a constant
    # linear over the horizon N = 4, held after it
    assert values("linear(1.0, 0.0)") == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert values("linear(1.0, 0.0, steps=2)") == [1.0, 0.5, 0.0, 0.0, 0.0]
    # cosine: end + (start - end) (1 + cos(pi s / 4)) / 2
    c = [0.005 + 0.045 * (1 + math.cos(math.pi * s / 4)) / 2 for s in range(4)] + [0.005]
    assert values("cosine(0.05, 0.005)") == pytest.approx(c, rel=1e-15, abs=0)
    assert values("cosine(0.05, 0.005)")[2] == pytest.approx(0.0275, rel=1e-15)  # u = 1/2
    assert values("warmup(0.2, steps=4)") == pytest.approx(
        [0.0, 0.05, 0.1, 0.15, 0.2], rel=1e-15, abs=1e-18
    )  # float64 ulps
    assert values("warmup(0.2, 2, start=0.1)") == pytest.approx([0.1, 0.15, 0.2, 0.2, 0.2])
    pw = "piecewise(values=(0.1, 0.05, 0.01), boundaries=(1, 3))"
    assert values(pw) == [0.1, 0.05, 0.05, 0.01, 0.01]
    # periodic: low at s = 0 and every period, high at half a period
    per = values("periodic(0.0, 1.0, period=4)")
    assert per == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0], abs=1e-15)
    assert values("periodic(0.0, 1.0, 4, phase=0.5)")[0] == pytest.approx(1.0)


def test_the_three_spec_forms_agree():
    as_call = values("cosine(0.05, 0.005, steps=3)")
    assert values("cosine(start=0.05, end=0.005, steps=3)") == as_call
    assert values({"kind": "cosine", "start": 0.05, "end": 0.005, "steps": 3}) == as_call
    s = Schedule(KEY, "cosine(0.05, 0.005)", 10)
    assert s.describe() == {"kind": "cosine", "start": 0.05, "end": 0.005, "steps": 10}
    assert json.loads(json.dumps(s.describe())) == s.describe()
    # a schedule with its own span does not depend on the horizon (a resume may change it)
    assert Schedule(KEY, "cosine(0.05, 0.005, steps=3)", 10).describe() == (
        Schedule(KEY, "cosine(0.05, 0.005, steps=3)", 20).describe()
    )


@pytest.mark.parametrize(
    "spec, words",
    [
        ("cosin(0.05, 0.005)", ["schedules.objective.kl_coef", "'cosin'", "cosine, linear"]),
        ("cosine(0.05)", [KEY, "'end'", "its parameters: start, end, steps=0"]),
        ("cosine(0.05, end=x)", [KEY, "'x' is not a number"]),
        ("cosine(0.05, 0.005", [KEY, "write a call such as"]),
        ("cosine(0.05, float('nan'))", [KEY, "is not a number"]),
        ({"start": 0.05}, [KEY, "names its 'kind'"]),
        ("piecewise(values=(1.0, 2.0), boundaries=(1, 2))", [KEY, "one value more"]),
        ("periodic(0.0, 1.0, period=0)", [KEY, "period = 0"]),
        ("linear(0.1, True)", [KEY, "True is not a finite number"]),
    ],
)
def test_a_bad_spec_names_the_key(spec, words):
    with pytest.raises(ConfigError) as e:
        Schedule(KEY, spec, 10)
    assert all(w in str(e.value) for w in words), str(e.value)


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
