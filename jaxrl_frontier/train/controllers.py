"""Controllers: feedback rules that move a float config key from what the run measures.

After RL step s the controller of a key reads one logged scalar of that step, y_s (its
`metric`: `train/kl_ref`, `train/entropy`, ... the mean over the step's optimizer steps, as
logged), and sets the value step s + 1 uses:

    v_{s+1} = clip(rule(v_s, y_s), floor, ceiling),    v_0 = init

Rules (`CONTROLLERS`; each entry's default metric in brackets):

    adaptive_kl(target, rate=0.1, clip=0.2)    [train/kl_ref]
        e = clip(y / target - 1, -clip, clip),  v <- v (1 + rate e)
        Ziegler et al. 2019 ("Fine-Tuning Language Models from Human Preferences"), PPO's
        adaptive KL penalty: the coefficient grows while the KL is above its target.
    entropy(target, band=0.0, step=0.001)      [train/entropy]
        v <- v + step   if y < target - band   (entropy too low: a larger bonus)
             v - step   if y > target + band
             v          otherwise
    clip_fraction(target, rate=0.1)            [train/clip_frac]
        e = clip(y / target - 1, -1, 1),  v <- v (1 + rate e)
        a clip range widened while more than `target` of the tokens are clipped.

Every controller also takes `init` (default: the key's configured value), `metric`,
`floor` (default 0) and `ceiling` (default +inf). A non-finite y leaves v. The state is
{'value', 'updates'}: plain floats, checkpointed as JSON, so a resumed run continues exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.train.schedules import bind, entry, parse_call

CONTROLLERS = Registry("controller", key="controllers.<key>")
COMMON = ("init", "metric", "floor", "ceiling")  # the keys every controller takes


def register_controller(name: str, metric: str) -> Callable:
    """Register `rule(value, observed, **params) -> value` under `name`, observing `metric`
    unless the config names another."""

    def decorator(fn):
        fn.metric = metric
        return CONTROLLERS.register(name)(fn)

    return decorator


@register_controller("adaptive_kl", metric="train/kl_ref")
def adaptive_kl(
    value: float, observed: float, target: float, rate: float = 0.1, clip: float = 0.2
) -> float:
    """v (1 + rate e), e = clip(y / target - 1, -clip, clip) (Ziegler et al. 2019)."""
    if target <= 0:
        raise ValueError(f"adaptive_kl: target = {target}; must be > 0")
    error = min(max(observed / target - 1.0, -clip), clip)
    return value * (1.0 + rate * error)


@register_controller("entropy", metric="train/entropy")
def entropy(
    value: float, observed: float, target: float, band: float = 0.0, step: float = 1e-3
) -> float:
    """v + step below the band [target - band, target + band], v - step above it, v inside."""
    if band < 0 or step < 0:
        raise ValueError(f"entropy: band = {band}, step = {step}; both must be >= 0")
    if observed < target - band:
        return value + step
    if observed > target + band:
        return value - step
    return value


@register_controller("clip_fraction", metric="train/clip_frac")
def clip_fraction(value: float, observed: float, target: float, rate: float = 0.1) -> float:
    """v (1 + rate e), e = clip(y / target - 1, -1, 1): wider while more is clipped."""
    if target <= 0:
        raise ValueError(f"clip_fraction: target = {target}; must be > 0")
    return value * (1.0 + rate * min(max(observed / target - 1.0, -1.0), 1.0))


class Controller:
    """A key's controller: `value` (the one the next step uses), `observe(scalars)` after a
    step, `state()` / `restore(state)` for the checkpoint."""

    def __init__(self, key: str, spec: Any, init: float | None):
        name, args, kwargs = parse_call(key, spec)
        self.key, self.kind = key, name
        self.fn = entry(CONTROLLERS, key, name)
        common = {k: kwargs.pop(k) for k in COMMON if k in kwargs}
        self.metric = str(common.get("metric", self.fn.metric))
        self.params = bind(key, self.fn, name, args, kwargs, skip=2)
        bounds = {k: common.get(k, d) for k, d in (("floor", 0.0), ("ceiling", math.inf))}
        bounds["init"] = common.get("init", init)
        for k, v in bounds.items():
            if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
                raise ConfigError(
                    f"config key {key!r}: {name}: {k} = {v!r} is not a number"
                    + (" (the key has no configured value to start from)" if k == "init" else "")
                )
        self.floor, self.ceiling = float(bounds["floor"]), float(bounds["ceiling"])
        self.init = float(bounds["init"])
        if not self.floor <= self.init <= self.ceiling:
            raise ConfigError(
                f"config key {key!r}: {name}: init = {self.init} outside "
                f"[floor, ceiling] = [{self.floor}, {self.ceiling}]"
            )
        try:
            self.fn(self.init, 0.0, **self.params)
        except ValueError as e:
            raise ConfigError(f"config key {key!r}: {e}") from None
        self.value, self.updates = self.init, 0

    def upper(self) -> float:
        """The largest value the key can take: the ceiling, or the start when unbounded."""
        return self.ceiling if math.isfinite(self.ceiling) else max(self.init, self.floor)

    def observe(self, scalars: dict[str, float]) -> float:
        """Update from one step's logged scalars; returns the new value."""
        if self.metric not in scalars:
            raise ConfigError(
                f"config key {self.key!r}: {self.kind} observes {self.metric!r}, which this "
                f"run does not log; logged: {', '.join(sorted(scalars))}"
            )
        y = float(scalars[self.metric])
        if math.isfinite(y):
            new = self.fn(self.value, y, **self.params)
            self.value = min(max(float(new), self.floor), self.ceiling)
        self.updates += 1
        return self.value

    def state(self) -> dict[str, Any]:
        return {"value": self.value, "updates": self.updates}

    def restore(self, state: dict[str, Any]) -> None:
        self.value, self.updates = float(state["value"]), int(state["updates"])

    def describe(self) -> dict[str, Any]:
        """The controller as data (kind, parameters, init, bounds, metric): what a resume
        compares."""
        ceiling = self.ceiling if math.isfinite(self.ceiling) else None  # JSON has no inf
        bounds = dict(init=self.init, floor=self.floor, ceiling=ceiling, metric=self.metric)
        return {"kind": self.kind, **self.params, **bounds}
