"""Where each RL step's batch comes from, and what of it a checkpoint holds.

    supply.take(done)          this step's (Experience, info): a batch produced ahead, one
                               begun by the last step's decode (partial rollouts), or one
                               produced now from the prompts drawn for a population's
                               batched sampling, else from the next prompts
    supply.start_ahead(done)   batches ahead started while there is room (rl/ahead.py)
    supply.draw()              a population member's prompts and key, drawn before `take`
    supply.state() / restore   the batches in flight, the stale totals and the partial rows

The supply asks the step it feeds (`Producing`) for a rollout's `Production` (the weights,
version and sampling values of now), a sampling key and, for partial rollouts, to begin the
next batch in this draw's idle slots; it holds the prompt source's place across a
checkpoint. Its settings are the current stage's (`SupplyOptions`, set again at a stage
boundary).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax
import numpy as np

from jaxrl_frontier.core import distributed
from jaxrl_frontier.rl.ahead import FreeRunningRollouts, RolloutsAhead
from jaxrl_frontier.rl.experience import Experience, batches_from_state, batches_state
from jaxrl_frontier.rl.produce.production import Production


@dataclasses.dataclass(frozen=True)
class SupplyOptions:
    """max_staleness, free_running_queue: batches produced ahead (`rollout.*`, rl/ahead.py);
    resample_stale: a stale batch's prompts sampled again (`rollout.stale_batches =
    'resample'`), else dropped; partial: partial rollouts (`rollout.partial_budget > 0`);
    keeps_rows_in_flight: every part of the run saves batches in flight whole with a
    checkpoint (else a checkpoint is a sync step); checkpoint_every, steps: `train.*`;
    boundaries: the stage boundaries (sync steps: no batch in flight across one)."""

    max_staleness: int = 0
    free_running_queue: int = 0
    resample_stale: bool = False
    partial: bool = False
    keeps_rows_in_flight: bool = False
    checkpoint_every: int = 1
    steps: int = 1
    boundaries: frozenset[int] = frozenset()


class Producing(Protocol):
    """What the supply asks of the step it feeds."""

    source: Any  # the PromptSource: next_batch(), state(), restore()

    def production(self, copy: bool = False, step: int | None = None) -> Production:
        """A rollout's production over the weights of now (`copy`: a copy of them) and the
        moving sampling values at RL step `step` (default: the policy's version)."""

    def sample_key(self) -> jax.Array:
        """The next sampling key of the run's RNG stream."""

    def begin_next(self, examples: list, key: jax.Array) -> None:
        """Partial rollouts: the next batch begun in the next draw's idle slots."""


class BatchSupply:
    """Each RL step's batch (module docstring), over `rows`: the rollout sampler whose
    partial rows a checkpoint holds."""

    def __init__(self, options: SupplyOptions, step: Producing, rows):
        self.options, self.step, self.rows = options, step, rows
        k, queue = options.max_staleness, options.free_running_queue
        self.ahead = FreeRunningRollouts(k, queue) if k and queue else RolloutsAhead(k)
        # partial rollouts: the next batch (examples, key), begun by this step's decode
        self.next_batch: tuple[list, jax.Array] | None = None
        # a population's batched sampling: this step's (examples, key), drawn ahead of take
        self.drawn: tuple[list, jax.Array] | None = None
        self._free_key: jax.Array | None = None

    # ------------------------------------------------------------------ each step

    def take(self, done: int, version: int) -> tuple[Experience, dict]:
        """Step `done`'s batch, `version` the learner's: taken ahead (a stale one dropped or
        its prompts sampled again), begun by partial rollouts, or produced now."""
        resample = None
        if self.options.resample_stale:
            resample = lambda examples: self.rollout(examples, self.step.sample_key())  # noqa: E731
        out = self.ahead.take(version, resample)  # produced during the last update
        if out is None and self.options.partial:
            out = self._partial_rollout(done)
        return out or self.rollout(*self._this_batch())

    def start_ahead(self, done: int) -> None:
        """Start batches ahead while there is room: none that a sync step (a checkpoint that
        drains the queue, a stage boundary) would leave in flight. An evaluation is no sync
        step: it waits for the batches being produced and leaves them queued."""
        o = self.options
        drains = not self.keeps_in_flight  # else a checkpoint saves the batches in flight
        syncs = lambda s: (drains and s % o.checkpoint_every == 0) or s in o.boundaries  # noqa: E731
        while self.ahead.room(done, o.steps, syncs):  # taken at done + in_flight + 1
            step = done + self.ahead.in_flight  # its step's index, for the scheduled knobs
            key = self.step.sample_key()
            job, finish = self.step.production(copy=True, step=step).job(key)
            self.ahead.start(self.step.source, job, finish)

    def draw(self) -> tuple[list, jax.Array]:
        """This step's prompts and key drawn now (a population's batched sampling), kept for
        the step's `take`."""
        self.drawn = (self.step.source.next_batch(), self.step.sample_key())
        return self.drawn

    def publish(self) -> None:
        """After the update: a free-running producer's next weights."""
        self.ahead.publish(self._batch_maker)

    def rollout(self, examples, key) -> tuple[Experience, dict]:
        """One Experience (and its info) of `examples` from the current policy."""
        job, finish = self.step.production().job(key)
        return finish(job(examples))

    @property
    def keeps_in_flight(self) -> bool:
        """Batches produced ahead cross a checkpoint, saved whole with it (`batches_state`),
        instead of the queue draining before it."""
        return self.ahead.enabled and self.options.keeps_rows_in_flight

    def _this_batch(self) -> tuple[list, jax.Array]:
        batch, self.drawn = self.drawn, None
        return batch or (self.step.source.next_batch(), self.step.sample_key())

    def _partial_rollout(self, done: int) -> tuple[Experience, dict]:
        """This step's batch (begun by the last step's decode, or drawn now), with the next
        batch begun in its idle slots unless this is the run's last step or a stage ends
        with it (sampling/partial.py)."""
        source = self.step.source
        examples, key = self.next_batch or (source.next_batch(), self.step.sample_key())
        self.next_batch = None
        if done < self.options.steps and done not in self.options.boundaries:
            self.next_batch = (source.next_batch(), self.step.sample_key())
            self.step.begin_next(*self.next_batch)
        return self.rollout(examples, key)

    def _batch_maker(self) -> Callable:
        """A free-running producer's make(i) -> (job, finish): batch i by the weights, the
        version and the knobs of now (a copy), with its own key."""
        production, base = self.step.production(copy=True), self._free_key
        return lambda i: production.job(jax.random.fold_in(base, i))

    # ------------------------------------------------------------------ around the steps

    def begin(self, start: int, steps: int) -> None:
        """Before the first step: a free-running producer starts (after any batches
        restored)."""
        if self.ahead.free_running:
            self._free_key = self.step.sample_key()
            self.ahead.begin(self.step.source, steps - start, self._batch_maker)

    def state(self) -> dict[str, Any]:
        """The prompt source's state, the batches in flight (saved whole, or the source's
        state from before them), the stale totals and partial rollouts' rows in flight."""
        source, meta = self.step.source, {}
        if self.ahead.in_flight and self.keeps_in_flight:  # saved whole, the source past them
            meta["ahead"] = batches_state(self.ahead.finished())
            meta["data"] = source.state()
        else:
            meta["data"] = self.ahead.source_state(source)  # before any batch in flight
        if self.ahead.enabled:  # the totals go on across a resume
            meta["stale"] = dict(dropped=self.ahead.dropped, resampled=self.ahead.resampled)
        if self.next_batch is not None:  # partial rollouts: the rows in flight, not drained
            examples, key = self.next_batch
            partial = dict(
                examples=examples,
                key=jax.device_get(jax.random.key_data(key)).tolist(),
                rows=self.rows.state(),
            )
            if jax.process_count() > 1:  # each process's own prompts and rows
                partial = dict(per_process=distributed.allgather_json(partial))
            meta["partial"] = partial
        return meta

    def restore(self, meta: dict[str, Any], mesh) -> None:
        """Continue from a checkpoint's `state()` (the batches in flight placed on `mesh`)."""
        source = self.step.source
        if meta.get("data") is not None:
            source.restore(meta["data"])
        stale = meta.get("stale") or {}  # the stale totals (`rollout.max_staleness`)
        self.ahead.dropped = stale.get("dropped", 0)
        self.ahead.resampled = stale.get("resampled", 0)
        if meta.get("ahead"):  # batches produced ahead, saved with the checkpoint
            self.ahead.restore(batches_from_state(meta["ahead"], mesh), source.state())
        if meta.get("partial") is not None:
            partial = meta["partial"]
            if "per_process" in partial:
                partial = partial["per_process"][jax.process_index()]
            key = jax.random.wrap_key_data(np.asarray(partial["key"], np.uint32))
            self.next_batch = (list(partial["examples"]), key)
            self.rows.restore(partial["rows"])

    def paused(self):
        """A block during which no batch is being produced in the background."""
        return self.ahead.paused()

    def close(self) -> None:
        self.ahead.close()
