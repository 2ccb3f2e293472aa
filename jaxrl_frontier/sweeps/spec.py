"""Sweep files: a Python file whose `get_sweep()` returns a list of override dicts.

    from jaxrl_frontier.sweeps import grid, product, seeds

    def get_sweep():
        return product(grid(**{"objective.advantage": ["grpo", "rloo"]}), seeds(3))

Each dict is one run: its keys are config keys (`optimizer.lr`, `seed`, ...) set as
`--config.KEY=VALUE` on `scripts/train.py`, plus the reserved key `config`, the experiment
file (`configs/FILE.py[:ARG]`) of that run when it differs from the sweep's `--config`.
A run's workdir is named by its overrides (`run_name`), so the same sweep file run again
maps every run to the same directory (finished ones are skipped, killed ones resume).
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import os
import re
from typing import Any

from jaxrl_frontier.core.errors import SweepError

SEED_KEY = "seed"
CONFIG_KEY = "config"  # reserved: the run's experiment file, FILE.py[:ARG]
_SCALARS = (bool, int, float, str)
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")
_MAX_NAME = 160  # well under the 255-byte limit of common filesystems


def _axis(name: str, values: Any) -> list:
    if isinstance(values, (list, tuple)):
        if not values:
            raise SweepError(f"axis {name!r} has no values")
        return list(values)
    return [values]  # a scalar: the same value in every run


def grid(**axes) -> list[dict]:
    """Cartesian product of the axes: grid(a=[1, 2], b=[3, 4]) -> 4 dicts.

    Dotted keys need `grid(**{"optimizer.lr": [1e-4, 3e-4]})`.
    """
    names = list(axes)
    values = [_axis(n, axes[n]) for n in names]
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


def zip_(**axes) -> list[dict]:
    """Axes walked together: zip_(a=[1, 2], b=[3, 4]) -> [{a: 1, b: 3}, {a: 2, b: 4}]."""
    values = {n: _axis(n, v) for n, v in axes.items()}
    lengths = {n: len(v) for n, v in values.items() if len(v) > 1}
    if len(set(lengths.values())) > 1:
        raise SweepError(f"zip_ axes differ in length: {lengths}")
    n = max([len(v) for v in values.values()] or [0])
    return [{k: (v[i] if len(v) > 1 else v[0]) for k, v in values.items()} for i in range(n)]


def product(*sweeps: list[dict]) -> list[dict]:
    """Every combination of one dict from each list, merged (a key in two lists is an error)."""
    out: list[dict] = [{}]
    for sweep in sweeps:
        merged = []
        for left, right in itertools.product(out, sweep):
            both = set(left) & set(right)
            if both:
                raise SweepError(f"product: key(s) {sorted(both)} set by two factors")
            merged.append({**left, **right})
        out = merged
    return out


def seeds(n: int, start: int = 0) -> list[dict]:
    """The seed axis: [{seed: start}, ..., {seed: start + n - 1}]."""
    if n < 1:
        raise SweepError(f"seeds(n): n must be >= 1, got {n}")
    return [{SEED_KEY: s} for s in range(start, start + n)]


def sweep_name(path: str) -> str:
    """The name of a sweep (its runs' directory under runs/sweeps/): the file's stem, with
    the stage after a colon: 'sweeps/claim_a.py' -> 'claim_a', 'sweeps/claim_e.py:sft' ->
    'claim_e_sft'."""
    file, _, stage = path.partition(":")
    stem = os.path.splitext(os.path.basename(file))[0]
    return f"{stem}_{stage}" if stage else stem


def load_sweep(path: str) -> list[dict]:
    """The checked list of override dicts of the sweep file at `path` (FILE, or FILE:STAGE
    for a file of several stages run one after another: get_sweep(STAGE)).

    Raises SweepError naming the file and what is wrong: no get_sweep, a result that is not
    a non-empty list of dicts, a key that is not a dotted name, a value that is not a
    scalar (bool, int, float, str), or two runs with the same overrides.
    """
    path, _, stage = path.partition(":")
    if not os.path.isfile(path):
        raise SweepError(f"sweep file {path}: no such file")
    spec = importlib.util.spec_from_file_location("sweep_file", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SweepError as e:
        raise SweepError(f"sweep file {path}: {e}") from None
    except Exception as e:  # a sweep file is user code: report where it broke
        raise SweepError(f"sweep file {path}: {type(e).__name__}: {e}") from e
    if not callable(getattr(module, "get_sweep", None)):
        raise SweepError(f"sweep file {path}: defines no get_sweep() function")
    try:
        runs = module.get_sweep(stage) if stage else module.get_sweep()
    except SweepError as e:
        raise SweepError(f"sweep file {path}: {e}") from None
    return check_sweep(runs, path)


def check_sweep(runs: Any, path: str = "<sweep>") -> list[dict]:
    """`runs` if it is a valid list of override dicts (see load_sweep), else SweepError."""
    if not isinstance(runs, list) or not runs:
        raise SweepError(f"sweep file {path}: get_sweep() must return a non-empty list of dicts")
    seen: dict[str, int] = {}
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            raise SweepError(f"sweep file {path}: run {i} is a {type(run).__name__}, not a dict")
        for key, value in run.items():
            if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_]\w*(\.\w+)*", key):
                raise SweepError(f"sweep file {path}: run {i}: key {key!r} is not a config key")
            if not isinstance(value, _SCALARS):
                raise SweepError(
                    f"sweep file {path}: run {i}: {key}={value!r} is a {type(value).__name__};"
                    " values must be bool, int, float or str"
                )
        name = run_name(run)  # every key shown: equal names are equal overrides
        if name in seen:
            raise SweepError(f"sweep file {path}: runs {seen[name]} and {i} are the same: {run}")
        seen[name] = i
    return runs


def _value_text(key: str, value: Any) -> str:
    if key == CONFIG_KEY:  # configs/dr_grpo_arith.py:runlocal -> dr_grpo_arith:runlocal
        file, _, arg = str(value).partition(":")
        value = os.path.splitext(os.path.basename(file))[0] + (f":{arg}" if arg else "")
    return repr(value) if isinstance(value, float) else str(value)


def varying_keys(runs: list[dict]) -> set[str]:
    """The keys whose value is not the same in every run (set in some runs only counts)."""
    keys = {k for run in runs for k in run}
    return {k for k in keys if len({repr(run.get(k, _MISSING)) for run in runs}) > 1}


_MISSING = object()


def run_name(overrides: dict, shown: set[str] | None = None) -> str:
    """The workdir name of a run: `key=value` pairs joined by `__` (the config file first,
    the seed last, other keys sorted), unsafe characters replaced by `-`.

    `shown` limits the pairs to those keys (a sweep names its runs by the keys that vary,
    `varying_keys`); then, or when the name would pass 160 characters, `--` and a hash of
    all the overrides follow, so runs differing in a hidden key never share a directory and
    a changed shared value gives new runs. A function of the overrides alone: stable across
    processes and launches.
    """
    keys = [k for k in overrides if shown is None or k in shown]
    hidden = len(keys) < len(overrides)
    middle = sorted(k for k in keys if k not in (CONFIG_KEY, SEED_KEY))
    keys = [k for k in (CONFIG_KEY,) if k in keys] + middle + [k for k in (SEED_KEY,) if k in keys]
    text = "__".join(f"{k}={_value_text(k, overrides[k])}" for k in keys) or "base"
    name = _UNSAFE.sub("-", text).strip(".")
    full = "__".join(f"{k}={overrides[k]!r}" for k in sorted(overrides))
    digest = hashlib.sha1(full.encode()).hexdigest()[:10]
    if len(name) > _MAX_NAME:
        name = name[: _MAX_NAME - 12]
        hidden = True
    return f"{name}--{digest}" if hidden else name


def group_key(overrides: dict, shown: set[str] | None = None) -> str:
    """The run's name without its seed: runs differing only in the seed share it."""
    return run_name({k: v for k, v in overrides.items() if k != SEED_KEY}, shown)
