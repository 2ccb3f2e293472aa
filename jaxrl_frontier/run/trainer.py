"""The loop: wires the stages of a step and holds the run's state.

One RL step, stage by stage (each a class in its own module, taking its neighbours as
arguments; none imports this one):

    PromptSource.next_batch()                                  rl/sources/
      -> RolloutProducer.produce(examples, weights, key)       rl/produce/rollout.py   -> Experience
      -> PromptSource.observe(info["results"])
      -> Learner.update(experience)                            rl/learn/learner.py
    metrics -> TensorBoard + JSONL + console;  state -> orbax checkpoint
    at a stage boundary (run/stages.py): learner and producer rebuilt from the staged config

SFT replaces the producer and learner by `sft.SFTStep`. Evaluation, checkpoints and stop
handling are shared. A run resumes whenever its workdir already holds a checkpoint;
SIGTERM/SIGINT save one and return. On several hosts every process runs this same loop on
its own prompts (`docs/distributed.md`); process 0 writes logs and exports.
"""

from __future__ import annotations

import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from jaxrl_frontier.core import distributed, sharding
from jaxrl_frontier.data.rewards.scorer import make_scorer
from jaxrl_frontier.data.tasks import task_for
from jaxrl_frontier.models import hf, lora
from jaxrl_frontier.rl import diagnostics
from jaxrl_frontier.rl.experience import (
    Experience,
    batches_from_state,
    batches_state,
    log_rollouts,
)
from jaxrl_frontier.rl.learn.learner import reshard_to
from jaxrl_frontier.rl.learn.optimizer import build_optimizer
from jaxrl_frontier.rl.learn.train_step import (
    init_train_state,
    optimizer_memory_kind,
)
from jaxrl_frontier.rl.overlap import FreeRunningRollouts, RolloutsAhead
from jaxrl_frontier.rl.produce.rollout import RolloutProducer
from jaxrl_frontier.rl.sources import make_source
from jaxrl_frontier.rl.sources.utils import prompt_text
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run import stages as stages_lib
from jaxrl_frontier.run.build import (
    attach_lora,
    build_meshes,
    build_model,
    build_teacher,
    build_tokenizer,
    check_resume_schedule,
    total_updates,
)
from jaxrl_frontier.run.knobs import KnobPlan
from jaxrl_frontier.run.rl_build import RunParts, build_rl_stages, checked_objective
from jaxrl_frontier.sampling import Sampler, make_sampler
from jaxrl_frontier.train import evaluation, faults
from jaxrl_frontier.train.checkpoint import Checkpointer, abstract_like
from jaxrl_frontier.train.metrics import MetricsWriter, ProgressBar, RolloutLogger, rl_step_scalars
from jaxrl_frontier.train.sft import SFTStep
from jaxrl_frontier.train.stopping import StopAgreement
from jaxrl_frontier.train.watchdog import Watchdog
from jaxrl_frontier.train.workdir_lock import take_for_job


class Trainer:
    """Builds every stage from a config and runs SFT or RL; `run()` returns a summary dict."""

    def __init__(self, config: ml_collections.ConfigDict, workdir: str | None = None):
        config = config_lib.resolve(config)
        if workdir:
            config.workdir = workdir
        if not config.workdir:
            raise config_lib.ConfigError("config key 'workdir' is empty: pass --workdir")
        distributed.initialize(config)  # before any device is touched
        config_lib.validate(config, num_devices=jax.device_count())
        # self.config: the config of the stage the run is in (run/stages.py); the one launched
        # (its stages listed, none applied) is what checkpoints and config.json record
        self.config = self.launch_config = c = config
        self.stages, self.stage_index = stages_lib.parse(c), 0
        self.workdir = os.path.abspath(c.workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.is_main = jax.process_index() == 0
        # one trainer per workdir (process 0 holds it), before anything is written there
        self.lock = take_for_job(self.workdir, say=self._print)
        self.watchdog = Watchdog.from_config(c, self.workdir)  # hangs, lost processes

        # ---- mesh, tokenizer, task
        self.mesh, self.rollout_mesh = build_meshes(c)  # the same mesh unless rollout.devices
        self.tokenizer = build_tokenizer(c)
        self.task = task_for(c, self.tokenizer)  # every prompt's length checked
        self.reward_names = list(self.task.reward_names)
        # one per run: training and evaluation; its calls are the watchdog's "scoring" phase
        self.scorer = self.watchdog.marked(make_scorer(c, self.task), "scoring")

        # keys that move as the run trains (schedules, controllers: run/knobs.py)
        self.knobs = KnobPlan.from_config(c, config_lib.RANGES)
        kl_coef = c.objective.kl_coef
        if "objective.kl_coef" in self.knobs.keys:  # loaded when it can rise above 0
            kl_coef = self.knobs.upper("objective.kl_coef")

        # ---- models: policy (trained), reference (frozen copy of the start), teacher
        k_model, k_teacher, rng0 = jax.random.split(jax.random.key(c.seed), 3)
        self.policy = build_model(
            c.model.init, c.model.path, c, self.tokenizer, self.mesh, k_model, c.model.dtype
        )
        self.policy = attach_lora(self.policy, c, self.mesh, k_model)
        # LoRA: `params` are the adapters, `base_params` the frozen weights (else None)
        self.graphdef, params, self.base_params, self.ref_params = lora.trained_and_frozen(
            self.policy, with_reference=c.mode == "rl" and kl_coef > 0
        )
        self.teacher = build_teacher(c, self.tokenizer, self.mesh, k_teacher, self.policy.cfg)
        self.teacher_params = None if self.teacher is None else nnx.state(self.teacher)

        # ---- optimizer, state, stages
        self.tx = build_optimizer(c.optimizer, total_updates(c))
        offload = optimizer_memory_kind(c.train.offload_optimizer, self.mesh)
        state = init_train_state(self.tx, params, self.mesh, rng0, memory_kind=offload)
        self.state_sharding = jax.tree.map(lambda x: x.sharding, state)
        n, pi = jax.process_count(), jax.process_index()
        batch = c.data.prompt_batch if c.mode == "rl" else c.train.sft_batch
        self.source = make_source(self.task, c, batch_size=batch, process_index=pi, process_count=n)
        if c.mode == "rl":
            self._parts = parts = RunParts(
                mesh=self.mesh,
                tokenizer=self.tokenizer,
                task=self.task,
                policy=self.policy,
                sampler=self.rollout_sampler,
                reference=self.ref_params is not None,
                teacher=self.teacher,
                scorer=self.scorer,
                rollout_mesh=self.rollout_mesh,
                base=self.base_params,
                knobs=self.knobs,
            )
            self.learner, self.producer, self.logp_fn = build_rl_stages(
                c, parts, tx=self.tx, state=state, log=self._print
            )
            self._check_stages()
        else:
            self._state = state
            self.sft_step = SFTStep.from_config(
                c, self.graphdef, self.tx, self.state_sharding, self.mesh, self.task, self.tokenizer
            )

        # ---- checkpointing, logging
        self.ckpt = Checkpointer(
            os.path.join(self.workdir, "checkpoints"), max_to_keep=c.train.keep_checkpoints
        )
        self.writer = MetricsWriter(self.workdir)
        self.rollout_log = RolloutLogger(self.workdir) if self.is_main else None
        self.history: dict[str, Any] = {"eval": []}
        self.guard = faults.RunGuard.from_config(c, say=self._print, scorer=self.scorer)
        k = c.rollout.max_staleness if c.mode == "rl" else 0
        queue = c.rollout.free_running_queue
        self.ahead = FreeRunningRollouts(k, queue) if k and queue else RolloutsAhead(k)
        # partial rollouts: the next batch (examples, key), begun by this step's decode
        self.next_batch: tuple[list, jax.Array] | None = None
        if self.is_main:
            with open(os.path.join(self.workdir, "config.json"), "w") as f:
                f.write(c.to_json_best_effort(indent=2))

    # ------------------------------------------------------------------ state

    @property
    def state(self):
        """The train state (the Learner's in RL)."""
        return self.learner.state if self.config.mode == "rl" else self._state

    @state.setter
    def state(self, value) -> None:
        if self.config.mode == "rl":
            self.learner.state = value
        else:
            self._state = value

    def _next_key(self):
        """Split the state's RNG (kept in the checkpoint, so a resume continues the stream)."""
        rng, key = jax.random.split(jax.random.wrap_key_data(self.state.rng))
        self.state = self.state.replace(rng=jax.random.key_data(rng))
        return key

    def _save(self) -> None:
        # a free-running producer holds still while it is saved
        with self.ahead.paused(), self.watchdog.phase("save"):
            self._save_now()

    def _save_now(self) -> None:
        ahead = None
        if self.ahead.in_flight and self.keeps_in_flight:  # saved whole, the source past them
            ahead = batches_state(self.ahead.finished())
            data = self.source.state()
        else:
            data = self.ahead.source_state(self.source)  # before any batch still in flight
        meta = dict(data=data, history=self.history, config=self.launch_config.to_dict())
        if ahead:
            meta["ahead"] = ahead
        if self.ahead.enabled:  # the totals go on across a resume
            meta["stale"] = dict(dropped=self.ahead.dropped, resampled=self.ahead.resampled)
        meta["knobs"] = self.knobs.state()  # controllers' states, every spec
        if self.next_batch is not None:  # partial rollouts: the rows in flight, not drained
            examples, key = self.next_batch
            partial = dict(
                examples=examples,
                key=jax.device_get(jax.random.key_data(key)).tolist(),
                rows=self.rollout_sampler.state(),
            )
            if jax.process_count() > 1:  # each process's own prompts and rows
                partial = dict(per_process=distributed.allgather_json(partial))
            meta["partial"] = partial
        faults.flush_logs(self.writer, self.rollout_log)  # a checkpoint's rows are on disk first
        self.ckpt.save(int(self.state.step), self.state, meta)

    def _restore(self) -> None:
        """Resume from the newest intact checkpoint in the workdir, if any (faults.resume)."""
        logs = (self.writer, self.rollout_log)
        restored = faults.resume(self.ckpt, abstract_like(self.state), logs, self._print)
        if restored is None:
            return
        self.state, meta = restored
        check_resume_schedule(meta.get("config") or {}, self.launch_config)
        stages_lib.check_resume(meta.get("config") or {}, self.stages, int(self.state.step))
        self.history = meta.get("history") or {"eval": []}
        if meta.get("data") is not None:
            self.source.restore(meta["data"])
        if meta.get("knobs") is not None or self.knobs:
            self.knobs.restore(meta.get("knobs") or {})
        stale = meta.get("stale") or {}  # the stale totals (`rollout.max_staleness`)
        self.ahead.dropped = stale.get("dropped", 0)
        self.ahead.resampled = stale.get("resampled", 0)
        if meta.get("ahead"):  # batches produced ahead, saved with the checkpoint
            outs = batches_from_state(meta["ahead"], self.mesh)
            self.ahead.restore(outs, self.source.state())
        if meta.get("partial") is not None:
            partial = meta["partial"]
            if "per_process" in partial:
                partial = partial["per_process"][jax.process_index()]
            key = jax.random.wrap_key_data(np.asarray(partial["key"], np.uint32))
            self.next_batch = (list(partial["examples"]), key)
            self.rollout_sampler.restore(partial["rows"])

    def _print(self, msg: str) -> None:
        if self.is_main:
            print(msg, flush=True)

    def export(self, path: str | None = None) -> str:
        """Write the current policy in Hugging Face format (+ tokenizer) to workdir/export;
        LoRA adapters merged into the weights (W + (alpha / r) A B)."""
        path = path or os.path.join(self.workdir, "export")
        nnx.update(self.policy, sharding.host_copy(self.state.params))  # every process joins
        if self.is_main:
            hf.save(self.policy if self.base_params is None else lora.merged(self.policy), path)
            self.tokenizer.save(path)
        return path

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, num_prompts: int | None = None) -> dict[str, float]:
        """Held-out greedy pass@1 and sampled pass@k (k = eval.pass_k) of the current policy."""
        params = self.state.params  # LoRA: the base + adapters, unmerged
        params = params if self.base_params is None else lora.combine(self.base_params, params)
        self.sampler.update_weights(params, int(self.state.step))
        return evaluation.evaluate(
            self.sampler, self.tokenizer, self.task, self.config, num_prompts, scorer=self.scorer
        )

    @property
    def sampler(self) -> Sampler:
        """The sampler of the evaluation and, but for process-local rollouts, the rollouts:
        on the rollout mesh (the training mesh unless roles are disaggregated)."""
        if not hasattr(self, "_sampler"):
            mesh = self.rollout_mesh
            if jax.process_count() > 1 and sharding.is_process_local(mesh):
                mesh = self.mesh  # the eval's prompts span every host: the global mesh
            self._sampler = self._make_sampler(mesh)
        return self._sampler

    @property
    def rollout_sampler(self) -> Sampler:
        """The training rollouts' sampler: `sampler`, or with asynchronous rollouts on
        several processes one on this process's own devices (`build_meshes`)."""
        partial = self.config.rollout.partial_budget > 0  # its own: it holds rows in flight
        local = jax.process_count() > 1 and sharding.is_process_local(self.rollout_mesh)
        if not (partial or local):
            return self.sampler
        if not hasattr(self, "_rollout_sampler"):
            self._rollout_sampler = self._make_sampler(self.rollout_mesh, partial=partial)
        return self._rollout_sampler

    def _make_sampler(self, mesh, partial: bool = False) -> Sampler:
        policy = self.policy  # placed on `mesh` when it is not the training mesh
        if mesh is not self.mesh:
            policy = nnx.merge(self.graphdef, reshard_to(mesh)(nnx.state(policy)))
        rollout = self.config.rollout
        if jax.process_count() > 1 and sharding.is_process_local(mesh):
            # a process's share of the continuous slots, with its share of the rows
            rollout = rollout.to_dict()
            rollout["continuous_slots"] //= jax.process_count()
        return make_sampler(  # rollout.speculative: a SpeculativeSampler
            policy, rollout, pad_id=self.tokenizer.pad_id, mesh=mesh, partial=partial
        )

    # ------------------------------------------------------------------ run

    def run(self) -> dict[str, Any]:
        stop = StopAgreement.from_config(self.config)  # agreed by every process
        self.watchdog.start()
        try:
            return self._loop(stop)
        except jax.errors.JaxRuntimeError:  # a collective whose peer died: say which, exit
            self.watchdog.on_error()
            raise
        finally:  # a run's threads and files end with it (a process may hold many runs)
            stop.restore()
            self.ahead.close()
            self.ckpt.wait()  # a failed save surfaces here, as one line
            for part in (self.ckpt, self.writer, self.rollout_log, self.scorer):
                getattr(part, "close", lambda: None)()
            self.watchdog.close()
            if self.lock is not None:
                self.lock.close()

    def _loop(self, stop: StopAgreement) -> dict[str, Any]:
        c, tag = self.config, self.config.mode
        self._restore()
        start = int(self.state.step)
        if tag == "rl":  # a run resumed after a stage boundary starts in that stage
            self._enter_stage(start)
        if start == 0 and tag == "rl" and c.eval.at_start:
            self._record_eval(0, tag)
        if start == 0 and tag == "sft":
            self._print(
                f"[sft] {self.policy.cfg.num_params() / 1e6:.2f}M params, "
                f"{c.train.steps} steps of {c.train.sft_batch} demonstrations"
            )
        bar = ProgressBar(c.train.steps, initial=start, desc=tag) if self.is_main else None
        steps = range(0) if diagnostics.finished(self.history) else range(start, c.train.steps)
        if self.ahead.free_running:  # it starts now, after any batches restored
            self._free_key = self._sample_key()
            self.ahead.begin(self.source, len(steps), self._batch_maker)
        for step in steps:
            t0 = time.perf_counter()
            scalars = self._rl_step() if tag == "rl" else self._sft_step()
            done = step + 1
            if done % c.train.log_every == 0 or done == c.train.steps:
                scalars = scalars(time.perf_counter() - t0)
                self.writer.write_scalars(done, scalars)
                if bar:
                    shown = dict(reward="reward/total", loss="train/loss") if tag == "rl" else {}
                    bar.update(
                        done, {k: scalars[v] for k, v in (shown or {"nll": "train/nll"}).items()}
                    )
            outcome = self._end_of_step(done, stop, tag)
            self.watchdog.after_step(done)
            if self.lock is not None:
                self.lock.after_step(done)
            if outcome == "signal":
                return dict(stopped=True, step=done, history=self.history)
            if outcome == "target":
                break
            if tag == "rl" and done < c.train.steps:
                self._enter_stage(done)
        if bar:
            bar.close()
        self.ckpt.wait()
        if c.train.export == "last":  # 'best': written at the best eval
            self.export()
        return dict(stopped=False, step=int(self.state.step), history=self.history)

    def _sft_step(self):
        self.state, metrics = self.sft_step(self.state, self.source.next_batch())
        self.guard.check_updates(int(self.state.step), metrics)
        return lambda dt: {f"train/{k}": float(v) for k, v in jax.device_get(metrics).items()}

    def rollout(self, examples, key) -> tuple[Experience, dict]:
        """One Experience (and its info) of `examples` from the current policy."""
        job, finish = self._producer_for(key)
        return finish(job(examples))

    @property
    def keeps_in_flight(self) -> bool:
        """Batches produced ahead (`rollout.max_staleness`) cross a checkpoint, saved whole
        with it (`RolloutsAhead.finished`; `batches_state`), instead of the queue draining
        before it: with the plain producer and a source that draws only in the main loop."""
        return (
            self.ahead.enabled
            and isinstance(self.producer, RolloutProducer)
            and self.config.data.source != "dynamic"
        )

    @property
    def local_rollouts(self) -> bool:
        """Each process samples its own rows on its own devices (asynchronous rollouts on
        several processes: rl/produce/rollout.py), so a rollout ahead runs `draw` alone in
        the background and its `finish` (collectives) in the main loop."""
        return isinstance(self.producer, RolloutProducer) and self.producer.local

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
        weights = dict(policy=p, reference=self.ref_params, teacher=self.teacher_params)
        sampling = KnobPlan.split(self.knobs.values(v if step is None else step))[1]
        options = dict(
            version=v, source=self.source, **({"sampling": sampling} if sampling else {})
        )
        with_knobs = lambda out: (out[0], {**out[1], "knobs": sampling})  # noqa: E731

        producer = self.producer

        def make(key):
            if self.local_rollouts:
                draw = lambda examples: producer.draw(examples, weights, key, **options)  # noqa: E731
                return draw, lambda drawn: with_knobs(producer.finish(drawn, weights))

            def produce(examples):  # the source may draw more prompts (dynamic sampling)
                return with_knobs(producer.produce(examples, weights, key, **options))

            return produce, lambda out: out

        return make

    def _sample_key(self):  # uncommitted: the rollout mesh may hold other devices
        return jax.random.wrap_key_data(
            jax.device_get(jax.random.key_data(jax.random.split(self._next_key())[0]))
        )

    def _partial_rollout(self, done: int, boundaries) -> tuple[Experience, dict]:
        """Partial rollouts: this step's batch (begun by the last step's decode, or drawn
        now), with the next batch begun in its idle slots unless this is the run's last step
        or a stage ends with it (sampling/partial.py)."""
        examples, key = self.next_batch or (self.source.next_batch(), self._sample_key())
        self.next_batch = None
        if done < self.config.train.steps and done not in boundaries:
            self.next_batch = (self.source.next_batch(), self._sample_key())
            self.producer.begin_next(*self.next_batch)
        return self.rollout(examples, key)

    def _rl_step(self):
        c = self.config
        done = int(self.state.step) + 1
        boundaries = stages_lib.boundaries(self.stages)  # no batch in flight across a stage
        resample = None  # a stale batch (lag > k): dropped, or its prompts sampled again
        if c.rollout.stale_batches == "resample":
            resample = lambda examples: self.rollout(examples, self._sample_key())  # noqa: E731
        out = self.ahead.take(self.learner.version, resample)  # produced during the last update
        if out is None and c.rollout.partial_budget:
            out = self._partial_rollout(done, boundaries)
        exp, info = out or self.rollout(self.source.next_batch(), self._sample_key())
        self.source.observe(info["results"])
        drains = not self.keeps_in_flight  # else a checkpoint saves the batches in flight
        syncs = lambda s: (
            s % c.train.eval_every == 0
            or (drains and s % c.train.checkpoint_every == 0)
            or s in boundaries
        )
        while self.ahead.room(done, c.train.steps, syncs):  # taken at done + in_flight + 1
            step = done + self.ahead.in_flight  # its step's index, for the scheduled knobs
            job, finish = self._producer_for(self._sample_key(), copy=True, step=step)
            self.ahead.start(self.source, job, finish)
        objective_knobs = KnobPlan.split(self.knobs.values(done - 1))[0]
        if objective_knobs:  # this step's values, arguments of the update
            self.learner.set_knobs(objective_knobs)
        with self.watchdog.phase("update"):
            step_metrics = self.learner.update(exp, self._next_key)
        self.ahead.publish(self._batch_maker)  # a free-running producer's next weights
        self.guard.check_rewards(done, info["n_failed"], c.data.prompt_batch * c.rollout.group_size)
        self.guard.check_updates(done, step_metrics)
        if self.rollout_log is not None or jax.process_count() > 1:
            if done % c.train.rollout_log_every == 0:
                log_rollouts(
                    self.rollout_log,
                    done,
                    exp,
                    info,
                    self.mesh,
                    lambda example: prompt_text(self.task, example),  # as sampled (ZPPO's)
                    self.reward_names,
                )

        lag, dropped = self.learner.version - 1 - info["policy_version"], self.ahead.dropped
        extra = {"rollout/policy_lag": lag, "rollout/dropped_stale_total": dropped}
        if c.rollout.stale_batches == "resample":
            extra["rollout/resampled_stale_total"] = self.ahead.resampled
        extra["perf/reshard_seconds"] = self.learner.reshard_seconds
        knobs = {f"objective.{k}": v for k, v in objective_knobs.items()}
        knobs.update({f"rollout.{k}": v for k, v in info.get("knobs", {}).items()})
        extra.update({f"schedule/{k}": v for k, v in knobs.items()})  # the values used
        if self.stages:
            extra["stage/index"] = self.stage_index
        if self.knobs.controllers:  # each reads its metric of this step, for the next
            self.knobs.observe(rl_step_scalars(step_metrics, info, 0.0, self.state.skipped))
        return lambda dt: {**rl_step_scalars(step_metrics, info, dt, self.state.skipped), **extra}

    def _check_stages(self) -> None:
        """Each stage's objective against what the run provides, and a prompt source that can
        change its batch if a stage does: ConfigErrors at the start, naming the stage."""
        for i, stage in enumerate(self.stages):
            try:
                checked_objective(config_lib.at_step(self.launch_config, stage.step), self._parts)
            except (config_lib.ConfigError, KeyError, ValueError) as e:
                raise config_lib.ConfigError(
                    f"config key 'stages[{i}]' (from step {stage.step}): {e.args[0]}"
                ) from None
            if "data.prompt_batch" in stage.overrides and not self.source.resizable:
                raise config_lib.ConfigError(
                    f"config key 'stages[{i}].overrides.data.prompt_batch': the prompt source "
                    f"{self.config.data.source!r} keeps its batch for the run"
                )

    def _enter_stage(self, done: int) -> None:
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
            c, self._parts, tx=self.tx, state=state, log=self._print
        )
        self.learner.state = state  # a critic's trained state (the build starts a fresh one)
        if self.source.resizable:
            self.source.resize(c.data.prompt_batch)
        self.stage_index = index
        overrides = stages_lib.overrides_of(self.stages, index)
        self._print(f"[rl] stage {index} from step {done + 1}: " + _fmt(overrides))

    def _record_eval(self, step: int, tag: str) -> dict:
        # the evaluation's sampler may be the rollouts'
        with self.ahead.paused(), self.watchdog.phase("eval"):
            ev = self.evaluate()
        self.history["eval"].append(dict(step=step, **ev))
        self.writer.write_scalars(step, ev)
        diagnostics.after_eval(self.history, ev, step, self.config, self.export, self._print)
        self._print(f"[{tag}] step {step}: " + _fmt(ev))
        return ev

    def _end_of_step(self, done: int, stop: StopAgreement, tag: str) -> str | None:
        """Eval, checkpoint and stop handling after step `done`.

        Returns None to go on, "signal" after SIGTERM/SIGINT (checkpoint saved), or "target"
        when pass@1 reached `train.stop_at_pass1` or the eval curve collapsed (checkpoint saved;
        the history records it, so running the same command again does not train further).
        """
        c = self.config
        outcome = "signal" if stop.agreed(done) else None  # the same step on every process
        if done % c.train.eval_every == 0 or done == c.train.steps:
            ev = self._record_eval(done, tag)
            target = c.train.stop_at_pass1
            if target > 0 and ev["eval/pass@1_greedy"] >= target and outcome is None:
                self.history["target_reached_at"] = done
                self._print(f"[{tag}] pass@1 reached train.stop_at_pass1={target}: done")
                outcome = "target"
            outcome = outcome or diagnostics.collapse_outcome(self.history, done)
        if done % c.train.checkpoint_every == 0 or done == c.train.steps or outcome:
            self._save()
        if outcome == "signal":
            self._print(f"[{tag}] stopped by {stop.signal_name} at step {done}; checkpoint saved")
        return outcome


def _fmt(d: dict) -> str:
    return "  ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items())


def train(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict[str, Any]:
    """Build a Trainer and run it (resuming from workdir if it holds a checkpoint)."""
    return Trainer(config, workdir).run()
