"""On-policy distillation on worked column addition (32-token completions).

    python scripts/train.py --config=configs/teacher_column_addition.py \
        --workdir=runs/teacher_column_addition
    python scripts/train.py --config=configs/sft_column_addition.py \
        --workdir=runs/sft_column_addition
    python scripts/train.py --config=configs/opd_column_addition.py \
        --workdir=runs/opd_column_addition

configs/opd_arith.py's objective (OPD survey, 2026: a_t = log q_teacher(y_t) -
log p_student(y_t) on the student's own samples, weight w = 1) on a task whose completions
are five times longer; IW-OPD is `--config.objective.weight=iw_opd`, OPD on a window of
positions `--config.objective.weight=position_window` (sweeps/claim_b.py, claim_c.py).
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic_opd("runs/teacher_column_addition", task="column_addition")
    return presets.finish(c, arg)
