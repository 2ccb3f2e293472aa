"""Gather a sweep's runs into one table: every run's overrides, status, wall time and final
metrics, and per group of seeds (same overrides but the seed) the mean and spread.

    python scripts/sweep.py collect ROOT   # -> ROOT/sweep_runs.csv, sweep_table.csv,
                                           #    sweep_results.json

Spread is the sample standard deviation over seeds (ddof=1; 0 for one seed), with min and
max. Curves (metric vs step) are averaged over the steps every seed of the group logged.
Besides the trainer's metrics.jsonl, the rollout log (rollouts.jsonl, every
train.rollout_log_every steps) gives `rollouts/length_correct` and
`rollouts/length_incorrect`: the mean completion length in characters (one token per
character for the char tokenizer) of the logged completions with correctness 1 and < 1.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections import defaultdict

from jaxrl_frontier.sweeps import populations
from jaxrl_frontier.sweeps.launch import ATTEMPTS_FILE, DONE_FILE, RUN_FILE
from jaxrl_frontier.sweeps.spec import CONFIG_KEY, SEED_KEY, group_key

RUNS_CSV, TABLE_CSV, RESULTS_JSON = "sweep_runs.csv", "sweep_table.csv", "sweep_results.json"


def _jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:  # a torn last line of a killed run
                continue
    return rows


def read_series(workdir: str) -> dict[str, list[list[float]]]:
    """{metric: [[step, value], ...]} from metrics.jsonl and the rollout lengths."""
    series: dict[str, dict[int, float]] = defaultdict(dict)
    for row in _jsonl(os.path.join(workdir, "metrics.jsonl")):
        for key, value in row.items():
            if key not in ("step", "time") and isinstance(value, (int, float)):
                series[key][int(row["step"])] = float(value)
    lengths: dict[tuple[str, int], list[int]] = defaultdict(list)
    for row in _jsonl(os.path.join(workdir, "rollouts.jsonl")):
        correct = row.get("rewards", {}).get("correctness", 0.0) >= 1.0
        kind = "rollouts/length_correct" if correct else "rollouts/length_incorrect"
        lengths[(kind, int(row["step"]))].append(len(row.get("completion", "")))
    for (kind, step), values in lengths.items():
        series[kind][step] = sum(values) / len(values)
    return {k: [[s, v[s]] for s in sorted(v)] for k, v in sorted(series.items())}


def read_run(workdir: str) -> dict:
    """One run's record: name, config, overrides, group, seed, status, wall time, series,
    final value of every metric."""
    with open(os.path.join(workdir, RUN_FILE)) as f:
        meta = json.load(f)
    overrides = {CONFIG_KEY: meta["config"], **meta["overrides"]}
    done_path = os.path.join(workdir, DONE_FILE)
    done = json.load(open(done_path)) if os.path.exists(done_path) else None
    attempts = _jsonl(os.path.join(workdir, ATTEMPTS_FILE))
    series = read_series(workdir)
    times = [r["time"] for r in _jsonl(os.path.join(workdir, "metrics.jsonl")) if "time" in r]
    return dict(
        name=meta["name"],
        workdir=workdir,
        config=meta["config"],
        overrides=meta["overrides"],
        group=meta.get("group") or group_key(overrides),
        seed=meta["overrides"].get(SEED_KEY),
        status="done" if done else "incomplete",
        machine=(done or {}).get("machine", ""),
        attempts=len(attempts),
        wall_seconds=done["wall_seconds"] if done else sum(a["seconds"] for a in attempts),
        cpu_seconds=sum(a.get("cpu_seconds", 0.0) for a in attempts),
        train_seconds=round(times[-1] - times[0], 2) if len(times) > 1 else 0.0,
        step=max((s for v in series.values() for s, _ in v), default=0),
        series=series,
        final={k: v[-1][1] for k, v in series.items()},
    )


def spread(values: list[float]) -> dict[str, float]:
    """mean, sample std (ddof=1, 0 for one value), min, max, n."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return dict(mean=mean, std=std, min=min(values), max=max(values), n=n)


def group_runs(runs: list[dict]) -> list[dict]:
    """Runs with the same overrides but the seed, with the spread of each final metric and
    mean/std curves over the steps all of them logged."""
    by_group: dict[str, list[dict]] = defaultdict(list)
    for run in runs:
        by_group[run["group"]].append(run)
    groups = []
    for name, members in by_group.items():
        members.sort(key=lambda r: (r["seed"] is None, r["seed"]))
        keys = sorted(set.intersection(*(set(r["final"]) for r in members)))
        curves = {}
        for key in keys:
            per_seed = [dict(map(tuple, r["series"][key])) for r in members]
            steps = sorted(set.intersection(*(set(s) for s in per_seed)))
            stats = [spread([s[t] for s in per_seed]) for t in steps]
            curves[key] = dict(
                steps=steps, mean=[x["mean"] for x in stats], std=[x["std"] for x in stats]
            )
        overrides = {k: v for k, v in members[0]["overrides"].items() if k != SEED_KEY}
        groups.append(
            dict(
                group=name,
                config=members[0]["config"],
                overrides=overrides,
                seeds=[r["seed"] for r in members],
                n_done=sum(r["status"] == "done" for r in members),
                wall_seconds=spread([r["wall_seconds"] for r in members]),
                step=spread([r["step"] for r in members]),
                final={k: spread([r["final"][k] for r in members]) for k in keys},
                curves=curves,
            )
        )
    return sorted(groups, key=lambda g: g["group"])


def collect(root: str) -> dict:
    """Read every run under `root` (directories holding sweep_run.json), write the CSV and
    JSON tables into `root`, and return {runs, groups}."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"sweep root {root}: no such directory")
    workdirs = sorted(
        os.path.join(root, d)
        for d in os.listdir(root)
        if os.path.isfile(os.path.join(root, d, RUN_FILE))
        and not os.path.isdir(os.path.join(root, d, populations.MEMBERS_DIR))
    ) + populations.member_workdirs(root, RUN_FILE)  # a population's runs: its members
    if not workdirs:
        raise FileNotFoundError(f"sweep root {root}: no run directory (none holds {RUN_FILE})")
    runs = [read_run(w) for w in workdirs]
    groups = group_runs(runs)
    _write_runs_csv(os.path.join(root, RUNS_CSV), runs)
    _write_table_csv(os.path.join(root, TABLE_CSV), groups)
    with open(os.path.join(root, RESULTS_JSON), "w") as f:
        json.dump(dict(runs=runs, groups=groups), f, indent=1)
    return dict(runs=runs, groups=groups)


def _override_keys(items: list[dict]) -> list[str]:
    return sorted({k for it in items for k in it["overrides"]})


def _write_runs_csv(path: str, runs: list[dict]) -> None:
    okeys = _override_keys(runs)
    mkeys = sorted({k for r in runs for k in r["final"]})
    head = ["name", "group", "config", *okeys, "status", "step", "wall_seconds", *mkeys]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        for r in runs:
            w.writerow(
                [r["name"], r["group"], r["config"]]
                + [r["overrides"].get(k, "") for k in okeys]
                + [r["status"], r["step"], r["wall_seconds"]]
                + [r["final"].get(k, "") for k in mkeys]
            )


def _write_table_csv(path: str, groups: list[dict]) -> None:
    okeys = _override_keys(groups)
    mkeys = sorted({k for g in groups for k in g["final"]})
    head = ["group", "config", *okeys, "n_seeds", "n_done", "step_mean", "wall_seconds_mean"]
    head += [f"{k}:{s}" for k in mkeys for s in ("mean", "std")]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        for g in groups:
            row = [g["group"], g["config"]] + [g["overrides"].get(k, "") for k in okeys]
            row += [len(g["seeds"]), g["n_done"], g["step"]["mean"], g["wall_seconds"]["mean"]]
            for k in mkeys:
                stat = g["final"].get(k)
                row += [stat["mean"], stat["std"]] if stat else ["", ""]
            w.writerow(row)
