"""Claim (e), stage 2: GRPO from each SFT checkpoint of claim_e_sft (same seed).

    python scripts/sweep.py run sweeps/claim_e_sft.py     # first
    python scripts/sweep.py run sweeps/claim_e_rl.py
    python scripts/sweep.py collect runs/sweeps/claim_e_rl && python scripts/report.py

Does the policy entropy before RL (train/entropy at the first logged RL step) predict the
GRPO outcome (the pass@1 gain)? configs/grpo_arith.py for 200 steps from each of the 9
SFT runs; model.path names the SFT run's workdir (train.steps=N in it gives the depth).
"""

import os

from jaxrl_frontier.sweeps.launch import REPO, plan

SFT_SWEEP = os.path.join(REPO, "sweeps", "claim_e_sft.py")
SFT_ROOT = os.path.join("runs", "sweeps", "claim_e_sft")
COMMON = {
    "config": "configs/grpo_arith.py",
    "train.steps": 200,
    "train.eval_every": 50,
    "train.checkpoint_every": 50,
}


def get_sweep():
    runs = plan(SFT_SWEEP, None, os.path.join(REPO, SFT_ROOT))
    return [
        {**COMMON, "model.path": os.path.join(SFT_ROOT, r.name), "seed": dict(r.overrides)["seed"]}
        for r in runs
    ]
