"""The config section the bottom layer reads: the device mesh (`mesh`). The `distributed`
section, multi-host start-up, is `distributed.DistributedOptions`."""

from __future__ import annotations

import dataclasses

from jaxrl_frontier.core import records
from jaxrl_frontier.core.records import key


@dataclasses.dataclass(frozen=True)
class MeshSection:
    """`mesh`: the device mesh's axes (sharding.make_mesh). -1 takes the remaining devices.
    sequence > 1: context parallelism in the update and the log-prob passes (each device
    along it holds a slice of every row's positions; it must divide the rows' length), the
    weights and optimizer state split over fsdp x sequence (core/sharding.py). population
    P > 1: a population's members split over an outer `population` axis of P blocks of
    devices, the axes above inside each block (their -1 takes the rest of a block); only
    with population.batched_update, P dividing population.size (docs/population.md)."""

    data: int = key(-1, "data-parallel devices (-1: the rest)")
    fsdp: int = key(1, "devices the weights and optimizer state are split over")
    sequence: int = key(1, "devices each row's positions are split over (context parallelism)")
    tensor: int = key(1, "devices each matmul is split over (tensor parallelism)")
    num_devices: int = key(0, "devices used: 0 all, N > 0 the first N (tests, roles)")
    population: int = key(1, "blocks of devices a population's members split over", low=1)

    def __post_init__(self):
        records.check(self, "mesh")
