"""Claim (e): SFT depth, pre-RL entropy and the GRPO outcome (entropy collapse), two stages.

    python scripts/sweep.py run sweeps/claim_e.py:sft     # first
    python scripts/sweep.py run sweeps/claim_e.py:rl
    python scripts/sweep.py collect runs/sweeps/claim_e_rl && python scripts/report.py

Stage `sft`: configs/sft_arith.py without its pass@1 stop (train.stop_at_pass1=0), trained
for DEPTHS steps, 3 seeds each: deeper SFT sharpens the policy (lower entropy) and raises
pass@1. Stage `rl`: does the policy entropy before RL (train/entropy at the first logged RL
step) predict the GRPO outcome (the pass@1 gain)? configs/grpo_arith.py for 200 steps from
each of the 9 SFT runs (same seed); model.path names the SFT run's workdir (train.steps=N
in it gives the depth).
"""

import math
import os

from jaxrl_frontier.sweeps import SweepError, grid, product, seeds
from jaxrl_frontier.sweeps.claims import (
    ARITH_TASK,
    DOES_NOT,
    INCONCLUSIVE,
    PASS1,
    REPRODUCES,
    Claim,
    Finding,
    compare,
    last_value,
    mean_curve,
    mean_std,
    series,
    wall_note,
)
from jaxrl_frontier.sweeps.launch import REPO, plan

DEPTHS = [200, 600, 1800]
SFT = {"config": "configs/sft_arith.py", "train.stop_at_pass1": 0.0}
SFT_ROOT = os.path.join("runs", "sweeps", "claim_e_sft")
RL = {
    "config": "configs/grpo_arith.py",
    "train.steps": 200,
    "train.eval_every": 50,
    "train.checkpoint_every": 50,
}


def get_sweep(stage: str):
    if stage == "sft":
        return product(grid(**{"train.steps": DEPTHS}), seeds(3), [SFT])
    if stage == "rl":
        runs = plan(f"{os.path.abspath(__file__)}:sft", None, os.path.join(REPO, SFT_ROOT))
        return [
            {**RL, "model.path": os.path.join(SFT_ROOT, r.name), "seed": dict(r.overrides)["seed"]}
            for r in runs
        ]
    raise SweepError(f"unknown stage {stage!r}; claim_e.py has the stages 'sft' and 'rl'")


# ------------------------------------------------------------------ analysis

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
        "final pass@1": last_value(PASS1),
    }
    done = [r for r in runs if r["status"] == "done"]
    depth = lambda lbl: int(lbl.split()[1]) if lbl.split()[1].isdigit() else 0
    order = sorted({_label_e(r) for r in done}, key=depth)
    groups, labels, rows = compare(done, _label_e, order, metrics)
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


CLAIM = Claim(
    "e",
    "Entropy collapse: SFT depth, pre-RL entropy and the GRPO outcome",
    "SFT Overtraining Predicts Rank Inversion via Entropy Collapse Under RLVR (2026): "
    "pre-RL entropy is positively associated with the GRPO outcome; SFT overtraining "
    "collapses the entropy and the later gain.",
    ["sweeps/claim_e.py:sft", "sweeps/claim_e.py:rl"],
    ARITH_TASK + "; configs/sft_arith.py for 200, 600 and 1800 steps (no pass@1 stop), "
    "then 200 steps of configs/grpo_arith.py from each",
    analyze_e,
    group_of=_label_e,
    series=frozenset({PASS1, ENTROPY}),
)
