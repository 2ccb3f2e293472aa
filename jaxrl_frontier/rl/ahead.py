"""Asynchronous rollouts with bounded staleness: up to k = `rollout.max_staleness` batches
are produced ahead of the learner, each by the weights of the step that started it.

    step t:   exp_t = ahead.take()  (or produced now)      policy version of exp_t: v_t
              lag = learner.version - v_t; lag > k -> dropped (or resampled), produced anew
              source.observe(info_t["results"])
              while fewer than k in flight (and none would cross a sync step):
                  ahead.start(produce, next prompts, next key)  with the weights of version t
              learner.update(exp_t)                         (overlaps the rollouts in flight)

The schedule is fixed, not timed: the batch started at step t is the one step t + j takes
(j its place in the queue), so its lag is j, k in the steady state, whatever the speeds, and a
run is reproducible bit for bit. A slow learner does not make the rollouts older, it makes
them wait; the drop rule guards a queue that outlived its bound (a resumed run with a smaller
k). The rollouts run in one background thread in order; JAX dispatch is thread-safe, and with
disaggregated roles (`rollout.devices`) they run on separate devices. On several processes
the background thread runs only what talks to no other process: each process samples and
scores its own prompts on a mesh of its own devices (`RolloutProducer.draw`), while the
weights' all-gather to it (`Learner.rollout_params`, at `start`), the batch's assembly into
global arrays with its log-prob passes and advantages (`RolloutProducer.finish`, at `take`)
and the update run in the main loop, at the same points of the schedule on every host, so
every host issues the same collectives in the same order. The weights handed to a
rollout are a copy (the update donates its state). The loss corrects for the lag with the
configured weight against the behaviour log-probs (`tis`, `dppo`, `ppo_clip`, ...): each row
carries the version that sampled it.

A free-running producer (`rollout.free_running_queue = Q`, `FreeRunningRollouts`) is timed
by itself instead: a background loop keeps up to Q batches queued, each sampled by the newest
weights the learner has published when it starts. A learner slower than the rollouts lets the
queue age, and a batch whose lag exceeds k when taken is stale: dropped (the step takes the
next one), or its prompts sampled again by the current weights (`rollout.stale_batches`).
Which weights a batch gets then depends on the two loops' speeds, so such a run is not
reproducible bit for bit (a resumed one loses no prompt or batch, but is not the uncut run).

Nothing is lost across a checkpoint. No batch is started that a sync step (a stage boundary,
the run's end) would leave in flight (`RolloutsAhead.room`). An evaluation is no sync step: it
waits for the batches being produced (`paused`) and leaves them queued, so evals do not
reset the lag. A checkpoint does not
drain the queue where the trainer can save it (`BatchSupply.keeps_in_flight`: the plain
producer, on one process or several): `finished` waits for the batch being produced and
returns every batch in flight, which the checkpoint holds and `restore` queues again. Elsewhere checkpoints are sync
steps too, and a stop signal with batches in flight saves the prompt source's state from
before the oldest one's prompts.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from jaxrl_frontier.core.capabilities import Capabilities


class RolloutsAhead:
    """Up to `max_staleness` Experiences produced ahead of the learner, oldest first."""

    capabilities = Capabilities.all_but(
        partial_rows="batches produced ahead whole",
        population="members step in turn, without rollouts produced ahead: set it to 0",
    )

    free_running = False  # batches started on the fixed schedule (`room`, `start`)

    def __init__(self, max_staleness: int):
        self.max_staleness = max_staleness
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rollout") if max_staleness else None
        # (the batch's job, its finish, the source state before it, its examples or None)
        self._pending: deque[tuple[Future, Callable, dict, Any]] = deque()
        self.dropped = 0  # batches taken past the bound (stale)
        self.resampled = 0  # of those, batches whose prompts were sampled again

    @property
    def enabled(self) -> bool:
        return self._pool is not None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def room(self, step: int, last_step: int, is_sync: Callable[[int], bool]) -> bool:
        """Whether a batch may start during step `step`: fewer than k in flight, and it
        would be taken by step step + in_flight + 1 <= last_step with no sync step (a stage
        boundary, a checkpoint that drains: `is_sync`) at the end of any step before that."""
        ahead = self.in_flight
        if not self.enabled or ahead >= self.max_staleness or step + ahead + 1 > last_step:
            return False
        return not any(is_sync(s) for s in range(step, step + ahead + 1))

    def start(self, source, job: Callable[[Any], Any], finish: Callable[[Any], tuple]) -> None:
        """Draw the next prompts now and run `job` on them in the background; `take` runs
        `finish` on its result (the identity, or the collectives of a run on many hosts)."""
        state, examples = source.state(), source.next_batch()
        self._pending.append((self._pool.submit(job, examples), finish, state, examples))

    def take(self, learner_version: int, resample: Callable | None = None) -> tuple | None:
        """The oldest batch produced ahead, or None (nothing in flight, or it lags too far
        and `resample` is None; else `resample(its examples)`: the same prompts, sampled now)."""
        if not self._pending:
            return None
        return self._checked(self._pending.popleft(), learner_version, resample)

    def _checked(self, entry, learner_version: int, resample: Callable | None):
        future, finish, _, examples = entry
        out = finish(future.result())
        if learner_version - out[1]["policy_version"] <= self.max_staleness:
            return out
        self.dropped += 1
        if resample is None or examples is None:  # a batch restored from a checkpoint
            return None
        self.resampled += 1
        return resample(examples)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """A block during which no batch is being produced: the fixed schedule waits for the
        batches in flight to be produced (they stay queued, their `finish` for `take`), so an
        evaluation or a checkpoint may use the sampler and leave the lag as it is."""
        wait([future for future, *_ in self._pending])
        yield

    def begin(self, source, remaining: int, maker: Callable[[], Callable]) -> None:
        """Start producing the `remaining` batches the run will take (a free-running
        producer: `maker()` -> make(i) -> (job, finish); nothing on the fixed schedule)."""

    def publish(self, maker: Callable[[], Callable]) -> None:
        """The weights the next batches sample with: `maker()` (a free-running producer
        calls it now, in the caller's thread; the fixed schedule never does)."""

    def finished(self) -> list[tuple]:
        """Every batch in flight, produced to its end (waiting for the one running), oldest
        first; they stay queued, now done: what a checkpoint that does not drain saves."""
        outs = []
        for i, (future, finish, state, examples) in enumerate(self._pending):
            outs.append(finish(future.result()))
            self._pending[i] = (_done(outs[-1]), _identity, state, examples)
        return outs

    def restore(self, outs: list[tuple], source_state: dict) -> None:
        """Queue batches saved by `finished` (a resumed run), oldest first."""
        self._pending.extend((_done(out), _identity, source_state, None) for out in outs)

    def source_state(self, source) -> dict:
        """The prompt-source state to checkpoint: from before the oldest batch in flight."""
        return self._pending[0][2] if self._pending else source.state()

    def close(self) -> None:
        for future, *_ in self._pending:
            future.cancel()
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)


class FreeRunningRollouts(RolloutsAhead):
    """A producer timed by itself (`rollout.free_running_queue = capacity`): one background
    loop keeps up to `capacity` batches queued (finished or being produced), never more than
    the run still needs, each sampled by the newest `make` the learner published when it
    starts (`make(i) -> (job, finish)`: the weights, version and key of batch i). `take`
    waits for the oldest; a stale one (lag > k) is dropped and the next taken, or resampled.
    `paused()` holds the loop (a checkpoint, an eval); `finished`, `restore` and
    `source_state` are the fixed schedule's, under a pause."""

    capabilities = Capabilities.all_but(
        partial_rows="batches produced ahead whole",
        multi_process="their collectives would follow its timing",
        stages="a boundary needs the queue empty",
        population="members step in turn, without rollouts produced ahead: set it to 0",
    )

    free_running = True

    def __init__(self, max_staleness: int, capacity: int):
        super().__init__(max_staleness)
        self.capacity = capacity
        self._cond = threading.Condition()
        self._make: Callable | None = None
        self._thread: threading.Thread | None = None
        self._remaining = 0  # batches the run will still take
        self._started = 0  # batches begun by the loop (their index i)
        self._paused = 0
        self._running = False
        self._closed = False

    @property
    def producing(self) -> bool:
        """The loop is sampling a batch now (a pause waits for it to end)."""
        return self._running

    def room(self, step: int, last_step: int, is_sync: Callable[[int], bool]) -> bool:
        return False  # the loop starts batches itself

    def begin(self, source, remaining: int, maker: Callable[[], Callable]) -> None:
        self._remaining, self._make = remaining, maker()
        self._thread = threading.Thread(target=self._loop, args=(source,), name="rollout-free")
        self._thread.daemon = True
        self._thread.start()

    def publish(self, maker: Callable[[], Callable]) -> None:
        make = maker()
        with self._cond:
            self._make = make

    def _may_start(self) -> bool:
        queued = len(self._pending)
        return not self._paused and queued < min(self.capacity, self._remaining)

    def _loop(self, source) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._may_start())
                if self._closed:
                    return
                job, finish = self._make(self._started)
                self._started += 1
                state, examples, future = source.state(), source.next_batch(), Future()
                self._pending.append((future, finish, state, examples))
                self._running = True
            try:
                future.set_result(job(examples))
            except BaseException as e:  # noqa: BLE001  (raised where the batch is taken)
                future.set_exception(e)
                with self._cond:
                    self._closed = True
            finally:
                with self._cond:
                    self._running = False
                    self._cond.notify_all()

    def take(self, learner_version: int, resample: Callable | None = None) -> tuple:
        """The oldest batch whose lag is within k (waiting for the loop as needed); a stale
        one is dropped, or with `resample` its prompts are sampled now (the loop paused)."""
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if not self._pending:
                    raise RuntimeError("the rollout loop stopped with no batch queued")
                entry = self._pending.popleft()
            out = self._checked(entry, learner_version, resample and self._held(resample))
            if out is not None:
                with self._cond:
                    self._remaining -= 1
                    self._cond.notify_all()
                return out
            with self._cond:
                self._cond.notify_all()  # room for one more

    def _held(self, resample: Callable) -> Callable:
        def held(examples):  # a resample shares the sampler with the loop: hold the loop
            with self.paused():
                return resample(examples)

        return held

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._cond:
            self._paused += 1
            self._cond.wait_for(lambda: not self._running)
        try:
            yield
        finally:
            with self._cond:
                self._paused -= 1
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        super().close()


def _done(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def _identity(x):
    return x
