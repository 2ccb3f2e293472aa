"""core/records.py: a section record's keys, defaults, docs, ranges and choices read from its
declaration (nested sections, free-form blocks and unset keys included), its own check with
the config's wording, `build` from a resolved section, and the config generated from the
records (`run/config/schema.py` RECORD_SECTIONS): each key of `base_config()` declared in exactly
one place, and no module below `run/` importing ml-collections."""

import ast
import dataclasses
from pathlib import Path

import pytest

from jaxrl_frontier.core import records


@dataclasses.dataclass(frozen=True)
class Inner:
    k: int = records.key(4, "tokens a round", low=0, low_open=True)
    draft: int | None = records.key(None, "the draft's layers (None: off)")


@dataclasses.dataclass(frozen=True)
class Toy:
    rows: int = records.key(8, "rows a batch", low=1)
    rate: float = records.key(0.5, "a fraction", low=0.0, high=1.0, low_open=True)
    drop: float = records.key(0.0, "a probability", low=0.0, high=1.0, high_open=True)
    mode: str = records.key("fast", "how", choices=("fast", "exact"))
    names: tuple = records.key((), "some names")
    kwargs: dict = records.key({"a": 1}, "free-form")
    inner: Inner = records.section(Inner, "a nested section")
    derived: int = 0  # not a config key: set by whoever builds the record

    def __post_init__(self):
        records.check(self, "toy")


def test_a_record_declares_its_keys_once():
    assert records.defaults(Toy) == {
        "rows": 8,
        "rate": 0.5,
        "drop": 0.0,
        "mode": "fast",
        "names": (),
        "kwargs": {"a": 1},
        "inner": {"k": 4, "draft": None},
    }
    assert records.docs(Toy)["rate"] == "a fraction"
    assert records.ranges("toy", Toy) == {
        "toy.rows": (1, None, True, None),
        "toy.rate": (0.0, 1.0, False, True),
        "toy.drop": (0.0, 1.0, True, False),
        "toy.inner.k": (0, None, False, None),
    }
    assert records.choices("toy", Toy) == {"toy.mode": ("fast", "exact")}
    assert records.unset_type(Inner, "draft") is int  # what a command line sets it to
    assert records.is_free(records.flat_keys("toy", Toy)["toy.kwargs"])
    assert Toy().kwargs is not Toy().kwargs  # a fresh dict each


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(rows=0), "config key 'toy.rows' = 0 must be >= 1"),
        (dict(rate=0.0), r"config key 'toy.rate' = 0.0 must be in \(0.0, 1.0\]"),
        (dict(rate=1.5), r"config key 'toy.rate' = 1.5 must be in \(0.0, 1.0\]"),
        (dict(drop=1.0), r"config key 'toy.drop' = 1.0 must be in \[0.0, 1.0\)"),
        (dict(rows=True), "config key 'toy.rows' = True must be >= 1"),
        (dict(mode="slow"), r"config key 'toy.mode' = 'slow'; allowed: \('fast', 'exact'\)"),
        (dict(inner=Inner(k=0)), "config key 'toy.inner.k' = 0 must be > 0"),
    ],
)
def test_a_record_checks_its_own_values(change, message):
    with pytest.raises(ValueError, match=message):
        Toy(**change)
    Toy(rows=1, rate=1.0, drop=0.0, mode="exact")  # the bounds themselves


def test_build_makes_the_record_of_a_section():
    built = records.build(Toy, {"names": ["x"], "inner": {"draft": 2}}, "toy", derived=3)
    assert built == Toy(names=("x",), inner=Inner(draft=2), derived=3)
    with pytest.raises(ValueError, match=r"unknown config key 'toy.inner.kk'.*'toy.inner.k'"):
        records.build(Toy, {"inner": {"kk": 1}}, "toy")


def _flat(node, prefix=""):
    """{dotted key: value} of a ConfigDict, a free-form block or a generated section as one."""
    from jaxrl_frontier.run.config.schema import FREE_FORM

    out = {}
    for k in node.keys():
        key, v = f"{prefix}{k}", node[k]
        if hasattr(v, "keys") and key not in FREE_FORM:
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def test_every_config_key_has_one_declaration():
    from jaxrl_frontier.run.config.schema import (
        CHOICES,
        RANGES,
        RECORD_SECTIONS,
        RUN_KEYS,
        RUN_SECTIONS,
        base_config,
    )

    declared = {}  # dotted key -> (the record that declares it, its field)
    for name, record in (RECORD_SECTIONS | RUN_SECTIONS).items():
        for key, f in records.flat_keys(name, record).items():
            assert key not in declared, f"{key}: declared twice"
            declared[key] = (record, f)
    # sections generated from the registries and run/'s own: the knobs a schedule or a
    # controller may move, a population's varied keys, the stages, and the objective's
    # choices as the file wrote them
    generated = ("schedules.", "controllers.", "population.vary.", "population.grid.", "stages")
    generated += ("objective.as_written",)
    c = base_config()
    for key, value in _flat(c).items():
        if key.startswith(generated):
            continue
        if key in RUN_KEYS:
            assert key not in declared and value == RUN_KEYS[key][0], key
            continue
        assert key in declared, f"{key}: no record declares it"
        record, f = declared.pop(key)
        default = records.default_of(f)
        value = value.to_dict() if hasattr(value, "to_dict") else value  # a free-form block
        assert value == default, key
        assert f.metadata["doc"], f"{key}: no doc"
        low, choices = f.metadata["low"], f.metadata["choices"]
        assert (key in RANGES) == (low is not None), key
        assert (key in CHOICES) == (choices is not None), key
    assert not declared, f"declared but not in the config: {sorted(declared)}"


def test_no_module_below_run_imports_ml_collections():
    """ml-collections is the user's format: run/ (and sweeps/ above it) turn it into the
    records; every layer below receives its record. objectives.default_config imports it
    inside the function (a notebook's ConfigDict of the objective, not read by a run)."""
    package = Path(__file__).resolve().parents[2] / "jaxrl_frontier"
    found = []
    for path in sorted(package.rglob("*.py")):
        layer = path.relative_to(package).parts[0]
        if layer in ("run", "sweeps"):
            continue
        for node in ast.parse(path.read_text()).body:  # module-level imports only
            names = [a.name for a in getattr(node, "names", [])]
            module = getattr(node, "module", None) or ""
            if module.startswith("ml_collections") or any(
                n.startswith("ml_collections") for n in names if isinstance(node, ast.Import)
            ):
                found.append(str(path.relative_to(package)))
    assert found == []
