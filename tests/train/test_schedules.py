"""Schedules as pure functions (train/schedules.py): every schedule against its formula at
hand-computed steps, the spec forms (a call string, a dict, a number) and their errors naming
the key. (Controllers: test_controllers.py.)"""

import json
import math

import pytest

from jaxrl_frontier.core.errors import ConfigError
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
