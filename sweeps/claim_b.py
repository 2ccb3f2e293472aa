"""Claim (b): OPD vs IW-OPD, steps to a target reverse KL and pass@1.

    python scripts/train.py --config=configs/teacher_column_addition.py \
        --workdir=runs/teacher_column_addition
    python scripts/train.py --config=configs/sft_column_addition.py \
        --workdir=runs/sft_column_addition
    python scripts/sweep.py run sweeps/claim_b.py
    python scripts/sweep.py collect runs/sweeps/claim_b && python scripts/report.py

IW-OPD (Xie et al., 2026) claims faster convergence than OPD. configs/opd_column_addition.py
(worked column addition, completions of 32 tokens; 200 steps, the sampled reverse KL logged
every 10) with the policy-gradient weight (OPD) and with `iw_opd` at gamma = 0.5 (IW-OPD),
the 2-layer SFT student, the 4-layer teacher, 3 seeds.
"""

from jaxrl_frontier.sweeps import product, seeds

COMMON = {"config": "configs/opd_column_addition.py", "eval.num_prompts": 256}
IW_OPD = {"objective.weight": "iw_opd", "objective.weight_kwargs.gamma": 0.5}


def get_sweep():
    return product([{"objective.weight": "pg"}, IW_OPD], seeds(3), [COMMON])
