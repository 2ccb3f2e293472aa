"""Train-step MFU: the trainer's own jitted update (`Learner.update_program`, the program
`Learner.update` runs; `SFTStep.update` for SFT: forward, backward, clip + AdamW) on random
Llama-shaped models, against a matmul peak measured in the same run (per-device memory
under FSDP: benchmarks/memory.py, `bench.py memory`).

    python benchmarks/bench.py train
    python benchmarks/bench.py train --models 25m --variants rl_plain,rl_fused --repeats 3
    python benchmarks/bench.py train --models tiny --batches tiny=16 --seq 48 \
        --variants rl_fused,rl_fused+unroll,rl_fused+dpa,rl_plain+unroll

`bench_mfu(args)` is registered in benchmarks/bench.py as `train` (with the padded vs packed
workload of train_spread.py), with `add_mfu_arguments`.

FLOPs of one step (stated in the JSON as `flops_formula`):

    6 * (N_nonembed + V * D) * B * T  +  12 * L * T^2 * D * B

N_nonembed: every parameter but the input embedding (a gather, no FLOPs); V * D: the output
layer (a matmul in every step, whether or not tied); 12 L T^2 D per sequence: q.k and p.v,
forward and backward (PaLM's appendix B; the causal mask is not halved). MFU = FLOPs /
step seconds / matmul peak, where the peak is the best of a 2048^2 f32 and bf16 jnp matmul
measured in the same run (same threads, same neighbours on a shared machine), timed
round-robin with the steps; `mfu` is the median over rounds, `mfu_best` the best step over
the best peak. Compile time is reported apart.

A variant is a loss (`rl_plain`: full logits; `rl_fused`: the chunked output layer +
log-softmax; `sft_fused`; `rl_fused_remat`) with model options after `+`
(`VARIANT_OPTIONS`): `+unroll` runs the layers unrolled (`model.scan_unroll = 0`), `+dpa`
through `jax.nn.dot_product_attention` (`model.attention`), `+cudnn` its cuDNN kernel (GPU,
bf16); e.g. `rl_fused+unroll+dpa`. `tiny` is benchmarks/configs/random_qwen2.py's tiny model
(tied here), at the GRPO benchmark's update shape with `--batches tiny=16 --seq 48`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import common

# Llama-shaped (no qkv bias), GQA, tied embeddings.
TRAIN_MODELS = {
    "tiny": dict(  # random_qwen2:tiny's shape: 3.0M in the blocks + 0.1M tied embedding
        vocab_size=512,
        hidden_size=256,
        intermediate_size=768,
        num_layers=4,
        num_heads=8,
        num_kv_heads=2,
    ),
    "25m": dict(  # 23.6M in the blocks + 4.2M tied embedding = 27.8M
        vocab_size=8192,
        hidden_size=512,
        intermediate_size=1408,
        num_layers=8,
        num_heads=8,
        num_kv_heads=4,
    ),
    "100m": dict(  # 75.5M in the blocks + 24.6M tied embedding = 100.1M
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_layers=12,
        num_heads=12,
        num_kv_heads=4,
    ),
    "0.5b": common.QWEN2_5_0_5B,  # without qkv bias: for a GPU
    "smollm2": dict(  # SmolLM2-135M-Instruct's shape (a GPU without the checkpoint's file)
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
    ),
}
DEFAULT_BATCH = {"tiny": 16, "25m": 4, "100m": 2, "0.5b": 16, "smollm2": 4}
CHECKPOINT_BATCH = 4  # a checkpoint's shape not in DEFAULT_BATCH (--batches NAME=B sets it)
VARIANTS = ("rl_plain", "rl_fused", "sft_fused", "rl_fused_remat")
# a variant's "+name" suffixes -> ModelConfig options (the config keys model.scan_unroll and
# model.attention)
VARIANT_OPTIONS = {
    "unroll": dict(scan_unroll=0),
    "dpa": dict(attention="dot_product"),
    "cudnn": dict(attention="cudnn"),
}


def split_variant(variant: str) -> tuple[str, dict]:
    """'rl_fused+unroll+dpa' -> ('rl_fused', the ModelConfig options of its suffixes)."""
    loss, *names = variant.split("+")
    unknown = [n for n in names if n not in VARIANT_OPTIONS] + [loss] * (loss not in VARIANTS)
    if unknown:
        raise ValueError(
            f"variant {variant!r}: unknown {unknown}; losses {VARIANTS}, options "
            f"{tuple(VARIANT_OPTIONS)} after '+'"
        )
    options = {}
    for name in names:
        options.update(VARIANT_OPTIONS[name])
    return loss, options


FLOPS_FORMULA = "6 * (N_nonembed + V*D) * B*T + 12 * L * T^2 * D * B"


median_time, matmul_peak = common.median_time, common.matmul_peak


def model_config(name: str, dtype: str = "float32", remat: bool | str = False, **options):
    """The shape `name` names: a `TRAIN_MODELS` entry, or a checkpoint (a pretrained name,
    .gguf file or Hugging Face directory: its config.json's shape; the benchmark's weights
    are random, an update's cost does not depend on their values)."""
    from jaxrl_frontier.models.model_config import ModelConfig

    if name not in TRAIN_MODELS:
        from jaxrl_frontier.models.architectures import config_from_hf

        cfg = config_from_hf(common.checkpoint_of(name)["config"])
        return cfg.replace(dtype=dtype, remat=remat, **options)
    return ModelConfig(
        **TRAIN_MODELS[name],
        tie_word_embeddings=True,
        dtype=dtype,
        family="llama",
        max_position_embeddings=4096,
        remat=remat,
        **options,
    )


def train_step_flops(cfg, batch: int, seq: int) -> dict:
    """Model FLOPs of one train step (see the module docstring)."""
    emb = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    nonembed = cfg.num_params() - emb
    tokens = batch * seq
    dense = 6 * (nonembed + cfg.vocab_size * cfg.hidden_size) * tokens
    attn = 12 * cfg.num_layers * seq**2 * cfg.num_heads * cfg.resolved_head_dim * batch
    return dict(
        params=cfg.num_params(),
        params_nonembedding=nonembed,
        tokens=tokens,
        dense_gflops=dense / 1e9,
        attention_gflops=attn / 1e9,
        gflops=(dense + attn) / 1e9,
        kaplan_gflops=6 * nonembed * tokens / 1e9,  # 6 N_nonembed only, for comparison
    )


def build_model(cfg, mesh=None, seed: int = 0):
    """A Transformer with random weights drawn by numpy (fast at any size), placed on `mesh`."""

    from jaxrl_frontier.core import sharding
    from jaxrl_frontier.models.random_init import random_model

    model = random_model(cfg, seed=seed, std=0.02)
    if mesh is not None:
        model = sharding.shard_model(model, mesh)
    return model


def make_state(params, tx, mesh):
    """A TrainState like the trainer's (`init_train_state`: optimizer state placed like the params)."""
    import jax
    import jax.numpy as jnp

    from jaxrl_frontier.core import sharding
    from jaxrl_frontier.rl.learn.train_step import TrainState, init_opt_state

    repl = sharding.replicated(mesh)
    opt_state = init_opt_state(tx, params, mesh)
    return TrainState(
        params=params,
        opt_state=opt_state,
        step=jax.device_put(jnp.zeros((), jnp.int32), repl),
        rng=jax.device_put(jax.random.key_data(jax.random.key(0)), repl),
        skipped=jax.device_put(jnp.zeros((), jnp.int32), repl),
    )


def rl_batch(vocab: int, batch: int, seq: int, prompt_len: int, seed: int = 0) -> dict:
    """A synthetic GRPO minibatch: all positions real, loss on the completion part."""
    rng = np.random.default_rng(seed)
    loss_mask = np.zeros((batch, seq), np.float32)
    loss_mask[:, prompt_len:] = 1.0
    adv = rng.standard_normal((batch, 1)).astype(np.float32)
    return dict(
        tokens=rng.integers(1, vocab, (batch, seq)).astype(np.int32),
        attention_mask=np.ones((batch, seq), np.int32),
        loss_mask=loss_mask,
        old_logp=(-rng.exponential(2.0, (batch, seq)) * loss_mask).astype(np.float32),
        advantages=(adv * loss_mask).astype(np.float32),
    )


def _update_fn(variant: str, graphdef, tx, state, mesh, batch_keys, cfg, rows: int):
    """The jitted update a variant times: the trainer's own programs where it has one.

    rl_fused / rl_fused_remat: `Learner.update_program`, the program `Learner.update` runs
    (GRPO: the base config's objective, whole rows, no shared prompt); sft_fused: the
    `SFTStep`'s update; rl_plain: the same RL loss through the full [B, T, V] logits
    (`rl_loss(logprob_chunk=None)`), an ablation no trainer path runs."""
    import jax

    from jaxrl_frontier.core import sharding
    from jaxrl_frontier.rl.learn.learner import Learner, LearnerOptions
    from jaxrl_frontier.rl.learn.loss import rl_loss
    from jaxrl_frontier.rl.learn.train_step import make_update_fn
    from jaxrl_frontier.run import config as config_lib
    from jaxrl_frontier.run.build import objective_section
    from jaxrl_frontier.train.sft import SFTStep

    state_sh = jax.tree.map(lambda x: x.sharding, state)
    if variant.startswith("sft"):
        step = SFTStep(graphdef, tx, state_sh, mesh, task=None, tokenizer=None, grad_accum=1,
                       max_prompt_len=0, max_new_tokens=0)  # fmt: skip
        return step.update
    objective = objective_section(config_lib.base_config().objective)
    if variant.endswith("plain"):
        batch_sh = {k: sharding.batch_sharding(mesh, 2) for k in batch_keys}
        loss_of = rl_loss(graphdef, objective, logprob_chunk=None)
        return make_update_fn(graphdef, tx, loss_of, 1, state_sh, batch_sh)
    options = LearnerOptions(objective=objective, rows=rows, group_size=1, completion_len=0,
                             share_prompt=False)  # fmt: skip
    learner = Learner(graphdef, tx, state, options, mesh=mesh, model_cfg=cfg, log=lambda _: None)
    return learner.update_program(tuple(sorted(batch_keys)))


def prepare_train_step(name: str, variant: str, batch: int, seq: int, dtype: str, run: bool = True):
    """Build and compile the jitted update for one variant; returns (step, info, cfg):
    `step()` runs one update on the donated state and blocks; info has the compile time and
    the compiled step's memory analysis. A first run that fails (out of device memory) gives
    step None and the error in info."""
    import jax
    from flax import nnx

    from jaxrl_frontier.core import sharding
    from jaxrl_frontier.rl.learn.optimizer import OptimizerSection, build_optimizer

    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    loss, options = split_variant(variant)
    cfg = model_config(name, dtype, remat=loss.endswith("remat"), **options)
    model = build_model(cfg, mesh)
    graphdef, params = nnx.split(model)
    tx = build_optimizer(OptimizerSection(), 1000)
    state = make_state(params, tx, mesh)
    data = rl_batch(cfg.vocab_size, batch, seq, prompt_len=seq // 4)
    if loss.startswith("sft"):
        data = {k: data[k] for k in ("tokens", "attention_mask", "loss_mask")}
    update = _update_fn(loss, graphdef, tx, state, mesh, list(data), cfg, batch)
    data = sharding.shard_batch(data, mesh)

    t0 = time.perf_counter()
    info = dict(variant=variant, batch=batch, seq=seq, dtype=dtype)
    try:
        compiled = update.lower(state, data).compile()
    except Exception as e:  # e.g. cuDNN attention on a GPU or shape it does not take
        info["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        return None, info, cfg
    info["compile_s"] = time.perf_counter() - t0
    mem = common.compiled_memory(compiled)
    if mem is not None:
        info["temp_mib"] = mem["temporaries"] / common.MIB
        info["argument_mib"] = mem["arguments"] / common.MIB
    if not run:
        return None, info, cfg
    box = [state]

    def step():
        box[0], metrics = compiled(box[0], data)
        jax.block_until_ready((box[0], metrics))

    t0 = time.perf_counter()
    try:
        step()  # the first run (allocations) kept apart
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        info["error"] = str(e).splitlines()[0][:300]  # out of device memory: time the others
        return None, info, cfg
    info["first_run_s"] = time.perf_counter() - t0
    step.hlo_text = compiled.as_text()  # for `profile_update`
    return step, info, cfg


# An op's kind, by its HLO name and the JAX op it came from (`op_name` metadata): the
# matmuls (XLA:CPU's dots and YNNPACK fusions; a GPU's GEMM kernels), then data movement,
# then the rest, split by phase (forward, backward, the optimizer after the gradient).
MATMUL_OP = re.compile(r"^(dot|ynn_fusion|.*(gemm|xmma|cutlass|cublas|matmul))", re.I)
MOVE_OP = re.compile(
    r"^(copy|transpose|slice|dynamic-slice|dynamic-update-slice|wrapped_broadcast|"
    r"bitcast_dynamic-update-slice|dynamic-slice_bitcast|wrapped_copy)"
)


def op_category(name: str, op_names: dict[str, str]) -> str:
    """'matmul', 'data movement', or 'forward' / 'backward' / 'optimizer' elementwise and
    reductions, for an op event's name (`op_names`: HLO instruction -> its JAX op_name)."""
    if MATMUL_OP.match(name):
        return "matmul"
    if MOVE_OP.match(name):
        return "data movement"
    jax_op = op_names.get(name, "")
    if "transpose(jvp(" in jax_op:
        return "backward elementwise"
    if "jvp(" in jax_op:
        return "forward elementwise"
    return "optimizer and loss elementwise"


def profile_update(step, flops: float, calls: int = 3) -> dict:
    """Where an update's time goes: `calls` traced steps, each op event summed by
    `op_category`, in ms per step and as a share of the busy time; the matmuls' own
    GFLOP/s (the model FLOPs over their time) says how close they run to the peak."""
    import jax

    from benchmarks import decode_profile

    op_names = dict(re.findall(r'%([\w.-]+) = .*?op_name="([^"]+)"', step.hlo_text))
    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir, create_perfetto_trace=True):
            for _ in range(calls):
                step()
        events = decode_profile.op_events(decode_profile.load_trace(Path(log_dir)))
    ms = collections.defaultdict(float)
    for _, name, us in events:
        ms[op_category(name, op_names)] += us / 1e3 / calls
    busy = sum(ms.values())
    return dict(
        busy_ms_per_step=busy,
        ms_per_step=dict(sorted(ms.items(), key=lambda kv: -kv[1])),
        share={k: v / busy for k, v in ms.items()},
        matmul_gflops=flops / (ms["matmul"] / 1e3) / 1e9 if ms["matmul"] else None,
    )


def add_mfu_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload",
        default="mfu",
        choices=("mfu", "spread"),
        help="mfu: the train step's MFU; spread: padded vs packed rows (train_spread.py)",
    )
    p.add_argument("--steps", type=int, default=6, help="spread: RL steps per variant")
    p.add_argument("--warmup", type=int, default=2, help="spread: first steps left out")
    p.add_argument(
        "--spread-shape",
        default="tiny",
        choices=("tiny", "0.5b"),
        help="spread: the policy's shape (0.5b: Qwen2.5-0.5B's layers in bf16, with its MFU)",
    )
    p.add_argument(
        "--models",
        default="25m,100m",
        help=f"from {sorted(TRAIN_MODELS)}, or a checkpoint's shape (a pretrained name, e.g. "
        "smollm2-135m-instruct, a .gguf file or a Hugging Face directory)",
    )
    p.add_argument("--seq", type=int, default=256)
    p.add_argument(
        "--batches",
        default="",
        help="per model, e.g. 25m=4,100m=2 (default: " + str(DEFAULT_BATCH) + ")",
    )
    p.add_argument("--variants", default="rl_plain,rl_fused,sft_fused", help=f"from {VARIANTS}")
    p.add_argument("--repeats", type=int, default=3, help="round-robin rounds")
    p.add_argument("--dtype", default="float32", help="compute dtype (params stay f32)")
    p.add_argument("--matmul-n", type=int, default=2048)
    p.add_argument(
        "--profile", action="store_true", help="trace each variant: its time by kind of op"
    )
    p.add_argument(
        "--memory-batch",
        type=int,
        default=16,
        help="also compile (not run) every variant at this batch: temp bytes at a real batch",
    )


def bench_mfu(args) -> dict:
    """Train-step MFU (forward + backward + AdamW) vs a matmul peak measured in the same run.

    It starts only on a quiet machine (`peers.wait_for_quiet`; the busy share and load
    averages before and after are in `quiet`). The neighbours' load can still drift, so the
    variants of a model and the matmul peak are timed round-robin: each round times the peak, then one
    step of every variant; MFU of a round = step FLOPs / step seconds / that round's peak,
    and the reported figures are medians over rounds.
    """

    from benchmarks import peers

    busy_before, load_before = peers.wait_for_quiet(), os.getloadavg()  # refuses under load
    batches = dict(DEFAULT_BATCH)
    for item in filter(None, args.batches.split(",")):
        k, v = item.split("=")
        batches[k] = int(v)
    result = dict(
        **common.machine_info(),
        flops_formula=FLOPS_FORMULA,
        rounds=args.repeats,
        models={},
    )
    for name in args.models.split(","):
        variants = args.variants.split(",")
        steps, rows = {}, {}
        for variant in variants:
            steps[variant], rows[variant], cfg = prepare_train_step(
                name, variant, batches.get(name, CHECKPOINT_BATCH), args.seq, args.dtype
            )
            if steps[variant] is None:
                print(f"[{name} {variant}] failed: {rows[variant]['error']}", file=sys.stderr)
        failed = {v: rows[v] for v in variants if steps[v] is None}
        variants = [v for v in variants if steps[v] is not None]
        flops = train_step_flops(cfg, batches.get(name, CHECKPOINT_BATCH), args.seq)
        peaks, times = [], {v: [] for v in variants}
        for _ in range(args.repeats):
            peaks.append(matmul_peak(args.matmul_n, repeats=3))
            for variant in variants:
                t0 = time.perf_counter()
                steps[variant]()
                times[variant].append(time.perf_counter() - t0)
        shape = TRAIN_MODELS.get(name) or common.checkpoint_of(name)
        entry = dict(
            config=shape,
            flops=flops,
            matmul_rounds=peaks,
            peak_gflops=statistics.median(p["peak_gflops"] for p in peaks),
            variants={},
            failed_variants=failed,
        )
        for variant in variants:
            row, ts = rows[variant], times[variant]
            mfus = [flops["gflops"] / t / p["peak_gflops"] for t, p in zip(ts, peaks)]
            row.update(
                seconds=statistics.median(ts),
                times=ts,
                tokens_per_s=flops["tokens"] / statistics.median(ts),
                achieved_gflops=flops["gflops"] / statistics.median(ts),
                mfu=statistics.median(mfus),
                mfu_rounds=mfus,
                # best step over best peak: both ends at their least disturbed
                mfu_best=flops["gflops"] / min(ts) / max(p["peak_gflops"] for p in peaks),
                mfu_kaplan=statistics.median(
                    flops["kaplan_gflops"] / t / p["peak_gflops"] for t, p in zip(ts, peaks)
                ),
            )
            if args.profile:
                row["profile"] = profile_update(steps[variant], flops["gflops"] * 1e9)
                row["profile"]["matmul_over_peak"] = (row["profile"]["matmul_gflops"] or 0) / entry[
                    "peak_gflops"
                ]
            entry["variants"][variant] = row
            print(f"[{name} {variant}] {json.dumps(row)}", file=sys.stderr)
        base = entry["variants"].get("rl_plain")
        if base:
            for row in entry["variants"].values():
                row["speedup_vs_rl_plain"] = statistics.median(
                    a / b for a, b in zip(base["times"], row["times"])
                )
        del steps
        if args.memory_batch:
            mb = args.memory_batch
            entry["compiled_temp_mib_at_batch"] = {"batch": mb}
            for variant in variants:
                _, info, _ = prepare_train_step(name, variant, mb, args.seq, args.dtype, run=False)
                entry["compiled_temp_mib_at_batch"][variant] = info.get("temp_mib")
        result["models"][name] = entry
    result["quiet"] = dict(
        busy_share_before=busy_before,
        busy_share_after=peers.busy_share(),
        load_average_before=list(load_before),
        load_average_after=list(os.getloadavg()),
    )
    return result
