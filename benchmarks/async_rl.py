"""Seconds per RL step: rollouts on the training mesh, on a mesh of their own, and ahead of
the learner (asynchronous, `rollout.max_staleness = 1`), on the 8-device mesh.

    python benchmarks/bench.py async
    python benchmarks/bench.py async --steps 20 --variants colocated,async

Each variant trains `configs/grpo_arith.py` (the main job's shapes, from scratch) in its own
process with the same seed and devices; the figure is the median `perf/step_seconds` of the
steps after `--warmup` (compiles). Variants:
  colocated  rollout and update on all 8 devices, one after the other (the default)
  roles      rollout on 4 devices, update on the other 4, one after the other
  async      as roles, with batch k+1 sampled while the update on batch k runs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks import common

REPO = common.REPO

VARIANTS = {
    "colocated": {},
    "roles": {"rollout.devices": 4},
    "async": {"rollout.devices": 4, "rollout.max_staleness": 1},
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=30, help="RL steps per variant")
    p.add_argument("--warmup", type=int, default=5, help="first steps left out (compiles)")
    p.add_argument("--devices", type=int, default=8, help="fake CPU devices (CPU only)")
    p.add_argument("--variants", default=",".join(VARIANTS))


def _run(variant: str, args, workdir: str) -> dict:
    flags = {
        **VARIANTS[variant],
        "model.init": "scratch",
        "train.steps": args.steps,
        "train.log_every": 1,
        "train.eval_every": 10**6,
        "train.checkpoint_every": 10**6,
        "eval.at_start": False,
        "eval.num_prompts": 16,
        "eval.pass_k": 1,
    }
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
    )
    cmd = [
        sys.executable,
        str(REPO / "scripts" / "train.py"),
        "--config=configs/grpo_arith.py",
        f"--workdir={workdir}",
        *(f"--config.{k}={v}" for k, v in flags.items()),
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{variant}: {proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    rows = [r for r in rows if "perf/step_seconds" in r][args.warmup :]
    times = [r["perf/step_seconds"] for r in rows]
    return dict(
        seconds_per_step=statistics.median(times),
        times=times,
        rollout_seconds=statistics.median(r["rollout/seconds"] for r in rows),
        max_policy_lag=max(r.get("rollout/policy_lag", 0.0) for r in rows),
        reshard_seconds=statistics.median(r.get("perf/reshard_seconds", 0.0) for r in rows),
        final_reward=rows[-1]["reward/total"],
        config=flags,
    )


def bench_async(args) -> dict:
    """Seconds per RL step: colocated, roles on their own devices, and asynchronous."""
    settings = {k: v for k, v in vars(args).items() if k != "config_args"}
    out = dict(**common.machine_info(), settings=settings, variants={})
    for variant in args.variants.split(","):
        with tempfile.TemporaryDirectory() as workdir:
            out["variants"][variant] = _run(variant, args, workdir)
    v = out["variants"]
    if "async" in v and "roles" in v:
        out["async_vs_roles"] = v["roles"]["seconds_per_step"] / v["async"]["seconds_per_step"]
    if "async" in v and "colocated" in v:
        out["async_vs_colocated"] = (
            v["colocated"]["seconds_per_step"] / v["async"]["seconds_per_step"]
        )
    return out
