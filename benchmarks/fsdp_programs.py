"""Per-device compiled memory of each program of an RL step under FSDP, nothing executed.

    python -m benchmarks.fsdp_programs --devices 8 --out /tmp/programs.json

Builds the policy abstractly (`nnx.eval_shape`: no weights allocated) in a Qwen2.5 shape,
shards it over an fsdp mesh of `--devices` fake CPU devices and compiles the four programs
an RL step of the trainer runs: the sampler's prefill and decode (`Sampler.program`), the
reference's chunked log-prob forward (`forward.make_logp_fn`, the trainer's layout) and the
update (`learner.rl_loss` with the `configs/qwen_math.py` objective: a clipped ratio with a
k3 KL to the reference, through `train_step.make_update_fn`, state donated). Reported per
program and per device: `compiled.memory_analysis()`'s arguments, temporaries, outputs and
aliased bytes, and the peak (arguments + temporaries + outputs - aliased).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from benchmarks import common


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="0.5b", help="'0.5b' (Qwen2.5-0.5B shape) or 'tiny'")
    p.add_argument("--devices", type=int, default=8, help="fake CPU devices (fsdp axis)")
    p.add_argument("--prompts", type=int, default=2, help="prompts per RL step (all devices)")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--dtype", default="float32", help="compute dtype (parameters stay f32)")
    p.add_argument("--remat", default="full", choices=("none", "full", "dots_saveable"))
    p.add_argument("--programs", default="prefill,decode,reference,update")
    p.add_argument("--out", default="")
    return p.parse_args(argv)


def memory(compiled) -> dict:
    """Per-device bytes of a compiled program, and its peak."""
    m = compiled.memory_analysis()
    row = dict(
        arguments=m.argument_size_in_bytes,
        temporaries=m.temp_size_in_bytes,
        outputs=m.output_size_in_bytes,
        aliased=m.alias_size_in_bytes,
    )
    row["peak"] = row["arguments"] + row["temporaries"] + row["outputs"] - row["aliased"]
    return row


def abstract_out(lowered, compiled):
    """The outputs of a compiled program as ShapeDtypeStructs with their shardings."""
    import jax

    return jax.tree.map(
        lambda i, s: jax.ShapeDtypeStruct(i.shape, i.dtype, sharding=s),
        lowered.out_info,
        compiled.output_shardings,
    )


def main(argv=None) -> dict:
    args = parse(argv)
    flag = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from benchmarks.fsdp_rl import model_config
    from jaxrl_frontier.core import sharding
    from jaxrl_frontier.models.transformer import Transformer
    from jaxrl_frontier.objectives import losses
    from jaxrl_frontier.rl.learn.forward import make_logp_fn
    from jaxrl_frontier.rl.learn.learner import rl_loss, update_layout
    from jaxrl_frontier.rl.learn.train_step import make_update_fn
    from jaxrl_frontier.sampling import Sampler, SamplingParams
    from jaxrl_frontier.sampling.params import Knobs, Plan
    from scripts.memory_plan import abstract_state

    cfg = model_config(args.model, args.remat).replace(dtype=args.dtype)
    mesh = sharding.make_mesh((1, args.devices, 1))
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        state,
        sharding.state_shardings(state, mesh),
    )
    nnx.update(abstract, state)
    n, tp, tn = args.group_size, args.prompt_len, args.new_tokens
    rows, t = args.prompts * n, tp + tn
    # the sampler pads the prompts to a multiple of the batch devices (`Sampler.pad_prompts`)
    m = sharding.batch_size_multiple(mesh)
    sampled = -(-args.prompts // m) * m
    batch_sh = sharding.batch_sharding(mesh, 2)
    out = dict(
        benchmark="fsdp_programs",
        settings=vars(args),
        params=cfg.num_params(),
        devices=jax.device_count(),
        machine=common.machine_info(),
        programs={},
    )
    wanted = args.programs.split(",")

    def record(name, lowered, t0):
        compiled = lowered.compile()
        row = memory(compiled)
        row["compile_s"] = round(time.perf_counter() - t0, 1)
        out["programs"][name] = row
        print(name, json.dumps(row), flush=True)
        return compiled

    sampler = Sampler(abstract, pad_id=0, mesh=mesh, prompt_buckets=(tp,))
    sp = SamplingParams(max_new_tokens=tn, n=n)
    plan, knobs, key = Plan.of(sp), Knobs.of(sp), jax.random.key(0)
    prompts = jax.ShapeDtypeStruct((sampled, tp), jnp.int32, sharding=batch_sh)
    if "prefill" in wanted or "decode" in wanted:
        t0 = time.perf_counter()
        run = sampler.program("prefill", sampled * tp)
        lowered = run.lower(state, prompts, prompts, key, knobs, n=n, use_dropout=False, slots=tn)
        compiled = record("prefill", lowered, t0)
        cache, logits0, prompt_len = abstract_out(lowered, compiled)
    if "decode" in wanted:
        t0 = time.perf_counter()
        run = sampler.program("decode", sampled * n)
        version = jnp.int32(0)
        lowered = run.lower(
            state, cache, logits0, prompt_len, (prompts, prompts), key, knobs, version, plan=plan
        )
        record("decode", lowered, t0)
    tokens = jax.ShapeDtypeStruct((rows, t), jnp.int32, sharding=batch_sh)
    # the trainer's layout: each group's prompt once where whole groups split over the devices
    layout = update_layout(rows=rows, group_size=n, completion_len=tn, mesh=mesh, share_prompt=True)
    out["layout"] = layout
    if "reference" in wanted:
        t0 = time.perf_counter()
        logp_fn = make_logp_fn(graphdef, **layout)
        record("reference", logp_fn.lower(state, tokens, tokens), t0)
    if "update" in wanted:
        from configs import qwen_math
        from jaxrl_frontier.run.build import objective_section

        objective = objective_section(qwen_math.get_config().objective)
        loss_of = rl_loss(graphdef, objective, model_cfg=cfg, **layout)
        tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6))
        train_state = abstract_state(tx, state, mesh)
        f32 = jax.ShapeDtypeStruct((rows, t), jnp.float32, sharding=batch_sh)
        batch = dict(
            tokens=tokens, attention_mask=tokens, loss_mask=f32, old_logp=f32, advantages=f32,
            ref_logp=f32,
        )  # fmt: skip
        state_sh = jax.tree.map(lambda x: x.sharding, train_state)
        update = make_update_fn(
            graphdef, tx, loss_of, 1, state_sh, {k: batch_sh for k in batch},
            denominator_fn=lambda b: losses.aggregation_denominator(objective, b["loss_mask"]),
        )  # fmt: skip
        t0 = time.perf_counter()
        record("update", update.lower(train_state, batch), t0)
    if args.out:
        common.write_json(out, args.out, echo=False)
    return out


if __name__ == "__main__":
    main()
