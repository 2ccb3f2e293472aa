"""A config section declared once, as a frozen dataclass beside the code that reads it.

    @dataclasses.dataclass(frozen=True)
    class EvalSection:
        num_prompts: int = key(256, "held-out prompts evaluated", low=1)

Each field is a config key: its type, its default, a one-line doc and its checks (a range,
a closed set of choices). A default of None is an unset key of the field's type (the
command line may set it); a dict default is a free-form block whose keys are checked by
what it configures (a task's keyword arguments); `section(Record, doc)` nests a record's
keys under the field's name (`model.moe.*`). `run/config/schema.py` builds the `ConfigDict` from
the records (`defaults`, `unset_type`) and the config's range and choice tables from their
fields (`ranges`, `choices`); a record checks its own values when it is built (`check`), with
the same messages, and `build` makes a record from a resolved section, so a key is written in
one place whatever reads it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping
from typing import Any


def key(
    default: Any,
    doc: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    choices: tuple | None = None,
) -> Any:
    """A config key of a section record: `default`, `doc` (one line), and its checks: a
    number in [low, high] (`low_open`: > low, `high_open`: < high), or one of `choices`. A dict `default` is a
    free-form block (any keys; checked by what it configures)."""
    meta = dict(doc=doc, low=low, high=high, low_open=low_open, high_open=high_open)
    meta["choices"] = choices
    if isinstance(default, dict):
        frozen = dict(default)
        return dataclasses.field(default_factory=lambda: dict(frozen), metadata=meta | {"free": 1})
    return dataclasses.field(default=default, metadata=meta)


def section(record: type, doc: str) -> Any:
    """A nested section: the keys `record` declares, under this field's name."""
    meta = dict(doc=doc, low=None, high=None, low_open=False, high_open=False, choices=None)
    meta["section"] = record
    return dataclasses.field(default_factory=record, metadata=meta)


def keys_of(record: type) -> list[dataclasses.Field]:
    """The fields of `record` declared with `key` or `section` (its config keys), in order."""
    return [f for f in dataclasses.fields(record) if "doc" in f.metadata]


def subsection(f: dataclasses.Field) -> type | None:
    """The record a `section` field nests (None for a key)."""
    return f.metadata.get("section")


def is_free(f: dataclasses.Field) -> bool:
    """Whether the field is a free-form block (a dict default)."""
    return "free" in f.metadata


def default_of(f: dataclasses.Field) -> Any:
    """The field's default (a fresh one for a dict or a nested section)."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def defaults(record: type) -> dict[str, Any]:
    """{key: default} of the section `record` declares (nested sections as dicts)."""
    return {
        f.name: defaults(subsection(f)) if subsection(f) else default_of(f) for f in keys_of(record)
    }


def docs(record: type) -> dict[str, str]:
    """{key: its one-line doc}."""
    return {f.name: f.metadata["doc"] for f in keys_of(record)}


def unset_type(record: type, name: str) -> type:
    """The type an unset (None) key of `record` takes when set: `int` of `int | None`, the
    origin of a generic (`tuple` of `tuple[str, ...]`), `object` for `Any` or a union of
    several (`int | str | None`: checked by the record itself)."""
    hint = typing.get_type_hints(record)[name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = options[0] if len(options) == 1 else object
    hint = typing.get_origin(hint) or hint
    return hint if isinstance(hint, type) else object


def flat_keys(prefix: str, record: type) -> dict[str, dataclasses.Field]:
    """{'prefix.key': field} of every key `record` declares, nested sections' keys
    included (a free-form block is one key)."""
    out = {}
    for f in keys_of(record):
        sub = subsection(f)
        out.update(flat_keys(f"{prefix}.{f.name}", sub) if sub else {f"{prefix}.{f.name}": f})
    return out


def ranges(prefix: str, record: type) -> dict[str, tuple]:
    """{'prefix.key': (low, high, low inclusive, high inclusive)} of its numeric keys, as the
    config's range table reads them."""
    return {
        k: (
            m["low"],
            m["high"],
            not m["low_open"],
            None if m["high"] is None else not m["high_open"],
        )
        for k, f in flat_keys(prefix, record).items()
        if (m := f.metadata)["low"] is not None
    }


def choices(prefix: str, record: type) -> dict[str, tuple]:
    """{'prefix.key': allowed values} of its keys with a closed set."""
    return {
        k: f.metadata["choices"]
        for k, f in flat_keys(prefix, record).items()
        if f.metadata["choices"] is not None
    }


def check(record: Any, prefix: str) -> None:
    """A ValueError naming 'prefix.key' for a value of `record` (or of a section nested in
    it) outside its declared range or choices (the config's own check says the same of a
    ConfigDict). An unset key (None) is not checked."""
    for f in keys_of(type(record)):
        v, m = getattr(record, f.name), f.metadata
        if subsection(f):
            check(v, f"{prefix}.{f.name}")
            continue
        if m["choices"] is not None and v not in m["choices"]:
            raise ValueError(f"config key '{prefix}.{f.name}' = {v!r}; allowed: {m['choices']}")
        if m["low"] is None or v is None:
            continue
        bad = isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
        bad = bad or v < m["low"] or (v == m["low"] and m["low_open"])
        high = m["high"]
        bad = bad or (high is not None and (v > high or (v == high and m["high_open"])))
        if bad:
            low = f"> {m['low']}" if m["low_open"] else f">= {m['low']}"
            bracket = ("(" if m["low_open"] else "[", ")" if m["high_open"] else "]")
            bound = low if high is None else f"in {bracket[0]}{m['low']}, {high}{bracket[1]}"
            raise ValueError(f"config key '{prefix}.{f.name}' = {v!r} must be {bound}")


def build(record: type, given: Mapping[str, Any], prefix: str, **extra: Any) -> Any:
    """The record of a section given as a mapping (a resolved ConfigDict's section, or a
    plain dict): nested sections built as their records, free-form blocks as plain dicts,
    lists as tuples; a key the record does not declare is a ValueError naming it (with the
    closest declared key). Keys not given keep their defaults. `extra`: the record's fields
    that are not config keys (an options record's values from other sections)."""
    fields = {f.name: f for f in keys_of(record)}
    unknown = [k for k in given if k not in fields]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(fields), n=1)
        hint = f"; did you mean '{prefix}.{close[0]}'?" if close else ""
        raise ValueError(f"unknown config key '{prefix}.{unknown[0]}'{hint}")
    values = {}
    for name, v in given.items():
        f = fields[name]
        if subsection(f):
            v = build(subsection(f), v, f"{prefix}.{name}")
        elif is_free(f):
            v = plain(v)
        elif isinstance(v, list):
            v = tuple(v)
        values[name] = v
    return record(**values, **extra)


def plain(value: Any) -> Any:
    """A mapping (a ConfigDict included: anything with `to_dict`) as a plain dict."""
    return value.to_dict() if hasattr(value, "to_dict") else dict(value)
