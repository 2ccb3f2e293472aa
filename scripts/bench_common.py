"""Helpers shared by the benchmark scripts: timing, the matmul peak, JSON output."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

# The tiny Qwen2-shaped model of the sampler, RL-step and speculative benchmarks.
TINY_QWEN2 = dict(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=768,
    num_layers=4,
    num_heads=8,
    num_kv_heads=2,
)

# Qwen2.5-0.5B's shape, the ~0.5B model of the GPU benchmarks (bench.py, bench_train.py).
QWEN2_5_0_5B = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_layers=24,
    num_heads=14,
    num_kv_heads=2,
)


def ints(text: str) -> list[int]:
    """'16,64' -> [16, 64] (a comma-separated list option)."""
    return [int(x) for x in text.split(",") if x]


def median_time(fn, repeats: int) -> tuple[float, list[float]]:
    """Median wall time of `repeats` calls of `fn` (already compiled), and every time."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def decode_step_rounds(full, prefill, repeats: int, each_round=None):
    """Rounds for timing a decode step as (T(full) - T(prefill)) / (Tn - 1): a rollout of Tn
    >= 2 new tokens is the prefill (which samples the first token) plus Tn - 1 decode steps,
    and a 1-token rollout is the prefill alone. Each round runs `each_round()` (e.g. a
    matmul-peak probe; its results are returned), then the two warm rollouts back to back.
    Returns (full seconds, prefill seconds, each_round's results), one per round."""
    t_full, t_prefill, probes = [], [], []
    for _ in range(repeats):
        probes.append(each_round() if each_round else None)
        for run, times in ((full, t_full), (prefill, t_prefill)):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
    return t_full, t_prefill, probes


def matmul_peak(n: int = 2048, repeats: int = 5) -> dict:
    """GFLOP/s of an n x n jnp matmul in f32 and bf16 (median of repeats); peak = the best."""
    import jax
    import jax.numpy as jnp

    out = {}
    for name, dt in (("float32", jnp.float32), ("bfloat16", jnp.bfloat16)):
        a = jax.random.normal(jax.random.key(0), (n, n), dt)
        b = jax.random.normal(jax.random.key(1), (n, n), dt)
        mm = jax.jit(lambda x, y: x @ y)
        mm(a, b).block_until_ready()
        t, _ = median_time(lambda mm=mm, a=a, b=b: mm(a, b).block_until_ready(), repeats)
        out[f"{name}_gflops"] = 2 * n**3 / t / 1e9
    out["peak_gflops"] = max(out["float32_gflops"], out["bfloat16_gflops"])
    out["n"] = n
    return out


def write_json(result: dict, path: str | Path, *, echo: bool = True) -> dict:
    """Write `result` to `path` (parents created) and, with `echo`, print it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2)
    path.write_text(text + "\n")
    if echo:
        print(text)
    return result


def machine_info() -> dict:
    """Where a figure was measured: device, core count, versions, XLA flags."""
    import os
    import platform

    import jax

    return dict(
        device=str(jax.devices()[0]),
        device_kind=jax.devices()[0].device_kind,
        device_count=jax.device_count(),
        cpu_count=os.cpu_count(),
        platform=platform.platform(),
        python=platform.python_version(),
        jax=jax.__version__,
        xla_flags=os.environ.get("XLA_FLAGS", ""),
    )


def standalone_main(name: str, doc: str, add_arguments, run, argv=None) -> dict:
    """`python scripts/bench_<name>.py [--out PATH] [options]`: run one benchmark, write JSON."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default=f"artifacts/bench_{name}.json", help="JSON path")
    add_arguments(parser)
    args = parser.parse_args(argv)
    return write_json(dict(benchmark=name, **run(args)), args.out)
