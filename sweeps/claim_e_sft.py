"""Claim (e), stage 1: SFT checkpoints of increasing depth (the RL starts of claim_e_rl).

    python scripts/sweep.py run sweeps/claim_e_sft.py
    python scripts/sweep.py run sweeps/claim_e_rl.py
    python scripts/sweep.py collect runs/sweeps/claim_e_rl && python scripts/report.py

configs/sft_arith.py without its pass@1 stop (train.stop_at_pass1=0), trained for DEPTHS
steps, 3 seeds each: deeper SFT sharpens the policy (lower entropy) and raises pass@1.
"""

from jaxrl_frontier.sweeps import grid, product, seeds

DEPTHS = [200, 600, 1800]
COMMON = {"config": "configs/sft_arith.py", "train.stop_at_pass1": 0.0}


def get_sweep():
    return product(grid(**{"train.steps": DEPTHS}), seeds(3), [COMMON])
