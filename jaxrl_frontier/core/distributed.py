"""Multi-host start-up: plain multi-controller JAX, one process per host, no extra service.

Every host runs the same command. `initialize(options)` must run before anything touches a
device; the CLI calls it first. Where the processes come from:

* `distributed.coordinator_address`, `num_processes`, `process_id` set (any launcher,
  localhost tests): passed to `jax.distributed.initialize` as they are.
* unset, on a TPU pod slice or under SLURM with more than one task: JAX's own cluster
  detection fills them in (`jax.distributed.initialize()` without arguments).
* unset elsewhere: one process; nothing is initialised and nothing changes.

On CPU the processes talk through gloo collectives (set here, before the backend starts).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import jax
import numpy as np

log = logging.getLogger(__name__)


def _cluster_detected() -> bool:
    """A multi-process launch that JAX can read from the environment by itself."""
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in os.environ:
        return True
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    return "," in hosts or "MEGASCALE_COORDINATOR_ADDRESS" in os.environ


@dataclasses.dataclass(frozen=True)
class DistributedOptions:
    """The `distributed` section: how the processes find each other (None: unset)."""

    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


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
    kwargs = {}
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
