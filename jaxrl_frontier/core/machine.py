"""The machine a figure or a run was measured on, from /proc/cpuinfo (no jax import).

    cpu_info()          # {cpu_model, vector_extensions, cpu_count}
    machine_name([0])   # 'AMD EPYC 7B13, 1 core'

CPU timings and the last bits of f32 reductions depend on the CPU model, its vector
extensions (AVX2, AVX-512, AMX) and the cores a process had: the benchmarks record all
three in their JSON, the sweeps record the name with each finished run, and the recorded
runlocal metrics name the CPU they are bitwise on.
"""

from __future__ import annotations

import os
import platform

# /proc/cpuinfo flag -> the extension's name
VECTOR_EXTENSIONS = {"avx2": "AVX2", "avx512f": "AVX-512", "amx_tile": "AMX"}


def _cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str | None, set[str]]:
    """(the first 'model name', the first 'flags' set) of `path`; (None, {}) without it."""
    model, flags = None, set()
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model is None:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model, flags


def cpu_info(path: str = "/proc/cpuinfo") -> dict:
    """The CPU model, its vector extensions (AVX2, AVX-512, AMX) and its cores."""
    model, flags = _cpuinfo(path)
    return dict(
        cpu_model=model or platform.processor() or "unknown",
        vector_extensions=[name for flag, name in VECTOR_EXTENSIONS.items() if flag in flags],
        cpu_count=os.cpu_count(),
    )


def machine_name(cpus: list[int] | None = None, path: str = "/proc/cpuinfo") -> str:
    """'<CPU model>, <N> cores': `cpus` when the process was pinned, else every core this
    process may use."""
    model = _cpuinfo(path)[0] or platform.processor() or platform.machine()
    cores = len(cpus) if cpus else len(os.sched_getaffinity(0))
    return f"{model}, {cores} core{'s' if cores > 1 else ''}"
