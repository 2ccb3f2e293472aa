r"""Per-device memory of the trainer's programs under FSDP on fake CPU devices, nothing run.

    python benchmarks/bench.py memory                          # 100m, fsdp 8 vs 1 device
    python benchmarks/bench.py memory --model 0.5b --remat full --seq 48 --prompt-len 16 \
        --programs prefill,decode,reference,update --config=configs/qwen_math.py --no-compare
    python benchmarks/bench.py memory --model 7b --lora 16 --remat full --dtype bfloat16 \
        --rows 8 --seq 512 --no-compare

In a child process with `--devices` fake CPU devices, builds the policy abstractly
(`nnx.eval_shape`: no weights allocated, so 32B compiles in about 30 s), shards it over a
(data, fsdp, tensor) mesh and compiles the programs of an RL step as the trainer builds
them: the sampler's prefill and decode (`Sampler.program`), the reference's log-prob pass
(`forward.make_logp_fn` with the update's layout) and the update of a `rl.learn.Learner`
(its objective and optimizer from `--config`, default the base config: loss, clip + AdamW,
state donated; with `--lora R` the adapters train and the base is a frozen argument).
A step of `--rows` rows of `--seq` tokens, the last `--seq - --prompt-len` of them the
completion, in groups of `--group-size`.

Per program and device: `compiled.memory_analysis()`'s arguments, temporaries, outputs,
aliased (donated) bytes and the peak they add up to (arguments + temporaries + outputs -
aliased); the state's bytes (parameters, optimizer state) from its shardings; and for the
update the arithmetic of docs/scaling.md beside it (`estimate`). With `--compare` (the
default) the same on one device and, for `--remat none`, with `remat=full`: the ratios
benchmarks/targets.py judges (FSDP on N devices holds 1/N of the state, and the update's
peak is at most 1/N of one device's plus one layer's gathered weights).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

from benchmarks import common
from benchmarks.train import TRAIN_MODELS

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
LLAMA = {k: v for k, v in TRAIN_MODELS.items() if k != "0.5b"}  # tiny, 25m, 100m (tied)
SHAPES = (*LLAMA, *QWEN2_5, *GEMMA3, *QWEN3_MOE)
PROGRAMS = ("prefill", "decode", "reference", "update")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="100m", choices=SHAPES, help="a model shape")
    p.add_argument("--devices", type=int, default=8, help="fake CPU devices")
    p.add_argument(
        "--mesh",
        default="",
        help="DATAxFSDPxTENSOR or DATAxFSDPxSEQUENCExTENSOR (default 1x<devices>x1)",
    )
    p.add_argument("--programs", default="update", help=f"comma-separated, from {PROGRAMS}")
    p.add_argument("--rows", type=int, default=8, help="rows of a step (all devices)")
    p.add_argument("--seq", type=int, default=64, help="tokens per row")
    p.add_argument("--prompt-len", type=int, default=16, help="the prompt's part of --seq")
    p.add_argument("--group-size", type=int, default=4, help="completions per prompt")
    p.add_argument("--dtype", default="float32", help="compute dtype (params stay f32)")
    p.add_argument("--remat", default="none", choices=("none", "full", "dots_saveable"))
    p.add_argument("--lora", type=int, default=0, help="LoRA rank (0: full fine-tune)")
    p.add_argument(
        "--moe-dispatch",
        default="gather",
        choices=("gather", "all_to_all"),
        help="an MoE shape's token dispatch (model.moe.dispatch)",
    )
    p.add_argument("--capacity-factor", type=float, default=0.0, help="all_to_all's (0: dropless)")
    p.add_argument(
        "--attention",
        default="xla",
        help="model.attention ('ring': ring attention over the mesh's sequence axis)",
    )
    p.add_argument(
        "--compare",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also on 1 device (and with remat=full): the FSDP ratios",
    )


def bench_memory(args) -> dict:
    """Per-device bytes of the trainer's programs under FSDP on N fake CPU devices (and 1)."""
    unknown = set(args.programs.split(",")) - set(PROGRAMS)
    if unknown:
        raise SystemExit(f"--programs: unknown {sorted(unknown)}; allowed: {', '.join(PROGRAMS)}")
    env = dict(os.environ)
    flag = f"--xla_force_host_platform_device_count={args.devices}"
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flag).strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(common.REPO), env.get("PYTHONPATH")]))
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    code = (
        "import json, sys; from benchmarks import memory; "
        "print('@@' + json.dumps(memory.measure(json.loads(sys.argv[1]))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(settings)], env=env, capture_output=True, text=True
    )
    if proc.returncode:
        raise RuntimeError(f"memory child failed:\n{proc.stderr[-4000:]}")
    line = [x for x in proc.stdout.splitlines() if x.startswith("@@")][-1]
    result = dict(**json.loads(line[2:]), settings=settings)
    result["xla_flags"] = env["XLA_FLAGS"]
    return result


# ----------------------------------------------------------------------------- the child


def model_config(
    name: str,
    dtype: str,
    remat: str,
    dispatch: str = "gather",
    capacity_factor: float = 0.0,
    attention: str = "xla",
):
    """The `ModelConfig` of a shape name (`remat` 'none' -> off; an MoE shape's dispatch;
    `attention`: model.attention)."""
    from jaxrl_frontier.models import hf
    from jaxrl_frontier.models.model_config import ModelConfig

    kw = dict(dtype=dtype, remat=False if remat == "none" else remat, attention=attention)
    if name in LLAMA:
        return ModelConfig(**LLAMA[name], tie_word_embeddings=True, family="llama",
                           max_position_embeddings=4096, **kw)  # fmt: skip
    if name in GEMMA3:
        return hf.config_from_hf({**GEMMA3_COMMON, **GEMMA3[name]}).replace(**kw)
    if name in QWEN3_MOE:
        moe = dict(moe_dispatch=dispatch, moe_capacity_factor=capacity_factor)
        return ModelConfig(**QWEN3_MOE[name], rope_theta=1e6, family="qwen3_moe", **kw, **moe)
    return ModelConfig(**QWEN2_5[name], qkv_bias=True, rope_theta=1e6, family="qwen2", **kw)


def abstract_policy(cfg, mesh, lora_rank: int):
    """(graphdef, the whole state, the trained params, the frozen base or None), each leaf a
    ShapeDtypeStruct with the sharding the trainer gives it (nothing allocated)."""
    import jax
    from flax import nnx

    from jaxrl_frontier.core import sharding
    from jaxrl_frontier.models import lora
    from jaxrl_frontier.models.transformer import Transformer

    def build():
        model = Transformer(cfg, rngs=nnx.Rngs(0))
        if lora_rank:
            lora.add_adapters(model, rank=lora_rank, alpha=2.0 * lora_rank,
                              targets=tuple(lora.TARGETS), key=jax.random.key(1))  # fmt: skip
        return model

    graphdef, state = nnx.split(nnx.eval_shape(build))
    state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        state,
        sharding.state_shardings(state, mesh),
    )
    params, base = lora.split(state) if lora_rank else (state, None)
    return graphdef, state, params, base


def abstract_train_state(tx, params, mesh):
    """The TrainState of `train_step.init_train_state` as ShapeDtypeStructs with its
    shardings (the optimizer's moments sharded like their parameters, the rest replicated)."""
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


def bytes_per_device(tree) -> int:
    """Bytes one device holds of a tree of sharded ShapeDtypeStructs (its shard of each)."""
    import math

    import jax

    return sum(
        math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree)
    )


def estimate(cfg, n_params: int, trained: int, s: dict, mesh_shape) -> dict:
    """The update's docs/scaling.md estimate per device, in bytes (f32 parameters and Adam;
    remat 'full': the saved activations are each block's input)."""
    from jaxrl_frontier.objectives.logprobs import DEFAULT_LOGPROB_CHUNK

    data, fsdp, seq, tensor = mesh_shape  # seq: the sequence axis splits every row's positions
    shards, act = fsdp * tensor, 2 if s["dtype"] == "bfloat16" else 4
    rows = max(s["rows"] // (data * fsdp), 1)
    layer = n_params - cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    layer //= cfg.num_layers
    # an MoE layer's experts stay split (expert parallelism): only the rest is gathered
    layer -= 3 * cfg.num_experts * cfg.hidden_size * cfg.moe_intermediate_size
    vocab = cfg.vocab_size * cfg.hidden_size
    out = dict(
        params=4 * n_params // shards,
        grads=4 * trained // shards,
        optimizer_update=4 * trained // shards,  # AdamW's update tree, before it is applied
        adam=8 * trained // shards,
        saved_activations=cfg.num_layers * rows * s["seq"] // seq * cfg.hidden_size * act,
        gathered_layer=layer * act,  # one layer's weights, cast, gathered whole
        # the output layer [D, V] is split by vocabulary and never gathered: its cast share
        output_layer_share=vocab * act // shards,
        # one chunk of f32 logits and its gradient on this device's V / shards share
        logits_chunk=rows * min(DEFAULT_LOGPROB_CHUNK, s["seq"]) * cfg.vocab_size * 8 // tensor,
    )
    out["arguments"] = out["params"] + out["adam"]
    out["temporaries"] = sum(out[k] for k in out if k not in ("params", "adam", "arguments"))
    return out


def _config(config_args: list[str]):
    """The experiment config whose objective and optimizer the update runs (default: the
    base config's)."""
    from jaxrl_frontier.run import config as config_lib

    if not any(a.startswith("--config=") for a in config_args):
        if config_args:
            raise SystemExit(f"{' '.join(config_args)}: --config.KEY needs a --config=FILE")
        return config_lib.base_config()
    return common.load_config(config_args, "")


def measure_mesh(s: dict, mesh_shape: tuple[int, ...], remat: str) -> dict:
    """One mesh: the state's bytes, each program's compiled memory, the update's estimate."""
    import jax

    from jaxrl_frontier.core import sharding
    from jaxrl_frontier.rl.learn.learner import Learner, LearnerOptions, update_layout
    from jaxrl_frontier.rl.learn.optimizer import OptimizerSection, build_optimizer
    from jaxrl_frontier.run.build import objective_section

    devices = jax.devices()[: math.prod(mesh_shape)]
    mesh = sharding.make_mesh(mesh_shape, devices)
    mesh_shape = tuple(mesh.shape[a] for a in sharding.MESH_AXES)
    moe = (s.get("moe_dispatch", "gather"), s.get("capacity_factor", 0.0))
    cfg = model_config(s["model"], s["dtype"], remat, *moe, s.get("attention", "xla"))
    graphdef, state, params, base = abstract_policy(cfg, mesh, s["lora"])
    config = _config(s["config_args"])
    tx = build_optimizer(OptimizerSection(**config.optimizer.to_dict()), 1000)
    train_state = abstract_train_state(tx, params, mesh)
    n_params = sum(x.size for x in jax.tree.leaves(state))
    trained = sum(x.size for x in jax.tree.leaves(params))
    row = dict(
        mesh=dict(zip(sharding.MESH_AXES, mesh_shape)),
        remat=remat,
        params_bytes=bytes_per_device(state),
        opt_state_bytes=bytes_per_device(train_state.opt_state),
    )
    row["total_bytes"] = row["params_bytes"] + row["opt_state_bytes"]
    rows, tn, g = s["rows"], s["seq"] - s["prompt_len"], s["group_size"]
    options = LearnerOptions(
        objective=objective_section(config.objective), rows=rows, group_size=g, completion_len=tn
    )
    learner = Learner(graphdef, tx, train_state, options, mesh=mesh, model_cfg=cfg, base=base,
                      log=lambda _: None)  # fmt: skip
    layout = update_layout(rows=rows, group_size=g, completion_len=tn, mesh=mesh, share_prompt=True)
    wanted = s["programs"].split(",")
    row["programs"] = {
        name: run_program(name, s, cfg, mesh, graphdef, state, learner, layout)
        for name in PROGRAMS
        if name in wanted
    }
    if "update" in wanted:
        row["estimate"] = estimate(cfg, n_params, trained, s, mesh_shape)
    row.update(params=n_params, trained_params=trained, layout=layout)
    return row


def run_program(name, s, cfg, mesh, graphdef, state, learner, layout) -> dict:
    """Compile one program of the step on abstract inputs; its memory and compile time."""
    import jax
    import jax.numpy as jnp

    from jaxrl_frontier.core import sharding
    from jaxrl_frontier.objectives import losses
    from jaxrl_frontier.rl.experience import UPDATE_FIELDS
    from jaxrl_frontier.rl.learn.forward import make_logp_fn
    from jaxrl_frontier.sampling import Sampler, SamplingParams
    from jaxrl_frontier.sampling.params import Knobs, Plan

    t0 = time.perf_counter()
    rows, seq, tp, g = s["rows"], s["seq"], s["prompt_len"], s["group_size"]
    batch_sh = sharding.batch_sharding(mesh, 2)
    tokens = jax.ShapeDtypeStruct((rows, seq), jnp.int32, sharding=batch_sh)
    if name == "update":
        f32 = jax.ShapeDtypeStruct((rows, seq), jnp.float32, sharding=batch_sh)
        needed = {f for fields in losses.required_fields(learner.options.objective).values()
                  for f in fields}  # fmt: skip
        batch = {k: tokens if k in ("tokens", "attention_mask") else f32 for k in UPDATE_FIELDS}
        batch.update({k: f32 for k in needed & {"ref_logp", "teacher_logp"}})
        _, update = learner.programs(batch)
        frozen = () if learner.frozen is None else (learner.frozen,)
        lowered = update.lower(learner.state, batch, *frozen)
    elif name == "reference":
        lowered = make_logp_fn(graphdef, **layout).lower(state, tokens, tokens)
    else:  # the sampler's prefill or decode, prompts padded to the batch devices' multiple
        prompts_n = rows // g
        m = sharding.batch_size_multiple(mesh)
        sampled = -(-prompts_n // m) * m
        nnx_model = __import__("flax").nnx.merge(graphdef, state)
        sampler = Sampler(nnx_model, pad_id=0, mesh=mesh, prompt_buckets=(tp,))
        sp = SamplingParams(max_new_tokens=seq - tp, n=g)
        knobs, key = Knobs.of(sp), jax.random.key(0)
        prompts = jax.ShapeDtypeStruct((sampled, tp), jnp.int32, sharding=batch_sh)
        prefill = sampler.program("prefill", sampled * tp)
        lowered = prefill.lower(state, prompts, prompts, key, knobs, n=g, use_dropout=False,
                                slots=seq - tp)  # fmt: skip
        if name == "decode":
            compiled = lowered.compile()
            cache, logits0, prompt_len = jax.tree.map(
                lambda i, sh: jax.ShapeDtypeStruct(i.shape, i.dtype, sharding=sh),
                lowered.out_info,
                compiled.output_shardings,
            )
            decode = sampler.program("decode", sampled * g)
            lowered = decode.lower(state, cache, logits0, prompt_len, (prompts, prompts), key,
                                   knobs, jnp.int32(0), plan=Plan.of(sp))  # fmt: skip
    row = common.compiled_memory(lowered.compile())
    row["compile_s"] = round(time.perf_counter() - t0, 1)
    print(name, json.dumps(row), file=sys.stderr, flush=True)
    return row


def measure(s: dict) -> dict:
    """In the child: every mesh's row, and with `compare` the FSDP ratios."""
    import jax

    n = jax.device_count()
    shape = tuple(int(x) for x in s["mesh"].split("x")) if s["mesh"] else (1, n, 1)
    label = f"fsdp_{n}" if shape == (1, n, 1) else "mesh_" + "x".join(map(str, shape))
    out = dict(model=s["model"], devices=n, **common.machine_info())
    out[label] = measure_mesh(s, shape, s["remat"])
    if s["compare"]:
        out["1_device"] = measure_mesh(s, (1, 1, 1), s["remat"])
        if s["remat"] == "none":
            out[f"{label}_remat_full"] = measure_mesh(s, shape, "full")
        out.update(fsdp_ratios(out, out["1_device"], out[label], label, s))
    return out


def fsdp_ratios(out: dict, one: dict, many: dict, label: str, s: dict) -> dict:
    """The state and the update's bytes on one device over those on the mesh; the peak bound
    1/N of one device's peak plus one layer's gathered weights (`param_dtype` bytes)."""
    import jax.numpy as jnp

    moe = (s.get("moe_dispatch", "gather"), s.get("capacity_factor", 0.0))
    cfg = model_config(s["model"], s["dtype"], s["remat"], *moe)
    layer = (
        cfg.num_params()
        - cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
        - cfg.hidden_size
    ) // cfg.num_layers
    n = out["devices"]
    ratios = dict(
        ratio_total=one["total_bytes"] / many["total_bytes"],
        one_layer_param_bytes=layer * jnp.dtype(cfg.param_dtype).itemsize,
    )
    if "update" in one["programs"]:
        u1, un = one["programs"]["update"], many["programs"]["update"]
        ratios.update(
            ratio_compiled_arguments=u1["arguments"] / un["arguments"],
            ratio_compiled_temps=u1["temporaries"] / un["temporaries"],
            ratio_compiled_peak=u1["peak"] / un["peak"],
            peak_bound_bytes=u1["peak"] / n + ratios["one_layer_param_bytes"],
        )
        remat = out.get(f"{label}_remat_full")
        if remat:
            ratios["ratio_compiled_peak_remat_full"] = (
                u1["peak"] / remat["programs"]["update"]["peak"]
            )
    return ratios
