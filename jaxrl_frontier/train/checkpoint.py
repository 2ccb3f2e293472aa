"""Checkpoints: an orbax CheckpointManager holding everything a run needs to resume exactly.

One checkpoint = a step directory with two items:
  state  the train-state pytree (params, optimizer state, step, RNG key data, counters),
         restored onto an abstract target that carries the shardings, so each device reads
         only its shard;
  meta   JSON: data-iterator state, the resolved config, and anything small (eval history).

Saves are asynchronous; `wait()` before exit. A run resumes when its work directory
already holds a checkpoint (`latest_step() is not None`); `copy_step` seeds a new work
directory with one step of another's, so a new run resumes from it (a campaign's segments,
sweeps/campaign.py).

Faults. `restore_latest` tries the steps newest first: a damaged step (unparsable or missing
metadata, truncated array data) is reported with a warning naming the step and the file, and
the next older one is tried, so a kill during a save or a corrupted disk block costs the steps
since the previous checkpoint, never the run. To name a truncated array file (TensorStore's
error does not), each finalised step gets a manifest of its files' sizes,
`.manifest-<step>.json` beside the step directories. A failed save (disk full, permissions)
raises `CheckpointSaveError`: one line naming the path and the OS error, instead of orbax's
asyncio traceback; orbax commits a step by renaming its temporary directory, so the previous
checkpoint is untouched.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxrl_frontier.core.errors import CheckpointError, CheckpointSaveError

log = logging.getLogger(__name__)


class Checkpointer:
    """Save / restore (state pytree, JSON metadata) pairs under `directory`."""

    def __init__(self, directory: str, *, max_to_keep: int = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        if jax.process_count() > 1:
            _poll_orbax_barriers()
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
        """Start an (async) save of `state` and `meta` at `step`.

        Raises CheckpointSaveError if this save, or the previous async one (orbax reports it
        here), failed."""
        try:
            saved = self._manager.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(_jsonable(meta))
                ),
                force=force,
            )
        except TypeError:
            raise  # metadata that is not JSON: a programming error, not a fault
        except Exception as e:
            # orbax finishes the previous async save first and raises its failure here
            pending = getattr(self, "_pending", None)
            if pending is not None and pending not in self.all_steps():
                step = pending
            raise CheckpointSaveError(self._save_error(step, e)) from None
        self._pending = step
        self._write_manifests(exclude=step)  # earlier steps are finalised once save returns
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

    def restore_latest(self, abstract_state: Any, warn=None) -> tuple[Any, dict, int] | None:
        """(state, meta, step) of the newest step that restores; None if there is none.

        A step that fails to restore is reported through `warn` (default: log.warning) with
        the step and the damaged file, and the next older step is tried. CheckpointError when
        every step is damaged (starting over silently would discard the run)."""
        warn = warn or log.warning
        steps = sorted(self.all_steps(), reverse=True)
        problems, damaged = [], []
        for step in steps:
            try:
                state, meta = self.restore(abstract_state, step)
            except Exception as e:  # any damage: report it and fall back to an older step
                where = self.damaged_file(step)
                problems.append(f"step {step}: {where}: {_one_line(e)}")
                damaged.append(step)
                warn(
                    f"checkpoint step {step} is damaged ({where}: {_one_line(e)}); "
                    "trying the next older checkpoint"
                )
                continue
            if damaged:
                # the resumed run saves these steps again: move the damaged ones aside (kept
                # for inspection) so the new saves do not collide with them
                moved = self._move_aside(damaged, "damaged")
                warn(f"damaged checkpoints {damaged} moved to {moved}")
            return state, meta, step
        if problems:
            raise CheckpointError(
                f"no checkpoint in {self.directory} could be restored: " + "; ".join(problems)
            )
        return None

    def set_aside_after(self, step: int) -> list[int]:
        """Move the steps after `step` to `<directory>.set_aside/<step>-<time>` (kept, not
        deleted), so that a run resumed from `step` saves its later steps again: e.g. a
        population's members rolled back to the newest step they all saved. The steps
        moved, oldest first."""
        later = sorted(s for s in self.all_steps() if s > step)
        if later:
            self._move_aside(later, "set_aside")
        return later

    def _move_aside(self, steps: list[int], why: str) -> str:
        """Move step directories to `<directory>.<why>/<step>-<time>`; process 0 moves
        (a shared filesystem), every process reloads its step list."""
        import time

        target = Path(f"{self.directory}.{why}")
        if jax.process_index() == 0:
            target.mkdir(exist_ok=True)
            stamp = time.strftime("%Y%m%d-%H%M%S")
            for step in steps:
                src = Path(self.directory) / str(step)
                if src.exists():
                    os.replace(src, target / f"{step}-{stamp}")
                (Path(self.directory) / f".manifest-{step}.json").unlink(missing_ok=True)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"jaxrl_frontier checkpoint {why}")
        self._manager.reload()
        return str(target)

    def damaged_file(self, step: int) -> str:
        """The path of the first damaged file of `step` found (JSON files that do not parse or
        are missing, files whose size differs from the step's manifest), else its directory."""
        root = Path(self.directory) / str(step)
        for rel in ("_CHECKPOINT_METADATA", "meta/metadata", "state/_METADATA", "state/_sharding"):
            path = root / rel
            if rel == "meta/metadata" and not path.exists():
                return f"{path} (missing)"
            if path.exists():
                try:
                    json.loads(path.read_text())
                except (ValueError, OSError) as e:
                    return f"{path} ({type(e).__name__})"
        manifest = Path(self.directory) / f".manifest-{step}.json"
        if manifest.exists():
            try:
                sizes = json.loads(manifest.read_text())
            except ValueError:
                sizes = {}
            for rel, size in sizes.items():
                path = root / rel
                if not path.exists():
                    return f"{path} (missing)"
                if path.stat().st_size != size:
                    return f"{path} (size {path.stat().st_size}, written {size})"
        return str(root)

    def _write_manifests(self, exclude: int | None = None) -> None:
        """Record the file sizes of every finalised step lacking a manifest; drop the manifests
        of deleted steps. Only process 0 writes (the files are shared on a multi-host run)."""
        if jax.process_index() != 0:
            return
        root = Path(self.directory)
        steps = set(self.all_steps())
        for path in root.glob(".manifest-*.json"):
            if int(path.stem.split("-", 1)[1]) not in steps:
                path.unlink(missing_ok=True)
        for step in steps - {exclude}:
            manifest = root / f".manifest-{step}.json"
            step_dir = root / str(step)
            if manifest.exists() or not (step_dir / "commit_success.txt").exists():
                continue
            sizes = {
                str(p.relative_to(step_dir)): p.stat().st_size
                for p in sorted(step_dir.rglob("*"))
                if p.is_file()
            }
            tmp = manifest.with_suffix(".tmp")
            try:
                tmp.write_text(json.dumps(sizes))
                os.replace(tmp, manifest)  # atomic: never a half-written manifest
            except OSError:
                tmp.unlink(missing_ok=True)  # a manifest only helps name damage; never fatal

    def _save_error(self, step: int, err: BaseException) -> str:
        cause = _root_os_error(err)
        if cause is not None:
            path = cause.filename or self.directory
            return (
                f"checkpoint save failed at step {step}: {path}: {cause.strerror or cause} "
                f"(previous checkpoint: {self._previous(step)})"
            )
        return (
            f"checkpoint save failed at step {step} in {self.directory}: {_one_line(err)} "
            f"(previous checkpoint: {self._previous(step)})"
        )

    def _previous(self, step: int) -> str:
        done = [s for s in self.all_steps() if s < step]
        return f"step {max(done)}" if done else "none"

    def wait(self, step: int | None = None) -> None:
        """Block until the async save finishes; CheckpointSaveError if it failed."""
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            step = getattr(self, "_pending", None) if step is None else step
            raise CheckpointSaveError(self._save_error(step or 0, e)) from None
        self._write_manifests()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def _poll_orbax_barriers() -> None:
    """Make orbax's cross-process barriers wait by key-value polling
    (`distributed.polling_barrier`): the coordination service's `wait_at_barrier` holds the
    GIL while it waits, so with a process lost during a save no other thread, the watchdog
    that reports it included, could run until the barrier's timeout (300 s)."""
    from orbax.checkpoint._src.multihost import multihost as ocp_multihost

    if getattr(ocp_multihost.get_jax_distributed_client, "polling", False):
        return
    real = ocp_multihost.get_jax_distributed_client

    def client():
        return _PollingBarriers(real())

    client.polling = True
    ocp_multihost.get_jax_distributed_client = client


class _PollingBarriers:
    """The jax distributed client with `wait_at_barrier` by polling; the rest as it is."""

    def __init__(self, client):
        self._client = client

    def wait_at_barrier(self, key: str, timeout_in_ms: int, process_ids=None) -> None:
        from jaxrl_frontier.core import distributed

        distributed.polling_barrier(key, timeout_in_ms, process_ids)

    def __getattr__(self, name: str):
        return getattr(self._client, name)


def _one_line(err: BaseException) -> str:
    """The exception as one short line (TensorStore errors run to pages)."""
    text = " ".join(str(err).split()) or type(err).__name__
    text = text if len(text) <= 240 else text[:237] + "..."
    return f"{type(err).__name__}: {text}"


def _root_os_error(err: BaseException | None) -> OSError | None:
    """The OSError at the root of `err` (through causes, contexts and exception groups)."""
    seen = set()
    stack = [err]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None:
            return e
        stack += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
    # TensorStore reports the OS error as text: ... Failed writing: "PATH": ...
    # [os_error_code='28']; orbax may re-raise any error as text only
    text = "".join(traceback.format_exception(err))
    code = re.search(r"os_error_code='(\d+)'", text)
    if code:
        paths = re.findall(r'Failed (?:writing|reading|to open)[^"]*"([^"]+)"', text)
        errno = int(code.group(1))
        return OSError(errno, os.strerror(errno), paths[0] if paths else None)
    match = re.search(r"\[Errno (\d+)\] ([^\n:]+)(?:: '([^']+)')?", text)
    if match:
        return OSError(int(match.group(1)), match.group(2), match.group(3))
    return None


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


def step_dirs(directory: str) -> list[int]:
    """The committed steps of a checkpoint directory, read from its file names without orbax
    (a step's directory takes its number when its save commits): [] if there is none."""
    if not os.path.isdir(directory):
        return []
    names = os.listdir(directory)
    return sorted(
        int(n) for n in names if n.isdigit() and os.path.isdir(os.path.join(directory, n))
    )


def read_step_meta(directory: str, step: int) -> dict:
    """The JSON metadata (data-iterator state, history, config, knobs) of step `step` of a
    checkpoint directory, read without orbax; CheckpointError naming the file if unreadable."""
    path = os.path.join(directory, str(step), "meta", "metadata")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint metadata {path}: {_one_line(e)}") from None


def copy_step(
    src: str, step: int, dst: str, edit_meta: Callable[[dict], dict] | None = None
) -> bool:
    """Seed the checkpoint directory `dst` with step `step` of the checkpoint directory `src`,
    so a Trainer whose workdir holds `dst` resumes from it, as from its own checkpoint: the
    parameters, the optimizer state (moments and step count), the step counter, the RNG, the
    data-iterator position and the controllers' states all continue from `step`.

    `edit_meta(meta) -> meta` rewrites the copy's JSON metadata (never the source's). The
    step is staged in `dst + '.seeding'` and renamed into `dst`, so a kill mid-copy leaves no
    half step (a stale stage is cleared). A no-op returning False when `dst` holds a step
    already (its run started: it resumes from its own checkpoints); True after a copy.
    CheckpointError when `src` has no step `step` (naming the steps it has)."""
    if step_dirs(dst):
        return False
    source = os.path.join(src, str(step))
    if not os.path.isdir(source):
        raise CheckpointError(
            f"no checkpoint step {step} in {src} (its steps: {step_dirs(src) or 'none'})"
        )
    stage = dst.rstrip(os.sep) + ".seeding"
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(source, os.path.join(stage, str(step)))
    meta_file = os.path.join(stage, str(step), "meta", "metadata")
    if edit_meta is not None and os.path.exists(meta_file):
        with open(meta_file) as f:
            meta = edit_meta(json.load(f))
        with open(meta_file, "w") as f:
            json.dump(_jsonable(meta), f)
    os.makedirs(dst, exist_ok=True)
    os.replace(os.path.join(stage, str(step)), os.path.join(dst, str(step)))
    shutil.rmtree(stage, ignore_errors=True)
    return True


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
