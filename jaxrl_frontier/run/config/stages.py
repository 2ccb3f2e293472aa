"""Stages: the keys that fix shapes or programs, switched at chosen steps (`config.stages`).

    c.stages = (
        dict(step=100, overrides={"rollout.group_size": 16, "rollout.max_new_tokens": 512}),
        dict(step=300, overrides={"data.prompt_batch": 64, "objective.weight": "dppo"}),
    )

Stage i starts once `step` RL steps are done: steps step + 1, ... run with its overrides on
top of those of the stages before it (they accumulate, LLMZero's capacity knobs growing
stage by stage). At the boundary the trainer rebuilds the learner and the producer from the
staged config (`config.at_step`) and keeps everything else: the train state (weights,
optimizer state, step, RNG), the prompt stream, the knobs, the logs. The new shapes compile
their programs at the first step after the boundary and never again; a boundary is a sync
point of the rollouts sampled ahead (none is in flight across it), and the stage of a step is
a function of the step alone, so a run resumed on either side of a boundary continues
exactly. Every stage's config is validated up front (`config.validate`), its errors naming
the stage.

Keys a stage may set (`KEYS`; `objective.weight_kwargs` also as a dict, merged knob by
knob). The float keys of the objective and the sampler move by `schedules` / `controllers`
instead, without recompiling (run/knobs.py); a key is staged or moved, not both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.run.knobs import SECTIONS, set_entries

KEYS = (
    "rollout.group_size",
    "rollout.max_new_tokens",
    "data.prompt_batch",
    "objective.weight",
    "objective.weight_kwargs.<knob>",
    "train.epochs",
    "train.minibatches",
)
KWARGS = "objective.weight_kwargs."  # a knob of the weight: any name the entry takes


@dataclasses.dataclass(frozen=True)
class Stage:
    """One entry of `config.stages`: from RL step `step` + 1 on, `overrides` ({dotted key:
    value}, this stage's own, weight_kwargs flattened to dotted knobs) apply."""

    step: int
    overrides: dict[str, Any]


def _flatten(overrides: Mapping) -> dict[str, Any]:
    """{dotted key: value}: a dict value of `objective.weight_kwargs` (or a nested section,
    `{"rollout": {"group_size": 8}}`) spelled out knob by knob."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if isinstance(value, Mapping):
            for sub, v in _flatten(value).items():
                out[f"{key}.{sub}"] = v
        else:
            out[str(key)] = value
    return out


def _allowed(key: str) -> bool:
    return key in KEYS or (key.startswith(KWARGS) and len(key) > len(KWARGS))


def parse(config) -> tuple[Stage, ...]:
    """The run's stages in order, checked for form (ConfigError naming `stages[i]`): each a
    dict(step=int, overrides={key: value}) with 0 < step <= train.steps (a stage at
    train.steps starts only if the run is extended), steps strictly increasing, keys among
    `KEYS`, none also scheduled or controlled. The values are checked by `config.validate`
    on each stage's config."""
    given = config.get("stages") or ()
    if not isinstance(given, list | tuple):
        raise ConfigError(
            "config key 'stages' must be a list of dict(step=..., overrides={...}); "
            f"got {type(given).__name__}"
        )
    if given and config.mode != "rl":
        raise ConfigError(f"config key 'stages': stages act on RL runs (mode={config.mode!r})")
    moving = {
        key: f"{section}.{key}" for section in SECTIONS for key in set_entries(config.get(section))
    }
    out: list[Stage] = []
    for i, entry in enumerate(given):
        where = f"stages[{i}]"
        if not isinstance(entry, Mapping) or set(entry) != {"step", "overrides"}:
            raise ConfigError(
                f"config key {where!r} must be dict(step=..., overrides={{...}}); got {entry!r}"
            )
        step, overrides = entry["step"], entry["overrides"]
        if isinstance(step, bool) or not isinstance(step, int):
            raise ConfigError(f"config key '{where}.step' = {step!r} must be an int")
        if not 0 < step <= config.train.steps:
            raise ConfigError(
                f"config key '{where}.step' = {step} must be in [1, train.steps = "
                f"{config.train.steps}] (the RL steps done when the stage starts)"
            )
        if out and step <= out[-1].step:
            raise ConfigError(
                f"config key '{where}.step' = {step}: stage steps must increase "
                f"(stages[{i - 1}].step = {out[-1].step})"
            )
        if not isinstance(overrides, Mapping) or not overrides:
            raise ConfigError(f"config key '{where}.overrides' must be a non-empty dict")
        flat = _flatten(overrides)
        for key in flat:
            if not _allowed(key):
                raise ConfigError(
                    f"config key '{where}.overrides.{key}': a stage may set {', '.join(KEYS)}"
                )
            for moved, spec in moving.items():
                same = moved == key or (key == "objective.weight" and moved.startswith(KWARGS))
                if same:
                    raise ConfigError(
                        f"config key {key!r} is both staged ({where}.overrides.{key}) and "
                        f"moved ({spec}): a key is staged or scheduled / controlled, not both"
                        + (" (the weight's knobs belong to the weight)" if moved != key else "")
                    )
        out.append(Stage(step, flat))
    return tuple(out)


def index_at(stages: tuple[Stage, ...], done: int) -> int:
    """The stage of the run after `done` RL steps: how many stages have started (0: none)."""
    return sum(stage.step <= done for stage in stages)


def overrides_of(stages: tuple[Stage, ...], index: int) -> dict[str, Any]:
    """The overrides in force in stage `index`: those of stages[:index], later ones last."""
    out: dict[str, Any] = {}
    for stage in stages[:index]:
        out.update(stage.overrides)
    return out


def boundaries(stages: tuple[Stage, ...]) -> frozenset[int]:
    """The steps after which the run switches stage (the sync points of rollouts ahead)."""
    return frozenset(stage.step for stage in stages)


def updates_over(config, stages: tuple[Stage, ...]) -> int:
    """Optimizer steps of the whole RL run: train.epochs x train.minibatches of each stage
    times the steps it spans within train.steps (the learning-rate schedule's horizon)."""
    n, total = config.train.steps, 0
    starts = [0, *(stage.step for stage in stages)]
    for i, (start, end) in enumerate(zip(starts, [*starts[1:], n], strict=True)):
        o = overrides_of(stages, i)
        per = o.get("train.epochs", config.train.epochs) * o.get(
            "train.minibatches", config.train.minibatches
        )
        total += (min(end, n) - min(start, n)) * per
    return total


def check_resume(saved: Mapping, stages: tuple[Stage, ...], step: int) -> None:
    """Refuse a resume at `step` whose stages up to it differ from the checkpoint's (`saved`:
    its config as a dict): the steps done ran with those. Stages still ahead may change."""
    import ml_collections

    if not saved.get("train"):
        return
    before = parse(ml_collections.ConfigDict({**saved, "stages": saved.get("stages") or ()}))
    done_now, done_then = stages[: index_at(stages, step)], before[: index_at(before, step)]
    if done_now != done_then:
        raise ConfigError(
            f"resuming at step {step} with other stages than the checkpoint's: the stages "
            f"started by then were {[dataclasses.asdict(s) for s in done_then]}, the config "
            f"has {[dataclasses.asdict(s) for s in done_now]}. A stage that has started is "
            "fixed: restore config key 'stages' (stages still ahead may change)"
        )
