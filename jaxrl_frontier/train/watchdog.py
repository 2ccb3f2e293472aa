"""A run's watchdog: a step that hangs, and a process of a multi-process run that is lost.

Hangs. With `train.hang_timeout_s` > 0, a step (with the eval and save after it) that runs
longer than that is a hang: a collective that never returns, a host stuck in reward scoring.
Every thread's stack goes to `<run dir>/hang-<process>.txt` (`faulthandler`), one line on
stderr names the step and the phase the loop was in (rollout, scoring, update, save, eval:
markers the loop sets with `phase(name)`), and the process exits with `EXIT_HANG`, so a
restart (scripts/launch.py) takes over. The first step of a run compiles its programs: its
limit is `FIRST_STEP_FACTOR` times the timeout. A hang inside a call that holds the GIL
(no Python thread runs then) is caught by faulthandler's own thread at twice the limit: the
stacks on stderr, exit status 1.

Lost processes. On several processes a second thread publishes a heartbeat in the
coordination service's key-value store every `poll_s` and reads the others'
(`distributed.beat`, `heartbeats`); a process whose heartbeat has not moved for
`distributed.heartbeat_timeout_s` is lost: one line on stderr names it and the step, and the
process exits with `EXIT_LOST_PROCESS` (no stack trace; no atexit shutdown barrier waiting on
the dead). A collective that failed in the loop because its peer died is handed to
`on_error`, which waits for the verdict the same way. (The service's own liveness query,
`get_live_nodes`, is a barrier that holds the GIL: it would stall the loop.) Process 0 runs
the coordination service: when it dies, the others' coordination clients abort them at once
in C++; `distributed.CoordinatorWatch` turns that abort into the same one line (naming
process 0, "its coordination service is gone") and exit status, within a second.

Hook-shaped: `start()`, `after_step(step)`, `close()`.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from jaxrl_frontier.core import distributed

EXIT_LOST_PROCESS = 75  # EX_TEMPFAIL: a restart from the last checkpoint may succeed
EXIT_HANG = 76
FIRST_STEP_FACTOR = 10
_ENDS = 0  # runs ended in this process: each end's barrier has its own key


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Watchdog:
    """Watches one run (see the module docstring).

    run_dir: where the stacks file goes. hang_timeout_s: 0 turns the hang check off.
    process_index, process_count: this process and the job's size (lost-process polling when
    > 1). heartbeat_timeout_s: named in the lost-process line. poll_s: how often it looks.
    exit: how it leaves (tests replace it).
    """

    def __init__(
        self,
        run_dir: str,
        *,
        hang_timeout_s: float = 0.0,
        process_index: int = 0,
        process_count: int = 1,
        heartbeat_timeout_s: float | None = None,
        poll_s: float = 1.0,
        end_timeout_s: float = 300.0,
        say: Callable[[str], None] = _stderr,
        exit: Callable[[int], Any] = distributed.exit_now,
    ):
        self.run_dir, self.hang_timeout_s = run_dir, float(hang_timeout_s)
        self.process_index, self.process_count = process_index, process_count
        self.heartbeat_timeout_s, self.poll_s = heartbeat_timeout_s, poll_s
        self.end_timeout_s = end_timeout_s
        self.say, self.exit = say, exit
        self.step: int | None = None  # the last step done
        self.current_phase = "start"
        self._deadline: float | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # lost processes: each one's last heartbeat value, and when this process saw it change
        self._beat_lock = threading.Lock()
        self._backstop = None  # where faulthandler writes the stacks, while armed
        self._beats = 0
        self._seen: dict[int, tuple[str | None, float]] = {}
        self._coordinator_gone = False
        self._coordinator: distributed.CoordinatorWatch | None = None
        self._leaving = threading.Lock()  # one line, from the first thread that saw a loss
        self._left = threading.Event()  # set if `exit` returned (tests)

    # ------------------------------------------------------------------ hook

    def start(self) -> None:
        if self.hang_timeout_s > 0:
            self._deadline = time.monotonic() + FIRST_STEP_FACTOR * self.hang_timeout_s
            self._spawn(self._watch_hangs, "watchdog-hang")
            # the backstop, for a hang that holds the GIL (no Python thread runs then):
            # faulthandler's own C thread prints the stacks and exits 1 at twice the limit
            self._backstop = sys.stderr
            self._arm_backstop(FIRST_STEP_FACTOR)
        if self.process_count > 1:
            self._spawn(self._watch_processes, "watchdog-processes")
        if self.process_count > 1 and self.process_index != 0:
            self._coordinator = distributed.CoordinatorWatch(self._coordinator_lost)
            self._coordinator.install()

    def after_step(self, step: int) -> None:
        """Step `step` is done (with its eval and save): the next one's clock starts."""
        self.step = step
        self.current_phase = "rollout"
        if self.hang_timeout_s > 0:
            self._deadline = time.monotonic() + self.hang_timeout_s
            self._arm_backstop(1)

    def close(self) -> None:
        """On several processes, first meet the others (a polling barrier, at most
        `end_timeout_s`): a process lost while the run ends (in its last save) is still
        reported, and no process stops watching while another may still need it. Then stop."""
        if self.process_count > 1 and self._threads:
            global _ENDS
            _ENDS += 1
            try:
                distributed.polling_barrier(f"run-end-{_ENDS}", int(self.end_timeout_s * 1000))
            except Exception:  # not every process got here: leave (finish() says so)
                pass
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2 * self.poll_s)
        self._threads = []
        if self._coordinator is not None:
            self._coordinator.uninstall()
            self._coordinator = None
        if self._backstop is not None:
            faulthandler.cancel_dump_traceback_later()
            self._backstop = None

    @property
    def _stacks_path(self) -> str:
        return os.path.join(self.run_dir, f"hang-{self.process_index}.txt")

    def _arm_backstop(self, factor: float) -> None:
        if self._backstop is not None:
            timeout = 2 * factor * self.hang_timeout_s
            faulthandler.dump_traceback_later(timeout, exit=True, file=self._backstop)

    # ------------------------------------------------------------------ phases

    @contextlib.contextmanager
    def phase(self, name: str):
        """Mark the loop as in phase `name` (the previous phase back on leaving)."""
        before, self.current_phase = self.current_phase, name
        try:
            yield
        finally:
            self.current_phase = before

    def marked(self, fn: Callable, name: str) -> Callable:
        """`fn` whose calls run in phase `name` (its attributes readable through it)."""
        return _Marked(fn, name, self)

    # ------------------------------------------------------------------ checks

    def _spawn(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    @property
    def _doing(self) -> str:
        step = 1 if self.step is None else self.step + 1
        return f"step {step} (phase: {self.current_phase})"

    def _watch_hangs(self) -> None:
        while not self._stop.wait(min(self.poll_s, self.hang_timeout_s / 4)):
            if self._deadline is not None and time.monotonic() > self._deadline:
                self.hung()
                return

    def hung(self) -> None:
        """Dump every thread's stack to the run directory, say so in one line, exit."""
        path = self._stacks_path
        if self._backstop is not None:
            faulthandler.cancel_dump_traceback_later()
        with open(path, "w") as f:
            f.write(f"{self._doing} overran train.hang_timeout_s={self.hang_timeout_s:g}\n")
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)
        self.say(
            f"hang: {self._doing} ran past train.hang_timeout_s={self.hang_timeout_s:g} s on "
            f"process {self.process_index}; every thread's stack is in {path}"
        )
        self.exit(EXIT_HANG)

    def _watch_processes(self) -> None:
        while not self._stop.wait(self.poll_s):
            lost = self.lost_processes()
            if lost and not self._stop.is_set():
                self.lost(lost)
                return

    def lost_processes(self) -> list[int]:
        """Publish this process's heartbeat and return the processes whose own has not moved
        for `heartbeat_timeout_s` ([] if none). A coordination service that does not answer
        counts process 0, which runs it, as lost."""
        with self._beat_lock:
            self._beats += 1
            now = time.monotonic()
            try:
                distributed.beat(self._beats)
                beats = distributed.heartbeats()
            except Exception:  # the coordinator itself is gone
                self._coordinator_gone = True
                return [0]
            for p in range(self.process_count):
                value = beats.get(p)
                if p not in self._seen or self._seen[p][0] != value:
                    self._seen[p] = (value, now)
            limit = self.heartbeat_timeout_s or 60
            return [p for p, (_, seen) in sorted(self._seen.items()) if now - seen > limit]

    def lost(self, processes: list[int]) -> None:
        """Say which processes are lost, in one line, and exit (the first caller only: the
        others wait for the exit)."""
        if not self._leaving.acquire(blocking=False):
            self._left.wait()  # the first caller is leaving the process
            return
        names = ", ".join(str(p) for p in processes)
        if self._coordinator_gone and processes == [0]:
            why = "its coordination service is gone"
        else:
            limit = f"distributed.heartbeat_timeout_s={self.heartbeat_timeout_s:g}"
            why = f"it died or was silent past {limit}"
        self.say(
            f"lost process {names} of {self.process_count} during {self._doing}: {why}; "
            f"process {self.process_index} exits (resume from the last checkpoint)"
        )
        self.exit(EXIT_LOST_PROCESS)
        self._left.set()

    def _coordinator_lost(self) -> None:
        """Process 0 (the coordination service) is gone and the client is aborting us."""
        self._coordinator_gone = True
        self._stop.set()
        self.lost([0])

    def on_error(self, wait_s: float | None = None) -> None:
        """After an exception in the loop of a multi-process run: if a process is lost (a
        collective failed because its peer died), report that and exit, waiting up to the
        heartbeat timeout for the coordination service's verdict; else return (the caller
        re-raises the error)."""
        if self.process_count == 1:
            return
        wait_s = (self.heartbeat_timeout_s or 60) + 5 if wait_s is None else wait_s
        deadline = time.monotonic() + wait_s
        while True:
            lost = self.lost_processes()
            if lost:
                self._stop.set()
                self.lost(lost)
                return
            if time.monotonic() > deadline:
                return
            time.sleep(self.poll_s)


class _Marked:
    """A callable run in a watchdog phase; other attributes are the wrapped object's."""

    def __init__(self, fn: Callable, name: str, watchdog: Watchdog):
        self._fn, self._name, self._watchdog = fn, name, watchdog

    def __call__(self, *args, **kwargs):
        with self._watchdog.phase(self._name):
            return self._fn(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._fn, name)
