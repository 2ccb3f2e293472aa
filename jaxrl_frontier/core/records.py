"""A config section declared once, as a frozen dataclass beside the code that reads it.

    @dataclasses.dataclass(frozen=True)
    class EvalSection:
        num_prompts: int = key(256, "held-out prompts evaluated", low=1)

Each field is a config key: its type, its default, a one-line doc and its checks (a range,
a closed set of choices). `run/schema.py` builds the `ConfigDict` section from the record
(`defaults`) and the config's range and choice tables from its fields (`ranges`,
`choices`); the record checks its own values when it is built (`check`), with the same
messages, so a key is written in one place whatever reads it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


def key(
    default: Any,
    doc: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    choices: tuple | None = None,
) -> Any:
    """A config key of a section record: `default`, `doc` (one line), and its checks: a
    number in [low, high] (`low_open`: > low), or one of `choices`."""
    meta = dict(doc=doc, low=low, high=high, low_open=low_open, choices=choices)
    return dataclasses.field(default=default, metadata=meta)


def keys_of(record: type) -> list[dataclasses.Field]:
    """The fields of `record` declared with `key` (the section's config keys), in order."""
    return [f for f in dataclasses.fields(record) if "doc" in f.metadata]


def defaults(record: type) -> dict[str, Any]:
    """{key: default} of the section `record` declares."""
    return {f.name: f.default for f in keys_of(record)}


def docs(record: type) -> dict[str, str]:
    """{key: its one-line doc}."""
    return {f.name: f.metadata["doc"] for f in keys_of(record)}


def ranges(prefix: str, record: type) -> dict[str, tuple]:
    """{'prefix.key': (low, high, low inclusive, high inclusive)} of its numeric keys, as the
    config's range table reads them."""
    return {
        f"{prefix}.{f.name}": (
            f.metadata["low"],
            f.metadata["high"],
            not f.metadata["low_open"],
            True,
        )
        for f in keys_of(record)
        if f.metadata["low"] is not None
    }


def choices(prefix: str, record: type) -> dict[str, tuple]:
    """{'prefix.key': allowed values} of its keys with a closed set."""
    return {
        f"{prefix}.{f.name}": f.metadata["choices"]
        for f in keys_of(record)
        if f.metadata["choices"] is not None
    }


def check(record: Any, prefix: str) -> None:
    """A ValueError naming 'prefix.key' for a value of `record` outside its declared range or
    choices (the config's own check says the same of a ConfigDict)."""
    for f in keys_of(type(record)):
        v, m = getattr(record, f.name), f.metadata
        if m["choices"] is not None and v not in m["choices"]:
            raise ValueError(f"config key '{prefix}.{f.name}' = {v!r}; allowed: {m['choices']}")
        if m["low"] is None:
            continue
        bad = isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
        bad = bad or v < m["low"] or (v == m["low"] and m["low_open"])
        bad = bad or (m["high"] is not None and v > m["high"])
        if bad:
            low = f"> {m['low']}" if m["low_open"] else f">= {m['low']}"
            bracket = "(" if m["low_open"] else "["
            bound = low if m["high"] is None else f"in {bracket}{m['low']}, {m['high']}]"
            raise ValueError(f"config key '{prefix}.{f.name}' = {v!r} must be {bound}")
