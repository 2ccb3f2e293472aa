"""A stop every process agrees on: SIGTERM or SIGINT on any one process stops all of them
after the same step.

A TPU maintenance event or a SLURM preemption signals one host, not all. A process that
stopped alone would enter the checkpoint's collectives while the others are in the step's
(a collective mismatch, then an abort). So after each step every process contributes its
own request (0, or the signal's number) to one all-gather of one int32
(`distributed.gather_ints`), and all of them see the same answer: stop after this step,
save it, exit 0. Measured cost in docs/reliability.md.

JAX's own preemption sync point (`multihost_utils.reached_preemption_sync_point`) costs
nothing per step but listens to SIGTERM only (not Ctrl-C), through a C++ handler that our
Python one replaces, and needs every process to have started at the same step.
"""

from __future__ import annotations

import signal

from jaxrl_frontier.core import distributed
from jaxrl_frontier.train.checkpoint import StopRequest


class StopAgreement(StopRequest):
    """`StopRequest`, agreed over processes: `agreed(step)` after every step (a collective on
    several processes; every process must call it at the same steps). `requested` stays the
    local flag; `signal_name` names the first signal and the process it reached.

    agree: False skips the collective (each process stops on its own signal only: the
    single-process behaviour, kept to measure the agreement's cost)."""

    def __init__(self, agree: bool = True, signals=(signal.SIGTERM, signal.SIGINT)):
        super().__init__(signals)
        self.agree = agree
        self.stopped_at: int | None = None

    # hook shape: start() is the constructor (handlers installed), close() restores them
    def start(self) -> None:
        pass

    def after_step(self, step: int) -> bool:
        return self.agreed(step)

    def close(self) -> None:
        self.restore()

    def agreed(self, step: int) -> bool:
        """True when any process has a stop request (the same answer on every process)."""
        mine = signal.Signals[self.signal_name].value if self.requested else 0
        if not self.agree:
            every = [mine]
        else:
            every = distributed.gather_ints(mine)
        if not any(every):
            return False
        first = next(i for i, code in enumerate(every) if code)
        name = signal.Signals(every[first]).name
        self.requested = True
        self.stopped_at = step
        self.signal_name = name if len(every) == 1 else f"{name} on process {first}"
        return True
