"""On-policy distillation on 3-digit addition: a larger SFT teacher scores the student.

    # teacher: a bigger SFT model with its own budget and stop (configs/teacher_arith.py)
    python scripts/train.py --config=configs/teacher_arith.py --workdir=runs/teacher_arith
    python scripts/train.py --config=configs/opd_arith.py --workdir=runs/opd_arith

OPD (OPD survey, 2026): per-token reward a_t = log q_teacher(y_t) - log p_student(y_t) on the
student's own samples (the sampled-token reverse KL), used as a token-level advantage
with the policy-gradient weight w = 1 on fresh on-policy samples.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic_opd()
    return presets.finish(c, arg)
