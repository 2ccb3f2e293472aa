"""Expert parallelism measured on 8 fake CPU devices: one tiny Qwen3-MoE's forward +
gradient with the experts split over `fsdp` and run under `shard_map` (tokens all-gathered,
local experts, reduce-scatter: `moe.expert_parallel`) against the same placement left to
XLA (`_flat` on the sharded weights: XLA's SPMD partitioner decides the data movement), and
against plain FSDP (the `expert` rule dropped: the experts' D split over fsdp and gathered).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/moe_parallel.py

Prints, per form, the compiled per-device argument and temporary bytes and ms per step.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import common
from jaxrl_frontier.core import sharding
from jaxrl_frontier.models import moe
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.transformer import Transformer

CFG = ModelConfig(
    vocab_size=256, hidden_size=256, intermediate_size=256, num_layers=2, num_heads=4,
    num_kv_heads=2, num_experts=16, num_experts_per_tok=2, moe_intermediate_size=512,
)  # fmt: skip
ROWS, LENGTH = 8, 16


def step_fn(graphdef):
    def loss(params, tokens):
        return jnp.mean(nnx.merge(graphdef, params)(tokens) ** 2)

    return jax.jit(jax.value_and_grad(loss))


def measure(name, rules, patch, impl):
    mesh = sharding.make_mesh((1, 8, 1))
    cfg = CFG.replace(moe_impl=impl)
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, abstract = nnx.split(model)
    rng = np.random.RandomState(0)
    state = jax.tree.map(
        lambda a: jnp.asarray(0.05 * rng.standard_normal(a.shape), a.dtype), abstract
    )
    state = jax.device_put(state, sharding.state_shardings(state, mesh, rules))
    tokens = sharding.shard_batch(rng.randint(0, 256, (ROWS, LENGTH)).astype(np.int32), mesh)
    original = moe.expert_parallel
    if patch:
        moe.expert_parallel = lambda fn, x, e, g, w, *_: (moe._flat(fn, x, e, g, w, 0), 0.0)
    try:
        step = step_fn(graphdef)
        mem = common.compiled_memory(step.lower(state, tokens).compile())
        jax.block_until_ready(step(state, tokens))
        t0 = time.perf_counter()
        for _ in range(3):
            out = step(state, tokens)
        jax.block_until_ready(out)
        ms = (time.perf_counter() - t0) / 3 * 1e3
    finally:
        moe.expert_parallel = original
    print(
        f"{impl:6s} {name}: arguments {mem['arguments'] / common.MIB:.2f} MiB, temporaries "
        f"{mem['temporaries'] / common.MIB:.2f} MiB per device, {ms:.0f} ms per step, "
        f"loss {float(out[0]):.6f}"
    )


def main():
    no_expert_rule = tuple(r for r in sharding.DEFAULT_RULES if r[0] != "expert")
    for impl in ("dense", "ragged"):
        measure(
            "expert-parallel shard_map (experts over fsdp)", sharding.DEFAULT_RULES, False, impl
        )
        measure("same placement, XLA's partitioner", sharding.DEFAULT_RULES, True, impl)
        measure("plain FSDP (experts' D over fsdp)", no_expert_rule, True, impl)


if __name__ == "__main__":
    main()
