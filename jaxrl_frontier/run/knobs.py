"""Knobs that move during a run: the `schedules` and `controllers` sections wired in.

A key of the objective (`objective.kl_coef`, `objective.weight_kwargs.eps_high`, ... the
float keys of `losses.traced_keys()`) or of the rollout (`rollout.temperature`, `top_p`,
`min_p`) may follow a schedule of the step (`train/schedules.py`) or a feedback controller
(`train/controllers.py`); not both. Each RL step s:

    values = plan.values(s)                     the schedule at s, each controller's value now
    learner.set_knobs(objective values)         f32 scalars, an argument of the jitted update
    producer.produce(..., sampling=rollout values)     traced by the sampler (`Knobs`)
    ... the update ...
    plan.observe(step scalars)                  each controller reads its metric of step s

so a value that moves compiles nothing. The structure of the run is decided once, from each
key's largest value (`upper`): a KL coefficient that is scheduled or controlled loads the
reference as long as it can be above 0. Every value is logged as `schedule/<key>`; the
controllers' states and every spec go into the checkpoint (`state`), so a resumed run
follows the same values and refuses a changed spec.
"""

from __future__ import annotations

import math
from typing import Any

import ml_collections
import numpy as np
from ml_collections import config_dict

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.objectives import losses
from jaxrl_frontier.sampling.rollout_section import TRACED_ROLLOUT_KEYS
from jaxrl_frontier.train.controllers import Controller
from jaxrl_frontier.train.schedules import Schedule

SECTIONS = ("schedules", "controllers")


def knob_section() -> ml_collections.ConfigDict:
    """`schedules` and `controllers` (each its own copy): one unset entry per key a run may
    move as it trains, generated from what the programs take as traced values: the
    objective's coefficients and float weight knobs (`losses.traced_keys`), the rollout's
    temperature, top_p and min_p. An entry is a spec: a string ('cosine(0.05, 0.005)',
    'adaptive_kl(target=0.02)') or a dict with 'kind' (train/schedules.py,
    train/controllers.py)."""
    unset = lambda keys: ml_collections.ConfigDict(
        {k: config_dict.placeholder(object) for k in keys}
    )
    s = ml_collections.ConfigDict()
    keys = losses.traced_keys()
    s.objective = unset([k for k in keys if "." not in k])
    s.objective.weight_kwargs = unset([k.split(".", 1)[1] for k in keys if "." in k])
    s.rollout = unset(TRACED_ROLLOUT_KEYS)
    return s


def set_entries(section) -> dict[str, Any]:
    """{dotted key: spec} of the entries set (not None) in a `schedules` / `controllers`
    section, the section's own name left out ('objective.kl_coef')."""
    tree = (
        section.to_dict() if isinstance(section, ml_collections.ConfigDict) else dict(section or {})
    )
    out: dict[str, Any] = {}

    def walk(node, prefix):
        for k, v in node.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and "kind" not in v:
                walk(v, key + ".")
            elif v is not None:
                out[key] = v

    walk(tree, "")
    return out


def _configured(c, key: str):
    """The configured (static) value of a knob key."""
    section, rest = key.split(".", 1)
    if section == "objective":
        return losses.value_of(_objective(c), rest)
    return c[section][rest]


def _objective(c):
    """The objective's record, of its loss keys (not the file's own `as_written`)."""
    return losses.objective_of({k: v for k, v in c.objective.items() if k in losses.DEFAULTS})


def _in_range(value: float, bounds: tuple) -> bool:
    low, high, low_in, high_in = bounds
    ok = value > low or (value == low and low_in)
    return ok and (high is None or value < high or (value == high and high_in))


class KnobPlan:
    """The run's scheduled and controlled keys (module docstring); empty when none is set."""

    def __init__(self, schedules: dict[str, Schedule], controllers: dict[str, Controller]):
        self.schedules, self.controllers = schedules, controllers
        # population-based training moves a member's constant schedules (`set_constant`):
        # then a resume takes the checkpoint's constants back instead of refusing them
        self.adopts_constants = False

    @classmethod
    def from_config(cls, c, ranges: dict[str, tuple] | None = None) -> KnobPlan:
        """Parse and check both sections (ConfigError naming the key): `ranges` are the
        config's numeric ranges (`config.RANGES`): every value a schedule takes over the run
        and every controller's bounds lie inside its key's."""
        entries = {s: set_entries(c.get(s)) for s in SECTIONS}
        both = sorted(set(entries["schedules"]) & set(entries["controllers"]))
        if both:
            raise ConfigError(
                f"config key {both[0]!r} is both scheduled (schedules.{both[0]}) and "
                f"controlled (controllers.{both[0]}): a key follows one of them"
            )
        for section, keys in entries.items():
            for key in keys:
                _check_key(c, f"{section}.{key}", key)
        horizon = int(c.train.get("horizon", 0) or c.train.steps)
        schedules = {
            k: Schedule(f"schedules.{k}", spec, horizon) for k, spec in entries["schedules"].items()
        }
        controllers = {
            k: Controller(f"controllers.{k}", spec, _configured(c, k))
            for k, spec in entries["controllers"].items()
        }
        plan = cls(schedules, controllers)
        plan._check_values(ranges or {})
        return plan

    def _check_values(self, ranges: dict[str, tuple]) -> None:
        for key, schedule in self.schedules.items():
            values = [schedule(s) for s in range(max(schedule.horizon, 1))]
            bounds = ranges.get(key)
            bad = [v for v in values if bounds is not None and not _in_range(v, bounds)]
            if bad:
                raise ConfigError(
                    f"config key 'schedules.{key}' = {schedule!r} takes the value {bad[0]!r}, "
                    f"outside the range of {key!r} {_range_words(bounds)}"
                )
        for key, ctl in self.controllers.items():
            bounds = ranges.get(key)
            ends = [ctl.floor, ctl.init] + ([ctl.ceiling] if math.isfinite(ctl.ceiling) else [])
            bad = [v for v in ends if bounds is not None and not _in_range(v, bounds)]
            if bad:
                raise ConfigError(
                    f"config key 'controllers.{key}': floor, init and ceiling must lie in the "
                    f"range of {key!r} {_range_words(bounds)}; got {bad[0]!r}"
                )
        if "objective.kl_coef" in self.keys and self.upper("objective.kl_coef") <= 0:
            where = "schedules" if "objective.kl_coef" in self.schedules else "controllers"
            raise ConfigError(
                f"config key '{where}.objective.kl_coef' never rises above 0, so the run "
                "would load no reference model: give it a positive value, or drop it"
            )

    # ------------------------------------------------------------------ values

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(sorted({**self.schedules, **self.controllers}))

    def __bool__(self) -> bool:
        return bool(self.keys)

    @property
    def objective_keys(self) -> tuple[str, ...]:
        """The moving keys of the objective, as the loss names them ('kl_coef',
        'weight_kwargs.eps_high'): `LearnerOptions.knobs`."""
        return tuple(k.split(".", 1)[1] for k in self.keys if k.startswith("objective."))

    def upper(self, key: str) -> float:
        """The largest value `key` takes: over the schedule's horizon, or the controller's."""
        if key in self.schedules:
            schedule = self.schedules[key]
            return max(schedule(s) for s in range(max(schedule.horizon, 1)))
        return self.controllers[key].upper()

    def values(self, step: int) -> dict[str, float]:
        """{key: value at RL step `step`} for every moving key, rounded to f32 (the value the
        update and the sampler receive, and the one logged)."""
        out = {k: s(step) for k, s in self.schedules.items()}
        out.update({k: ctl.value for k, ctl in self.controllers.items()})
        return {k: float(np.float32(v)) for k, v in sorted(out.items())}

    @staticmethod
    def split(values: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
        """(objective values by loss key, rollout values by `SamplingParams` field)."""
        parts: tuple[dict, dict] = ({}, {})
        for key, v in values.items():
            section, rest = key.split(".", 1)
            parts[section != "objective"][rest] = v
        return parts

    def structural(self, objective: dict) -> dict:
        """The objective with each moving key at its largest value: what decides the run's
        structure (the reference model when kl_coef > 0, the loss's terms)."""
        uppers = {k: self.upper(f"objective.{k}") for k in self.objective_keys}
        return losses.with_values(objective, uppers)

    def observe(self, scalars: dict[str, float]) -> None:
        """Each controller reads its metric from one step's logged scalars."""
        for ctl in self.controllers.values():
            ctl.observe(scalars)

    # ------------------------------------------------------------------ checkpoint

    def state(self) -> dict[str, Any]:
        """JSON: every spec as data and each controller's state."""
        return {
            "schedules": {k: s.describe() for k, s in self.schedules.items()},
            "controllers": {k: c.describe() for k, c in self.controllers.items()},
            "controller_state": {k: c.state() for k, c in self.controllers.items()},
        }

    def set_constant(self, key: str, value: float) -> None:
        """Give the constant schedule of `key` the value `value` from now on (a population
        member's varied key, moved by population-based training: run/population/driver.py)."""
        old = self.schedules.get(key)
        if old is None or old.kind != "constant":
            raise ValueError(f"set_constant: {key!r} has no constant schedule")
        self.schedules[key] = Schedule(f"schedules.{key}", float(value), old.horizon)

    def restore(self, saved: dict[str, Any]) -> None:
        """Continue from a checkpoint's `state()`; ConfigError when a spec changed (a
        resumed run would follow other values without a word). With `adopts_constants`, a
        constant schedule takes the checkpoint's value first."""
        if self.adopts_constants:
            for key, spec in (saved.get("schedules") or {}).items():
                if key in self.schedules and self.schedules[key].kind == spec.get("kind"):
                    if spec["kind"] == "constant":
                        self.set_constant(key, spec["value"])
        now = self.state()
        changed = [
            f"{section}.{k}"
            for section in SECTIONS
            for k in sorted(set(now[section]) | set(saved.get(section, {})))
            if now[section].get(k) != saved.get(section, {}).get(k)
        ]
        if changed:
            raise ConfigError(
                f"resuming with other schedules or controllers than the checkpoint's: "
                f"{', '.join(changed)} changed (the horizon, train.horizon or else train.steps, counts). They are "
                "fixed by the run that started them: restore those keys, or start a new "
                "workdir from this one's export (model.init='checkpoint')"
            )
        for k, ctl in self.controllers.items():
            ctl.restore(saved["controller_state"][k])


def _range_words(bounds: tuple) -> str:
    low, high, low_in, high_in = bounds
    if high is None:
        return f"({'>=' if low_in else '>'} {low})"
    return f"({'[' if low_in else '('}{low}, {high}{']' if high_in else ')'})"


def _check_key(c, where: str, key: str) -> None:
    """A key that may move in this run (ConfigError naming `where` otherwise)."""
    section, rest = key.split(".", 1)
    if c.mode != "rl":
        raise ConfigError(f"config key {where!r}: schedules and controllers act on RL runs")
    if section == "rollout":
        if c.env.name:
            raise ConfigError(
                f"config key {where!r}: environment rollouts (env.name = {c.env.name!r}) fix "
                "their sampling settings for the run; schedule objective keys only"
            )
        if rest not in TRACED_ROLLOUT_KEYS:
            raise ConfigError(
                f"config key {where!r}: the rollout keys that may move are "
                f"{', '.join(TRACED_ROLLOUT_KEYS)}"
            )
        return
    if section != "objective" or rest not in losses.traced_keys():
        raise ConfigError(
            f"config key {where!r} cannot move during a run; the keys that may: "
            + ", ".join(f"objective.{k}" for k in losses.traced_keys())
            + ", "
            + ", ".join(f"rollout.{k}" for k in TRACED_ROLLOUT_KEYS)
        )
    if rest.startswith("weight_kwargs.") and losses.value_of(_objective(c), rest) is None:
        raise ConfigError(
            f"config key {where!r}: the weight {c.objective.weight!r} has no knob "
            f"{rest.split('.', 1)[1]!r}"
        )
    if rest == "kl_coef" and c.objective.kl_in_reward:
        raise ConfigError(
            f"config key {where!r}: with objective.kl_in_reward the KL penalty is folded into "
            "the rewards at rollout time; a moving kl_coef acts on the loss's KL term only"
        )
    if rest == "distill_coef" and not c.objective.distill:
        raise ConfigError(
            f"config key {where!r}: objective.distill is unset, so there is no distillation "
            "term to scale"
        )
