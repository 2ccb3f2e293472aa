"""A population's driver: N runs of one config in one job (`population.*`, section.py).

    workdir/population.json           each member's varied values
    workdir/lineage.jsonl             population-based training's copies (pbt.py)
    workdir/members/<i>/              an ordinary run directory: config.json, metrics.jsonl,
                                      TensorBoard, rollouts.jsonl, checkpoints/, export/

Every member is a `Trainer` of its own config (the seed and the varied values set), built
over the first member's compiled programs (`Trainer(shared=)`: the samplers, the learner's
update, the producer's passes), so the population compiles once. The members step in turn,
in lockstep: step s of every member, then step s + 1. Each member checkpoints in its own
directory at the same steps and resumes from its own newest checkpoint; a member resumed
behind the others (a kill during a save) catches up first, or, with population-based
training, the members ahead roll back to the step all of them saved. A stop signal stops
every member after the same step (`OnceAStep`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import ml_collections

from jaxrl_frontier.core import distributed
from jaxrl_frontier.rl.learn.optimizer import learning_rate, with_learning_rate
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run import trainer
from jaxrl_frontier.run.config import sections
from jaxrl_frontier.run.population import pbt
from jaxrl_frontier.run.population import section as population_config
from jaxrl_frontier.run.population.batched_sampling import MemberRequest, MemberSampler
from jaxrl_frontier.run.population.batched_update import MemberUpdates
from jaxrl_frontier.train.stopping import StopAgreement
from jaxrl_frontier.train.workdir_lock import take_for_job

LINEAGE = "lineage.jsonl"  # population-based training's copies, a row each


class MemberStep(Protocol):
    """What a population asks of a member's step (`RLStep`, run/rl_step.py), and all it asks:
    the batched sampling's request and sampler, the batched update's collect, learner,
    key and finish."""

    learner: Any  # its Learner: its state and programs join the members' one update
    updated: tuple[dict[str, Any], list[dict]] | None  # set: the next call runs `finish` only

    def member_request(self) -> MemberRequest:
        """This step's prompts and key drawn, and what its rows are sampled from."""

    def sample_through(self, batched: Callable[[Any], Any]) -> Any:
        """Its producer samples through `batched(its sampler)`, which is returned."""

    def collect(self) -> dict[str, Any]:
        """This step's batch and the values its update reads."""

    def next_key(self) -> jax.Array:
        """The next key of its RNG stream (its update's)."""

    def finish(self, got: dict[str, Any], step_metrics: list[dict]):
        """After the update: the step's scalars."""


class OnceAStep:
    """A stop request asked once per step: the first member to ask after step s decides for
    every member (a signal that arrives while the members step in turn stops them all after
    the same step)."""

    def __init__(self, request: StopAgreement):
        self.request, self.answers = request, {}

    def agreed(self, step: int) -> bool:
        if step not in self.answers:
            self.answers[step] = self.request.agreed(step)
        return self.answers[step]

    @property
    def signal_name(self) -> str | None:
        return self.request.signal_name


class Population:
    """The members of a population config (module docstring); `run()` trains them."""

    def __init__(self, config: ml_collections.ConfigDict, workdir: str | None = None):
        c = config_lib.resolve(config)
        if workdir:
            c.workdir = workdir
        if not c.workdir:
            raise config_lib.ConfigError("config key 'workdir' is empty: pass --workdir")
        distributed.initialize(sections.distributed_options(c))
        self.values = population_config.member_values(c)
        if not self.values:
            raise config_lib.ConfigError(
                "config key 'population.size': no population is set (size 0, no vary or grid)"
            )
        self.workdir = os.path.abspath(c.workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.lock = take_for_job(self.workdir, say=print)  # one population per workdir
        with open(os.path.join(self.workdir, "population.json"), "w") as f:
            json.dump({"members": self.values}, f, indent=2)
        self.members: list[trainer.Trainer] = []
        for i, values in enumerate(self.values):
            member = trainer.Trainer(
                population_config.member_config(c, values),
                self.member_dir(i),
                shared=self.members[0] if self.members else None,
                label=f"[member {i}] ",
            )
            self.members.append(member)
        batched_update, batched_sampling = population_config.batched(c)
        self.updates = None  # population.batched_update: one update of every member
        if batched_update:
            self.updates = MemberUpdates([step.learner for step in self.steps_of_members])
        self.sampling = None  # population.batched_sampling: one rollout program of every member
        if batched_sampling:  # the first member's producer and sampler are every member's
            self.sampling = self.steps_of_members[0].sample_through(MemberSampler)
        self.pbt = pbt.PBTOptions.from_config(c)
        if self.pbt.every:  # a resume takes each member's moved values from its checkpoint
            for member in self.members:
                member.knobs.adopts_constants = True
        self.say(f"[population] {len(self.members)} members: " + "; ".join(
            f"{i}: " + ", ".join(f"{k}={v}" for k, v in m.items())
            for i, m in enumerate(self.values)
        ))  # fmt: skip

    @property
    def steps_of_members(self) -> list[MemberStep]:
        return [member.step for member in self.members]

    def member_dir(self, i: int) -> str:
        return os.path.join(self.workdir, "members", str(i))

    def say(self, msg: str) -> None:
        if jax.process_index() == 0:
            print(msg, flush=True)

    def run(self) -> dict[str, Any]:
        """Train every member to `train.steps` (resuming each from its checkpoint); the
        population's summary: each member's, and whether a signal stopped them."""
        agree = self.members[0].launch_config.distributed.agree_stop
        request = StopAgreement(agree=agree)
        once = OnceAStep(request)
        stops: list[str | None] = [None] * len(self.members)
        try:
            for member in self.members:
                member.stop_request = once
                member.watchdog.start()
            at = self._resume_at()
            steps = [member.begin(at) for member in self.members]
            first = min(r.start for r in steps)
            self._check_pbt_resume(steps)
            if self.pbt.due(first, self.steps):  # a checkpoint of a PBT step: before its copies
                self.exploit(first)
            for step in range(first, max(r.stop for r in steps)):
                active = [
                    i for i in range(len(self.members)) if stops[i] is None and step in steps[i]
                ]
                if len(active) == len(self.members):
                    self._batched()
                for i in active:
                    stops[i] = self.members[i].advance(step)
                if "signal" in stops:
                    break
                if self.pbt.due(step + 1, self.steps) and not any(stops):
                    self.exploit(step + 1)
            summaries = [m.end(stop) for m, stop in zip(self.members, stops)]
        finally:
            request.restore()
            for member in self.members:
                member.close()
            self.lock.close()
        return dict(
            stopped="signal" in stops,
            step=max(s["step"] for s in summaries),
            history=summaries[0]["history"],
            members=[dict(values=v, **s) for v, s in zip(self.values, summaries)],
        )

    def _batched(self) -> None:
        """With `population.batched_sampling`: every member's rows of this step sampled by
        one program first (batched_sampling.py), each member's rollout then taking its own.
        With `population.batched_update`: every member's batch collected and one vmapped
        update of them all (batched_update.py), each member's step then finishing with its
        own (`MemberStep.updated`). Otherwise each member steps whole, in turn."""
        steps = self.steps_of_members
        if self.sampling is not None:
            self.sampling.prepare([step.member_request() for step in steps])
        if self.updates is None:
            return
        got = [step.collect() for step in steps]
        keys = [step.next_key for step in steps]
        metrics = self.updates.update([g["exp"] for g in got], keys)
        for step, g, x in zip(steps, got, metrics):
            step.updated = (g, x)

    @property
    def steps(self) -> int:
        return int(self.members[0].launch_config.train.steps)

    def _resume_at(self) -> int | None:
        """With PBT, the step every member resumes from: the oldest of their newest
        checkpoints (a kill while the members saved a step in turn leaves some a step
        behind; PBT compares and copies members at one step, so those ahead roll back,
        their later checkpoints set aside, and run those steps again, as they ran them).
        None without PBT: each member resumes from its own newest and catches up."""
        if not self.pbt.every:
            return None
        return min(max(m.ckpt.all_steps(), default=0) for m in self.members)

    def _check_pbt_resume(self, steps: list[range]) -> None:
        if self.pbt.every and len({r.start for r in steps}) > 1:  # a damaged checkpoint
            starts = {i: r.start for i, r in enumerate(steps)}
            raise config_lib.ConfigError(
                f"population.pbt: the members resumed from different steps {starts} (a "
                "damaged checkpoint was skipped); PBT needs them at one step: remove the "
                "newer checkpoints (members/<i>/checkpoints/<step>) down to the oldest common "
                "step"
            )

    def exploit(self, step: int) -> None:
        """PBT at step `step` (pbt.py): the bottom members take a top member's params and
        optimizer state and its perturbed values; a row per copy in lineage.jsonl (written
        once: a resumed population redoes the same copies)."""
        varied = [k for k in self.values[0] if k != population_config.SEED]
        scores = []
        for i, member in enumerate(self.members):
            evals = [e for e in member.history["eval"] if e["step"] == step]
            if not evals or self.pbt.metric not in evals[-1]:
                raise config_lib.ConfigError(
                    f"config key 'population.pbt.metric' = {self.pbt.metric!r}: member {i} has "
                    f"no such eval metric at step {step}"
                )
            scores.append(float(evals[-1][self.pbt.metric]))
        now = [_values_now(m, varied, step) for m in self.members]
        rows = pbt.plan(self.pbt, step, scores, now)
        for row in rows:
            source, target = self.members[row["copied_from"]], self.members[row["member"]]
            params, opt_state = jax.tree.map(
                jnp.copy, (source.state.params, source.state.opt_state)
            )
            for key, value in row["values"].items():
                if key == population_config.LR:  # a value of the optimizer state
                    opt_state = with_learning_rate(opt_state, value)
                else:
                    target.knobs.set_constant(key, value)
            target.state = target.state.replace(params=params, opt_state=opt_state)
        path = os.path.join(self.workdir, LINEAGE)
        written = set()
        if os.path.exists(path):
            written = {json.loads(line)["step"] for line in open(path)}
        if jax.process_index() == 0 and step not in written:
            with open(path, "a") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows)
        moves = ", ".join(f"{r['copied_from']}->{r['member']}" for r in rows)
        self.say(f"[population] step {step}: PBT copies {moves}")


def _values_now(member: trainer.Trainer, keys: list[str], step: int) -> dict[str, float]:
    """A member's values of its varied float keys at `step` (the learning rate from its
    optimizer state, the rest from its knobs)."""
    knobs = member.knobs.values(step)
    lr = lambda: learning_rate(member.state.opt_state)  # noqa: E731
    return {k: lr() if k == population_config.LR else knobs[k] for k in keys}


def train(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict[str, Any]:
    """Train `config`: a population when its `population` section sets one, else one run."""
    c = config_lib.resolve(config)
    if population_config.member_values(c):
        return Population(config, workdir).run()
    population_config.check_solo_mesh(c)  # no member axis without members
    return trainer.train(config, workdir)
