"""RL steps of a large model under FSDP on fake CPU devices: host memory and compiled memory.

    /usr/bin/time -v python -m benchmarks.fsdp_rl --devices 8 --out /tmp/fsdp_rl.json

Builds a policy with random weights in the shape of `--model` (default: Qwen2.5-0.5B, as
`configs/qwen_math.py` loads it; float32), a reference copy (its own arrays), both sharded
over an fsdp mesh of `--devices` fake CPU devices, and runs `--steps` RL steps: a rollout
(`Sampler.generate`, `--prompts` x `--group-size` completions of `--new-tokens` tokens),
the reference's log-probs, and a jitted update (a clipped importance-weighted policy
gradient with a k3 KL to the reference, value and gradient, clip + AdamW, state donated);
both log-prob passes run the trainer's fused, chunked output layer.
The trainer's own step is not used: this measures the model, sampler and sharding alone.

Reported: seconds per part, the compiled update's per-device arguments, temporaries and
peak (`compiled.memory_analysis()`), and the process's peak resident memory (on fake CPU
devices every device's buffers live in this one process, so it is their sum).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

from benchmarks import common
from benchmarks.configs import random_qwen2


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="0.5b", help="'0.5b' (Qwen2.5-0.5B shape) or 'tiny'")
    p.add_argument("--devices", type=int, default=8, help="fake CPU devices (fsdp axis)")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--remat", default="full", help="ModelConfig.remat of the policy")
    p.add_argument("--out", default="")
    return p.parse_args(argv)


def model_config(name: str, remat: str):
    from jaxrl_frontier.models.layers import ModelConfig

    shape = dict(common.QWEN2_5_0_5B if name == "0.5b" else random_qwen2.MODELS["tiny"])
    shape.update(tie_word_embeddings=True)
    return ModelConfig(
        **shape,
        qkv_bias=True,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        family="qwen2",
        dtype="float32",
        remat=remat,
    )


def main(argv=None) -> dict:
    args = parse(argv)
    flag = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from jaxrl_frontier.core import sharding
    from jaxrl_frontier.models.random_init import random_model
    from jaxrl_frontier.objectives import logprobs
    from jaxrl_frontier.rl.learn.forward import apply_hidden
    from jaxrl_frontier.sampling import Sampler, SamplingParams

    def rss_mb() -> float:  # peak so far (Linux: kilobytes)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    out = dict(benchmark="fsdp_rl", settings=vars(args), devices=jax.device_count())
    cfg = model_config(args.model, args.remat)
    out["params"] = cfg.num_params()
    mesh = sharding.make_mesh((1, args.devices, 1))
    repl = sharding.replicated(mesh)
    t0 = time.perf_counter()
    policy = sharding.shard_model(random_model(cfg, seed=0, std=0.02), mesh)
    graphdef, params = nnx.split(policy)
    ref_params = jax.tree.map(jnp.copy, params)  # the reference: its own (sharded) arrays
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6))
    opt_state = jax.tree.map(  # Adam's moments: zeros like each (sharded) parameter
        lambda x: x if len(x.sharding.device_set) == mesh.size else jax.device_put(x, repl),
        tx.init(params),
    )
    out["build_s"] = time.perf_counter() - t0
    out["rss_after_build_mb"] = rss_mb()
    print(f"built policy, reference and AdamW state: peak RSS {rss_mb():,.0f} MB", file=sys.stderr)

    hidden_fn = apply_hidden(graphdef)

    def token_logp(state, tokens, mask):
        """[B, T-1] log p(tokens[:, 1:] | prefix), through the trainer's fused, chunked
        output layer (no [B, T, V] logits)."""
        hidden, w_out = hidden_fn(state, tokens, mask)
        return logprobs.token_logprobs_from_hidden(hidden, w_out, tokens)[:, 1:]

    def loss_fn(state, batch):
        logp = token_logp(state, batch["tokens"], batch["mask"])
        m = batch["loss_mask"]
        ratio = jnp.exp(logp - batch["old_logp"])
        adv = batch["advantages"][:, None]
        pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 0.8, 1.28) * adv)
        d = batch["ref_logp"] - logp
        kl = jnp.exp(d) - d - 1.0  # k3
        return jnp.sum((pg + 1e-3 * kl) * m) / jnp.maximum(jnp.sum(m), 1.0)

    def update(state, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(state, batch)
        updates, opt_state = tx.update(grads, opt_state, state)
        return optax.apply_updates(state, updates), opt_state, loss

    param_sh = jax.tree.map(lambda x: x.sharding, params)
    opt_sh = jax.tree.map(lambda x: x.sharding, opt_state)
    update = jax.jit(
        update,
        donate_argnums=(0, 1),
        out_shardings=(param_sh, opt_sh, repl),
    )
    ref_logp_fn = jax.jit(token_logp)

    sampler = Sampler(policy, pad_id=0, mesh=mesh, prompt_buckets=(args.prompt_len,))
    sp = SamplingParams(max_new_tokens=args.new_tokens, n=args.group_size)
    rng = np.random.default_rng(0)
    steps = []
    for step in range(args.steps):
        row = {}
        prompts = rng.integers(1, cfg.vocab_size, (args.prompts, args.prompt_len), np.int32)
        t0 = time.perf_counter()
        ro = sampler.generate(prompts, np.ones_like(prompts), sp, jax.random.key(step))
        seq = jax.block_until_ready(ro.sequences())
        row["rollout_s"] = time.perf_counter() - t0
        print(f"step {step}: rollout done, peak RSS {rss_mb():,.0f} MB", file=sys.stderr)
        t0 = time.perf_counter()
        ref_logp = jax.block_until_ready(ref_logp_fn(ref_params, seq.tokens, seq.attention_mask))
        row["reference_s"] = time.perf_counter() - t0
        rewards = rng.standard_normal(seq.tokens.shape[0]).astype(np.float32)
        groups = rewards.reshape(-1, args.group_size)
        adv = (groups - groups.mean(1, keepdims=True)) / (groups.std(1, keepdims=True) + 1e-6)
        batch = dict(
            tokens=seq.tokens,
            mask=seq.attention_mask,
            loss_mask=seq.loss_mask[:, 1:],
            old_logp=seq.old_logp[:, 1:],
            ref_logp=ref_logp,
            advantages=sharding.shard_batch(adv.reshape(-1), mesh),
        )
        t0 = time.perf_counter()
        if step == 0:
            compiled = update.lower(params, opt_state, batch).compile()
            out["update_compile_s"] = time.perf_counter() - t0
            print(f"update compiled, peak RSS {rss_mb():,.0f} MB", file=sys.stderr)
            mem = compiled.memory_analysis()
            if mem is not None:
                out["update_memory_per_device"] = dict(
                    argument_bytes=mem.argument_size_in_bytes,
                    temp_bytes=mem.temp_size_in_bytes,
                    output_bytes=mem.output_size_in_bytes,
                    alias_bytes=mem.alias_size_in_bytes,
                    peak_bytes=mem.argument_size_in_bytes
                    + mem.temp_size_in_bytes
                    + mem.output_size_in_bytes
                    - mem.alias_size_in_bytes,
                )
                print(
                    f"update memory per device: {out['update_memory_per_device']}", file=sys.stderr
                )
            t0 = time.perf_counter()
        params, opt_state, loss = compiled(params, opt_state, batch)
        row["loss"] = float(loss)
        row["update_s"] = time.perf_counter() - t0
        sampler.update_weights(params, version=step + 1)  # the updated policy samples next
        row["rss_mb"] = rss_mb()
        steps.append(row)
        print(f"step {step}: {row}", file=sys.stderr)
    out["steps"] = steps
    out["peak_rss_mb"] = rss_mb()
    out["param_bytes_per_device"] = sum(
        x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(params)
    )
    if args.out:
        common.write_json(out, args.out)
    else:
        import json

        print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
