"""The `Step` protocol the loop runs, and the SFT step (the RL step: run/rl_step.py).

A step owns the train state and what produces its batches; the loop (run/trainer.py) calls
it once per step and hands the rest to hooks (train/hooks.py). `STEPS` maps the config key
`mode` to the step's builder, `builder(config, roles, StepContext) -> Step`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax

from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.rl.sources import make_source
from jaxrl_frontier.run.config import sections
from jaxrl_frontier.train.guards import RunGuard
from jaxrl_frontier.train.sft import SFTStep

STEPS = Registry("training step", key="mode")


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What a step's builder gets from the trainer besides the config and the roles: the
    train state it starts from and the run's services."""

    state: Any  # the train state (params, optimizer state, step, RNG), placed on the mesh
    state_sharding: Any  # its shardings, a pytree like `state`
    tx: Any  # the optax optimizer the state's optimizer state belongs to
    task: Any  # the run's Task
    scorer: Any  # the run's RewardScorer (None: the step builds the config's)
    knobs: Any  # the moving keys' plan (run/knobs.py; None: none move)
    say: Callable[[str], None]  # one console line (the main process prints it)
    watchdog: Any  # `watchdog.phase(name)`: the phase a hang is reported in
    rollout_log: Any = None  # the RolloutLogger on the main process, else None
    shared: Any = None  # a population member's programs, shared with the first member's


class Step(Protocol):
    """One training step of a run and the state it trains."""

    tag: str  # "rl" | "sft": the prefix of the step's console lines
    shown: dict[str, str]  # the progress line's {label: scalar name}
    evaluates_at_start: bool  # an evaluation before the first step (of a fresh run)
    config: Any  # the config of the stage the run is in (the launched one but for stages)
    state: Any  # the train state (params, optimizer state, step, RNG)
    source: Any  # the prompt source (`state()` / `restore()` go with the checkpoint)

    def __call__(self) -> Callable[[float], dict[str, float]]:
        """Run one step; returns scalars(seconds the step took) for the metrics writers."""

    def begin(self, start: int, steps: int) -> None:
        """Before the first step (`start`: the step resumed from, of `steps`)."""

    def checkpoint_meta(self) -> dict[str, Any]:
        """What a checkpoint holds besides the train state (JSON, and arrays under 'ahead')."""

    def restore(self, meta: dict[str, Any]) -> None:
        """Continue from a checkpoint's `checkpoint_meta`."""

    def paused(self) -> contextlib.AbstractContextManager:
        """A block during which no batch is being produced in the background."""

    def hooks(self) -> list:
        """Hooks of the step's own (train/hooks.py), run after the trainer's."""

    def close(self) -> None:
        """End the step's threads."""


class SFTRunStep:
    """Supervised fine-tuning on the task's demonstrations: one `SFTStep` update per step
    on the next batch of the prompt source."""

    tag = "sft"
    shown = {"nll": "train/nll"}
    evaluates_at_start = False

    def __init__(
        self,
        config,
        update: SFTStep,
        state,
        source,
        describe: Callable[[], str],
        *,
        guard: RunGuard,
        say: Callable[[str], None],
        watchdog,
    ):
        self.config, self.update, self.state, self.source = config, update, state, source
        self.describe, self.guard, self.say, self.watchdog = describe, guard, say, watchdog

    def __call__(self) -> Callable[[float], dict[str, float]]:
        examples = self.source.next_batch()
        with self.watchdog.phase("update"):
            self.state, metrics = self.update(self.state, examples)
        self.guard.check_updates(int(self.state.step), metrics)
        return lambda dt: {f"train/{k}": float(v) for k, v in jax.device_get(metrics).items()}

    def begin(self, start: int, steps: int) -> None:
        if start == 0:
            self.say(f"[sft] {self.describe()}")

    def checkpoint_meta(self) -> dict[str, Any]:
        return dict(data=self.source.state())

    def restore(self, meta: dict[str, Any]) -> None:
        if meta.get("data") is not None:
            self.source.restore(meta["data"])

    def paused(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def hooks(self) -> list:
        return []

    def close(self) -> None:
        pass


@STEPS.register("sft")
def sft_step(c, roles, ctx: StepContext) -> SFTRunStep:
    """The SFT step of config `c`: `SFTStep` over the `SFTOptions` section record, the prompt
    source over its `SourceOptions` (a batch of train.sft_batch demonstrations)."""
    source = make_source(
        ctx.task,
        sections.source_options(c),
        batch_size=c.train.sft_batch,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    update = SFTStep.from_options(
        sections.sft_options(c),
        roles.graphdef,
        ctx.tx,
        ctx.state_sharding,
        roles.mesh,
        ctx.task,
        roles.tokenizer,
    )
    describe = lambda: (  # noqa: E731
        f"{roles.policy.cfg.num_params() / 1e6:.2f}M params, "
        f"{c.train.steps} steps of {c.train.sft_batch} demonstrations"
    )
    guard = run_guard(c, say=ctx.say, scorer=ctx.scorer)
    return SFTRunStep(
        c, update, ctx.state, source, describe, guard=guard, say=ctx.say, watchdog=ctx.watchdog
    )


def run_guard(c, *, say: Callable[[str], None], scorer) -> RunGuard:
    """The stop rules of a run's updates and rewards (`train.max_skipped_updates`,
    `rewards.max_failure_steps`), naming the scorer's first failure."""
    return RunGuard.from_options(sections.guard_options(c), say=say, scorer=scorer)
