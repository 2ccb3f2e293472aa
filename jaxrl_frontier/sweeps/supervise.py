"""Restarts that need nobody: run a job (one or several local processes), and when it fails,
start it again (it resumes from its last checkpoint) after a back-off, within a budget.

`Job.start()` starts the processes of one attempt; `supervise(job, policy)` runs attempts
until one succeeds, the budget of restarts is spent, or the job failed the same way
`same_failure_limit` times in a row (a config error, a diverged run: restarting cannot help),
and says why it stopped. A failure's signature is the failing process's exit status and the
last line it wrote to stderr (numbers masked: the step or a pid differs between attempts).

When one process of a multi-process attempt fails, the others get `grace_s` seconds to
notice (the lost-process watchdog exits them) before they are killed. SIGTERM / SIGINT to the
supervisor go to every process (they agree on a step, save it and exit 0) and end supervision.
`scripts/launch.py` is the command line.
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """max_restarts: restarts after the first attempt. same_failure_limit: this many failures
    in a row with the same signature stop the job. backoff_s: the wait before the first
    restart, doubled for each one after, at most max_backoff_s. grace_s: how long the other
    processes of a failed attempt may take to exit by themselves."""

    max_restarts: int = 5
    same_failure_limit: int = 3
    backoff_s: float = 10.0
    max_backoff_s: float = 300.0
    grace_s: float = 30.0

    def backoff(self, restart: int) -> float:
        return min(self.backoff_s * 2 ** max(restart - 1, 0), self.max_backoff_s)


@dataclasses.dataclass
class Attempt:
    """How one attempt ended: every process's exit status, and the first failing one's."""

    returncodes: list[int]
    failed: int | None  # the index of the first process that failed (None: success)
    last_line: str  # its last stderr line
    summary: dict  # process 0's last JSON line on stdout (the trainer's summary)

    @property
    def ok(self) -> bool:
        return self.failed is None

    @property
    def signature(self) -> str:
        return f"exit {self.returncodes[self.failed]}: " + re.sub(r"\d+", "N", self.last_line)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """`command` as `processes` local processes: with more than one, each gets the
    `--config.distributed.*` flags of a job on 127.0.0.1 (a fresh port per attempt)."""

    def __init__(
        self, command: Sequence[str], processes: int = 1, env: dict | None = None, cwd=None
    ):
        self.command, self.processes = list(command), processes
        self.env, self.cwd = env, cwd
        self.procs: list[subprocess.Popen] = []

    def commands(self) -> list[list[str]]:
        if self.processes == 1:
            return [self.command]
        port = free_port()
        return [
            self.command
            + [
                f"--config.distributed.coordinator_address=127.0.0.1:{port}",
                f"--config.distributed.num_processes={self.processes}",
                f"--config.distributed.process_id={i}",
            ]
            for i in range(self.processes)
        ]

    def run(self, grace_s: float, say: Say) -> Attempt:
        """One attempt: start every process, forward their output, wait (see the module)."""
        self.procs = [
            subprocess.Popen(
                cmd,
                cwd=self.cwd,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
            )  # fmt: skip
            for cmd in self.commands()
        ]
        last_err = [""] * len(self.procs)
        last_json: list[dict] = [{} for _ in self.procs]
        tag = (lambda i: f"[process {i}] ") if len(self.procs) > 1 else (lambda i: "")
        pumps = [
            threading.Thread(target=_pump, args=(p.stdout, sys.stdout, tag(i), last_json, i))
            for i, p in enumerate(self.procs)
        ] + [
            threading.Thread(target=_pump, args=(p.stderr, sys.stderr, tag(i), last_err, i))
            for i, p in enumerate(self.procs)
        ]
        for t in pumps:
            t.start()
        failed = self._wait(grace_s)
        for t in pumps:
            t.join()
        codes = [p.returncode for p in self.procs]
        line = last_err[failed] if failed is not None else ""
        return Attempt(codes, failed, line or "(no output on stderr)", last_json[0])

    def _wait(self, grace_s: float) -> int | None:
        """Wait for every process; once one fails, the rest get grace_s, then are killed."""
        failed, deadline = None, None
        while any(p.poll() is None for p in self.procs):
            for i, p in enumerate(self.procs):
                if failed is None and p.poll() not in (None, 0):
                    failed, deadline = i, time.monotonic() + grace_s
            if deadline is not None and time.monotonic() > deadline:
                for p in self.procs:
                    if p.poll() is None:
                        p.kill()
            time.sleep(0.05)
        if failed is None:
            failed = next((i for i, p in enumerate(self.procs) if p.returncode != 0), None)
        return failed

    def signal(self, signum: int) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signum)


def _pump(stream, out, prefix: str, last: list, i: int) -> None:
    """Forward `stream` line by line to `out`; keep its last line (or last JSON object)."""
    for line in stream:
        out.write(prefix + line)
        out.flush()
        text = line.strip()
        if not text:
            continue
        if isinstance(last[i], dict):
            try:
                row = json.loads(text)
            except ValueError:
                continue
            if isinstance(row, dict):
                last[i] = row
        else:
            last[i] = text


def supervise(
    job: Job,
    policy: RestartPolicy = RestartPolicy(),
    say: Say = print,
    sleep: Callable[[float], None] = time.sleep,
) -> Attempt:
    """Run `job` until an attempt succeeds or the policy stops it; the last Attempt. A job
    stopped by a signal to the supervisor is not restarted."""
    stopping = []

    def forward(signum, frame):
        stopping.append(signum)
        job.signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        same, last_signature, restarts = 0, None, 0
        while True:
            attempt = job.run(policy.grace_s, say)
            if attempt.ok or stopping:
                return attempt
            same = same + 1 if attempt.signature == last_signature else 1
            last_signature = attempt.signature
            say(
                f"[launch] attempt {restarts + 1} failed: process {attempt.failed} "
                f"{attempt.signature}"
            )
            if same >= policy.same_failure_limit:
                say(
                    f"[launch] stopping: the job failed the same way {same} times in a row "
                    f"({attempt.signature}); a restart will not help"
                )
                return attempt
            if restarts >= policy.max_restarts:
                say(f"[launch] stopping: the restart budget ({policy.max_restarts}) is spent")
                return attempt
            restarts += 1
            wait = policy.backoff(restarts)
            say(f"[launch] restart {restarts} of {policy.max_restarts} in {wait:g} s")
            sleep(wait)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
