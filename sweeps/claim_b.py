"""Claim (b): OPD vs IW-OPD, steps to a target reverse KL and pass@1.

    make demo    # the student's start, runs/demo/sft
    python scripts/train.py --config=configs/teacher_arith.py --workdir=runs/teacher_arith
    python scripts/sweep.py run sweeps/claim_b.py
    python scripts/sweep.py collect runs/sweeps/claim_b && python scripts/report.py

IW-OPD (Xie et al., 2026) claims faster convergence than OPD. Both experiment files as
written (200 steps, the sampled reverse KL logged every 10), the demo's SFT policy as the
student, configs/teacher_arith.py's run as the teacher, 3 seeds.
"""

from jaxrl_frontier.sweeps import grid, product, seeds

COMMON = {
    "model.path": "runs/demo/sft",
    "teacher.path": "runs/teacher_arith",
    "eval.num_prompts": 256,
}


def get_sweep():
    configs = grid(config=["configs/opd_arith.py", "configs/iw_opd_arith.py"])
    return product(configs, seeds(3), [COMMON])
