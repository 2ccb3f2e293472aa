"""Helpers shared by the benchmark scripts: timing, the matmul peak, JSON output."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path


def median_time(fn, repeats: int) -> tuple[float, list[float]]:
    """Median wall time of `repeats` calls of `fn` (already compiled), and every time."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


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
