"""One trainer per run directory: a lock file holding the holder's host, pid and a heartbeat.

Two trainers writing one workdir (a relaunch while the old job still runs: a killed launcher
whose trainer lived on, a SLURM requeue) would interleave their log rows and checkpoints
silently. A run therefore takes `<workdir>/.lock` before it writes anything there:

* no lock file: it is created (atomically: `O_CREAT | O_EXCL`);
* a lock whose holder is alive (same host: its pid runs, is no zombie and started when the
  lock says; another host: its heartbeat is younger than `stale_after_s`) refuses with
  `WorkdirLocked` naming the holder;
* a lock whose holder is dead (same host, pid gone) or silent (heartbeat older than
  `stale_after_s`) is taken over, with a warning naming the old holder;
* a lock of this very process (a run of it that ended without closing) is taken over quietly.

A daemon thread rewrites the heartbeat every `heartbeat_s` seconds (atomic replace) while the
file still names this holder. On several processes, process 0 holds the lock for the job
(`take_for_job`: the others learn its verdict through one collective, so every process
refuses together). Hook-shaped: `start()`, `after_step(step)`, `close()`.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from jaxrl_frontier.core.errors import WorkdirLocked

LOCK_FILE = ".lock"


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time) of process `pid` from /proc (None where /proc is missing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "pid (name)"
    except OSError:
        return None
    return fields[0], fields[19]


def _pid_alive(pid: int, start: str | None = None) -> bool:
    """Whether process `pid` runs: not gone, not a zombie (killed, not yet reaped by its
    parent), and, when `start` is given, the same process (not a later one given its pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        pass
    stat = _proc_stat(pid)
    if stat is None:
        return True
    state, started = stat
    return state != "Z" and (start is None or started == start)


class WorkdirLock:
    """The lock of one run directory (see the module docstring).

    heartbeat_s: how often the holder refreshes its heartbeat.
    stale_after_s: a holder on another host silent this long is taken for dead.
    say: where takeover warnings go.
    """

    def __init__(
        self,
        workdir: str,
        *,
        heartbeat_s: float = 10.0,
        stale_after_s: float = 60.0,
        say: Callable[[str], None] = print,
    ):
        if stale_after_s <= heartbeat_s:
            raise ValueError(
                f"WorkdirLock: stale_after_s ({stale_after_s}) must exceed heartbeat_s "
                f"({heartbeat_s}), or a live holder looks dead between two heartbeats"
            )
        self.path = os.path.join(os.path.abspath(workdir), LOCK_FILE)
        self.heartbeat_s, self.stale_after_s, self.say = heartbeat_s, stale_after_s, say
        self.host, self.pid, self.token = socket.gethostname(), os.getpid(), uuid.uuid4().hex
        self.started = (_proc_stat(self.pid) or (None, None))[1]  # tells a reused pid apart
        self.step: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ hook

    def start(self) -> None:
        """Take the lock (WorkdirLocked if a live holder has it) and start the heartbeat."""
        if not self._create():
            holder = self.read()
            verdict = self._verdict(holder)
            if verdict == "alive":
                raise WorkdirLocked(self._refusal(holder))
            if verdict != "self":
                self.say(
                    f"warning: {self.path}: taking over the lock of {_who(holder)} ({verdict})"
                )
            self._write()
        self._thread = threading.Thread(target=self._beat, name="workdir-lock", daemon=True)
        self._thread.start()

    def after_step(self, step: int) -> None:
        """Record the step in the next heartbeat (shown to a trainer that is refused)."""
        self.step = step

    def close(self) -> None:
        """Stop the heartbeat and remove the lock file if it still names this holder."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.owned():
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    # ------------------------------------------------------------------ file

    def read(self) -> dict:
        """The lock file's record ({} if it is missing or unreadable: a torn write)."""
        try:
            with open(self.path) as f:
                record = json.load(f)
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def owned(self) -> bool:
        return self.read().get("token") == self.token

    def _record(self) -> dict:
        return dict(
            host=self.host,
            pid=self.pid,
            start=self.started,
            token=self.token,
            heartbeat=time.time(),
            step=self.step,
        )

    def _create(self) -> bool:
        """Create the lock file if there is none (False: one exists)."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(self._record(), f)
        return True

    def _write(self) -> None:
        tmp = f"{self.path}.{self.token}.tmp"
        with open(tmp, "w") as f:
            json.dump(self._record(), f)
        os.replace(tmp, self.path)  # atomic: a reader never sees half a record

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            if not self.owned():  # taken over (we were silent too long): say so, stop
                holder = self.read()
                if holder.get("pid") != self.pid or holder.get("host") != self.host:
                    self.say(f"warning: {self.path}: the lock was taken over by {_who(holder)}")
                return
            try:
                self._write()
            except OSError:  # a full disk must not kill the heartbeat; retried next time
                pass

    # ------------------------------------------------------------------ verdict

    def _verdict(self, holder: dict) -> str:
        """'alive', 'self' (this process's own), or why the holder counts as gone."""
        if not holder:
            return "the lock file is unreadable"
        age = time.time() - float(holder.get("heartbeat", 0))
        if holder.get("host") == self.host:
            pid = int(holder.get("pid", -1))
            if pid == self.pid:
                return "self"
            if not _pid_alive(pid, holder.get("start")):
                return f"pid {pid} is gone"
            return "alive"
        if age > self.stale_after_s:
            return f"no heartbeat for {age:.0f} s, more than {self.stale_after_s:g} s"
        return "alive"

    def _refusal(self, holder: dict) -> str:
        age = time.time() - float(holder.get("heartbeat", 0))
        step = holder.get("step")
        at = f", at step {step}" if step is not None else ""
        return (
            f"workdir {os.path.dirname(self.path)} is in use by {_who(holder)}{at} (heartbeat "
            f"{age:.0f} s ago; {self.path}): stop that run first, or pick another --workdir"
        )


def _who(holder: dict) -> str:
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"


def take_for_job(workdir: str, **kwargs) -> WorkdirLock | None:
    """Process 0 takes the workdir's lock for the whole job; every process raises the same
    WorkdirLocked if it is refused (one collective on several processes). Returns the lock
    on process 0 (started), None on the others."""
    import jax

    from jaxrl_frontier.core import distributed

    lock, refusal = None, ""
    if jax.process_index() == 0:
        lock = WorkdirLock(workdir, **kwargs)
        try:
            lock.start()
        except WorkdirLocked as e:
            lock, refusal = None, str(e)
    if jax.process_count() > 1:
        refusal = distributed.allgather_json(refusal)[0]
    if refusal:
        raise WorkdirLocked(refusal)
    return lock
