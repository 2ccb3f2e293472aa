"""Results claims: a paper's claim, the sweeps that redo it and the rule that judges it.

Each claim is one file `sweeps/claim_<key>.py` holding its sweep (`get_sweep`) and its
analysis (`CLAIM`, a `Claim` whose `analyze` reads the `collect` output of its sweeps,
ROOT/sweep_results.json, and returns a Finding: a table of groups (mean +- std over
seeds), curves to plot, and a verdict — "reproduces at this scale", "does not reproduce at
this scale" or "inconclusive" — from a stated rule). A difference counts when it exceeds
twice its standard error over seeds (sqrt(s1^2/n1 + s2^2/n2)); fewer than 3 finished seeds
per group leaves a claim "not run yet". This module holds what the claims share: the
records, the statistics and the loader (`load_claims`); scripts/claims.py lists the
claims and scripts/report.py renders their findings into docs/results.md.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import math
import os
from collections.abc import Callable

from jaxrl_frontier.sweeps.spec import sweep_name

REPRODUCES = "reproduces at this scale"
DOES_NOT = "does not reproduce at this scale"
INCONCLUSIVE = "inconclusive"
MIN_SEEDS = 3
PASS1 = "eval/pass@1_greedy"


@dataclasses.dataclass
class Claim:
    """A paper's claim and how the project tests it."""

    key: str
    title: str
    statement: str
    sweeps: list[str]  # sweep files (FILE or FILE:STAGE), in the order they are run
    task: str  # which task, and whether its completions are long enough
    analyze: Callable[[list[dict]], Finding]
    prerequisites: list[str] = dataclasses.field(default_factory=list)  # commands run first
    group_of: Callable[[dict], str] | None = None  # run -> its group (default: collect's)
    series: frozenset[str] = frozenset()  # the curves `analyze` reads (kept in the data)
    population: int = 0  # > 0: the sweep's seeds run as populations of this size

    def roots(self, runs_dir: str) -> list[str]:
        return [os.path.join(runs_dir, sweep_name(s)) for s in self.sweeps]

    def commands(self) -> list[str]:
        out = list(self.prerequisites)
        for sweep in self.sweeps:
            packed = f" --population {self.population}" if self.population else ""
            out.append(f"python scripts/sweep.py run {sweep}{packed}")
            out.append(f"python scripts/sweep.py collect runs/sweeps/{sweep_name(sweep)}")
        return out + ["python scripts/report.py"]


@dataclasses.dataclass
class Finding:
    verdict: str
    reason: str
    rows: list[dict]  # one per group: label and "mean +- std" cells
    columns: list[str]
    curves: dict[str, dict[str, dict]]  # panel title -> label -> {steps, mean, std}
    notes: list[str] = dataclasses.field(default_factory=list)


# ------------------------------------------------------------------ statistics


def mean_std(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    return mean, (math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0)


def differs(a: list[float], b: list[float]) -> float:
    """(mean(a) - mean(b)) / its standard error (inf when both spreads are 0 and means differ)."""
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    se = math.sqrt(sa**2 / len(a) + sb**2 / len(b))
    if se == 0:
        return 0.0 if ma == mb else math.copysign(math.inf, ma - mb)
    return (ma - mb) / se


def fmt(values: list[float], digits: int = 3) -> str:
    m, s = mean_std(values)
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def series(run: dict, key: str) -> list[list[float]]:
    return run["series"].get(key, [])


def window_mean(points: list[list[float]], first: bool, n: int = 3) -> float:
    """Mean of the first (or last) n logged values of a [[step, value], ...] curve."""
    part = points[:n] if first else points[-n:]
    return sum(v for _, v in part) / len(part)


def by_label(runs: list[dict], label: Callable[[dict], str]) -> dict[str, list[dict]]:
    """Finished runs grouped by label, in first-seen order."""
    out: dict[str, list[dict]] = {}
    for run in runs:
        if run["status"] == "done":
            out.setdefault(label(run), []).append(run)
    return out


def enough_seeds(groups: dict[str, list[dict]], labels: list[str]) -> bool:
    return all(len(groups.get(lbl, [])) >= MIN_SEEDS for lbl in labels)


def mean_curve(runs: list[dict], key: str) -> dict:
    """{steps, mean, std} over the steps every run logged `key` at."""
    per = [dict((int(s), v) for s, v in series(r, key)) for r in runs]
    steps = sorted(set.intersection(*(set(p) for p in per))) if per else []
    stats = [mean_std([p[s] for p in per]) for s in steps]
    return dict(steps=steps, mean=[m for m, _ in stats], std=[s for _, s in stats])


def config_stem(run: dict) -> str:
    return os.path.splitext(os.path.basename(run["config"].split(":")[0]))[0]


def wall_note(groups: dict[str, list[dict]]) -> str:
    runs = [r for rs in groups.values() for r in rs]
    total = sum(r["wall_seconds"] for r in runs)
    cpu = sum(r.get("cpu_seconds", 0.0) for r in runs)
    m, s = mean_std([r["wall_seconds"] for r in runs])
    steps = sorted({r["step"] for r in runs})
    return (
        f"{len(runs)} runs of {', '.join(map(str, steps))} steps; wall time {m:.0f} ± {s:.0f} s "
        f"per run, {total / 60:.1f} min in all ({cpu / 60:.1f} CPU-min)"
    )


def same_curves(a: list[dict], b: list[dict], key: str) -> int:
    """How many seeds of `b` log exactly the curve of `key` that `a`'s run of that seed does."""
    by_seed = {r["seed"]: series(r, key) for r in a}
    return sum(by_seed.get(r["seed"]) == series(r, key) for r in b)


# ------------------------------------------------------------------ shared comparison


def compare(
    runs: list[dict], label: Callable[[dict], str], order: list[str], metrics: dict[str, Callable]
) -> tuple[dict[str, list[dict]], list[str], list[dict]]:
    """Groups by label (in `order`), and one row per group: seeds and each metric's
    mean +- std over seeds (metrics: column -> fn(run) -> float)."""
    groups = by_label(runs, label)
    labels = [lbl for lbl in order if lbl in groups]
    rows = []
    for lbl in labels:
        row = {"method": lbl, "seeds": str(len(groups[lbl]))}
        row.update({col: fmt([fn(r) for r in groups[lbl]]) for col, fn in metrics.items()})
        rows.append(row)
    return groups, labels, rows


def last_value(key: str) -> Callable[[dict], float]:
    return lambda r: series(r, key)[-1][1]


def verdict_faster_or_higher(
    better: list[float], base: list[float], name: str, base_name: str, what: str, lower: bool
) -> tuple[str, str]:
    z = differs(better, base)
    if lower:
        z = -z
    text = f"{what}: {name} {fmt(better)}, {base_name} {fmt(base)} ({z:+.1f} SE in {name}'s favour)"
    if z > 2:
        return REPRODUCES, text
    if z < -2:
        return DOES_NOT, text
    return INCONCLUSIVE, text + " — within 2 SE"


# ------------------------------------------------------------------ the tasks

ARITH_TASK = (
    "3-digit addition (completions of at most 6 tokens: 4 digits + EOS), the demo's "
    "2-layer d=128 char model"
)
DEMO_START = "make demo  # the SFT start, runs/demo/sft"
COLUMNS_TASK = (
    '3-digit addition worked column by column, "123+459=" -> "3+9+0=12,2+5+1=08,'
    '1+4+0=05,0582" (completions of 32 tokens with EOS; configs/opd_column_addition.py); '
    "the student is the demo's 2-layer d=128 char model after configs/sft_column_addition.py, "
    "the teacher configs/teacher_column_addition.py's 4-layer d=256 model (3.16M parameters)"
)
COLUMN_STARTS = [
    f"python scripts/train.py --config=configs/{name}.py --workdir=runs/{name}"
    for name in ("teacher_column_addition", "sft_column_addition")
]

# ------------------------------------------------------------------ loading


def load_claims(sweeps_dir: str) -> dict[str, Claim]:
    """key -> Claim of every `claim_*.py` in `sweeps_dir` that defines CLAIM, by key."""
    claims = {}
    for path in sorted(glob.glob(os.path.join(sweeps_dir, "claim_*.py"))):
        spec = importlib.util.spec_from_file_location(f"claim_file_{len(claims)}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        claim = getattr(module, "CLAIM", None)
        if not isinstance(claim, Claim):
            raise TypeError(f"claim file {path}: defines no CLAIM = Claim(...)")
        if claim.key in claims:
            raise ValueError(f"claim file {path}: claim {claim.key!r} is defined twice")
        claims[claim.key] = claim
    return dict(sorted(claims.items()))


def describe(claim: Claim) -> str:
    """A claim as text: key, title, the paper's statement, the task, the commands that redo it."""
    lines = [f"({claim.key}) {claim.title}", f"  {claim.statement}", f"  task: {claim.task}"]
    return "\n".join(lines + ["  redo: " + c for c in claim.commands()])
