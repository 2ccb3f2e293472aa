"""A population of N seeds against N solo runs back to back, wall time with start-up and
compiles included, each variant in its own processes (`scripts/train.py`).

    python -m benchmarks.population [--members 8] [--steps 200] [--rounds 1]
        [--out artifacts/population.json]

The RL config is the demo's (configs/grpo_arith.py) from its SFT start (configs/sft_arith.py,
trained once into --workdir, untimed). Solo run i is `seed = i` with the prompts of seed 0
(`data.seed = 0`), which is what population member i runs (`population.same_prompts`); the
benchmark checks that each member's logged metrics equal its solo run's (time keys aside)
and records both variants' wall times per round, alternating, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from benchmarks import common

TRAIN = str(common.REPO / "scripts" / "train.py")


def _train(config: str, workdir: str, overrides: dict) -> float:
    """Wall seconds of one `scripts/train.py` process (start-up and compiles included)."""
    cmd = [sys.executable, TRAIN, f"--config={config}", f"--workdir={workdir}"]
    cmd += [f"--config.{k}={v}" for k, v in overrides.items()]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return seconds


def _rows(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if "time" not in k and "second" not in k} for r in rows]


def _step_seconds(workdir: str) -> list[float]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [r["perf/step_seconds"] for r in map(json.loads, f) if "perf/step_seconds" in r]


def common_random_numbers(args, rl: str, base: dict) -> dict:
    """The standard error of the difference between two arms (`--kl` coefficients, `--members`
    seeds each, one population of both arms per prompt mode) with every member on the same
    prompts (`population.same_prompts`) and with each member its own draw, over the same
    steps: each member's mean `reward/total` over the run is its outcome."""
    import statistics

    out = {}
    a, b = args.kl
    for same in (True, False):
        workdir = os.path.join(args.workdir, f"crn_same{int(same)}")
        shutil.rmtree(workdir, ignore_errors=True)
        grid = {"population.grid.seed": tuple(range(args.members)),
                "population.grid.objective.kl_coef": (a, b),
                "population.same_prompts": same, "objective.kl_coef": a}  # fmt: skip
        seconds = _train(rl, workdir, {**base, **grid})
        values = json.load(open(os.path.join(workdir, "population.json")))["members"]
        arms = {a: [], b: []}
        for i, v in enumerate(values):
            rows = _rows(os.path.join(workdir, "members", str(i)))
            rewards = [r["reward/total"] for r in rows if "reward/total" in r]
            arms[v["objective.kl_coef"]].append(statistics.fmean(rewards))
        se = (statistics.variance(arms[a]) / len(arms[a])
              + statistics.variance(arms[b]) / len(arms[b])) ** 0.5  # fmt: skip
        out["same_prompts" if same else "own_prompts"] = dict(
            difference=statistics.fmean(arms[b]) - statistics.fmean(arms[a]),
            standard_error=se,
            seconds=round(seconds, 1),
        )
    out["se_ratio_own_over_same"] = (
        out["own_prompts"]["standard_error"] / out["same_prompts"]["standard_error"]
    )
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--members", type=int, default=8)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=1, help="alternating solo / population rounds")
    p.add_argument("--workdir", default="/tmp/population_bench")
    p.add_argument("--out", default=str(common.REPO / "artifacts" / "population.json"))
    p.add_argument("--sft", default="", help="an SFT start's workdir (default: trained here)")
    p.add_argument("--solo-runs", type=int, default=0, help="solo runs timed (0: --members)")
    p.add_argument("--batched", action="store_true", help="population.batched_update = True")
    p.add_argument("--both", action="store_true", help="time the batched update as well")
    p.add_argument(
        "--scratch", action="store_true", help="from a random policy with shaped rewards, no SFT"
    )
    p.add_argument("--crn", action="store_true", help="the common-random-numbers comparison")
    p.add_argument("--kl", type=float, nargs=2, default=(0.01, 0.1), help="--crn's two arms")
    args = p.parse_args(argv)
    rl = str(common.REPO / "configs" / "grpo_arith.py")
    if args.scratch:  # a random policy, shaped rewards: benchmarks/configs/grpo_arith_scratch.py
        rl = str(common.REPO / "benchmarks" / "configs" / "grpo_arith_scratch.py")
        base = {"train.steps": args.steps}
    else:
        sft = args.sft or os.path.join(args.workdir, "sft")
        if not os.path.exists(os.path.join(sft, "export")):
            _train(str(common.REPO / "configs" / "sft_arith.py"), sft, {})
        base = {"model.init": "checkpoint", "model.path": sft, "train.steps": args.steps}
    load = lambda: os.getloadavg()[0]  # noqa: E731
    result = dict(machine=common.machine_info(jax_device=False), load_before=load(), rounds=[])
    if args.crn:
        result.update(crn=common_random_numbers(args, rl, base), load_after=load())
        result.update(members=args.members, steps=args.steps, config="configs/grpo_arith.py")
        return common.write_json(result, args.out)
    for r in range(args.rounds):
        round_dir = os.path.join(args.workdir, f"round{r}")
        shutil.rmtree(round_dir, ignore_errors=True)
        solo = []
        for i in range(args.solo_runs or args.members):
            overrides = {**base, "seed": i, "data.seed": 0}
            solo.append(_train(rl, os.path.join(round_dir, f"solo{i}"), overrides))
        pop_dir = os.path.join(round_dir, "population")
        batched = {"population.batched_update": True} if args.batched else {}
        pop = _train(rl, pop_dir, {**base, "population.size": args.members, **batched})
        both = {}
        if args.both:  # the batched update too, in the same round
            pop_b = _train(rl, pop_dir + "_batched", {**base, "population.size": args.members,
                                                      "population.batched_update": True})  # fmt: skip
            both = dict(batched_population_seconds=round(pop_b, 2),
                        batched_over_one_solo=round(pop_b / (sum(solo) / len(solo)), 3))  # fmt: skip
        equal = [
            _rows(os.path.join(pop_dir, "members", str(i)))
            == _rows(os.path.join(round_dir, f"solo{i}"))
            for i in range(len(solo))
        ]
        steps = sorted(_step_seconds(os.path.join(round_dir, "solo0"))[1:])
        result["rounds"].append(
            dict(
                solo_seconds=[round(s, 2) for s in solo],
                solo_total_seconds=round(sum(solo), 2),
                population_seconds=round(pop, 2),
                speedup=round(sum(solo) / len(solo) * args.members / pop, 3),
                population_over_one_solo=round(pop / (sum(solo) / len(solo)), 3),
                members_equal_solo=equal,
                solo_median_logged_step_seconds=steps[len(steps) // 2] if steps else None,
                **both,
            )
        )
        print(json.dumps(result["rounds"][-1]), flush=True)
    result["load_after"] = load()
    result["speedup_median"] = sorted(x["speedup"] for x in result["rounds"])[args.rounds // 2]
    result.update(members=args.members, steps=args.steps, config=os.path.relpath(rl, common.REPO))
    result.update(batched_update=args.batched, scratch=args.scratch)
    return common.write_json(result, args.out)


if __name__ == "__main__":
    sys.path.insert(0, str(common.REPO))
    main()
