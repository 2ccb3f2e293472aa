"""core/records.py: a section record's keys, defaults, docs, ranges and choices read from its
declaration, its own check with the config's wording, and the sections the schema builds from
records (`run/schema.py` RECORD_SECTIONS): each key, default and range declared once."""

import dataclasses

import pytest

from jaxrl_frontier.core import records


@dataclasses.dataclass(frozen=True)
class Toy:
    rows: int = records.key(8, "rows a batch", low=1)
    rate: float = records.key(0.5, "a fraction", low=0.0, high=1.0, low_open=True)
    mode: str = records.key("fast", "how", choices=("fast", "exact"))
    derived: int = 0  # not a config key: set by whoever builds the record

    def __post_init__(self):
        records.check(self, "toy")


def test_a_record_declares_its_keys_once():
    assert records.defaults(Toy) == {"rows": 8, "rate": 0.5, "mode": "fast"}
    assert records.docs(Toy)["rate"] == "a fraction"
    assert records.ranges("toy", Toy) == {
        "toy.rows": (1, None, True, True),
        "toy.rate": (0.0, 1.0, False, True),
    }
    assert records.choices("toy", Toy) == {"toy.mode": ("fast", "exact")}


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(rows=0), "config key 'toy.rows' = 0 must be >= 1"),
        (dict(rate=0.0), r"config key 'toy.rate' = 0.0 must be in \(0.0, 1.0\]"),
        (dict(rate=1.5), r"config key 'toy.rate' = 1.5 must be in \(0.0, 1.0\]"),
        (dict(rows=True), "config key 'toy.rows' = True must be >= 1"),
        (dict(mode="slow"), r"config key 'toy.mode' = 'slow'; allowed: \('fast', 'exact'\)"),
    ],
)
def test_a_record_checks_its_own_values(change, message):
    with pytest.raises(ValueError, match=message):
        Toy(**change)
    Toy(rows=1, rate=1.0, mode="exact")  # the bounds themselves


def test_the_schema_builds_record_sections_from_their_declarations():
    from jaxrl_frontier.run.schema import CHOICES, RANGES, RECORD_SECTIONS, base_config

    c = base_config()
    for name, record in RECORD_SECTIONS.items():
        assert c[name].to_dict() == records.defaults(record), name
        for key, bounds in records.ranges(name, record).items():
            assert RANGES[key] == bounds
        for key, allowed in records.choices(name, record).items():
            assert CHOICES[key] == allowed
    assert "eval" in RECORD_SECTIONS
