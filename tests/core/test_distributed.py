"""core/distributed.py on one process: which options start `jax.distributed` (and with what),
which refuse, and the collectives' one-process answers."""

import jax
import pytest

from jaxrl_frontier.core import distributed
from jaxrl_frontier.core.distributed import DistributedOptions

CLUSTER_VARS = (
    "SLURM_NTASKS",
    "SLURM_JOB_ID",
    "TPU_WORKER_HOSTNAMES",
    "MEGASCALE_COORDINATOR_ADDRESS",
)


@pytest.fixture
def started(monkeypatch):
    """No cluster in the environment; jax.distributed.initialize and jax.config.update
    recorded, not run."""
    for var in CLUSTER_VARS:
        monkeypatch.delenv(var, raising=False)
    calls = {"init": [], "config": []}
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls["init"].append(kw))
    monkeypatch.setattr(jax.config, "update", lambda k, v: calls["config"].append((k, v)))
    return calls


def test_unset_options_off_a_cluster_start_nothing(started):
    assert distributed.initialize(DistributedOptions()) is False
    assert started == {"init": [], "config": []}


def test_all_three_keys_are_passed_with_the_timeouts_as_whole_seconds(started):
    options = DistributedOptions("127.0.0.1:1234", 2, 1, heartbeat_timeout_s=10.7)
    assert distributed.initialize(options) is True
    assert started["init"] == [
        dict(
            heartbeat_timeout_seconds=10,
            initialization_timeout=300,
            shutdown_timeout_seconds=300,
            coordinator_address="127.0.0.1:1234",
            num_processes=2,
            process_id=1,
        )
    ]
    assert started["config"] == [
        ("jax_cpu_collectives_implementation", "gloo"),
        ("jax_enable_recoverability", True),
    ]


def test_some_keys_set_refuse_off_a_cluster_and_pass_on_one(started, monkeypatch):
    with pytest.raises(
        ValueError,
        match=r"distributed.num_processes are set but "
        r"distributed.coordinator_address, distributed.process_id are not",
    ):
        distributed.initialize(DistributedOptions(num_processes=2))
    assert started["init"] == []
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_JOB_ID", "17")
    assert distributed.initialize(DistributedOptions(num_processes=4)) is True
    assert started["init"][0]["num_processes"] == 4 and "process_id" not in started["init"][0]
    monkeypatch.setenv("SLURM_NTASKS", "1")  # a one-task SLURM job is no cluster
    assert distributed.initialize(DistributedOptions()) is False
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "host0,host1")  # a pod slice is
    assert distributed.initialize(DistributedOptions()) is True
    assert len(started["init"]) == 2


def test_collectives_on_one_process():
    assert distributed.allgather_json({"a": [1, 2]}) == [{"a": [1, 2]}]
    assert distributed.sum_over_processes(2.5) == 2.5
    assert distributed.gather_ints(7) == [7]
    assert distributed.coordinator_reachable() is True
    distributed.finish()  # one process: nothing to leave
