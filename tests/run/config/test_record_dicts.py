"""A section record as the user's ConfigDict (run/config/record_dicts.py): every key at its
default, a nested section as its own dict, a free-form block open to any key, and an unset
key a placeholder the command line can set with the field's type."""

import dataclasses

import pytest

from jaxrl_frontier.core import records
from jaxrl_frontier.run.config.record_dicts import section


@dataclasses.dataclass(frozen=True)
class Inner:
    rate: float = records.key(0.5, "a rate")


@dataclasses.dataclass(frozen=True)
class Outer:
    steps: int = records.key(3, "steps")
    limit: int | None = records.key(None, "unset until given")
    kwargs: dict = records.key({"a": 1}, "a free-form block")
    inner: Inner = records.section(Inner, "a nested section")


def test_a_record_as_its_config_dict():
    s = section(Outer)
    assert (s.steps, s.limit, s.kwargs.to_dict(), s.inner.rate) == (3, None, {"a": 1}, 0.5)
    s.limit = 7  # the placeholder takes the field's type
    with pytest.raises(TypeError):
        s.limit = "seven"
    s.kwargs.b = 2  # a free-form block takes any key
    assert s.kwargs.to_dict() == {"a": 1, "b": 2}
    assert section(Outer).kwargs.to_dict() == {"a": 1}  # each dict its own copy
