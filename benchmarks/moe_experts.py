"""The MoE experts' two forms timed on this machine: grouped matmuls over the assignments
sorted by expert (`moe.experts_ragged`, `jax.lax.ragged_dot`) against every expert on every
token with one-hot combine weights (`moe.experts_dense`); forward + gradient of one layer.

    python benchmarks/moe_experts.py [--reps 20]

Prints ms per call and the max difference between the two forms at each shape.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.models import moe

# (tokens N, hidden D, experts E, per token k, expert hidden F)
SHAPES = {
    "tiny": (256, 64, 8, 2, 32),
    "small": (2048, 256, 32, 4, 128),
    "qwen3_30b_a3b_layer_1k": (1024, 2048, 128, 8, 768),
}


def time_it(fn, args, reps: int) -> float:
    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    for _ in range(reps):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / reps * 1e3


def bench(shape, reps: int) -> dict:
    n, d, e, k, f = shape
    rng = np.random.RandomState(0)
    x = jnp.asarray(rng.standard_normal((n, d)), jnp.float32)
    w = [jnp.asarray(0.05 * rng.standard_normal(s), jnp.float32) for s in ((e, d, f),) * 2]
    w.append(jnp.asarray(0.05 * rng.standard_normal((e, f, d)), jnp.float32))
    w = moe.ExpertWeights(*w)
    logits = jnp.asarray(rng.standard_normal((n, e)), jnp.float32)
    experts, gates = moe.top_k_gates(logits, k, True)
    out = {}
    for name, fn in moe.EXPERT_IMPLS.items():
        loss = lambda x, w, fn=fn: jnp.sum(fn(x, experts, gates, w) ** 2)
        step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
        out[name] = time_it(step, (x, w), reps), step(x, w)[0]
    diff = abs(float(out["ragged"][1]) - float(out["dense"][1])) / abs(float(out["dense"][1]))
    return {"ragged_ms": out["ragged"][0], "dense_ms": out["dense"][0], "rel_diff": diff}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--shapes", default="tiny,small")
    a = p.parse_args()
    for name in a.shapes.split(","):
        r = bench(SHAPES[name], a.reps)
        print(
            f"{name} {SHAPES[name]} (N, D, E, k, F): ragged {r['ragged_ms']:.2f} ms, "
            f"dense {r['dense_ms']:.2f} ms (forward + gradient), rel diff {r['rel_diff']:.1e}"
        )


if __name__ == "__main__":
    main()
