"""Checkpoints: an orbax CheckpointManager holding everything a run needs to resume exactly.

One checkpoint = a step directory with two items:
  state  the train-state pytree (params, optimizer state, step, RNG key data, counters),
         restored onto an abstract target that carries the shardings, so each device reads
         only its shard;
  meta   JSON: data-iterator state, the resolved config, and anything small (eval history).

Saves are asynchronous; `wait()` before exit. A run resumes when its work directory
already holds a checkpoint (`latest_step() is not None`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from typing import Any

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class Checkpointer:
    """Save / restore (state pytree, JSON metadata) pairs under `directory`."""

    def __init__(self, directory: str, *, max_to_keep: int = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=async_save
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "meta")
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: Any, meta: dict, *, force: bool = True) -> bool:
        """Start an (async) save of `state` and `meta` at `step`."""
        saved = self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(_jsonable(meta))
            ),
            force=force,
        )
        return bool(saved)

    def restore(self, abstract_state: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restore onto `abstract_state` (a pytree of jax.ShapeDtypeStruct with shardings)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()
            ),
        )
        return restored["state"], dict(restored["meta"])

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs (with the arrays' shardings) of a pytree of arrays."""

    def one(x):
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        return x

    return jax.tree.map(one, tree)


def _jsonable(obj: Any) -> Any:
    """Round-trip through json so orbax's JsonSave never sees numpy scalars or tuples."""
    return json.loads(json.dumps(obj, default=_default))


def _default(o):
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, bytes):
        return o.decode("latin-1")
    if isinstance(o, set | frozenset):
        return sorted(o)
    raise TypeError(f"checkpoint metadata: {type(o).__name__} is not JSON-serialisable: {o!r}")


class StopRequest:
    """Turns SIGTERM / SIGINT into a flag the training loop polls between steps.

    The loop saves a checkpoint and exits cleanly when `requested` is set, so a preempted
    or Ctrl-C'd run resumes where it stopped. A second signal restores the default handler
    behaviour (a second Ctrl-C kills at once).
    """

    def __init__(self, signals=(signal.SIGTERM, signal.SIGINT)):
        self.requested = False
        self.signal_name: str | None = None
        self._previous = {}
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be installed from the main thread
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.requested:  # second signal: give up gracefully-stopping
            self.restore()
            signal.raise_signal(signum)
            return
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        log.warning("%s received: saving a checkpoint and stopping", self.signal_name)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
