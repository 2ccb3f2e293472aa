"""Claim (c): OPD on the first 30% vs the last 30% of completion tokens (position bias).

    python scripts/train.py --config=configs/teacher_column_addition.py \
        --workdir=runs/teacher_column_addition
    python scripts/train.py --config=configs/sft_column_addition.py \
        --workdir=runs/sft_column_addition
    python scripts/sweep.py run sweeps/claim_c.py
    python scripts/sweep.py collect runs/sweeps/claim_c && python scripts/report.py

configs/opd_column_addition.py with the `position_window` weight (w = 1 on relative
completion positions [start, end), else 0) on [0, 0.3) and [0.7, 1.0), beside OPD on every
token; 3 seeds each. A worked sum is 32 tokens: [0, 0.3) is its first column and a half
(the units, the tens' digits), [0.7, 1.0) the last column's sum and the answer.
"""

from jaxrl_frontier.sweeps import product, seeds, zip_
from jaxrl_frontier.sweeps.claims import (
    COLUMN_STARTS,
    COLUMNS_TASK,
    INCONCLUSIVE,
    PASS1,
    Claim,
    Finding,
    compare,
    differs,
    fmt,
    last_value,
    mean_curve,
    series,
    verdict_faster_or_higher,
    wall_note,
)

COMMON = {"config": "configs/opd_column_addition.py", "eval.num_prompts": 256}
WINDOW = "objective.weight_kwargs"


def get_sweep():
    windows = zip_(
        **{
            "objective.weight": "position_window",
            f"{WINDOW}.start": [0.0, 0.7],
            f"{WINDOW}.end": [0.3, 1.0],
        }
    )
    every_token = [{"objective.weight": "pg"}]
    return product(every_token + windows, seeds(3), [COMMON])


# ------------------------------------------------------------------ analysis

KL = "opd/reverse_kl"  # the sampled reverse KL to the teacher


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
    metrics = {"final pass@1": last_value(PASS1), "final reverse KL": last_value(KL)}
    groups, labels, rows = compare(runs, _label_c, ["all tokens", C_FIRST, C_LAST], metrics)
    curves = {
        "held-out greedy pass@1": {lbl: mean_curve(groups[lbl], PASS1) for lbl in labels},
        "sampled reverse KL to the teacher": {lbl: mean_curve(groups[lbl], KL) for lbl in labels},
    }
    if C_FIRST not in groups or C_LAST not in groups:
        verdict, reason = INCONCLUSIVE, "a window has no finished run"
    else:
        verdict, reason = verdict_faster_or_higher(
            [last_value(PASS1)(r) for r in groups[C_FIRST]],
            [last_value(PASS1)(r) for r in groups[C_LAST]],
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
    final = [last_value(PASS1)(r) for r in runs]
    if differs(best, final) <= 2:
        return ""
    when = sorted(max(series(r, PASS1), key=lambda p: p[1])[0] for r in runs)
    return (
        f"{label}: greedy pass@1 peaks at {fmt(best)} (step {when[len(when) // 2]:.0f}, the "
        f"median over seeds) and ends at {fmt(final)}; the positions outside the window get "
        "no teacher signal, so the shared weights are free to drift there"
    )


CLAIM = Claim(
    "c",
    "OPD on the first 30% vs the last 30% of completion tokens",
    "Position bias of OPD (Xie et al., 2026): the distillation signal sits in the "
    "early tokens; training on the first 30% of each completion does better than "
    "on the last 30%.",
    ["sweeps/claim_c.py"],
    COLUMNS_TASK + "; [0%, 30%) of a 32-token completion is its first column block and a "
    "half (the units and the tens' digits), [70%, 100%) the last block's sum and the "
    "answer",
    analyze_c,
    COLUMN_STARTS,
    series=frozenset({PASS1, KL}),
)
