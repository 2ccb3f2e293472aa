"""Ring attention (`model.attention = 'ring'`) against the all-gather path ('xla' on a mesh
with a sequence axis: XLA gathers the row's K/V and each device holds [T / s, T] scores),
for one causal attention layer's forward + backward (value and gradient w.r.t. q, k, v) on
8 fake CPU devices.

    python benchmarks/ring_attention.py [--out artifacts/ring_attention_cpu.json]
        [--meshes 1x2x4x1,1x1x8x1] [--lengths 2048,8192,16384] [--time-lengths 2048]
        [--rounds 5] [--rows 2] [--heads 14] [--kv-heads 2] [--head-dim 64]

Per mesh (data x fsdp x sequence x tensor) and row length: the compiled program's
temporaries per device (`compiled.memory_analysis()`, compile only) for both paths, of
the forward + backward and of the forward alone, and
whether it holds an f32 buffer spanning a device's queries x the row; for the lengths in
`--time-lengths`, the step time of each path, timed in alternating rounds (the order
flipped every round) with the median of the per-round ratios. The default head shape is
Qwen2.5-0.5B's (14 query heads, 2 kv heads of 64). CPU times on a shared machine are
noisy; the memory figures are exact for the compiled programs.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import time
from pathlib import Path

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402
from benchmarks.common import ints, machine_info, standalone_main  # noqa: E402

IMPLS = ("xla", "ring")  # 'xla' on a sequence-split mesh is the all-gather path
F32_SHAPES = re.compile(r"f32\[([0-9,]+)\]")


def add_arguments(parser) -> None:
    parser.add_argument("--meshes", default="1x2x4x1,1x1x8x1", help="data x fsdp x seq x tensor")
    parser.add_argument("--lengths", default="2048,8192,16384", help="row lengths (memory)")
    parser.add_argument("--time-lengths", default="2048", help="row lengths also timed")
    parser.add_argument("--rounds", type=int, default=5, help="alternating timing rounds")
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))


def _program(impl, mesh, args, t, grad=True):
    """(compiled value-and-gradient w.r.t. q, k, v of a weighted sum of one causal
    attention's output over padded rows (grad False: the value alone), its abstract
    inputs)."""
    import jax
    import jax.numpy as jnp

    from jaxrl_frontier.core import sharding
    from jaxrl_frontier.models import attention

    dt = jnp.dtype(args.dtype)
    b, h, k, d = args.rows, args.heads, args.kv_heads, args.head_dim

    def abstract(shape, dtype):
        spec = sharding.activation_sharding(mesh, jax.ShapeDtypeStruct(shape, dtype), True)
        return jax.ShapeDtypeStruct(shape, dtype, sharding=spec)

    def loss(q, k, v, valid):
        out = attention.attention(q, k, v, attention.RowMask(valid), impl=impl)
        return jnp.sum(out.astype(jnp.float32) * jnp.cos(out.astype(jnp.float32)))

    inputs = (
        abstract((b, t, h, d), dt),
        abstract((b, t, k, d), dt),
        abstract((b, t, k, d), dt),
        abstract((b, t), jnp.bool_),
    )
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)) if grad else loss)
    return step.lower(*inputs).compile(), inputs


def _concrete(inputs, t):
    """Random q, k, v and a validity mask (the first row left-padded by T / 8) placed as
    the abstract inputs are."""
    import jax
    import numpy as np

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(a.shape).astype(np.float32).astype(a.dtype) for a in inputs[:3]]
    valid = np.ones(inputs[3].shape, bool)
    valid[0, : t // 8] = False
    return [jax.device_put(x, a.sharding) for x, a in zip([*arrays, valid], inputs, strict=True)]


def _row_wide(text: str, n: int, t: int) -> bool:
    """The program holds an f32 buffer with a T / s and a T dim (queries x the row)."""
    return any({n, t} <= set(map(int, s.split(","))) for s in F32_SHAPES.findall(text))


def _time(programs, args, t) -> dict:
    """Alternating rounds of the two compiled steps: per path the median seconds, and the
    median of the per-round ratios all-gather / ring."""
    import jax

    data = _concrete(programs["xla"][1], t)
    for compiled, _ in programs.values():
        jax.block_until_ready(compiled(*data))  # warm
    seconds = {impl: [] for impl in IMPLS}
    for r in range(args.rounds):
        for impl in IMPLS if r % 2 == 0 else IMPLS[::-1]:
            t0 = time.perf_counter()
            jax.block_until_ready(programs[impl][0](*data))
            seconds[impl].append(time.perf_counter() - t0)
    ratios = [a / b for a, b in zip(seconds["xla"], seconds["ring"], strict=True)]
    return dict(
        step_seconds={impl: statistics.median(s) for impl, s in seconds.items()},
        rounds_seconds=seconds,
        time_ratio_gather_over_ring=statistics.median(ratios),
    )


def run(args) -> dict:
    from jaxrl_frontier.core import sharding

    results = []
    timed = set(ints(args.time_lengths))
    for mesh_text in args.meshes.split(","):
        shape = tuple(int(x) for x in mesh_text.split("x"))
        mesh = sharding.make_mesh(shape)
        s = sharding.sequence_size(mesh)
        for t in ints(args.lengths):
            row = dict(mesh=dict(zip(sharding.MESH_AXES, shape)), length=t)
            programs = {impl: _program(impl, mesh, args, t) for impl in IMPLS}
            for impl, (compiled, _) in programs.items():
                mem = common.compiled_memory(compiled)
                forward = common.compiled_memory(_program(impl, mesh, args, t, grad=False)[0])
                row[impl] = dict(
                    temp_mib=mem["temporaries"] / common.MIB,
                    forward_temp_mib=forward["temporaries"] / common.MIB,
                    argument_mib=mem["arguments"] / common.MIB,
                    row_wide_f32_buffer=_row_wide(compiled.as_text(), t // s, t),
                )
            for key in ("temp_mib", "forward_temp_mib"):
                ratio = row["xla"][key] / row["ring"][key]
                row[key.replace("_mib", "_ratio_gather_over_ring")] = ratio
            if t in timed:
                row.update(_time(programs, args, t))
            print({k: v for k, v in row.items() if k != "rounds_seconds"}, flush=True)
            results.append(row)
    shape = dict(rows=args.rows, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim)
    return dict(
        what="one causal attention layer, value and gradient w.r.t. q, k, v; per device",
        shape=dict(**shape, dtype=args.dtype),
        rounds=args.rounds,
        results=results,
        machine=machine_info(),
        note="CPU step times on a shared 2-core machine are noisy; temporaries are exact",
    )


if __name__ == "__main__":
    standalone_main("ring_attention_cpu", __doc__, add_arguments, run)
