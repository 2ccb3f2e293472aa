"""The config sections the bottom layer reads: the device mesh and multi-host start-up."""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict


def mesh_section() -> ml_collections.ConfigDict:
    """`mesh`: the device mesh's axes (sharding.make_mesh)."""
    # -1 takes the remaining devices; num_devices=0 uses all, N > 0 the first N (tests, roles).
    # sequence > 1: context parallelism in the update and the log-prob passes (each device
    # along it holds a slice of every row's positions; it must divide the rows' length),
    # the weights and optimizer state split over fsdp x sequence (core/sharding.py)
    s = ml_collections.ConfigDict(dict(data=-1, fsdp=1, sequence=1, tensor=1, num_devices=0))
    # P > 1: a population's members split over an outer `population` axis of P blocks of
    # devices, the axes above inside each block (their -1 takes the rest of a block); only
    # with population.batched_update, P dividing population.size (docs/population.md)
    s.population = 1
    return s


def distributed_section() -> ml_collections.ConfigDict:
    """`distributed`: how the processes of a multi-host run find each other (core/distributed.py)."""
    # Multi-host (docs/distributed.md): unset = JAX's own TPU-pod / SLURM detection, or one
    # process; set all three for any other launcher (e.g. several processes on localhost).
    s = ml_collections.ConfigDict()
    s.coordinator_address = config_dict.placeholder(str)
    s.num_processes = config_dict.placeholder(int)
    s.process_id = config_dict.placeholder(int)
    # The coordination service's timeouts (jax.distributed.initialize): a process silent
    # this long is lost (the survivors then exit with one line naming it and the step,
    # train/watchdog.py); how long processes wait for each other at start-up and at exit.
    s.heartbeat_timeout_s = 60
    s.initialization_timeout_s = 300
    s.shutdown_timeout_s = 300
    # a stop request (SIGTERM, SIGINT) on any process stops every process after the same step
    # (one all-gather of a flag per step, train/stopping.py); False: each process alone (only
    # to measure the agreement's cost: a lone stop breaks a multi-process run)
    s.agree_stop = True
    return s


# This layer's numeric keys: (low, high, low inclusive, high inclusive); None = open.
RANGES: dict[str, tuple] = {
    "mesh.population": (1, None, True, None),
    "distributed.heartbeat_timeout_s": (0, None, False, None),
    "distributed.initialization_timeout_s": (0, None, False, None),
    "distributed.shutdown_timeout_s": (0, None, False, None),
}
