"""Asynchronous rollouts with bounded staleness: up to k = `rollout.max_staleness` batches
are produced ahead of the learner, each by the weights of the step that started it.

    step t:   exp_t = ahead.take()  (or produced now)      policy version of exp_t: v_t
              lag = learner.version - v_t; lag > k -> dropped, produced anew
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

Nothing is lost across a checkpoint. No batch is started that a sync step (an eval, a stage
boundary, the run's end) would leave in flight (`RolloutsAhead.room`). A checkpoint does not
drain the queue where the trainer can save it (`Trainer.keeps_in_flight`: one process, the
plain producer): `finished` waits for the batch being produced and returns every batch in
flight, which the checkpoint holds and `restore` queues again. Elsewhere checkpoints are sync
steps too, and a stop signal with batches in flight saves the prompt source's state from
before the oldest one's prompts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class RolloutsAhead:
    """Up to `max_staleness` Experiences produced ahead of the learner, oldest first."""

    def __init__(self, max_staleness: int):
        self.max_staleness = max_staleness
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rollout") if max_staleness else None
        # (the batch's job, its finish, the source state before it)
        self._pending: deque[tuple[Future, Callable, dict]] = deque()
        self.dropped = 0  # batches dropped for staleness

    @property
    def enabled(self) -> bool:
        return self._pool is not None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def room(self, step: int, last_step: int, is_sync: Callable[[int], bool]) -> bool:
        """Whether a batch may start during step `step`: fewer than k in flight, and it
        would be taken by step step + in_flight + 1 <= last_step with no eval / checkpoint
        (`is_sync`) at the end of any step before that."""
        ahead = self.in_flight
        if not self.enabled or ahead >= self.max_staleness or step + ahead + 1 > last_step:
            return False
        return not any(is_sync(s) for s in range(step, step + ahead + 1))

    def start(self, source, job: Callable[[Any], Any], finish: Callable[[Any], tuple]) -> None:
        """Draw the next prompts now and run `job` on them in the background; `take` runs
        `finish` on its result (the identity, or the collectives of a run on many hosts)."""
        state = source.state()
        self._pending.append((self._pool.submit(job, source.next_batch()), finish, state))

    def take(self, learner_version: int) -> tuple | None:
        """The oldest batch produced ahead, or None (nothing in flight, or it lags too far)."""
        if not self._pending:
            return None
        future, finish, _ = self._pending.popleft()
        out = finish(future.result())
        if learner_version - out[1]["policy_version"] > self.max_staleness:
            self.dropped += 1
            return None
        return out

    def finished(self) -> list[tuple]:
        """Every batch in flight, produced to its end (waiting for the one running), oldest
        first; they stay queued, now done: what a checkpoint that does not drain saves."""
        outs = []
        for i, (future, finish, state) in enumerate(self._pending):
            outs.append(finish(future.result()))
            self._pending[i] = (_done(outs[-1]), _identity, state)
        return outs

    def restore(self, outs: list[tuple], source_state: dict) -> None:
        """Queue batches saved by `finished` (a resumed run), oldest first."""
        self._pending.extend((_done(out), _identity, source_state) for out in outs)

    def source_state(self, source) -> dict:
        """The prompt-source state to checkpoint: from before the oldest batch in flight."""
        return self._pending[0][2] if self._pending else source.state()

    def close(self) -> None:
        for future, _, _ in self._pending:
            future.cancel()
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def _done(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


def _identity(x):
    return x
