"""Schedules: a float config key as a function of the RL step.

LLMZero ("LLMZero: Discovering Adaptive Training Strategies for RL Post-Training via LLM
Agents") finds that good runs move their regularisation knobs (KL coefficient, entropy
bonus, clip range, temperature) during training instead of fixing them. A schedule gives a
key (`schedules.objective.kl_coef`, ...) its value v(s) at RL step s = 0, 1, ... (the policy
version: the updates completed before the step), over the run's horizon N = `train.horizon`, or `train.steps` when that is 0:

    constant(value)                       v = value
    linear(start, end, steps=0)           v = start + (end - start) u,        u = min(s / S, 1)
    cosine(start, end, steps=0)           v = end + (start - end) (1 + cos(pi u)) / 2
    warmup(value, steps, start=0.0)       v = start + (value - start) min(s / steps, 1)
    piecewise(values, boundaries)         v = values[i] for boundaries[i-1] <= s < boundaries[i]
    periodic(low, high, period, phase=0)  v = low + (high - low) (1 - cos(2 pi (s / period + phase))) / 2

(S = steps, or N when steps = 0; linear and cosine hold `end` after S.) A spec is a call
written as a string, `'cosine(0.05, 0.005)'`, `'piecewise(values=(0.1, 0.05), boundaries=(100,))'`,
or a dict `{'kind': 'cosine', 'start': 0.05, 'end': 0.005}`; a bare number is a constant.
Pure functions of (s, N): a resumed run follows the same values. `parse_call` reads the same
spec language for controllers (`train/controllers.py`).
"""

from __future__ import annotations

import ast
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

from jaxrl_frontier.core.errors import ConfigError, UnknownNameError
from jaxrl_frontier.core.registry import Registry

SCHEDULES = Registry("schedule", key="schedules.<key>")


def _fraction(step: int, steps: int, horizon: int) -> float:
    """u = min(s / S, 1) with S = steps, or the horizon when steps = 0."""
    span = steps or horizon
    return min(step / max(span, 1), 1.0)


@SCHEDULES.register("constant")
def constant(step: int, horizon: int, value: float) -> float:
    """v = value."""
    return float(value)


@SCHEDULES.register("linear")
def linear(step: int, horizon: int, start: float, end: float, steps: int = 0) -> float:
    """v = start + (end - start) u, u = min(s / S, 1) (S = steps, or the horizon N when 0)."""
    return start + (end - start) * _fraction(step, steps, horizon)


@SCHEDULES.register("cosine")
def cosine(step: int, horizon: int, start: float, end: float, steps: int = 0) -> float:
    """v = end + (start - end) (1 + cos(pi u)) / 2, u = min(s / S, 1): start at s = 0, end
    from s = S on."""
    u = _fraction(step, steps, horizon)
    return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * u))


@SCHEDULES.register("warmup")
def warmup(step: int, horizon: int, value: float, steps: int, start: float = 0.0) -> float:
    """v = start + (value - start) min(s / steps, 1): a linear ramp to `value`, then held."""
    if steps <= 0:
        raise ValueError(f"warmup: steps = {steps}; must be > 0")
    return start + (value - start) * min(step / steps, 1.0)


@SCHEDULES.register("piecewise")
def piecewise(step: int, horizon: int, values: tuple, boundaries: tuple) -> float:
    """v = values[i] for boundaries[i-1] <= s < boundaries[i] (boundaries increasing,
    len(values) = len(boundaries) + 1)."""
    values, boundaries = tuple(values), tuple(boundaries)
    if len(values) != len(boundaries) + 1:
        raise ValueError(
            f"piecewise: {len(values)} values for {len(boundaries)} boundaries; "
            "need one value more than boundaries"
        )
    if list(boundaries) != sorted(set(boundaries)):
        raise ValueError(f"piecewise: boundaries {boundaries} must increase strictly")
    return float(values[sum(step >= b for b in boundaries)])


@SCHEDULES.register("periodic")
def periodic(
    step: int, horizon: int, low: float, high: float, period: float, phase: float = 0.0
) -> float:
    """v = low + (high - low) (1 - cos(2 pi (s / period + phase))) / 2: from low (phase 0)
    up to high at half a period and back, every `period` steps."""
    if period <= 0:
        raise ValueError(f"periodic: period = {period}; must be > 0")
    return low + (high - low) * 0.5 * (1.0 - math.cos(2.0 * math.pi * (step / period + phase)))


# ----------------------------------------------------------------------------- specs


def _literal(node: ast.AST, key: str, text: str) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise ConfigError(
            f"config key {key!r} = {text!r}: {ast.unparse(node)!r} is not a number or a tuple "
            "of numbers"
        ) from None


def parse_call(key: str, spec: Any) -> tuple[str, tuple, dict[str, Any]]:
    """(name, positional args, keyword args) of a spec: 'name(a, b, k=v)' (arguments are
    Python literals), {'kind': name, k: v, ...}, or a bare number (name 'constant').
    ConfigError naming `key` for anything else."""
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        return "constant", (float(spec),), {}
    if isinstance(spec, Mapping) or hasattr(spec, "to_dict"):
        spec = dict(spec.to_dict() if hasattr(spec, "to_dict") else spec)
        if "kind" not in spec:
            raise ConfigError(f"config key {key!r} = {spec!r}: a dict spec names its 'kind'")
        kind = spec.pop("kind")
        return str(kind), (), spec
    if isinstance(spec, str):
        try:
            node = ast.parse(spec.strip(), mode="eval").body
        except SyntaxError:
            node = None
        if isinstance(node, ast.Name):  # 'name' alone: every parameter at its default
            return node.id, (), {}
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            raise ConfigError(
                f"config key {key!r} = {spec!r}: write a call such as 'cosine(0.05, 0.005)' "
                "or a dict {'kind': 'cosine', 'start': 0.05, 'end': 0.005}"
            )
        args = tuple(_literal(a, key, spec) for a in node.args)
        kwargs = {k.arg: _literal(k.value, key, spec) for k in node.keywords}
        return node.func.id, args, kwargs
    raise ConfigError(
        f"config key {key!r} = {spec!r} has type {type(spec).__name__}; expected a string "
        "such as 'cosine(0.05, 0.005)' or a dict with 'kind'"
    )


def entry(registry: Registry, key: str, name: str) -> Callable:
    """registry.get(name), an unknown name naming the exact key (`schedules.objective.kl_coef`)."""
    if name not in registry:
        raise UnknownNameError(
            f"config key {key!r}: unknown {registry.kind} {name!r}; known {registry.kind}s: "
            f"{', '.join(registry.names())}"
        )
    return registry.get(name)


def bind(key: str, fn: Callable, name: str, args: tuple, kwargs: dict, skip: int) -> dict:
    """`args`, `kwargs` bound to the parameters of registry entry `fn` after its first
    `skip` (the ones the caller supplies), defaults filled in: {parameter: value}.
    ConfigError naming `key` and the entry's parameters when they do not fit."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    sig = inspect.Signature(params)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        listed = ", ".join(
            p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
            for p in params
        )
        raise ConfigError(f"config key {key!r}: {name}: {e}; its parameters: {listed}") from None
    bound.apply_defaults()
    out = dict(bound.arguments)
    for p, value in out.items():
        numbers = value if isinstance(value, tuple | list) else (value,)
        ok = all(isinstance(x, int | float) and not isinstance(x, bool) for x in numbers)
        if not ok or not all(math.isfinite(x) for x in numbers):
            raise ConfigError(f"config key {key!r}: {name}: {p} = {value!r} is not a finite number")
    return out


class Schedule:
    """A key's schedule: `schedule(step) -> float` over the run's `horizon` (train.steps)."""

    def __init__(self, key: str, spec: Any, horizon: int):
        name, args, kwargs = parse_call(key, spec)
        self.key, self.kind, self.horizon = key, name, int(horizon)
        self.fn = entry(SCHEDULES, key, name)
        self.params = bind(key, self.fn, name, args, kwargs, skip=2)
        try:
            self(0)
        except ValueError as e:
            raise ConfigError(f"config key {key!r}: {e}") from None

    def __call__(self, step: int) -> float:
        return float(self.fn(int(step), self.horizon, **self.params))

    def describe(self) -> dict[str, Any]:
        """The schedule as data (kind, every parameter, `steps` = 0 resolved to the horizon):
        what a resume compares, so that cutting a run with another train.steps is refused
        only where the values depend on it."""
        params = {k: list(v) if isinstance(v, tuple | list) else v for k, v in self.params.items()}
        if params.get("steps") == 0 and self.kind in ("linear", "cosine"):
            params["steps"] = self.horizon
        return {"kind": self.kind, **params}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{self.kind}({args})"
