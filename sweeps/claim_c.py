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
