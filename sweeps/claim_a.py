"""Claim (a): GRPO vs Dr. GRPO vs DAPO vs RLOO, pass@1 and response length vs step.

    make demo    # the SFT start, runs/demo/sft (28.9% greedy pass@1)
    python scripts/sweep.py run sweeps/claim_a.py && python scripts/sweep.py collect \
        runs/sweeps/claim_a && python scripts/report.py

Dr. GRPO (Liu et al., 2025) says GRPO's 1/|o| aggregation and std normalisation make
incorrect answers grow longer, and that its constant-length aggregation removes that
growth. Each method's experiment file as written, from the demo's SFT policy, for a short
budget (STEPS) with the same evaluation (256 held-out prompts, greedy pass@1 and pass@4)
and the rollout log every 10 steps (the lengths of correct and incorrect completions).
3-digit addition: completions of at most 6 tokens (4 digits + EOS), so a length effect
has little room to show.
"""

from jaxrl_frontier.sweeps import product, seeds
from jaxrl_frontier.sweeps.claims import (
    ARITH_TASK,
    DEMO_START,
    DOES_NOT,
    INCONCLUSIVE,
    PASS1,
    REPRODUCES,
    Claim,
    Finding,
    by_label,
    config_stem,
    differs,
    fmt,
    mean_curve,
    same_curves,
    series,
    wall_note,
    window_mean,
)

STEPS = 200
METHODS = [
    dict(config="configs/grpo_arith.py"),
    dict(config="configs/dr_grpo_arith.py"),
    dict(config="configs/dapo_arith.py"),
    {"config": "configs/grpo_arith.py", "objective.advantage": "rloo"},
]
COMMON = {
    "model.path": "runs/demo/sft",
    "train.steps": STEPS,
    "train.eval_every": 50,
    "train.checkpoint_every": 50,
    "train.log_every": 10,
    "train.rollout_log_every": 10,
    "eval.num_prompts": 256,
    "eval.pass_k": 4,
}


def get_sweep():
    return product([{**m, **COMMON} for m in METHODS], seeds(3))


# ------------------------------------------------------------------ analysis

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
    same = same_curves(groups.get("GRPO", []), groups.get("DAPO", []), PASS1)
    clip = [v for r in groups.get("GRPO", []) for _, v in series(r, "train/ratio_clip_frac")]
    if same and clip:
        notes.append(
            f"DAPO's pass@1 curve equals GRPO's exactly in {same} of "
            f"{len(groups['DAPO'])} seeds: its clip-higher bound (eps_high 0.28 against 0.2) "
            "hardly binds with 2 minibatches per batch (GRPO clips "
            f"{100 * sum(clip) / len(clip):.2f}% of tokens, train/ratio_clip_frac)"
        )
    return Finding(verdict, reason, rows, list(rows[0]) if rows else [], curves, notes)


CLAIM = Claim(
    "a",
    "GRPO vs Dr. GRPO vs DAPO vs RLOO: pass@1 and response length",
    "Dr. GRPO (Liu et al., 2025): GRPO's per-sequence 1/|o| aggregation and std "
    "normalisation make incorrect answers grow longer; Dr. GRPO's constant-length "
    "aggregation removes that growth at equal accuracy.",
    ["sweeps/claim_a.py"],
    ARITH_TASK + ": little room for a length effect",
    analyze_a,
    [DEMO_START],
    series=frozenset(
        {
            PASS1,
            "eval/pass@4",
            "rollouts/length_incorrect",
            "rollouts/length_correct",
            "train/ratio_clip_frac",
        }
    ),
)
