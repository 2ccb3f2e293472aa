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

`--workload spread`: the rollout engines on completions whose lengths spread widely. The same
config from scratch on one device, sampled at temperature 1 with `rollout.max_new_tokens`
= 128: a random policy emits EOS at about 1 token in the char vocabulary's size, so lengths
run from 1 to the cap. Variants:
  static         every row decodes at once until the batch's longest ends (synchronous)
  continuous     rollout.continuous_slots = 32: a finished row's slot takes the next row
  k1, k2         static rollouts sampled 1 or 2 steps ahead (rollout.max_staleness)
  continuous_k1  both
  partial        continuous, and the next batch's rows begun in the idle slots, up to 32
                 tokens each (rollout.partial_budget), continued in the next step
  k1_free        k1 with a free-running producer (rollout.free_running_queue = 2): it
                 samples whenever the queue has room, by the newest weights, and the
                 learner drops a batch that lags by more than 1 (the drops are recorded)
Per variant (medians over the steps after --warmup, and over --rounds runs taken in
alternating order): seconds per step, useful tokens/s (completion tokens / step seconds, and
/ rollout seconds: the engine alone), rollout seconds, and the share of slot-steps spent on finished rows (static: 1 - mean / max
completion length of the batch, `rollout/response_length{,_max}`; continuous: 1 -
`rollout/{continuous,partial}_slot_busy_share`). Targets: continuous >= 1.5x static's useful tokens/s;
k1's step <= max(static's rollout, static's update) + 10%. The machine must be quiet
(`peers.wait_for_quiet` before each run); busy share and load are recorded.
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
SPREAD_SLOTS = 32
SPREAD = {  # the spread workload's shapes: 16 prompts x 8 completions of up to 128 tokens
    "mesh.num_devices": 1,
    "rollout.max_new_tokens": 128,
    "rollout.temperature": 1.0,
    "data.prompt_batch": 16,
    "rollout.group_size": 8,
}
SPREAD_VARIANTS = {
    "static": {},
    "continuous": {"rollout.continuous_slots": SPREAD_SLOTS},
    "k1": {"rollout.max_staleness": 1},
    "k2": {"rollout.max_staleness": 2},
    "continuous_k1": {"rollout.continuous_slots": SPREAD_SLOTS, "rollout.max_staleness": 1},
    "partial": {"rollout.continuous_slots": SPREAD_SLOTS, "rollout.partial_budget": 32},
    "k1_free": {"rollout.max_staleness": 1, "rollout.free_running_queue": 2},
}
WORKLOADS = {"roles": VARIANTS, "spread": SPREAD_VARIANTS}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default="roles", choices=sorted(WORKLOADS))
    p.add_argument("--steps", type=int, default=30, help="RL steps per variant")
    p.add_argument("--warmup", type=int, default=5, help="first steps left out (compiles)")
    p.add_argument("--devices", type=int, default=8, help="fake CPU devices (CPU only)")
    p.add_argument("--rounds", type=int, default=1, help="runs of each variant, alternating")
    p.add_argument("--variants", default="", help="comma-separated (default: the workload's)")


def _run(variant: str, args, workdir: str) -> dict:
    spread = args.workload == "spread"
    flags = {
        **(SPREAD if spread else {}),
        **WORKLOADS[args.workload][variant],
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
    devices = 1 if spread else args.devices
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
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
    median = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    out = dict(
        seconds_per_step=statistics.median(times),
        times=times,
        rollout_seconds=median("rollout/seconds"),
        max_policy_lag=max(r.get("rollout/policy_lag", 0.0) for r in rows),
        dropped_stale=rows[-1].get("rollout/dropped_stale_total", 0.0),  # over the whole run
        reshard_seconds=statistics.median(r.get("perf/reshard_seconds", 0.0) for r in rows),
        final_reward=rows[-1]["reward/total"],
        config=flags,
    )
    if spread:
        out["useful_tokens_per_second"] = median("perf/tokens_per_second")
        # the rollout engine alone: the step's completion tokens over its rollout seconds
        out["rollout_useful_tokens_per_second"] = statistics.median(
            r["perf/tokens_per_second"] * r["perf/step_seconds"] / r["rollout/seconds"]
            for r in rows
        )
        out["completion_length"] = dict(
            mean=median("rollout/response_length"), max=median("rollout/response_length_max")
        )
        busy = [
            r.get("rollout/continuous_slot_busy_share")
            or r.get("rollout/partial_slot_busy_share")
            or r["rollout/response_length"] / max(r["rollout/response_length_max"], 1.0)
            for r in rows
        ]
        out["finished_slot_step_share"] = 1.0 - statistics.median(busy)
    return out


ROUND_KEYS = ("seconds_per_step", "rollout_seconds", "useful_tokens_per_second")
ROUND_KEYS += ("rollout_useful_tokens_per_second", "finished_slot_step_share")


def _spread_targets(v: dict) -> dict:
    """The workload's targets from the variants measured."""
    out = {}
    if "static" in v and "continuous" in v:
        for key in ("rollout_useful_tokens_per_second", "useful_tokens_per_second"):
            ratio = v["continuous"][key] / v["static"][key]
            out[f"continuous_vs_static_{key}"] = dict(ratio=ratio, target=1.5, met=ratio >= 1.5)
    if "static" in v and "k1" in v:
        rollout = v["static"]["rollout_seconds"]
        update = v["static"]["seconds_per_step"] - rollout  # a synchronous step: rollout + rest
        bound = max(rollout, update)
        k1 = v["k1"]["seconds_per_step"]
        out["k1_step_vs_max_rollout_update"] = dict(
            ratio=k1 / bound, static_rollout=rollout, static_update=update,
            target=1.1, met=k1 <= 1.1 * bound,
        )  # fmt: skip
    return out


def bench_async(args) -> dict:
    """Seconds per RL step: colocated, roles on their own devices, and asynchronous; or
    (--workload spread) static vs continuous batching vs rollouts 1 or 2 steps ahead."""
    from benchmarks import peers

    settings = {k: v for k, v in vars(args).items() if k != "config_args"}
    out = dict(**common.machine_info(), settings=settings, variants={})
    variants = (args.variants or ",".join(WORKLOADS[args.workload])).split(",")
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    quiet = dict(busy_share_before=peers.wait_for_quiet(), load_average_before=os.getloadavg())
    for round_ in range(args.rounds):
        order = variants if round_ % 2 == 0 else variants[::-1]  # alternate the order
        for variant in order:
            peers.wait_for_quiet()
            with tempfile.TemporaryDirectory() as workdir:
                runs[variant].append(_run(variant, args, workdir))
            print(
                f"[async] {variant} round {round_ + 1}: "
                f"{runs[variant][-1]['seconds_per_step']:.3f} s/step",
                flush=True,
            )
    quiet.update(busy_share_after=peers.busy_share(), load_average_after=os.getloadavg())
    out["quiet"] = quiet
    out["variants"] = {name: common.median_of_rounds(r, ROUND_KEYS) for name, r in runs.items()}
    v = out["variants"]
    if args.workload == "spread":
        out["targets"] = _spread_targets(v)
        return out
    if "async" in v and "roles" in v:
        out["async_vs_roles"] = v["roles"]["seconds_per_step"] / v["async"]["seconds_per_step"]
    if "async" in v and "colocated" in v:
        out["async_vs_colocated"] = (
            v["colocated"]["seconds_per_step"] / v["async"]["seconds_per_step"]
        )
    return out
