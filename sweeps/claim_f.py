"""Claim (f): a fixed KL coefficient vs one that moves with the run (a schedule, a controller).

    make demo    # the SFT start, runs/demo/sft
    python scripts/sweep.py run sweeps/claim_f.py --population 8 && \
        python scripts/sweep.py collect runs/sweeps/claim_f && python scripts/report.py

LLMZero ("LLMZero: Discovering Adaptive Training Strategies for RL Post-Training via LLM
Agents") finds that the regularisation knobs of good runs move with the training dynamics.
configs/grpo_arith.py from the demo's SFT policy with a KL penalty to that policy, three
ways, the same 200 steps and evaluation (256 held-out prompts), 8 seeds each, each arm's
seeds one population job (docs/population.md):

    fixed        objective.kl_coef = 0.05
    schedule     schedules.objective.kl_coef = cosine(0.05, 0.005)      0.05 -> 0.005
    controller   controllers.objective.kl_coef = adaptive_kl(0.02, init=0.05)
                 (PPO's adaptive penalty: up while train/kl_ref is above 0.02, down below;
                 with the fixed 0.05 it rises from 0.016 to 0.05 in 40 steps)
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
    compare,
    differs,
    fmt,
    last_value,
    mean_curve,
    mean_std,
    series,
    wall_note,
)

COMMON = {
    "config": "configs/grpo_arith.py",
    "model.path": "runs/demo/sft",
    "train.steps": 200,
    "train.eval_every": 50,
    "train.checkpoint_every": 50,
    "train.log_every": 10,
    "eval.num_prompts": 256,
    "eval.pass_k": 4,
}
ARMS = [
    {"objective.kl_coef": 0.05},
    {"schedules.objective.kl_coef": "cosine(0.05, 0.005)"},
    {"controllers.objective.kl_coef": "adaptive_kl(0.02, init=0.05)"},
]


def get_sweep():
    return product(ARMS, seeds(8), [COMMON])


# ------------------------------------------------------------------ analysis

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
        "final pass@1": last_value(PASS1),
        "best pass@1": lambda r: max(v for _, v in series(r, PASS1)),
        "final KL to the SFT policy": last_value(KL_REF),
    }
    order = [F_FIXED, F_SCHEDULE, F_CONTROLLER]
    groups, labels, rows = compare(runs, _label_f, order, metrics)
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
    base = [last_value(PASS1)(r) for r in groups[F_FIXED]]
    zs = {lbl: differs([last_value(PASS1)(r) for r in groups[lbl]], base) for lbl in labels[1:]}
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
            f"the controller ({spec}) ends with train/kl_ref at {fmt([last_value(KL_REF)(r) for r in ctl])}"
            + (f" against its target {float(target.group(1)):g}" if target else "")
            + f", kl_coef raised to {fmt([last_value(KL_COEF)(r) for r in ctl])}; the fixed "
            f"coefficient's KL ends at {fmt([last_value(KL_REF)(r) for r in groups[F_FIXED]])}"
        )
    return Finding(verdict, reason, rows, columns, curves, notes)


CLAIM = Claim(
    "f",
    "A fixed KL coefficient vs a schedule and a controller",
    "LLMZero: Discovering Adaptive Training Strategies for RL Post-Training via LLM "
    "Agents (2026): the regularisation knobs of good runs (KL coefficient, entropy "
    "bonus, clip range) move with the training dynamics; a knob that moves beats a "
    "fixed one.",
    ["sweeps/claim_f.py"],
    ARITH_TASK + "; configs/grpo_arith.py with a KL penalty to the SFT policy: fixed at "
    "0.05, cosine(0.05, 0.005), or adaptive_kl(0.02, init=0.05) (PPO's adaptive "
    "penalty toward train/kl_ref = 0.02)",
    analyze_f,
    [DEMO_START],
    series=frozenset({PASS1, KL_REF, KL_COEF}),
    population=8,  # each arm's 8 seeds one job (docs/population.md)
)
