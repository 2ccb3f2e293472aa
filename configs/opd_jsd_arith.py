"""On-policy distillation on 3-digit addition with a full-vocabulary JSD to the teacher.

    python scripts/train.py --config=configs/opd_jsd_arith.py --workdir=runs/opd_jsd_arith

The OPD recipe of configs/opd_arith.py (a teacher run's export scores the student's own
samples; per-token advantage l_teacher - l_student, weight w = 1), plus the generalised
Jensen-Shannon divergence between the teacher's and the student's next-token distributions
at every completion position: M = beta p_T + (1 - beta) p_S,
JSD = beta KL(p_T || M) + (1 - beta) KL(p_S || M), beta = 0.5 (Agarwal et al. 2024, On-Policy
Distillation of Language Models: Learning from Self-Generated Mistakes, GKD). The teacher's
logits are formed inside the update from its hidden states, a chunk of positions at a time.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic_opd()
    c.objective.distill = "jsd"
    c.objective.distill_kwargs = dict(beta=0.5)
    c.objective.distill_coef = 1.0
    return presets.finish(c, arg)
