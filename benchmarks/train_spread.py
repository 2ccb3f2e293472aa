"""The update on completions of widely spread lengths: padded rows against packed rows
(`train.pack_tokens`), `python benchmarks/bench.py train --workload spread`.

    python benchmarks/bench.py train --workload spread --steps 6 --warmup 2

Each variant runs in its own process: `configs/grpo_arith.py` from scratch on one device
(the 2-layer d=128 char model, 16 prompts x 8 completions, 2 minibatches), sampled at
temperature 1 with `rollout.max_new_tokens` = 512: a random policy ends a completion at
about 1 token in the vocabulary's size, so lengths run from a few tokens up to the cap,
while every padded row is `max_prompt_len + 512` = 521 positions wide. Per step, timed on
the host with the device drained: the rollout (`Trainer.rollout`: sampling, scoring,
advantages) and the update (`Learner.update`). Figures (medians over the steps after
--warmup): the update's useful tokens/s (real prompt and completion tokens, the
attention mask's sum, over the update's seconds), the whole GRPO step's seconds, and the
XLA compiles after the warm-up (0: the buckets were all seen). Variants:
  padded   train.pack_tokens = 0 (rows of 521 positions)
  shared   padded, each group's prompt run once (train.share_prompt_forward, the default)
  packed   train.pack_tokens = 521 (first-fit decreasing into rows of 521 slots)
Targets: packed >= 1.8x padded's update useful tokens/s, >= 1.4x its GRPO step; the packed
against the shared prompt is recorded too (`packed_vs_shared`): which of the two wins here.
The machine's load (`os.getloadavg`) before and after each variant is recorded.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import common

ROW = 9 + 512  # grpo_arith's max_prompt_len + max_new_tokens
SPREAD = {
    "mesh.num_devices": 1,
    "rollout.max_new_tokens": 512,
    "rollout.temperature": 1.0,
    "data.prompt_batch": 16,
    "rollout.group_size": 8,
    "model.init": "scratch",
    "eval.at_start": False,
    "train.share_prompt_forward": False,  # packing refuses it; `shared` turns it on
}
# --spread-shape: the policy's shape. tiny: grpo_arith's 2-layer d=128 model; 0.5b: Qwen2.5-
# 0.5B's layers (24 x d=896, GQA 14/2, MLP 4864) in bf16 over the char vocabulary, for a GPU,
# where the update's model FLOP/s against the device's bf16 matmul peak (MFU) is recorded
SHAPES = {
    "tiny": {},
    "0.5b": {
        "model.hidden_size": 896,
        "model.intermediate_size": 4864,
        "model.num_layers": 24,
        "model.num_heads": 14,
        "model.num_kv_heads": 2,
        "model.head_dim": 64,
        "model.dtype": "bfloat16",
        "model.remat": "full",  # 64 rows x 521 positions x 24 layers: the activations
        "optimizer.grad_accum": 4,  # of a minibatch in one pass took 117 GiB on an H200
    },
}
VARIANTS = {
    "padded": {},
    "shared": {"train.share_prompt_forward": True},
    "packed": {"train.pack_tokens": ROW},
}


def run_variant(variant: str, steps: int, warmup: int, shape: str = "tiny") -> dict:
    """One variant's steps in this process (see the module docstring)."""
    import jax
    import numpy as np

    from jaxrl_frontier.run import trainer as tr

    flags = {**SPREAD, **SHAPES[shape], **VARIANTS[variant], "train.steps": steps}
    c = common.load_config([f"--config.{k}={v}" for k, v in flags.items()], "configs/grpo_arith.py")
    trainer = tr.Trainer(c, tempfile.mkdtemp())
    compiles: list[str] = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(str(kwargs.get("fun_name", "")))

    jax.monitoring.register_event_duration_secs_listener(listener)
    rows = []
    for step in range(steps):
        if step == warmup:
            compiles.clear()
        t0 = time.perf_counter()
        exp, info = trainer.step.rollout(trainer.source.next_batch(), trainer.step.sample_key())
        jax.block_until_ready(exp.tokens)
        t1 = time.perf_counter()
        metrics = trainer.step.learner.update(exp, trainer.step.next_key)
        jax.block_until_ready((trainer.state.params, metrics))
        t2 = time.perf_counter()
        real = float(np.asarray(exp.attention_mask).sum())
        completion = float(np.asarray(exp.loss_mask).sum())
        rows.append(
            dict(
                rollout_seconds=t1 - t0,
                update_seconds=t2 - t1,
                step_seconds=t2 - t0,
                real_tokens=real,
                completion_tokens=completion,
                padded_tokens=float(exp.tokens.size),
                pack_bucket=float(np.mean([m.get("pack_bucket", 0.0) for m in metrics])),
                lengths=np.asarray(exp.loss_mask).sum(1).astype(int).tolist(),
            )
        )
    measured = rows[warmup:]
    median = lambda key: statistics.median(r[key] for r in measured)  # noqa: E731
    lengths = [n for r in measured for n in r["lengths"]]
    epochs = c.train.epochs
    return dict(
        update_useful_tokens_per_second=statistics.median(
            epochs * r["real_tokens"] / r["update_seconds"] for r in measured
        ),
        update_seconds=median("update_seconds"),
        rollout_seconds=median("rollout_seconds"),
        step_seconds=median("step_seconds"),
        completion_length=dict(min=min(lengths), mean=float(np.mean(lengths)), max=max(lengths)),
        padding_share=1.0 - median("real_tokens") / median("padded_tokens"),
        pack_buckets=sorted({r["pack_bucket"] for r in rows}),
        compiles_after_warmup=len(compiles),
        # 6 N FLOPs a useful token (forward and backward, attention left out)
        params=trainer.roles.policy.cfg.num_params(),
        steps=[{k: v for k, v in r.items() if k != "lengths"} for r in rows],
        config=flags,
    )


def bench_train(args) -> dict:
    """Train-step MFU (`train.bench_mfu`), or with --workload spread padded vs packed rows."""
    if args.workload == "spread":
        return bench_spread(args)
    from benchmarks import train

    return train.bench_mfu(args)


def bench_spread(args) -> dict:
    """Padded vs packed update on spread completion lengths, each variant in its own process."""
    out: dict = {"machine": common.machine_info(jax_device=False)}
    variants = {}
    names = VARIANTS if args.spread_shape == "tiny" else ("padded", "packed")
    for variant in names:
        load_before = os.getloadavg()
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [
                sys.executable, "-m", "benchmarks.train_spread", variant,
                str(args.steps), str(args.warmup), f.name, args.spread_shape,
            ]  # fmt: skip
            path = os.pathsep.join(filter(None, [str(common.REPO), os.environ.get("PYTHONPATH")]))
            env = {**os.environ, "PYTHONPATH": path}
            proc = subprocess.run(cmd, cwd=common.REPO, env=env, capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(f"{variant}: {proc.stderr[-3000:]}")
            result = json.load(open(f.name))
        result["load_before_after"] = [list(load_before), list(os.getloadavg())]
        variants[variant] = result
    pad, pack, shared = variants["padded"], variants["packed"], variants.get("shared")
    if args.spread_shape != "tiny":  # the update's MFU against the device's bf16 matmul peak
        peak = common.matmul_peak(8192)["bfloat16_gflops"] * 1e9
        for v in variants.values():
            flops = 6 * v["params"] * v["update_useful_tokens_per_second"]
            v["update_model_tflops"], v["update_mfu"] = flops / 1e12, flops / peak
        out["bf16_matmul_peak_tflops"] = peak / 1e12
    out["packed_vs_shared"] = shared and dict(
        update_useful_tokens_ratio=pack["update_useful_tokens_per_second"]
        / shared["update_useful_tokens_per_second"],
        grpo_step_ratio=shared["step_seconds"] / pack["step_seconds"],
    )
    ratio = lambda key: pack[key] / pad[key]  # noqa: E731
    out.update(
        variants=variants,
        update_useful_tokens_ratio=ratio("update_useful_tokens_per_second"),
        grpo_step_ratio=pad["step_seconds"] / pack["step_seconds"],
        targets={
            "update useful tokens/s, packed / padded >= 1.8": ratio(
                "update_useful_tokens_per_second"
            )
            >= 1.8,
            "GRPO step, padded / packed seconds >= 1.4": pad["step_seconds"] / pack["step_seconds"]
            >= 1.4,
            "compiles after warm-up 0": all(
                v["compiles_after_warmup"] == 0 for v in variants.values()
            ),
        },
    )
    return out


if __name__ == "__main__":
    variant, steps, warmup, path, shape = sys.argv[1:6]
    with open(path, "w") as f:
        json.dump(run_variant(variant, int(steps), int(warmup), shape), f)
