"""Claim (c): OPD on the first 30% vs the last 30% of completion tokens (position bias).

    make demo    # the student's start, runs/demo/sft
    python scripts/train.py --config=configs/teacher_arith.py --workdir=runs/teacher_arith
    python scripts/sweep.py run sweeps/claim_c.py
    python scripts/sweep.py collect runs/sweeps/claim_c && python scripts/report.py

configs/opd_arith.py with the `position_window` weight (w = 1 on relative completion
positions [start, end), else 0) on [0, 0.3) and [0.7, 1.0), beside OPD on every token;
3 seeds each. Arithmetic completions are at most 6 tokens, so a window is one or two
tokens; countdown (configs/grpo_countdown.py's task, 24 tokens) is the longer test.
"""

from jaxrl_frontier.sweeps import product, seeds, zip_

COMMON = {
    "config": "configs/opd_arith.py",
    "model.path": "runs/demo/sft",
    "teacher.path": "runs/teacher_arith",
    "eval.num_prompts": 256,
}
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
