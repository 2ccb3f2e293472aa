"""Multi-host start-up: plain multi-controller JAX, one process per host, no extra service.

Every host runs the same command. `initialize(options)` must run before anything touches a
device; the CLI calls it first. Where the processes come from:

* `distributed.coordinator_address`, `num_processes`, `process_id` set (any launcher,
  localhost tests): passed to `jax.distributed.initialize` as they are.
* unset, on a TPU pod slice or under SLURM with more than one task: JAX's own cluster
  detection fills them in (`jax.distributed.initialize()` without arguments).
* unset elsewhere: one process; nothing is initialised and nothing changes.

On CPU the processes talk through gloo collectives (set here, before the backend starts).

Faults. The coordination service's timeouts are config keys (`distributed.heartbeat_timeout_s`,
`initialization_timeout_s`, `shutdown_timeout_s`). Tasks are started recoverable
(`jax_enable_recoverability`): a process that dies no longer makes the coordination service
abort every other one with a C++ stack trace; the survivors notice it (`heartbeats`, polled
by train/watchdog.py) and exit with one line naming it. `gather_ints` is the one tiny
collective a step adds on several processes (the stop agreement, train/stopping.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import jax
import numpy as np

from jaxrl_frontier.core import records
from jaxrl_frontier.core.records import key

log = logging.getLogger(__name__)


def _cluster_detected() -> bool:
    """A multi-process launch that JAX can read from the environment by itself."""
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in os.environ:
        return True
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    return "," in hosts or "MEGASCALE_COORDINATOR_ADDRESS" in os.environ


@dataclasses.dataclass(frozen=True)
class DistributedOptions:
    """The `distributed` section (docs/distributed.md): how the processes of a multi-host run
    find each other; unset = JAX's own TPU-pod / SLURM detection, or one process; set all
    three for any other launcher (several processes on localhost). The coordination
    service's timeouts (jax.distributed.initialize): a process silent for
    heartbeat_timeout_s is lost (the survivors exit with one line naming it and the step,
    train/watchdog.py); start-up and shut-down wait at most their own. agree_stop: a stop
    request (SIGTERM, SIGINT) on any process stops every process after the same step (one
    all-gather of a flag per step, train/stopping.py); False: each process alone (only to
    measure the agreement's cost: a lone stop breaks a multi-process run)."""

    coordinator_address: str | None = key(None, "host:port of process 0's coordinator")
    num_processes: int | None = key(None, "processes in the run")
    process_id: int | None = key(None, "this process's index")
    heartbeat_timeout_s: int = key(
        60, "seconds of silence before a process is lost", low=0, low_open=True
    )
    initialization_timeout_s: int = key(
        300, "seconds processes wait for each other at start-up", low=0, low_open=True
    )
    shutdown_timeout_s: int = key(
        300, "seconds processes wait for each other at exit", low=0, low_open=True
    )
    agree_stop: bool = key(True, "a stop on any process stops every process after the same step")

    def __post_init__(self):
        records.check(self, "distributed")


def initialize(options: DistributedOptions) -> bool:
    """Start `jax.distributed` once if the options or the cluster ask for several processes.

    Returns True when this process is part of a multi-process run. Idempotent.
    """
    if jax.distributed.is_initialized():
        return True
    address, num, pid = options.coordinator_address, options.num_processes, options.process_id
    given = [
        k
        for k, v in zip(("coordinator_address", "num_processes", "process_id"), (address, num, pid))
        if v is not None
    ]
    if given and len(given) < 3 and not _cluster_detected():
        missing = sorted({"coordinator_address", "num_processes", "process_id"} - set(given))
        raise ValueError(
            f"config keys distributed.{', distributed.'.join(given)} are set but "
            f"distributed.{', distributed.'.join(missing)} are not: set all three, or none "
            "(JAX then detects a TPU pod or SLURM cluster itself)"
        )
    if not given and not _cluster_detected():
        return False
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # a lost task is reported to the others, not made fatal in C++ (train/watchdog.py)
    jax.config.update("jax_enable_recoverability", True)
    kwargs = dict(
        heartbeat_timeout_seconds=int(options.heartbeat_timeout_s),
        initialization_timeout=int(options.initialization_timeout_s),
        shutdown_timeout_seconds=int(options.shutdown_timeout_s),
    )
    if address is not None:
        kwargs.update(coordinator_address=address)
    if num is not None:
        kwargs.update(num_processes=int(num))
    if pid is not None:
        kwargs.update(process_id=int(pid))
    jax.distributed.initialize(**kwargs)
    log.info(
        "jax.distributed: process %d of %d, %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return True


def allgather_json(obj: Any) -> list[Any]:
    """Every process's `obj` (JSON-able), in process order (a collective: all processes call)."""
    if jax.process_count() == 1:
        return [obj]
    import json

    from jax.experimental import multihost_utils

    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    n = multihost_utils.process_allgather(np.asarray([data.size], np.int64)).reshape(-1)
    buf = np.zeros(int(n.max()), np.uint8)
    buf[: data.size] = data
    every = multihost_utils.process_allgather(buf).reshape(len(n), -1)
    return [json.loads(bytes(every[i, : n[i]]).decode()) for i in range(len(n))]


def sum_over_processes(x: float) -> float:
    """The sum of every process's `x` (a collective: all processes call)."""
    return float(sum(allgather_json(float(x))))


def gather_ints(value: int) -> list[int]:
    """Every process's int `value`, in process order: one all-gather of one int32 (a
    collective: all processes call). [value] on one process."""
    if jax.process_count() == 1:
        return [int(value)]
    from jax.experimental import multihost_utils

    every = multihost_utils.process_allgather(np.asarray([value], np.int32))
    return [int(v) for v in np.asarray(every).reshape(-1)]


def _client():
    from jax._src import distributed as jax_distributed  # the client: no public accessor

    return jax_distributed.global_state.client


# Every call below is a short key-value RPC. The coordination service's own blocking calls
# (wait_at_barrier, get_live_nodes) hold the GIL while they wait: a watchdog thread could not
# run during them, so they are not used while a run may lose a process.
HEARTBEAT_DIR = "jaxrl_frontier/alive/"


def beat(count: int) -> None:
    """Publish this process's heartbeat (`count`, a number that grows with each call)."""
    _client().key_value_set(f"{HEARTBEAT_DIR}{jax.process_index()}", str(count), True)


def heartbeats() -> dict[int, str]:
    """Every process's last published heartbeat ({process: value})."""
    rows = _client().key_value_dir_get(HEARTBEAT_DIR)
    return {int(k.rsplit("/", 1)[1]): v for k, v in rows}


def polling_barrier(key: str, timeout_ms: int, process_ids=None, poll_s: float = 0.005) -> None:
    """The coordination service's `wait_at_barrier`, by key-value polling: it waits in
    `time.sleep`, so other threads (the watchdog) run meanwhile. TimeoutError naming the
    processes missing after `timeout_ms`."""
    import time

    client = _client()
    expected = sorted(process_ids) if process_ids is not None else range(jax.process_count())
    client.key_value_set(f"jaxrl_frontier/barrier/{key}/{jax.process_index()}", "", True)
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        arrived = {int(k.rsplit("/", 1)[1]) for k, _ in client.key_value_dir_get(
            f"jaxrl_frontier/barrier/{key}/"
        )}  # fmt: skip
        missing = [p for p in expected if p not in arrived]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {key!r}: processes {missing} did not arrive")
        time.sleep(poll_s)


def finish(timeout_s: float = 300.0) -> None:
    """Leave a multi-process job in order (once, at the end of the program, on every
    process). Recoverable tasks skip jax's own shutdown barrier, and the coordination service
    lives in process 0: were process 0 to leave first, a process still connected would
    abort. So every process says it is done and disconnects; process 0 waits (at most
    `timeout_s`, polling) for them before it shuts the service down."""
    if jax.process_count() == 1 or not jax.distributed.is_initialized():
        return
    try:
        polling_barrier("finish", int(timeout_s * 1000))
        if jax.process_index() == 0:  # the others disconnect now: wait for them to be gone
            while _client().get_live_nodes(list(range(jax.process_count()))).keys() != {0}:
                pass
    except Exception:  # a process lost or stuck: leave anyway (the watchdog named it)
        log.warning("distributed.finish: not every process reached the end")
    jax.distributed.shutdown()


def exit_now(code: int) -> None:
    """Leave at once with `code`: no atexit handlers (jax's shutdown barrier would wait for,
    or abort on, a lost process), buffered output flushed first."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def coordinator_reachable(timeout_s: float = 2.0) -> bool:
    """Whether the coordination service's address still accepts a connection (process 0,
    which runs it, is alive). True on one process."""
    import socket

    from jax._src import distributed as jax_distributed

    address = jax_distributed.global_state.coordinator_address
    if jax.process_count() == 1 or not address:
        return True
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


class CoordinatorWatch:
    """On a process other than 0: when process 0 dies, the coordination client's own thread
    aborts this process at once (SIGABRT after a C++ stack trace; no Python runs). With
    `install()`, a SIGABRT while the coordinator no longer accepts connections calls
    `on_lost()` instead (which prints its line and leaves with `exit_now`); an abort for any
    other reason goes on as before (default action). The handler runs Python on the aborting
    thread, so it waits for the GIL: a main thread in a call that holds it (none in the
    loop) delays it. `uninstall()` puts the previous handler back."""

    def __init__(self, on_lost):
        import ctypes
        import signal

        self.on_lost = on_lost
        self._signal = ctypes.CDLL(None).signal
        self._signal.restype, self._signal.argtypes = (
            ctypes.c_void_p,
            [ctypes.c_int, ctypes.c_void_p],
        )
        self._sigabrt = int(signal.SIGABRT)
        handler_type = ctypes.CFUNCTYPE(None, ctypes.c_int)
        self._handler = handler_type(self._on_abort)  # referenced while installed
        self._address = ctypes.cast(self._handler, ctypes.c_void_p)
        self._previous = None
        self.installed = False

    def install(self) -> None:
        if jax.process_count() > 1 and jax.process_index() != 0 and not self.installed:
            self._previous = self._signal(self._sigabrt, self._address)
            self.installed = True

    def uninstall(self) -> None:
        if self.installed:
            self._signal(self._sigabrt, self._previous)  # None: SIG_DFL
            self.installed = False

    def _on_abort(self, signum: int) -> None:
        if not coordinator_reachable():
            self.on_lost()  # leaves the process
        # not a lost coordinator: back to the default action; abort() raises it again
        self._signal(self._sigabrt, None)
