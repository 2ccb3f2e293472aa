"""The RL step: the stages of one step wired, and what they hold across steps.

    PromptSource.next_batch()                                  rl/sources/
      -> RolloutProducer.produce(examples, weights, key)       rl/produce/producer.py   -> Experience
      -> PromptSource.observe(info["results"])
      -> Learner.update(experience)                            rl/learn/learner.py

Up to `rollout.max_staleness` batches are produced ahead of the learner (rl/ahead.py);
with `rollout.partial_budget` the next batch's rows begin in this step's idle decode slots
(sampling/partial.py). At a stage boundary (run/stages.py) the learner and the producer are
rebuilt from the staged config; the train state, the prompt stream and the knobs are kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import jax
import numpy as np

from jaxrl_frontier.core import distributed
from jaxrl_frontier.rl.ahead import FreeRunningRollouts, RolloutsAhead
from jaxrl_frontier.rl.experience import (
    Experience,
    batches_from_state,
    batches_state,
    log_rollouts,
)
from jaxrl_frontier.rl.sources import make_source
from jaxrl_frontier.rl.sources.utils import prompt_text
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run import parts as parts_lib
from jaxrl_frontier.run import sections
from jaxrl_frontier.run import stages as stages_lib
from jaxrl_frontier.run.knobs import KnobPlan
from jaxrl_frontier.run.rl_build import RunParts, build_rl_stages, checked_objective
from jaxrl_frontier.run.steps import STEPS, StepContext, run_guard
from jaxrl_frontier.sampling.member_sampler import MemberRequest
from jaxrl_frontier.train import hooks as hooks_lib
from jaxrl_frontier.train.metrics import rl_step_scalars


class RLStep:
    """One RL step of a run (see the module docstring); `config`: the current stage's."""

    tag = "rl"
    shown = {"reward": "reward/total", "loss": "train/loss"}

    def __init__(
        self, config, launch_config, stages, roles, parts: RunParts, ctx: StepContext, source
    ):
        self.config, self.launch_config, self.stages, self.stage_index = (
            config,
            launch_config,
            stages,
            0,
        )
        self.roles, self.parts, self.tx = roles, parts, ctx.tx
        self.source, self.knobs = source, ctx.knobs
        self.guard = run_guard(config, say=ctx.say, scorer=ctx.scorer)
        self.rollout_log, self.say = ctx.rollout_log, ctx.say
        self.watchdog = ctx.watchdog  # the phase a hang is reported in
        self.learner, self.producer, self.logp_fn = build_rl_stages(
            config, parts, tx=ctx.tx, state=ctx.state, log=self.say
        )
        if ctx.shared is not None:  # a population's member: one set of programs
            self._run_programs_of(ctx.shared)
        self.evaluates_at_start = config.eval.at_start
        self._check_stages()
        k, queue = config.rollout.max_staleness, config.rollout.free_running_queue
        self.ahead = FreeRunningRollouts(k, queue) if k and queue else RolloutsAhead(k)
        # partial rollouts: the next batch (examples, key), begun by this step's decode
        self.next_batch: tuple[list, jax.Array] | None = None
        # a population's batched sampling: this step's (examples, key), drawn ahead of collect
        self.drawn_batch: tuple[list, jax.Array] | None = None

    def _run_programs_of(self, other: RLStep) -> None:
        """Run the compiled programs of `other`, an RL step of the same structure (a
        population's first member: only the seed and traced values differ): its learner's
        update programs, its producer (weights, keys and sampling values are arguments) and
        its log-prob forward; this step keeps its own state, prompts and knobs."""
        self.learner.share_programs(other.learner)
        self.producer, self.logp_fn = other.producer, other.logp_fn

    @property
    def state(self):
        return self.learner.state

    @state.setter
    def state(self, value) -> None:
        self.learner.state = value

    # ------------------------------------------------------------------ the step

    def __call__(self):
        """One step: `collect`, the learner's update, `finish`."""
        got = self.collect()
        with self.watchdog.phase("update"):
            step_metrics = self.learner.update(got["exp"], self.next_key)
        return self.finish(got, step_metrics)

    def collect(self) -> dict[str, Any]:
        """This step's batch (taken ahead, begun by partial rollouts, or produced now), the
        source told its results, batches ahead started, this step's knob values set on the
        learner: {done, exp, info, objective_knobs}, what the update and `finish` read."""
        c = self.config
        done = int(self.state.step) + 1
        boundaries = stages_lib.boundaries(self.stages)  # no batch in flight across a stage
        resample = None  # a stale batch (lag > k): dropped, or its prompts sampled again
        if c.rollout.stale_batches == "resample":
            resample = lambda examples: self.rollout(examples, self.sample_key())  # noqa: E731
        out = self.ahead.take(self.learner.version, resample)  # produced during the last update
        if out is None and c.rollout.partial_budget:
            out = self._partial_rollout(done, boundaries)
        exp, info = out or self.rollout(*self._this_batch())
        self.source.observe(info["results"])
        self._start_ahead(done, boundaries)
        objective_knobs = KnobPlan.split(self.knobs.values(done - 1))[0]
        if objective_knobs:  # this step's values, arguments of the update
            self.learner.set_knobs(objective_knobs)
        return dict(done=done, exp=exp, info=info, objective_knobs=objective_knobs)

    def _this_batch(self) -> tuple[list, jax.Array]:
        """This step's prompts and key: drawn by `member_request`, else now."""
        batch, self.drawn_batch = self.drawn_batch, None
        return batch or (self.source.next_batch(), self.sample_key())

    def member_request(self) -> MemberRequest:
        """A population's batched sampling (sampling/member_sampler.py): this step's prompts and key
        drawn now (as `collect` draws them, kept for it) and what this member's rows are
        sampled from: its prompts, sampling values, key, rollout weights and version."""
        examples, key = self.drawn_batch = (self.source.next_batch(), self.sample_key())
        v = self.learner.version
        sampling = KnobPlan.split(self.knobs.values(v))[1]
        params = dataclasses.replace(self.producer.sampling, **sampling)
        tokens, mask = self.producer.encode(examples)
        return MemberRequest(tokens, mask, params, key, self.learner.rollout_params(), v)

    def finish(self, got: dict[str, Any], step_metrics: list[dict]):
        """After the update (`step_metrics`): the stop rules, the rollout log, the
        controllers; returns scalars(seconds) for the metrics writers."""
        c, done, exp, info = self.config, got["done"], got["exp"], got["info"]
        self.ahead.publish(self._batch_maker)  # a free-running producer's next weights
        self.guard.check_rewards(done, info["n_failed"], c.data.prompt_batch * c.rollout.group_size)
        self.guard.check_updates(done, step_metrics)
        self._log_rollouts(done, exp, info)
        extra = self._extra_scalars(info, got["objective_knobs"])
        if self.knobs.controllers:  # each reads its metric of this step, for the next
            self.knobs.observe(rl_step_scalars(step_metrics, info, 0.0, self.state.skipped))
        return lambda dt: {**rl_step_scalars(step_metrics, info, dt, self.state.skipped), **extra}

    def _start_ahead(self, done: int, boundaries) -> None:
        """Start batches ahead while there is room: none that a sync step (a checkpoint that
        drains the queue, a stage boundary) would leave in flight. An evaluation is no sync
        step: it waits for the batches being produced and leaves them queued."""
        c = self.config
        drains = not self.keeps_in_flight  # else a checkpoint saves the batches in flight
        syncs = lambda s: (drains and s % c.train.checkpoint_every == 0) or s in boundaries  # noqa: E731
        while self.ahead.room(done, c.train.steps, syncs):  # taken at done + in_flight + 1
            step = done + self.ahead.in_flight  # its step's index, for the scheduled knobs
            job, finish = self._producer_for(self.sample_key(), copy=True, step=step)
            self.ahead.start(self.source, job, finish)

    def _log_rollouts(self, done: int, exp: Experience, info: dict) -> None:
        if self.rollout_log is None and jax.process_count() == 1:
            return
        if done % self.config.train.rollout_log_every == 0:
            log_rollouts(
                self.rollout_log,
                done,
                exp,
                info,
                self.roles.mesh,
                lambda example: prompt_text(self.parts.task, example),  # as sampled (ZPPO's)
                list(self.parts.task.reward_names),
            )

    def _extra_scalars(self, info: dict, objective_knobs: dict) -> dict[str, float]:
        """The lag, the stale totals, the knobs' values used, the stage."""
        lag = self.learner.version - 1 - info["policy_version"]
        extra = {"rollout/policy_lag": lag, "rollout/dropped_stale_total": self.ahead.dropped}
        if self.config.rollout.stale_batches == "resample":
            extra["rollout/resampled_stale_total"] = self.ahead.resampled
        extra["perf/reshard_seconds"] = self.learner.reshard_seconds
        knobs = {f"objective.{k}": v for k, v in objective_knobs.items()}
        knobs.update({f"rollout.{k}": v for k, v in info.get("knobs", {}).items()})
        extra.update({f"schedule/{k}": v for k, v in knobs.items()})  # the values used
        if self.stages:
            extra["stage/index"] = self.stage_index
        return extra

    # ------------------------------------------------------------------ rollouts

    def rollout(self, examples, key) -> tuple[Experience, dict]:
        """One Experience (and its info) of `examples` from the current policy."""
        job, finish = self._producer_for(key)
        return finish(job(examples))

    @property
    def keeps_in_flight(self) -> bool:
        """Batches produced ahead (`rollout.max_staleness`) cross a checkpoint, saved whole
        with it (`RolloutsAhead.finished`; `batches_state`), instead of the queue draining
        before it: with the plain producer and a source that draws only in the main loop."""
        return self.ahead.enabled and parts_lib.supports(self.config, "keeps_rows_in_flight")

    @property
    def local_rollouts(self) -> bool:
        """Each process samples its own rows on its own devices (asynchronous rollouts on
        several processes: rl/produce/producer.py), so a rollout ahead runs `draw` alone in
        the background and its `finish` (collectives) in the main loop."""
        return self.producer.local

    def _producer_for(self, key, copy: bool = False, step: int | None = None):
        """(job(examples), finish(job's result) -> (Experience, info)) over the weights and
        version of now (captured here, so that a rollout ahead samples with them while the
        learner moves on), and the moving rollout keys at RL step `step` (default: the
        version), reported in info['knobs']. job is the whole production (finish: the
        identity), or with `local_rollouts` the producer's process-local `draw` (finish: its
        `finish`), the part a background thread may run on every host."""
        return self._production(copy, step)(key)

    def _batch_maker(self):
        """A free-running producer's make(i) -> (job, finish): batch i by a copy of the
        weights, the version and the knobs of now, with its own key."""
        production, base = self._production(copy=True), self._free_key

        def make(i: int):
            return production(jax.random.fold_in(base, i))

        return make

    def _production(self, copy: bool = False, step: int | None = None):
        """make(key) -> `_producer_for(key, copy, step)`'s pair, over what it reads now."""
        p, v = self.learner.rollout_params(copy), self.learner.version
        roles = self.roles
        weights = dict(policy=p, reference=roles.ref_params, teacher=roles.teacher_params)
        sampling = KnobPlan.split(self.knobs.values(v if step is None else step))[1]
        options = dict(
            version=v, source=self.source, **({"sampling": sampling} if sampling else {})
        )
        with_knobs = lambda out: (out[0], {**out[1], "knobs": sampling})  # noqa: E731
        producer, local = self.producer, self.local_rollouts

        def make(key):
            if local:
                draw = lambda examples: producer.draw(examples, weights, key, **options)  # noqa: E731
                return draw, lambda drawn: with_knobs(producer.finish(drawn, weights))

            def produce(examples):  # the source may draw more prompts (dynamic sampling)
                return with_knobs(producer.produce(examples, weights, key, **options))

            return produce, lambda out: out

        return make

    def next_key(self):
        """Split the state's RNG (kept in the checkpoint, so a resume continues the stream)."""
        rng, key = jax.random.split(jax.random.wrap_key_data(self.state.rng))
        self.state = self.state.replace(rng=jax.random.key_data(rng))
        return key

    def sample_key(self):  # uncommitted: the rollout mesh may hold other devices
        return jax.random.wrap_key_data(
            jax.device_get(jax.random.key_data(jax.random.split(self.next_key())[0]))
        )

    def _partial_rollout(self, done: int, boundaries) -> tuple[Experience, dict]:
        """Partial rollouts: this step's batch (begun by the last step's decode, or drawn
        now), with the next batch begun in its idle slots unless this is the run's last step
        or a stage ends with it (sampling/partial.py)."""
        examples, key = self.next_batch or (self.source.next_batch(), self.sample_key())
        self.next_batch = None
        if done < self.config.train.steps and done not in boundaries:
            self.next_batch = (self.source.next_batch(), self.sample_key())
            self.producer.begin_next(*self.next_batch)
        return self.rollout(examples, key)

    # ------------------------------------------------------------------ around the steps

    def begin(self, start: int, steps: int) -> None:
        self.enter_stage(start)  # a run resumed after a stage boundary starts in that stage
        if self.ahead.free_running:  # it starts now, after any batches restored
            self._free_key = self.sample_key()
            self.ahead.begin(self.source, steps - start, self._batch_maker)

    def paused(self) -> contextlib.AbstractContextManager:
        return self.ahead.paused()

    def hooks(self) -> list:
        return [hooks_lib.BetweenSteps(self.enter_stage)]  # the next stage, from the step it starts

    def close(self) -> None:
        self.ahead.close()

    def checkpoint_meta(self) -> dict[str, Any]:
        """The prompt source's state, the batches in flight (saved whole, or the source's
        state from before them), the stale totals and partial rollouts' rows in flight."""
        meta: dict[str, Any] = {}
        if self.ahead.in_flight and self.keeps_in_flight:  # saved whole, the source past them
            meta["ahead"] = batches_state(self.ahead.finished())
            meta["data"] = self.source.state()
        else:
            meta["data"] = self.ahead.source_state(self.source)  # before any batch in flight
        if self.ahead.enabled:  # the totals go on across a resume
            meta["stale"] = dict(dropped=self.ahead.dropped, resampled=self.ahead.resampled)
        if self.next_batch is not None:  # partial rollouts: the rows in flight, not drained
            examples, key = self.next_batch
            partial = dict(
                examples=examples,
                key=jax.device_get(jax.random.key_data(key)).tolist(),
                rows=self.roles.rollout_sampler.state(),
            )
            if jax.process_count() > 1:  # each process's own prompts and rows
                partial = dict(per_process=distributed.allgather_json(partial))
            meta["partial"] = partial
        return meta

    def restore(self, meta: dict[str, Any]) -> None:
        if meta.get("data") is not None:
            self.source.restore(meta["data"])
        stale = meta.get("stale") or {}  # the stale totals (`rollout.max_staleness`)
        self.ahead.dropped = stale.get("dropped", 0)
        self.ahead.resampled = stale.get("resampled", 0)
        if meta.get("ahead"):  # batches produced ahead, saved with the checkpoint
            outs = batches_from_state(meta["ahead"], self.roles.mesh)
            self.ahead.restore(outs, self.source.state())
        if meta.get("partial") is not None:
            partial = meta["partial"]
            if "per_process" in partial:
                partial = partial["per_process"][jax.process_index()]
            key = jax.random.wrap_key_data(np.asarray(partial["key"], np.uint32))
            self.next_batch = (list(partial["examples"]), key)
            self.roles.rollout_sampler.restore(partial["rows"])

    # ------------------------------------------------------------------ stages

    def _check_stages(self) -> None:
        """Each stage's objective against what the run provides, and a prompt source that can
        change its batch if a stage does: ConfigErrors at the start, naming the stage."""
        for i, stage in enumerate(self.stages):
            try:
                checked_objective(config_lib.at_step(self.launch_config, stage.step), self.parts)
            except (config_lib.ConfigError, KeyError, ValueError) as e:
                raise config_lib.ConfigError(
                    f"config key 'stages[{i}]' (from step {stage.step}): {e.args[0]}"
                ) from None
            if "data.prompt_batch" in stage.overrides and not self.source.resizable:
                raise config_lib.ConfigError(
                    f"config key 'stages[{i}].overrides.data.prompt_batch': the prompt source "
                    f"{self.config.data.source!r} keeps its batch for the run"
                )

    def enter_stage(self, done: int) -> None:
        """Run the stage of step `done` + 1 on (run/stages.py), unless it is the current one:
        the learner and the producer rebuilt from its config, the prompt batch resized; the
        train state (a critic's too), the prompt stream, the knobs and the logs kept. A
        boundary is a sync point, so no rollout sampled ahead is in flight across it."""
        index = stages_lib.index_at(self.stages, done)
        if index == self.stage_index:
            return
        assert not self.ahead.in_flight, "rollouts in flight across a stage boundary"
        self.config = c = config_lib.at_step(self.launch_config, done)
        state = self.learner.state
        self.learner, self.producer, self.logp_fn = build_rl_stages(
            c, self.parts, tx=self.tx, state=state, log=self.say
        )
        self.learner.state = state  # a critic's trained state (the build starts a fresh one)
        if self.source.resizable:
            self.source.resize(c.data.prompt_batch)
        self.stage_index = index
        overrides = stages_lib.overrides_of(self.stages, index)
        self.say(f"[rl] stage {index} from step {done + 1}: " + hooks_lib.fmt(overrides))


@STEPS.register("rl")
def rl_step(c, roles, ctx: StepContext) -> RLStep:
    """The RL step of config `c` (the launched one: its stages listed, none applied), over
    the roles built for it."""
    parts = RunParts(
        mesh=roles.mesh,
        tokenizer=roles.tokenizer,
        task=ctx.task,
        policy=roles.policy,
        sampler=roles.rollout_sampler,
        reference=roles.ref_params is not None,
        teacher=roles.teacher,
        scorer=ctx.scorer,
        rollout_mesh=roles.rollout_mesh,
        base=roles.base_params,
        knobs=ctx.knobs,
    )
    source = make_source(
        ctx.task,
        sections.source_options(c),
        batch_size=c.data.prompt_batch,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    return RLStep(c, c, stages_lib.parse(c), roles, parts, ctx, source)
