"""The benchmarks' own tests (tooling, beside the tooling: nothing under tests/ imports
benchmarks/): the harness, the targets table and the profile parsing, on hand-made
results and tiny shapes. `make test` runs them with the package's tests.

As in tests/conftest.py, set before anything imports jax: 8 fake CPU devices (the memory
benchmark's meshes), cheaper XLA CPU compiles, and no wait for a quiet machine (the tests
time nothing).
"""

import os

import pytest

_FLAGS = (
    "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
    "--xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false"
)
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAGS).strip()
os.environ.setdefault("JAXRL_BENCH_QUIET_SHARE", "1.0")


@pytest.fixture(scope="session")
def tiny_model_args() -> list[str]:
    """Config overrides for a 2-layer random model: D 32, 2 heads of 16, 1 KV head, F 64,
    V 64 (a benchmark's own code paths at the smallest shape)."""
    return [
        "--config.model.vocab_size=64",
        "--config.model.hidden_size=32",
        "--config.model.intermediate_size=64",
        "--config.model.num_heads=2",
        "--config.model.num_kv_heads=1",
        "--config.model.num_layers=2",
    ]
