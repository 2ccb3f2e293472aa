"""The loop: a `Step` (SFT or RL, run/steps.py and run/rl_step.py) called once per step,
and hooks that do the periodic work around it (train/hooks.py):

    begin():   restore the newest checkpoint, if any; hook.begin(start) for each hook
    advance(): scalars = step(); hook.after_step(end) for each hook (stop signal, metrics,
               progress, eval, checkpoint, stage switch); end.stop: the loop breaks
    end():     hook.end(stop) for each hook (export)

The trainer builds the roles (run/roles.py), the step the config's `mode` names (`STEPS`)
and the hooks. A run resumes whenever its workdir holds a checkpoint; SIGTERM/SIGINT save
one and return. On several hosts every process runs this loop on its own prompts
(`docs/distributed.md`); process 0 writes logs and exports.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import jax
import ml_collections

from jaxrl_frontier.core import distributed
from jaxrl_frontier.data.rewards.scorer import make_scorer
from jaxrl_frontier.data.tasks import task_for
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run import periodic, rl_step  # noqa: F401  (rl_step: "rl")
from jaxrl_frontier.run.build import build_tokenizer, build_train_state, check_resume_schedule
from jaxrl_frontier.run.config import sections
from jaxrl_frontier.run.config import stages as stages_lib
from jaxrl_frontier.run.knobs import KnobPlan
from jaxrl_frontier.run.roles import build_roles
from jaxrl_frontier.run.steps import STEPS, Step, StepContext
from jaxrl_frontier.train import collapse, evaluation, resume
from jaxrl_frontier.train import hooks as hooks_lib
from jaxrl_frontier.train.checkpoint import Checkpointer, abstract_like
from jaxrl_frontier.train.metrics import MetricsWriter, RolloutLogger
from jaxrl_frontier.train.stopping import StopAgreement
from jaxrl_frontier.train.workdir_lock import take_for_job


class Trainer:
    """Builds the roles, the step and the hooks from a config; `run()` returns a summary."""

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        workdir: str | None = None,
        *,
        shared: Trainer | None = None,
        label: str = "",
    ):
        """shared: a trainer of the same structure whose compiled programs this one runs (a
        population's first member, run/population/driver.py); label: the console lines' prefix."""
        self.label, self.shared = label, shared
        config = config_lib.resolve(config)
        if workdir:
            config.workdir = workdir
        if not config.workdir:
            raise config_lib.ConfigError("config key 'workdir' is empty: pass --workdir")
        distributed.initialize(sections.distributed_options(config))  # before any device
        config_lib.validate(config, num_devices=jax.device_count())
        # the config launched (its stages listed, none applied): what checkpoints and
        # config.json record; the step holds the config of the stage the run is in
        self.launch_config = c = config
        self.workdir = os.path.abspath(c.workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.is_main = jax.process_index() == 0
        # one trainer per workdir (process 0 holds it), before anything is written there
        self.lock = take_for_job(self.workdir, say=self.say)
        self.watchdog = periodic.watchdog(c, self.workdir)  # hangs, lost processes

        self.tokenizer = build_tokenizer(c)
        self.task = task_for(sections.task_options(c), self.tokenizer)  # prompt lengths checked
        self.scorer = make_scorer(sections.reward_options(c), self.task)  # train, eval share it
        self.scoring = self.watchdog.marked(self.scorer, "scoring")  # the watchdog's phase
        # keys that move as the run trains (schedules, controllers: run/knobs.py)
        self.knobs = KnobPlan.from_config(c, config_lib.RANGES)
        moving = "objective.kl_coef" in self.knobs.keys  # then loaded if it can rise above 0
        kl_coef = self.knobs.upper("objective.kl_coef") if moving else c.objective.kl_coef
        k_model, k_teacher, rng0 = jax.random.split(jax.random.key(c.seed), 3)
        self.roles, params = build_roles(c, self.tokenizer, kl_coef, k_model, k_teacher)
        if shared is not None:  # the samplers' programs; the weights from files held once
            self.roles = self.roles.sharing(shared.roles, c)

        self.tx, state, self.state_sharding = build_train_state(c, self.roles.mesh, params, rng0)
        self.ckpt = Checkpointer(
            os.path.join(self.workdir, "checkpoints"), max_to_keep=c.train.keep_checkpoints
        )
        self.writer = MetricsWriter(self.workdir, c.metrics.to_dict(), run_config=c.to_dict())
        self.rollout_log = RolloutLogger(self.workdir) if self.is_main else None
        self.history: dict[str, Any] = {"eval": []}
        context = StepContext(
            state=state,
            state_sharding=self.state_sharding,
            tx=self.tx,
            task=self.task,
            scorer=self.scoring,
            knobs=self.knobs,
            say=self.say,
            watchdog=self.watchdog,
            rollout_log=self.rollout_log,
            shared=shared and shared.step,
        )
        self.step: Step = STEPS.get(c.mode)(c, self.roles, context)
        self.stop_request: StopAgreement | None = None
        self.hooks: list[hooks_lib.Hook] = periodic.hooks(self, c)
        if self.is_main:
            with open(os.path.join(self.workdir, "config.json"), "w") as f:
                f.write(c.to_json_best_effort(indent=2))

    # ------------------------------------------------------------------ the run's parts

    @property
    def config(self) -> ml_collections.ConfigDict:
        """The config of the stage the run is in (run/config/stages.py)."""
        return self.step.config

    @property
    def state(self):
        """The train state (params, optimizer state, step, RNG)."""
        return self.step.state

    @state.setter
    def state(self, value) -> None:
        self.step.state = value

    source = property(lambda self: self.step.source)  # the prompt source

    def say(self, msg: str) -> None:
        """Print on process 0."""
        if self.is_main:
            print(f"{self.label}{msg}", flush=True)

    # ------------------------------------------------------------------ save, export, evaluate

    def save(self) -> None:
        """Checkpoint the train state and everything the run resumes from (no batch is being
        produced meanwhile: a free-running producer holds still)."""
        with self.holding("save"):
            meta = self.step.checkpoint_meta()
            meta.update(history=self.history, config=self.launch_config.to_dict())
            meta["knobs"] = self.knobs.state()  # controllers' states, every spec
            resume.flush_logs(self.writer, self.rollout_log)  # a checkpoint's rows first
            self.ckpt.save(int(self.state.step), self.state, meta)

    @contextlib.contextmanager
    def holding(self, phase: str):
        """A block with no batch produced in the background, in the watchdog's `phase`."""
        with self.step.paused(), self.watchdog.phase(phase):
            yield

    def restore(self, at_most: int | None = None) -> None:
        """Resume from the newest intact checkpoint in the workdir, if any (resume.resume);
        at_most: from none later than that step (later ones set aside)."""
        logs = (self.writer, self.rollout_log)
        restored = resume.resume(self.ckpt, abstract_like(self.state), logs, self.say, at_most)
        if restored is None:
            return
        self.state, meta = restored
        check_resume_schedule(meta.get("config") or {}, self.launch_config)
        stages = stages_lib.parse(self.launch_config)
        stages_lib.check_resume(meta.get("config") or {}, stages, int(self.state.step))
        self.history.clear()  # in place: the hooks hold it
        self.history.update(meta.get("history") or {"eval": []})
        if meta.get("knobs") is not None or self.knobs:
            self.knobs.restore(meta.get("knobs") or {})
        self.step.restore(meta)

    def export(self, path: str | None = None) -> str:
        """Write the current policy in Hugging Face format (+ tokenizer) to workdir/export;
        LoRA adapters merged into the weights (W + (alpha / r) A B)."""
        path = path or os.path.join(self.workdir, "export")
        self.roles.export(self.state.params, path, write=self.is_main)  # every process joins
        return path

    def evaluate(self, num_prompts: int | None = None) -> dict[str, float]:
        """Held-out greedy pass@1 and sampled pass@k (k = eval.pass_k) of the current policy."""
        params = self.roles.full_params(self.state.params)  # LoRA: base + adapters
        self.roles.sampler.update_weights(params, int(self.state.step))
        sampler, options = self.roles.sampler, sections.eval_options(self.config)
        return evaluation.evaluate(
            sampler, self.tokenizer, self.task, options, num_prompts, scorer=self.scoring
        )

    # ------------------------------------------------------------------ the loop

    def run(self) -> dict[str, Any]:
        agree = self.launch_config.distributed.agree_stop  # a stop agreed by every process
        self.stop_request = StopAgreement(agree=agree)
        self.watchdog.start()
        try:
            stop = None
            for step in self.begin():
                if (stop := self.advance(step)) is not None:
                    break
            return self.end(stop)
        except jax.errors.JaxRuntimeError:  # a collective whose peer died: say which, exit
            self.watchdog.on_error()
            raise
        finally:  # a run's threads and files end with it (a process may hold many runs)
            self.stop_request.restore()
            self.close()

    def begin(self, at_most: int | None = None) -> range:
        """Restore the newest checkpoint (no later than `at_most`), start the step and the
        hooks: the steps to run."""
        self.restore(at_most)
        start, steps = int(self.state.step), self.launch_config.train.steps
        last = start if collapse.finished(self.history) else steps
        self.step.begin(start, last)
        for hook in self.hooks:
            hook.begin(start)
        return range(start, last)

    def advance(self, step: int) -> str | None:
        """Step `step` + 1 and its hooks; why the run stops (None: it goes on)."""
        t0 = time.perf_counter()
        scalars = self.step()
        dt = time.perf_counter() - t0
        end = hooks_lib.StepEnd(step + 1, self.launch_config.train.steps, lambda: scalars(dt))
        for hook in self.hooks:
            hook.after_step(end)
        return end.stop

    def end(self, stop: str | None) -> dict[str, Any]:
        """The hooks' end (the export); the run's summary."""
        for hook in self.hooks:
            hook.end(stop)
        return dict(stopped=stop == "signal", step=int(self.state.step), history=self.history)

    def close(self) -> None:
        """End the step's threads, wait for the last save, close the files and the lock."""
        self.step.close()
        self.ckpt.wait()  # a failed save surfaces here, as one line
        parts = (self.ckpt, self.writer, self.rollout_log, self.scorer, self.watchdog, self.lock)
        for part in parts:  # rollout_log, lock: process 0's alone; the lock released last
            if part is not None:
                part.close()


def train(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict[str, Any]:
    """Build a Trainer and run it (resuming from workdir if it holds a checkpoint)."""
    return Trainer(config, workdir).run()
