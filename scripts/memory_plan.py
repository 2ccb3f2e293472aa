r"""Per-device bytes of an RL update: the arithmetic beside XLA's compiled memory analysis.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \
        python scripts/memory_plan.py --model 0.5b --fsdp 8 --out /tmp/plan.json

For a Qwen2.5 shape (0.5b, 7b, 32b), a Gemma 3 one (gemma3-12b, gemma3-27b) or Qwen3-30B-A3B's
(30b-a3b: 128 experts, top 8, split over fsdp: expert parallelism; the experts' ragged form, as
on an accelerator), builds the policy abstractly (`nnx.eval_shape`: no
weights are allocated), shards it over a (data, fsdp, tensor) mesh of fake CPU devices and
compiles the jitted update the trainer runs (`train_step.make_update_fn`: value and
gradient of a policy-gradient loss through the chunked output layer, clip + AdamW, state
donated) for `--rows` rows of `--seq` tokens per microbatch. Nothing executes: the figures
are `compiled.memory_analysis()` per device (arguments, temporaries) beside the
arithmetic of docs/scaling.md (parameters, gradients, Adam's two moments, saved
activations, one gathered layer, the vocab-parallel logits chunk). `--lora R` trains rank-R adapters on every projection
instead (the base an argument, not differentiated, no optimizer state).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402  (the repository root on the path first)

QWEN2_5 = {  # Hugging Face config.json of Qwen/Qwen2.5-{0.5B,7B,32B}
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                 num_kv_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
               num_kv_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "32b": dict(hidden_size=5120, intermediate_size=27648, num_layers=64, num_heads=40,
                num_kv_heads=8, vocab_size=152064, tie_word_embeddings=False),
}  # fmt: skip
GEMMA3 = {  # the text_config of google/gemma-3-{12b,27b}-it's config.json
    "gemma3-12b": dict(hidden_size=3840, intermediate_size=15360, num_hidden_layers=48,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                       query_pre_attn_scalar=256),
    "gemma3-27b": dict(hidden_size=5376, intermediate_size=21504, num_hidden_layers=62,
                       num_attention_heads=32, num_key_value_heads=16, head_dim=128,
                       query_pre_attn_scalar=168),
}  # fmt: skip
GEMMA3_COMMON = dict(architectures=["Gemma3ForCausalLM"], vocab_size=262208,
                     sliding_window=1024, sliding_window_pattern=6, rope_theta=1e6,
                     rope_local_base_freq=1e4, rope_scaling=dict(rope_type="linear", factor=8.0),
                     max_position_embeddings=131072, tie_word_embeddings=True)  # fmt: skip
QWEN3_MOE = {  # Hugging Face config.json of Qwen/Qwen3-30B-A3B
    "30b-a3b": dict(hidden_size=2048, intermediate_size=6144, num_layers=48, num_heads=32,
                    num_kv_heads=4, head_dim=128, vocab_size=151936, tie_word_embeddings=False,
                    num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                    norm_topk_prob=True, qk_norm=True, moe_impl="ragged"),
}  # fmt: skip
SHAPES = {**QWEN2_5, **GEMMA3, **QWEN3_MOE}


def model_config(name: str, **kw):
    """The `ModelConfig` of a shape name (a Qwen2.5, Gemma 3 or Qwen3-MoE config.json's
    fields); kw: ModelConfig fields to set (dtype, remat)."""
    from jaxrl_frontier.models import hf
    from jaxrl_frontier.models.layers import ModelConfig

    if name in GEMMA3:
        return hf.config_from_hf({**GEMMA3_COMMON, **GEMMA3[name]}).replace(**kw)
    if name in QWEN3_MOE:
        return ModelConfig(**QWEN3_MOE[name], rope_theta=1e6, family="qwen3_moe", **kw)
    return ModelConfig(**QWEN2_5[name], qkv_bias=True, rope_theta=1e6, family="qwen2", **kw)


def parse(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="0.5b", choices=sorted(SHAPES), help="a model shape")
    p.add_argument("--data", type=int, default=1, help="mesh axis data (devices)")
    p.add_argument("--fsdp", type=int, default=8, help="mesh axis fsdp (devices)")
    p.add_argument("--tensor", type=int, default=1, help="mesh axis tensor (devices)")
    p.add_argument("--rows", type=int, default=8, help="rows per microbatch (all devices)")
    p.add_argument("--seq", type=int, default=512, help="tokens per row")
    p.add_argument("--dtype", default="bfloat16", help="compute dtype (params stay f32)")
    p.add_argument(
        "--remat", default="full", choices=("none", "full", "dots_saveable"), help="model.remat"
    )
    p.add_argument("--chunk", type=int, default=512, help="positions per output-layer chunk")
    p.add_argument("--lora", type=int, default=0, help="LoRA rank (0: full fine-tune)")
    p.add_argument("--out", default="", help="write the plan here as JSON")
    return p.parse_args(argv)


def arithmetic(cfg, n_params: int, trained: int, args) -> dict:
    """The docs/scaling.md estimate per device, in bytes (f32 parameters and Adam; remat
    'full': the saved activations are each block's input)."""
    shards = args.fsdp * args.tensor  # every weight is split over fsdp x tensor
    batch_devices = args.data * args.fsdp
    act = 2 if args.dtype == "bfloat16" else 4
    rows = args.rows // batch_devices
    layer = n_params - cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    layer //= cfg.num_layers
    # an MoE layer's experts stay split (expert parallelism): only the rest is gathered
    layer -= 3 * cfg.num_experts * cfg.hidden_size * cfg.moe_intermediate_size
    saved = cfg.num_layers * rows * args.seq * cfg.hidden_size * act  # remat=full: block inputs
    vocab = cfg.vocab_size * cfg.hidden_size
    out = dict(
        params=4 * n_params // shards,
        grads=4 * trained // shards,
        optimizer_update=4 * trained // shards,  # AdamW's update tree, before it is applied
        adam=8 * trained // shards,
        saved_activations=saved,
        gathered_layer=layer * act,  # one layer's weights, cast, gathered whole
        # the output layer [D, V] is split by vocabulary over fsdp x tensor and never
        # gathered (vocab-parallel logits): its cast share only
        output_layer_share=vocab * act // shards,
        # one chunk of f32 logits and its gradient: the chunk's positions of the fsdp
        # group's rows on this device's V / (fsdp x tensor) share, rows x chunk x V x 4 x 2
        logits_chunk=rows * min(args.chunk, args.seq) * cfg.vocab_size * 8 // args.tensor,
    )
    out["arguments"] = out["params"] + out["adam"]
    out["temporaries"] = sum(out[k] for k in out if k not in ("params", "adam", "arguments"))
    return out


def abstract_state(tx, params, mesh):
    """The TrainState of `train_step.init_train_state` as ShapeDtypeStructs with its
    shardings (Adam's moments sharded like their parameters, the rest replicated)."""
    import jax
    import jax.numpy as jnp
    import optax

    from jaxrl_frontier.core import sharding
    from jaxrl_frontier.rl.learn.train_step import TrainState

    repl = sharding.replicated(mesh)
    opt = jax.eval_shape(tx.init, params)
    opt_sh = optax.tree_map_params(
        tx,
        lambda _, s: s,
        opt,
        jax.tree.map(lambda x: x.sharding, params),
        transform_non_params=lambda _: repl,
    )
    opt = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), opt, opt_sh)
    scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=repl)
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=repl)
    return TrainState(params=params, opt_state=opt, step=scalar, rng=rng, skipped=scalar)


def main(argv=None) -> dict:
    args = parse(argv)
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from jaxrl_frontier.core import sharding
    from jaxrl_frontier.models import lora
    from jaxrl_frontier.models.transformer import Transformer
    from jaxrl_frontier.objectives import logprobs
    from jaxrl_frontier.rl.learn.forward import apply_hidden
    from jaxrl_frontier.rl.learn.learner import with_base
    from jaxrl_frontier.rl.learn.train_step import make_update_fn

    cfg = model_config(args.model, dtype=args.dtype, remat=args.remat)
    mesh = sharding.make_mesh((args.data, args.fsdp, args.tensor))

    def build():
        model = Transformer(cfg, rngs=nnx.Rngs(0))
        if args.lora:
            lora.add_adapters(model, rank=args.lora, alpha=2.0 * args.lora,
                              targets=tuple(lora.TARGETS), key=jax.random.key(1))  # fmt: skip
        return model

    abstract = nnx.eval_shape(build)
    graphdef, state = nnx.split(abstract)
    state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        state,
        sharding.state_shardings(state, mesh),
    )
    base = None
    params = state
    if args.lora:
        params, base = lora.split(state)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6))
    train_state = abstract_state(tx, params, mesh)
    hidden_fn = apply_hidden(graphdef)

    def loss_of(p, batch, denominator=None, frozen=None):  # -mean(A * log pi), chunked
        hidden, w_out = hidden_fn(p, batch["tokens"], batch["attention_mask"])
        logp = logprobs.token_logprobs_from_hidden(hidden, w_out, batch["tokens"], args.chunk, 1)
        return -jnp.mean(logp * batch["advantages"]), {}

    batch_sh = sharding.batch_sharding(mesh, 2)
    shape = (args.rows, args.seq)
    batch = {
        "tokens": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=batch_sh),
        "attention_mask": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=batch_sh),
        "advantages": jax.ShapeDtypeStruct(shape, jnp.float32, sharding=batch_sh),
    }
    state_sh = jax.tree.map(lambda x: x.sharding, train_state)
    batch_shardings = {k: batch_sh for k in batch}
    t0 = time.perf_counter()
    if base is None:
        update = make_update_fn(graphdef, tx, loss_of, 1, state_sh, batch_shardings)
        lowered = update.lower(train_state, batch)
    else:
        frozen = {"base": base}
        frozen_sh = jax.tree.map(lambda x: x.sharding, frozen)
        update = make_update_fn(graphdef, tx, with_base(loss_of), 1, state_sh, batch_shardings,
                                frozen_sharding=frozen_sh)  # fmt: skip
        lowered = update.lower(train_state, batch, frozen)
    stats = lowered.compile().memory_analysis()
    seconds = time.perf_counter() - t0
    n_params = sum(x.size for x in jax.tree.leaves(state))
    trained = sum(x.size for x in jax.tree.leaves(params))
    out = dict(
        model=args.model,
        mesh=dict(data=args.data, fsdp=args.fsdp, tensor=args.tensor),
        rows=args.rows,
        seq=args.seq,
        dtype=args.dtype,
        remat=args.remat,
        lora_rank=args.lora,
        logprob_chunk=args.chunk,
        params=n_params,
        trained_params=trained,
        estimate=arithmetic(cfg, n_params, trained, args),
        compiled=dict(
            arguments=stats.argument_size_in_bytes,
            temporaries=stats.temp_size_in_bytes,
            outputs=stats.output_size_in_bytes,
            aliased=stats.alias_size_in_bytes,
        ),
        compile_seconds=round(seconds, 1),
        machine=common.machine_info(),
    )
    print(json.dumps(out, indent=1))
    if args.out:
        common.write_json(out, args.out, echo=False)
    return out


if __name__ == "__main__":
    main()
