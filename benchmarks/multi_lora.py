"""A multi-LoRA population's adapter forms timed on this machine: one LoRA projection
y = x W + s (x A_m) B_m over the rows of N members (one frozen W; member m's adapters A_m
[D, r], B_m [r, O]), forward + gradient with respect to the adapters, in three forms:

    grouped   rows grouped by member, [N, R, T, D]: the model's projection vmapped over
              the members' adapters, a batched matmul (population.lora)
    gathered  rows in any order with a per-row adapter index: each row's A_m, B_m
              gathered, [N R, D, r] (SkyRL's JAX backend)
    ragged    rows sorted by adapter with the group sizes: `jax.lax.ragged_dot`

    python benchmarks/bench.py multi-lora [--members 8] [--reps 10] [--out FILE]

Each form is timed in alternating rounds (median ms per call); the JSON holds the machine,
the shapes, the medians, their ratios and the max difference from the grouped form.
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from jaxrl_frontier.models import layers

# (rows per member R, tokens per row T, model width D, projection width O, rank r):
# Qwen2.5-0.5B's q projection at rank 16, 4 rows of 128 tokens per member
SHAPE = (4, 128, 896, 896, 16)


def grouped(x, w, a, b, scale):
    """x [N, R, T, D], adapters [N, D, r], [N, r, O] -> [N, R, T, O]: the model's own
    projection (`layers.dense`, rows flattened) vmapped over the members, W shared (in_axes
    None), as population.lora runs it."""

    def member(x, a, b):
        return layers.dense(x, w) + scale * layers.dense(layers.dense(x, a), b)

    return jax.vmap(member)(x, a, b)


def gathered(x, idx, w, a, b, scale):
    """x [M, T, D] rows in any order, idx [M] each row's adapter -> [M, T, O]."""
    a_rows, b_rows = a[idx], b[idx]  # [M, D, r], [M, r, O]
    lora = jnp.einsum("mtk,mko->mto", jnp.einsum("mtd,mdk->mtk", x, a_rows), b_rows)
    return jnp.einsum("mtd,do->mto", x, w) + scale * lora


def ragged(x, sizes, w, a, b, scale):
    """x [M T, D] tokens sorted by adapter, sizes [N] tokens per adapter -> [M T, O]."""
    h = jax.lax.ragged_dot(x, a, sizes)
    return x @ w + scale * jax.lax.ragged_dot(h, b, sizes)


def programs(n: int, shape) -> dict:
    """Each form's jitted forward + adapter gradient and its inputs (the same numbers)."""
    r, t, d, o, k = shape
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((n, r, t, d)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((d, o)) / np.sqrt(d), jnp.float32)
    a = jnp.asarray(rng.standard_normal((n, d, k)) / np.sqrt(d), jnp.float32)
    b = jnp.asarray(rng.standard_normal((n, k, o)) / np.sqrt(k), jnp.float32)
    scale = 2.0
    idx = jnp.repeat(jnp.arange(n), r)
    sizes = jnp.full((n,), r * t, jnp.int32)

    out = {}
    for name, form, inputs in (
        ("grouped", grouped, (x, w)),
        ("gathered", gathered, (x.reshape(n * r, t, d), idx, w)),
        ("ragged", ragged, (x.reshape(n * r * t, d), sizes, w)),
    ):
        fn = jax.jit(
            jax.value_and_grad(
                lambda a, b, f=form, i=inputs: 0.5 * jnp.mean(f(*i, a, b, scale) ** 2),
                argnums=(0, 1),
            )
        )
        out[name] = (fn, (a, b))
    return out


def bench(args) -> dict:
    shape = (args.rows, args.tokens, args.width, args.width, args.rank)
    load_before = os.getloadavg()
    forms = programs(args.members, shape)
    results = {name: fn(*inp) for name, (fn, inp) in forms.items()}  # compile + reference
    _, (ref_ga, ref_gb) = results["grouped"]
    diffs = {}
    for name, (_, (ga, gb)) in results.items():
        diffs[name] = max(
            float(jnp.max(jnp.abs(ga - ref_ga)) / jnp.max(jnp.abs(ref_ga))),
            float(jnp.max(jnp.abs(gb - ref_gb)) / jnp.max(jnp.abs(ref_gb))),
        )
    rounds: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(args.rounds):  # alternating rounds: each form's time in every round
        for name, (fn, inp) in forms.items():
            ms, _ = common.median_time(
                lambda fn=fn, inp=inp: jax.block_until_ready(fn(*inp)), args.reps
            )
            rounds[name].append(ms * 1e3)
    median = {name: float(np.median(v)) for name, v in rounds.items()}
    return {
        "machine": common.machine_info(),
        "load_1m_before_after": [load_before[0], os.getloadavg()[0]],
        "members": args.members,
        "shape": dict(zip(("rows", "tokens", "width", "out", "rank"), shape)),
        "median_ms": median,
        "rounds_ms": rounds,
        "vs_grouped": {name: median[name] / median["grouped"] for name in forms},
        "max_rel_diff_from_grouped": diffs,
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--members", type=int, default=8)
    p.add_argument("--rows", type=int, default=SHAPE[0], help="rows per member")
    p.add_argument("--tokens", type=int, default=SHAPE[1], help="tokens per row")
    p.add_argument("--width", type=int, default=SHAPE[2], help="D = O")
    p.add_argument("--rank", type=int, default=SHAPE[4])
    p.add_argument("--reps", type=int, default=5, help="calls per round (median)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="artifacts/multi_lora_cpu.json")
    args = p.parse_args(argv)
    return common.write_json(bench(args), args.out)


if __name__ == "__main__":
    main()
