"""The RL step: the stages of one step wired, and what they hold across steps.

    PromptSource.next_batch()                                  rl/sources/
      -> Production(producer, weights, version, sampling)      rl/produce/production.py
           .job(key): RolloutProducer.produce(examples, ...)   rl/produce/producer.py -> Experience
      -> PromptSource.observe(info["results"])
      -> Learner.update(experience)                            rl/learn/learner.py

The step reads collect -> update -> finish. Its batch comes from the `BatchSupply`
(rl/batch_supply.py): produced ahead of the learner (`rollout.max_staleness`, rl/ahead.py),
begun in the last step's idle decode slots (`rollout.partial_budget`, sampling/partial.py),
drawn for a population's batched sampling, or produced now, each by a `Production` of the
weights, version and sampling values of its step. At a stage boundary (run/config/stages.py) the
learner and the producer are rebuilt from the staged config; the train state, the prompt
stream and the knobs are kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from jaxrl_frontier.data.rewards.judge import JudgeScorer, NextTokenProbs
from jaxrl_frontier.data.rewards.reward_model import RewardModelScorer
from jaxrl_frontier.data.tasks import chat
from jaxrl_frontier.rl.batch_supply import BatchSupply, SupplyOptions
from jaxrl_frontier.rl.experience import (
    Experience,
    log_rollouts,
)
from jaxrl_frontier.rl.produce.judge_verdicts import SampledVerdicts
from jaxrl_frontier.rl.produce.production import Production
from jaxrl_frontier.rl.sources import make_source
from jaxrl_frontier.rl.sources.utils import prompt_text
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run.config import parts as parts_lib
from jaxrl_frontier.run.config import sections
from jaxrl_frontier.run.config import stages as stages_lib
from jaxrl_frontier.run.knobs import KnobPlan
from jaxrl_frontier.run.population.batched_sampling import MemberRequest
from jaxrl_frontier.run.rl_build import RunParts, build_rl_stages, checked_objective
from jaxrl_frontier.run.steps import STEPS, StepContext, run_guard
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
        # this step's batch: ahead, partial, drawn for the members, or now (rl/batch_supply.py)
        self.supply = BatchSupply(self._supply_options(config), self, roles.rollout_sampler)
        # a population's batched update: this step's collected batch and its update's metrics
        self.updated: tuple[dict[str, Any], list[dict]] | None = None

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
        """One step: `collect`, the learner's update, `finish` (a population's member whose
        batch was collected and updated with the others': `finish` alone)."""
        if self.updated is not None:
            (got, step_metrics), self.updated = self.updated, None
            return self.finish(got, step_metrics)
        got = self.collect()
        with self.watchdog.phase("update"):
            step_metrics = self.learner.update(got["exp"], self.next_key)
        return self.finish(got, step_metrics)

    def collect(self) -> dict[str, Any]:
        """This step's batch (taken ahead, begun by partial rollouts, or produced now), the
        source told its results, batches ahead started, this step's knob values set on the
        learner: {done, exp, info, objective_knobs}, what the update and `finish` read."""
        done = int(self.state.step) + 1
        exp, info = self.supply.take(done, self.learner.version)
        self.source.observe(info["results"])
        self.supply.start_ahead(done)
        objective_knobs = KnobPlan.split(self.knobs.values(done - 1))[0]
        if objective_knobs:  # this step's values, arguments of the update
            self.learner.set_knobs(objective_knobs)
        return dict(done=done, exp=exp, info=info, objective_knobs=objective_knobs)

    def member_request(self) -> MemberRequest:
        """A population's batched sampling (run/population/batched_sampling.py): this step's prompts and key
        drawn now (as `collect` draws them, kept for it) and what this member's rows are
        sampled from: its prompts, sampling values, key, rollout weights and version."""
        examples, key = self.supply.draw()
        v = self.learner.version
        sampling = KnobPlan.split(self.knobs.values(v))[1]
        params = dataclasses.replace(self.producer.sampling, **sampling)
        tokens, mask = self.producer.encode(examples)
        return MemberRequest(tokens, mask, params, key, self.learner.rollout_params(), v)

    def sample_through(self, batched: Callable[[Any], Any]) -> Any:
        """A population's batched sampling: this step's producer samples through
        `batched(its sampler)` (one program of every member's rows), which is returned."""
        self.producer.sampler = sampler = batched(self.producer.sampler)
        return sampler

    def finish(self, got: dict[str, Any], step_metrics: list[dict]):
        """After the update (`step_metrics`): the stop rules, the rollout log, the
        controllers; returns scalars(seconds) for the metrics writers."""
        c, done, exp, info = self.config, got["done"], got["exp"], got["info"]
        self.supply.publish()  # a free-running producer's next weights
        self.guard.check_rewards(done, info["n_failed"], c.data.prompt_batch * c.rollout.group_size)
        self.guard.check_updates(done, step_metrics)
        self._log_rollouts(done, exp, info)
        extra = self._extra_scalars(info, got["objective_knobs"])
        if self.knobs.controllers:  # each reads its metric of this step, for the next
            self.knobs.observe(rl_step_scalars(step_metrics, info, 0.0, self.state.skipped))
        return lambda dt: {**rl_step_scalars(step_metrics, info, dt, self.state.skipped), **extra}

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
        ahead = self.supply.ahead
        extra = {"rollout/policy_lag": lag, "rollout/dropped_stale_total": ahead.dropped}
        if self.config.rollout.stale_batches == "resample":
            extra["rollout/resampled_stale_total"] = ahead.resampled
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
        return self.supply.rollout(examples, key)

    def begin_next(self, examples, key) -> None:
        """Partial rollouts: the next batch begun in the next draw's idle slots."""
        self.producer.begin_next(examples, key)

    def _supply_options(self, c) -> SupplyOptions:
        """The batch supply's settings in config `c` (the current stage's)."""
        return SupplyOptions(
            max_staleness=c.rollout.max_staleness,
            free_running_queue=c.rollout.free_running_queue,
            resample_stale=c.rollout.stale_batches == "resample",
            partial=bool(c.rollout.partial_budget),
            # the plain producer and a source that draws only in the main loop
            keeps_rows_in_flight=parts_lib.supports(c, "keeps_rows_in_flight"),
            checkpoint_every=c.train.checkpoint_every,
            steps=c.train.steps,
            boundaries=frozenset(stages_lib.boundaries(self.stages)),
        )

    def production(self, copy: bool = False, step: int | None = None) -> Production:
        """A rollout's production over the weights and version of now (captured here, so a
        rollout ahead samples with them while the learner moves on; `copy`: a copy of the
        weights) and the moving rollout keys at RL step `step` (default: the version)."""
        p, v = self.learner.rollout_params(copy), self.learner.version
        roles = self.roles
        weights = dict(policy=p, reference=roles.ref_params, teacher=roles.teacher_weights)
        sampling = KnobPlan.split(self.knobs.values(v if step is None else step))[1]
        return Production(self.producer, weights, v, sampling, self.source)

    def next_key(self):
        """Split the state's RNG (kept in the checkpoint, so a resume continues the stream)."""
        rng, key = jax.random.split(jax.random.wrap_key_data(self.state.rng))
        self.state = self.state.replace(rng=jax.random.key_data(rng))
        return key

    def sample_key(self):  # uncommitted: the rollout mesh may hold other devices
        return jax.random.wrap_key_data(
            jax.device_get(jax.random.key_data(jax.random.split(self.next_key())[0]))
        )

    # ------------------------------------------------------------------ around the steps

    def begin(self, start: int, steps: int) -> None:
        self.enter_stage(start)  # a run resumed after a stage boundary starts in that stage
        self.supply.begin(start, steps)  # a free-running producer, after any batches restored

    def paused(self) -> contextlib.AbstractContextManager:
        return self.supply.paused()

    def hooks(self) -> list:
        return [hooks_lib.BetweenSteps(self.enter_stage)]  # the next stage, from the step it starts

    def close(self) -> None:
        self.supply.close()

    def checkpoint_meta(self) -> dict[str, Any]:
        """The batch supply's state: the prompt source's, the batches in flight, the stale
        totals, partial rollouts' rows in flight."""
        return self.supply.state()

    def restore(self, meta: dict[str, Any]) -> None:
        self.supply.restore(meta, self.roles.mesh)

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
        """Run the stage of step `done` + 1 on (run/config/stages.py), unless it is the current one:
        the learner and the producer rebuilt from its config, the prompt batch resized; the
        train state (a critic's too), the prompt stream, the knobs and the logs kept. A
        boundary is a sync point, so no rollout sampled ahead is in flight across it."""
        index = stages_lib.index_at(self.stages, done)
        if index == self.stage_index:
            return
        assert not self.supply.ahead.in_flight, "rollouts in flight across a stage boundary"
        self.config = c = config_lib.at_step(self.launch_config, done)
        state = self.learner.state
        self.learner, self.producer, self.logp_fn = build_rl_stages(
            c, self.parts, tx=self.tx, state=state, log=self.say
        )
        self.learner.state = state  # a critic's trained state (the build starts a fresh one)
        if self.source.resizable:
            self.source.resize(c.data.prompt_batch)
        self.supply.options = self._supply_options(c)
        self.stage_index = index
        overrides = stages_lib.overrides_of(self.stages, index)
        self.say(f"[rl] stage {index} from step {done + 1}: " + hooks_lib.fmt(overrides))


def _teacher_index_of(c, roles):
    """Several teachers: an example's teacher, by its tag (`teacher.tag_key`); None with one."""
    if not roles.tagged_teachers:
        return None
    tags, field = roles.teacher_tags, c.teacher.tag_key
    return lambda example: tags.get(str(example.get(field)), 0)


def _learned_rewards(c, roles, task) -> tuple:
    """The learned reward terms' scorers over the task's prompts: the reward model's, then
    the judge's (data/rewards/shaping.LEARNED_REWARDS), each when configured."""
    question_of = lambda example: chat.question_of(task, example)  # noqa: E731
    out = []
    if roles.reward_model is not None:
        out.append(
            RewardModelScorer(
                roles.reward_model,
                sections.record(c, "reward_model"),
                prompt_of=lambda example: prompt_text(task, example),
                question_of=question_of,
            )
        )
    if roles.judge is not None:
        options = sections.record(c, "judge")
        if options.mode == "sampled":  # its own Sampler over the judge, on the run's mesh
            key = jax.random.fold_in(jax.random.key(c.seed), 0x7D6E)
            read = SampledVerdicts(roles.judge, options, mesh=roles.mesh, key=key)
        else:
            read = NextTokenProbs(roles.judge, options)
        out.append(JudgeScorer(read, roles.judge.tokenizer, options, question_of=question_of))
    return tuple(out)


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
        learned=_learned_rewards(c, roles, ctx.task),
        tagged_teachers=roles.tagged_teachers,
        teacher_tokenizer=roles.teacher_tokenizer,
        teacher_index_of=_teacher_index_of(c, roles),
    )
    source = make_source(
        ctx.task,
        sections.source_options(c),
        batch_size=c.data.prompt_batch,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )
    return RLStep(c, c, stages_lib.parse(c), roles, parts, ctx, source)
