"""The per-step cost of the stop agreement (train/stopping.py) on 2 processes x 4 CPU devices.

    python benchmarks/stop_agreement.py [--steps=30] [--rounds=2]

Runs `tests/fixtures/grpo_arith_shaped.py:runlocal` (the multi-host tests' run) as 2 local
processes with `distributed.agree_stop` on
and off, alternating, `--rounds` times each; the step time is the median gap between
consecutive `metrics.jsonl` rows after the first 5 steps (compiles), so it includes the
end-of-step work where the agreement runs. Also times `distributed.gather_ints` alone (500
calls). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from jaxrl_frontier.sweeps.supervise import free_port  # noqa: E402

FLAGS = {  # the multi-host tests' run, without evals or checkpoints between the steps
    "train.log_every": 1,
    "train.eval_every": 10**6,
    "train.checkpoint_every": 10**6,
    "train.rollout_log_every": 10**6,
    "eval.at_start": False,
}

GATHER = """
import os, sys, time, json
sys.path.insert(0, {repo!r})
from jaxrl_frontier.core import distributed
distributed.initialize({{"distributed": dict(coordinator_address="127.0.0.1:{port}",
    num_processes=2, process_id=int(sys.argv[1]))}})
for i in range(50):
    distributed.gather_ints(0)
times = []
for i in range(500):
    t = time.perf_counter(); distributed.gather_ints(0); times.append(time.perf_counter() - t)
times.sort()
if sys.argv[1] == "0":
    print(json.dumps(dict(median_ms=1e3 * times[250], p90_ms=1e3 * times[450])))
distributed.finish(30)
"""


def _env() -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    return env


def two_processes(cmd_of) -> list[str]:
    port = free_port()
    procs = [
        subprocess.Popen(cmd_of(i, port), cwd=REPO, env=_env(), stdout=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a process failed: {[p.returncode for p in procs]}")
    return outs


def median_step(steps: int, agree: bool) -> float:
    with tempfile.TemporaryDirectory() as workdir:
        flags = {**FLAGS, "train.steps": steps, "distributed.agree_stop": agree}

        def cmd(i, port):
            return [
                sys.executable,
                os.path.join(REPO, "scripts", "train.py"),
                "--config=tests/fixtures/grpo_arith_shaped.py:runlocal",
                f"--workdir={workdir}",
                *(f"--config.{k}={v}" for k, v in flags.items()),
                f"--config.distributed.coordinator_address=127.0.0.1:{port}",
                "--config.distributed.num_processes=2",
                f"--config.distributed.process_id={i}",
            ]

        two_processes(cmd)
        rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
        times = [r["time"] for r in rows if "train/loss" in r]
    gaps = [b - a for a, b in zip(times[5:], times[6:])]
    return statistics.median(gaps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    with_, without = [], []
    for _ in range(args.rounds):
        with_.append(median_step(args.steps, True))
        without.append(median_step(args.steps, False))
        print(f"with {with_[-1]:.4f} s, without {without[-1]:.4f} s", file=sys.stderr)
    gather = GATHER.format(repo=REPO, port=free_port())
    out = two_processes(lambda i, port: [sys.executable, "-c", gather, str(i)])[0]
    alone = json.loads(out.strip().splitlines()[-1])
    print(
        json.dumps(
            dict(
                median_step_s_with=statistics.median(with_),
                median_step_s_without=statistics.median(without),
                rounds_with=with_,
                rounds_without=without,
                gather_ints_alone=alone,
                steps=args.steps,
                time=time.strftime("%Y-%m-%d %H:%M"),
            )
        )
    )


if __name__ == "__main__":
    main()
