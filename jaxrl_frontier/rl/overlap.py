"""Asynchronous rollouts with bounded staleness: batch k+1 is produced while the learner
updates on batch k.

    step k:   exp_k = ahead.take()  (or produced now)      policy version of exp_k: v_k
              lag = learner.version - v_k; lag > max_staleness -> dropped, produced anew
              source.observe(info_k["results"])
              ahead.start(produce, next prompts, next key)  with the weights of version k
              learner.update(exp_k)                         (overlaps the rollout of k+1)

The rollout runs in one background thread; JAX dispatch is thread-safe, and with
disaggregated roles (`rollout.devices`) the two run on separate devices. The weights handed
to the rollout are a copy (the update donates its state). The loss corrects for the lag with
the configured weight against the behaviour log-probs (`tis`, `dppo`, `ppo_clip`, ...): each
row carries the version that sampled it.

Nothing is lost across a checkpoint: no batch is started ahead of a step that ends with an
eval, a checkpoint or the run's end, so every checkpoint is taken with nothing in flight, and
a resumed run continues exactly. If a stop signal arrives while a batch is in flight, the
prompt source's state from before that batch's prompts is the one saved.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class RolloutsAhead:
    """At most one Experience produced ahead of the learner (`max_staleness` > 0)."""

    def __init__(self, max_staleness: int):
        self.max_staleness = max_staleness
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rollout") if max_staleness else None
        self._pending: Future | None = None
        self._source_state: dict | None = None
        self.dropped = 0  # batches dropped for staleness

    @property
    def enabled(self) -> bool:
        return self._pool is not None

    def start(self, source, produce: Callable[[Any], tuple]) -> None:
        """Draw the next prompts now and produce their Experience in the background."""
        self._source_state = source.state()
        examples = source.next_batch()
        self._pending = self._pool.submit(produce, examples)

    def take(self, learner_version: int) -> tuple | None:
        """The batch produced ahead, or None (nothing in flight, or it lags too far)."""
        if self._pending is None:
            return None
        out = self._pending.result()
        self._pending, self._source_state = None, None
        lag = learner_version - out[1]["policy_version"]
        if lag > self.max_staleness:
            self.dropped += 1
            return None
        return out

    def source_state(self, source) -> dict:
        """The prompt-source state to checkpoint: from before a batch still in flight."""
        return self._source_state if self._source_state is not None else source.state()

    def close(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
