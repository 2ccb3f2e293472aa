"""The claims of docs/results.md: what each tests, the sweeps that redo it, its verdict rule.

    python scripts/claims.py            # every claim: its statement, sweeps and commands
    python scripts/claims.py a e        # claims (a) and (e) only

Each claim reads the `collect` output of its sweeps (ROOT/sweep_results.json) and returns
a Finding: a table of groups (mean +- std over seeds), curves to plot, and a verdict —
"reproduces at this scale", "does not reproduce at this scale" or "inconclusive" — from a
stated rule. A difference counts when it exceeds twice its standard error over seeds
(sqrt(s1^2/n1 + s2^2/n2)); fewer than 3 finished seeds per group leaves a claim "not run
yet". scripts/report.py renders the findings.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from collections.abc import Callable

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
    sweeps: list[str]  # sweep files, in the order they are run
    task: str  # which task, and whether its completions are long enough
    analyze: Callable[[list[dict]], Finding]
    prerequisites: list[str] = dataclasses.field(default_factory=list)  # commands run first
    group_of: Callable[[dict], str] | None = None  # run -> its group (default: collect's)

    def roots(self, runs_dir: str) -> list[str]:
        return [
            os.path.join(runs_dir, os.path.splitext(os.path.basename(s))[0]) for s in self.sweeps
        ]

    def commands(self) -> list[str]:
        out = list(self.prerequisites)
        for sweep in self.sweeps:
            stem = os.path.splitext(os.path.basename(sweep))[0]
            out.append(f"python scripts/sweep.py run {sweep}")
            out.append(f"python scripts/sweep.py collect runs/sweeps/{stem}")
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


# ------------------------------------------------------------------ (a)


A_LABELS = {
    ("grpo_arith", ""): "GRPO",
    ("dr_grpo_arith", ""): "Dr. GRPO",
    ("dapo_arith", ""): "DAPO",
    ("grpo_arith", "rloo"): "RLOO",
}


def _label_a(run: dict) -> str:
    key = (config_stem(run), run["overrides"].get("objective.advantage", ""))
    return A_LABELS.get(key, f"{key[0]} {key[1]}".strip())


def _growth(run: dict) -> float:
    """Length change of incorrect completions: mean of the last 3 logged points minus the
    first 3 (characters = tokens for the char tokenizer)."""
    points = series(run, "rollouts/length_incorrect")
    return window_mean(points, first=False) - window_mean(points, first=True)


def analyze_a(runs: list[dict]) -> Finding:
    """Rule: GRPO's incorrect completions must grow (growth > 2 SE above 0), else
    inconclusive (nothing to remove). Then Dr. GRPO reproduces when its growth is below
    GRPO's by > 2 SE and not itself > 2 SE above 0; otherwise it does not."""
    groups = by_label(runs, _label_a)
    labels = [lbl for lbl in A_LABELS.values() if lbl in groups]
    rows = []
    for lbl in labels:
        rs = groups[lbl]
        start = [series(r, PASS1)[0][1] for r in rs]
        final = [series(r, PASS1)[-1][1] for r in rs]
        rows.append(
            {
                "method": lbl,
                "seeds": str(len(rs)),
                "pass@1 start": fmt(start),
                "pass@1 final": fmt(final),
                "pass@4 final": fmt([series(r, "eval/pass@4")[-1][1] for r in rs]),
                "incorrect length first → last": (
                    f"{fmt([window_mean(series(r, 'rollouts/length_incorrect'), True) for r in rs], 2)}"
                    f" → {fmt([window_mean(series(r, 'rollouts/length_incorrect'), False) for r in rs], 2)}"
                ),
                "correct length last": fmt(
                    [window_mean(series(r, "rollouts/length_correct"), False) for r in rs], 2
                ),
            }
        )
    curves = {
        "held-out greedy pass@1": {lbl: mean_curve(groups[lbl], PASS1) for lbl in labels},
        "length of incorrect completions (tokens)": {
            lbl: mean_curve(groups[lbl], "rollouts/length_incorrect") for lbl in labels
        },
        "length of correct completions (tokens)": {
            lbl: mean_curve(groups[lbl], "rollouts/length_correct") for lbl in labels
        },
    }
    g_grpo = [_growth(r) for r in groups.get("GRPO", [])]
    g_dr = [_growth(r) for r in groups.get("Dr. GRPO", [])]
    z_grpo = differs(g_grpo, [0.0] * len(g_grpo)) if g_grpo else 0.0
    if not g_grpo or not g_dr:
        verdict, reason = INCONCLUSIVE, "GRPO or Dr. GRPO has no finished run"
    elif z_grpo <= 2:
        verdict = INCONCLUSIVE
        reason = (
            f"GRPO's incorrect completions change by {fmt(g_grpo, 2)} tokens over the run "
            f"(not > 2 SE above 0): there is no length growth for Dr. GRPO to remove "
            f"(Dr. GRPO: {fmt(g_dr, 2)}); on this task a completion's length is set by its "
            "answer's digits, and all four methods raise pass@1 alike"
        )
    else:
        z = differs(g_dr, g_grpo)
        dr_grows = differs(g_dr, [0.0] * len(g_dr)) > 2
        ok = z < -2 and not dr_grows
        verdict = REPRODUCES if ok else DOES_NOT
        reason = (
            f"incorrect-completion growth: GRPO {fmt(g_grpo, 2)} tokens, Dr. GRPO "
            f"{fmt(g_dr, 2)} ({z:+.1f} SE)"
        )
    notes = [wall_note(groups)]
    same = _same_curves(groups.get("GRPO", []), groups.get("DAPO", []), PASS1)
    clip = [v for r in groups.get("GRPO", []) for _, v in series(r, "train/ratio_clip_frac")]
    if same and clip:
        notes.append(
            f"DAPO's pass@1 curve equals GRPO's exactly in {same} of "
            f"{len(groups['DAPO'])} seeds: its clip-higher bound (eps_high 0.28 against 0.2) "
            "hardly binds with 2 minibatches per batch (GRPO clips "
            f"{100 * sum(clip) / len(clip):.2f}% of tokens, train/ratio_clip_frac)"
        )
    return Finding(verdict, reason, rows, list(rows[0]) if rows else [], curves, notes)


def _same_curves(a: list[dict], b: list[dict], key: str) -> int:
    """How many seeds of `b` log exactly the curve of `key` that `a`'s run of that seed does."""
    by_seed = {r["seed"]: series(r, key) for r in a}
    return sum(by_seed.get(r["seed"]) == series(r, key) for r in b)


# ------------------------------------------------------------------ shared comparison


def _compare(
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


def _final(key: str) -> Callable[[dict], float]:
    return lambda r: series(r, key)[-1][1]


def _verdict_faster_or_higher(
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


# ------------------------------------------------------------------ (b)

KL = "opd/reverse_kl"


def steps_to(run: dict, key: str, target: float) -> float:
    """First logged step with value <= target; the run's last step + 1 if it never does
    (a censored count: the run's budget was not enough)."""
    for step, value in series(run, key):
        if value <= target:
            return float(step)
    return float(run["step"] + 1)


def _label_b(run: dict) -> str:
    return (
        "IW-OPD"
        if run["overrides"].get("objective.weight", "") == "iw_opd"
        or config_stem(run).startswith("iw_opd")
        else "OPD"
    )


def analyze_b(runs: list[dict]) -> Finding:
    """Rule: the target is half the mean reverse KL at the first logged step over all runs;
    IW-OPD reproduces when it reaches it in fewer steps than OPD by > 2 SE, does not when
    it needs more by > 2 SE."""
    done = [r for r in runs if r["status"] == "done" and series(r, KL)]
    target = 0.5 * mean_std([series(r, KL)[0][1] for r in done])[0] if done else 0.0
    metrics = {
        f"steps to KL ≤ {target:.3f}": lambda r: steps_to(r, KL, target),
        "final reverse KL": _final(KL),
        "final pass@1": _final(PASS1),
    }
    groups, labels, rows = _compare(done, _label_b, ["OPD", "IW-OPD"], metrics)
    curves = {
        "sampled reverse KL to the teacher": {lbl: mean_curve(groups[lbl], KL) for lbl in labels},
        "held-out greedy pass@1": {lbl: mean_curve(groups[lbl], PASS1) for lbl in labels},
    }
    fn = metrics[f"steps to KL ≤ {target:.3f}"]
    censored = all(fn(r) > r["step"] for r in done)
    if len(labels) < 2:
        verdict, reason = INCONCLUSIVE, "OPD or IW-OPD has no finished run"
    elif censored:
        moves = ", ".join(
            f"{lbl} {mean_std([series(r, KL)[0][1] for r in groups[lbl]])[0]:.3f} → "
            f"{mean_std([_final(KL)(r) for r in groups[lbl]])[0]:.3f}"
            for lbl in labels
        )
        verdict = INCONCLUSIVE
        reason = (
            f"no run reached the target (half the starting reverse KL) within its steps, so "
            f"the step counts are the budget + 1; the sampled reverse KL went {moves}"
        )
    else:
        verdict, reason = _verdict_faster_or_higher(
            [fn(r) for r in groups["IW-OPD"]],
            [fn(r) for r in groups["OPD"]],
            "IW-OPD",
            "OPD",
            "steps to the target KL",
            lower=True,
        )
    notes = [wall_note(groups)]
    steps = [int(s) for s, _ in series(done[0], KL)] if done else []
    if len(steps) > 1:
        notes.append(
            f"the reverse KL is logged every {steps[1] - steps[0]} steps, so a step count "
            "has that resolution"
        )
    return Finding(verdict, reason, rows, list(rows[0]) if rows else [], curves, notes)


# ------------------------------------------------------------------ (c)


def _label_c(run: dict) -> str:
    o = run["overrides"]
    if o.get("objective.weight") != "position_window":
        return "all tokens"
    start = float(o.get("objective.weight_kwargs.start", 0.0))
    end = float(o.get("objective.weight_kwargs.end", 0.3))
    return f"tokens [{start:.0%}, {end:.0%})"


C_FIRST, C_LAST = "tokens [0%, 30%)", "tokens [70%, 100%)"


def analyze_c(runs: list[dict]) -> Finding:
    """Rule: the position-bias claim reproduces when OPD on the first 30% of completion
    tokens ends with a higher pass@1 than on the last 30% by > 2 SE, and does not when the
    last 30% is higher by > 2 SE."""
    metrics = {"final pass@1": _final(PASS1), "final reverse KL": _final(KL)}
    groups, labels, rows = _compare(runs, _label_c, ["all tokens", C_FIRST, C_LAST], metrics)
    curves = {
        "held-out greedy pass@1": {lbl: mean_curve(groups[lbl], PASS1) for lbl in labels},
        "sampled reverse KL to the teacher": {lbl: mean_curve(groups[lbl], KL) for lbl in labels},
    }
    if C_FIRST not in groups or C_LAST not in groups:
        verdict, reason = INCONCLUSIVE, "a window has no finished run"
    else:
        verdict, reason = _verdict_faster_or_higher(
            [_final(PASS1)(r) for r in groups[C_FIRST]],
            [_final(PASS1)(r) for r in groups[C_LAST]],
            "first 30%",
            "last 30%",
            "final pass@1",
            lower=False,
        )
    windows = [lbl for lbl in labels if lbl != "all tokens"]
    notes = [wall_note(groups)] + [_peak_note(lbl, groups[lbl]) for lbl in windows]
    return Finding(
        verdict, reason, rows, list(rows[0]) if rows else [], curves, [n for n in notes if n]
    )


def _peak_note(label: str, runs: list[dict]) -> str:
    """A window whose pass@1 falls from its best eval to its last by > 2 SE: both, and when."""
    best = [max(v for _, v in series(r, PASS1)) for r in runs]
    final = [_final(PASS1)(r) for r in runs]
    if differs(best, final) <= 2:
        return ""
    when = sorted(max(series(r, PASS1), key=lambda p: p[1])[0] for r in runs)
    return (
        f"{label}: greedy pass@1 peaks at {fmt(best)} (step {when[len(when) // 2]:.0f}, the "
        f"median over seeds) and ends at {fmt(final)}; the positions outside the window get "
        "no teacher signal, so the shared weights are free to drift there"
    )


# ------------------------------------------------------------------ (d)

D_LABELS = {"ppo_clip": "PPO clip", "dppo": "DPPO", "drpo": "DRPO", "cppo": "CPPO"}


def _label_d(run: dict) -> str:
    return D_LABELS.get(run["overrides"].get("objective.weight", "ppo_clip"), "?")


def drop(run: dict) -> float:
    """Stability: best eval pass@1 minus the final one (0 for a run that ends at its best)."""
    values = [v for _, v in series(run, PASS1)]
    return max(values) - values[-1]


def analyze_d(runs: list[dict]) -> Finding:
    """Rule: per trust region, final pass@1 against PPO clip (> 2 SE higher: better, > 2 SE
    lower: worse); the claim (divergence-based trust regions beat ratio clipping on stale
    data) reproduces when at least one is better and none worse, does not when none is
    better and one is worse, else inconclusive."""
    metrics = {"final pass@1": _final(PASS1), "best − final pass@1": drop}
    order = list(D_LABELS.values())
    groups, labels, rows = _compare(runs, _label_d, order, metrics)
    curves = {"held-out greedy pass@1": {lbl: mean_curve(groups[lbl], PASS1) for lbl in labels}}
    if "PPO clip" not in groups or len(labels) < 2:
        return Finding(
            INCONCLUSIVE,
            "PPO clip or every other method has no finished run",
            rows,
            list(rows[0]) if rows else [],
            curves,
        )
    base = [_final(PASS1)(r) for r in groups["PPO clip"]]
    zs = {lbl: differs([_final(PASS1)(r) for r in groups[lbl]], base) for lbl in labels[1:]}
    better = [lbl for lbl, z in zs.items() if z > 2]
    worse = [lbl for lbl, z in zs.items() if z < -2]
    verdict = (
        REPRODUCES if better and not worse else DOES_NOT if worse and not better else INCONCLUSIVE
    )
    reason = "final pass@1 vs PPO clip: " + ", ".join(f"{lbl} {z:+.1f} SE" for lbl, z in zs.items())
    return Finding(verdict, reason, rows, list(rows[0]), curves, [wall_note(groups)])


# ------------------------------------------------------------------ (e)

ENTROPY = "train/entropy"


def _label_e(run: dict) -> str:
    import re

    m = re.search(r"train\.steps=(\d+)", run["overrides"].get("model.path", ""))
    return f"SFT {m.group(1)} steps" if m else "SFT ?"


def rank_correlation(x: list[float], y: list[float]) -> float:
    """Spearman's rho (average ranks for ties)."""

    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(x), ranks(y)
    (mx, sx), (my, sy) = mean_std(rx), mean_std(ry)
    if sx == 0 or sy == 0:
        return 0.0
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry)) / (len(x) - 1)
    return cov / (sx * sy)


def gain(run: dict) -> float:
    values = series(run, PASS1)
    return values[-1][1] - values[0][1]


def analyze_e(runs: list[dict]) -> Finding:
    """Rule: over all RL runs, Spearman's rho between the policy entropy at the first
    logged RL step and the pass@1 gain of RL; t = rho sqrt((n-2)/(1-rho^2)) > 2 (more
    entropy, more gain) reproduces, < -2 does not, else inconclusive."""
    metrics = {
        "pre-RL entropy": lambda r: series(r, ENTROPY)[0][1],
        "pass@1 gain": gain,
        "final pass@1": _final(PASS1),
    }
    done = [r for r in runs if r["status"] == "done"]
    depth = lambda lbl: int(lbl.split()[1]) if lbl.split()[1].isdigit() else 0
    order = sorted({_label_e(r) for r in done}, key=depth)
    groups, labels, rows = _compare(done, _label_e, order, metrics)
    curves = {
        "held-out greedy pass@1": {lbl: mean_curve(groups[lbl], PASS1) for lbl in labels},
        "policy entropy": {lbl: mean_curve(groups[lbl], ENTROPY) for lbl in labels},
    }
    used = [r for r in done if series(r, ENTROPY)]
    if len(used) < 3:
        return Finding(
            INCONCLUSIVE,
            "fewer than 3 finished RL runs",
            rows,
            list(rows[0]) if rows else [],
            curves,
        )
    rho = rank_correlation([series(r, ENTROPY)[0][1] for r in used], [gain(r) for r in used])
    n = len(used)
    t = rho * math.sqrt((n - 2) / max(1 - rho**2, 1e-12))
    verdict = REPRODUCES if t > 2 else DOES_NOT if t < -2 else INCONCLUSIVE
    reason = f"Spearman rho(pre-RL entropy, pass@1 gain) = {rho:+.2f} over {n} runs (t = {t:+.1f})"
    return Finding(
        verdict,
        reason,
        rows,
        list(rows[0]),
        curves,
        [wall_note(groups), _depth_note(groups, labels)],
    )


def _depth_note(groups: dict[str, list[dict]], labels: list[str]) -> str:
    """Whether the SFT depths reach over-training: the RL start's greedy pass@1 by depth."""
    start = {lbl: mean_std([series(r, PASS1)[0][1] for r in groups[lbl]])[0] for lbl in labels}
    cells = ", ".join(f"{lbl} {v:.3f}" for lbl, v in start.items())
    values = list(start.values())
    if all(b > a for a, b in zip(values, values[1:])):
        return (
            f"greedy pass@1 at the start of RL rises with every SFT depth ({cells}): the "
            "depths run from under-trained to better-trained starts and none is past its "
            "best, so the over-training the claim is about is not reached; deeper SFT is "
            "the test of it"
        )
    return f"greedy pass@1 at the start of RL by SFT depth: {cells}"


# ------------------------------------------------------------------ (f)

KL_REF = "train/kl_ref"
KL_COEF = "schedule/objective.kl_coef"
F_FIXED, F_SCHEDULE, F_CONTROLLER = "fixed 0.05", "cosine schedule", "adaptive controller"


def _label_f(run: dict) -> str:
    o = run["overrides"]
    if "schedules.objective.kl_coef" in o:
        return F_SCHEDULE
    if "controllers.objective.kl_coef" in o:
        return F_CONTROLLER
    return F_FIXED


def _coef_range(runs: list[dict]) -> str:
    """The coefficient at the first logged step (mean over seeds) → at the last (mean ± std)."""
    curves = [[v for _, v in series(r, KL_COEF)] for r in runs]
    if not all(curves):
        return "0.050 (fixed)"
    return f"{mean_std([c[0] for c in curves])[0]:.3f} → {fmt([c[-1] for c in curves])}"


def analyze_f(runs: list[dict]) -> Finding:
    """Rule: each moving coefficient against the fixed one on final greedy pass@1 (> 2 SE
    higher: better, > 2 SE lower: worse, else within noise); the claim (a regularisation
    knob that moves with the run beats a fixed one) reproduces when one is better and none
    worse, does not when one is worse and none better, else inconclusive."""
    metrics = {
        "pass@1 start": lambda r: series(r, PASS1)[0][1],
        "final pass@1": _final(PASS1),
        "best pass@1": lambda r: max(v for _, v in series(r, PASS1)),
        "final KL to the SFT policy": _final(KL_REF),
    }
    order = [F_FIXED, F_SCHEDULE, F_CONTROLLER]
    groups, labels, rows = _compare(runs, _label_f, order, metrics)
    for row, lbl in zip(rows, labels):
        row["kl_coef first → last"] = _coef_range(groups[lbl])
    curves = {
        "held-out greedy pass@1": {lbl: mean_curve(groups[lbl], PASS1) for lbl in labels},
        "KL to the SFT policy (train/kl_ref)": {
            lbl: mean_curve(groups[lbl], KL_REF) for lbl in labels
        },
        "kl_coef": {lbl: mean_curve(groups[lbl], KL_COEF) for lbl in labels if lbl != F_FIXED},
    }
    columns = list(rows[0]) if rows else []
    if F_FIXED not in groups or len(labels) < 2:
        return Finding(
            INCONCLUSIVE,
            "the fixed arm or both moving arms have no finished run",
            rows,
            columns,
            curves,
        )
    base = [_final(PASS1)(r) for r in groups[F_FIXED]]
    zs = {lbl: differs([_final(PASS1)(r) for r in groups[lbl]], base) for lbl in labels[1:]}
    word = lambda z: "better" if z > 2 else "worse" if z < -2 else "within noise"  # noqa: E731
    better = [lbl for lbl, z in zs.items() if z > 2]
    worse = [lbl for lbl, z in zs.items() if z < -2]
    verdict = (
        REPRODUCES if better and not worse else DOES_NOT if worse and not better else INCONCLUSIVE
    )
    reason = "final pass@1 against the fixed coefficient: " + ", ".join(
        f"{lbl} {word(z)} ({z:+.1f} SE)" for lbl, z in zs.items()
    )
    notes = [wall_note(groups)]
    if F_CONTROLLER in groups:
        import re

        spec = groups[F_CONTROLLER][0]["overrides"]["controllers.objective.kl_coef"]
        target = re.search(r"\(\s*([0-9.eE+-]+)", spec)
        ctl = groups[F_CONTROLLER]
        notes.append(
            f"the controller ({spec}) ends with train/kl_ref at {fmt([_final(KL_REF)(r) for r in ctl])}"
            + (f" against its target {float(target.group(1)):g}" if target else "")
            + f", kl_coef raised to {fmt([_final(KL_COEF)(r) for r in ctl])}; the fixed "
            f"coefficient's KL ends at {fmt([_final(KL_REF)(r) for r in groups[F_FIXED]])}"
        )
    return Finding(verdict, reason, rows, columns, curves, notes)


# The curves the analyses read: what scripts/report.py keeps of each run in the committed
# trimmed results (docs/results/data).
SERIES_USED = frozenset(
    {PASS1, "eval/pass@4", "rollouts/length_incorrect", "rollouts/length_correct"}
    | {"train/ratio_clip_frac", KL, ENTROPY, KL_REF, KL_COEF}
)

# ------------------------------------------------------------------ the claims

_ARITH = (
    "3-digit addition (completions of at most 6 tokens: 4 digits + EOS), the demo's "
    "2-layer d=128 char model"
)
_DEMO = "make demo  # the SFT start, runs/demo/sft"
_COLUMNS = (
    '3-digit addition worked column by column, "123+459=" -> "3+9+0=12,2+5+1=08,'
    '1+4+0=05,0582" (completions of 32 tokens with EOS; configs/opd_column_addition.py); '
    "the student is the demo's 2-layer d=128 char model after configs/sft_column_addition.py, "
    "the teacher configs/teacher_column_addition.py's 4-layer d=256 model (3.16M parameters)"
)
_COLUMN_RUNS = [
    f"python scripts/train.py --config=configs/{name}.py --workdir=runs/{name}"
    for name in ("teacher_column_addition", "sft_column_addition")
]

CLAIMS: dict[str, Claim] = {
    c.key: c
    for c in [
        Claim(
            "a",
            "GRPO vs Dr. GRPO vs DAPO vs RLOO: pass@1 and response length",
            "Dr. GRPO (Liu et al., 2025): GRPO's per-sequence 1/|o| aggregation and std "
            "normalisation make incorrect answers grow longer; Dr. GRPO's constant-length "
            "aggregation removes that growth at equal accuracy.",
            ["sweeps/claim_a.py"],
            _ARITH + ": little room for a length effect",
            analyze_a,
            [_DEMO],
        ),
        Claim(
            "b",
            "OPD vs IW-OPD: steps to a target reverse KL",
            "IW-OPD (Xie et al., 2026): weighting each token by the discrepancy not yet "
            "accumulated converges faster than plain on-policy distillation.",
            ["sweeps/claim_b.py"],
            _COLUMNS,
            analyze_b,
            _COLUMN_RUNS,
        ),
        Claim(
            "c",
            "OPD on the first 30% vs the last 30% of completion tokens",
            "Position bias of OPD (Xie et al., 2026): the distillation signal sits in the "
            "early tokens; training on the first 30% of each completion does better than "
            "on the last 30%.",
            ["sweeps/claim_c.py"],
            _COLUMNS + "; [0%, 30%) of a 32-token completion is its first column block and a "
            "half (the units and the tens' digits), [70%, 100%) the last block's sum and the "
            "answer",
            analyze_c,
            _COLUMN_RUNS,
        ),
        Claim(
            "d",
            "PPO clip vs DPPO vs DRPO vs CPPO with 4 epochs per batch (stale data)",
            "DPPO/DRPO (Yao et al., 2026) and CPPO (Mao et al., 2026): divergence-based "
            "trust regions stay stable and end higher than ratio clipping when each batch "
            "is reused for several epochs.",
            ["sweeps/claim_d.py"],
            _ARITH,
            analyze_d,
            [_DEMO],
        ),
        Claim(
            "e",
            "Entropy collapse: SFT depth, pre-RL entropy and the GRPO outcome",
            "SFT Overtraining Predicts Rank Inversion via Entropy Collapse Under RLVR (2026): "
            "pre-RL entropy is positively associated with the GRPO outcome; SFT overtraining "
            "collapses the entropy and the later gain.",
            ["sweeps/claim_e_sft.py", "sweeps/claim_e_rl.py"],
            _ARITH + "; configs/sft_arith.py for 200, 600 and 1800 steps (no pass@1 stop), "
            "then 200 steps of configs/grpo_arith.py from each",
            analyze_e,
            group_of=_label_e,
        ),
        Claim(
            "f",
            "A fixed KL coefficient vs a schedule and a controller",
            "LLMZero: Discovering Adaptive Training Strategies for RL Post-Training via LLM "
            "Agents (2026): the regularisation knobs of good runs (KL coefficient, entropy "
            "bonus, clip range) move with the training dynamics; a knob that moves beats a "
            "fixed one.",
            ["sweeps/claim_f.py"],
            _ARITH + "; configs/grpo_arith.py with a KL penalty to the SFT policy: fixed at "
            "0.05, cosine(0.05, 0.005), or adaptive_kl(0.02, init=0.05) (PPO's adaptive "
            "penalty toward train/kl_ref = 0.02)",
            analyze_f,
            [_DEMO],
        ),
    ]
}


def describe(claim: Claim) -> str:
    """A claim as text: key, title, the paper's statement, the task, the commands that redo it."""
    lines = [f"({claim.key}) {claim.title}", f"  {claim.statement}", f"  task: {claim.task}"]
    return "\n".join(lines + ["  redo: " + c for c in claim.commands()])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("keys", nargs="*", help=f"claims to show (default: all of {', '.join(CLAIMS)})")
    args = p.parse_args(argv)
    unknown = [k for k in args.keys if k not in CLAIMS]
    if unknown:
        p.error(f"unknown claim {', '.join(unknown)}; known: {', '.join(CLAIMS)}")
    print("\n\n".join(describe(CLAIMS[k]) for k in args.keys or CLAIMS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
