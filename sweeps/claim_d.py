"""Claim (d): PPO clip vs DPPO vs DRPO vs CPPO with 4 epochs per batch (stale data).

    make demo    # the SFT start, runs/demo/sft
    python scripts/sweep.py run sweeps/claim_d.py
    python scripts/sweep.py collect runs/sweeps/claim_d && python scripts/report.py

configs/grpo_arith.py with each trust region's weight at its defaults, every rollout
batch reused for train.epochs=4 passes of 2 minibatches (8 updates per batch: the later
ones on data 7 updates stale), 200 steps, 3 seeds. Stability: best minus final eval pass@1.
"""

from jaxrl_frontier.sweeps import grid, product, seeds

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
