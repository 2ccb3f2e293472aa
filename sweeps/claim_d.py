"""Claim (d): PPO clip vs DPPO vs DRPO vs CPPO with 4 epochs per batch (stale data).

    make demo    # the SFT start, runs/demo/sft
    python scripts/sweep.py run sweeps/claim_d.py
    python scripts/sweep.py collect runs/sweeps/claim_d && python scripts/report.py

configs/grpo_arith.py with each trust region's weight at its defaults, every rollout
batch reused for train.epochs=4 passes of 2 minibatches (8 updates per batch: the later
ones on data 7 updates stale), 200 steps, 3 seeds. Stability: best minus final eval pass@1.
"""

from jaxrl_frontier.sweeps import grid, product, seeds
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
    last_value,
    mean_curve,
    series,
    wall_note,
)

COMMON = {
    "config": "configs/grpo_arith.py",
    "model.path": "runs/demo/sft",
    "train.epochs": 4,
    "train.steps": 200,
    "train.eval_every": 50,
    "train.checkpoint_every": 50,
}


def get_sweep():
    weights = grid(**{"objective.weight": ["ppo_clip", "dppo", "drpo", "cppo"]})
    return product(weights, seeds(3), [COMMON])


# ------------------------------------------------------------------ analysis

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
    metrics = {"final pass@1": last_value(PASS1), "best − final pass@1": drop}
    order = list(D_LABELS.values())
    groups, labels, rows = compare(runs, _label_d, order, metrics)
    curves = {"held-out greedy pass@1": {lbl: mean_curve(groups[lbl], PASS1) for lbl in labels}}
    if "PPO clip" not in groups or len(labels) < 2:
        return Finding(
            INCONCLUSIVE,
            "PPO clip or every other method has no finished run",
            rows,
            list(rows[0]) if rows else [],
            curves,
        )
    base = [last_value(PASS1)(r) for r in groups["PPO clip"]]
    zs = {lbl: differs([last_value(PASS1)(r) for r in groups[lbl]], base) for lbl in labels[1:]}
    better = [lbl for lbl, z in zs.items() if z > 2]
    worse = [lbl for lbl, z in zs.items() if z < -2]
    verdict = (
        REPRODUCES if better and not worse else DOES_NOT if worse and not better else INCONCLUSIVE
    )
    reason = "final pass@1 vs PPO clip: " + ", ".join(f"{lbl} {z:+.1f} SE" for lbl, z in zs.items())
    return Finding(verdict, reason, rows, list(rows[0]), curves, [wall_note(groups)])


CLAIM = Claim(
    "d",
    "PPO clip vs DPPO vs DRPO vs CPPO with 4 epochs per batch (stale data)",
    "DPPO/DRPO (Yao et al., 2026) and CPPO (Mao et al., 2026): divergence-based "
    "trust regions stay stable and end higher than ratio clipping when each batch "
    "is reused for several epochs.",
    ["sweeps/claim_d.py"],
    ARITH_TASK,
    analyze_d,
    [DEMO_START],
    series=frozenset({PASS1}),
)
