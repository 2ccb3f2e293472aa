"""Claim (a): GRPO vs Dr. GRPO vs DAPO vs RLOO, pass@1 and response length vs step.

    make demo    # the SFT start, runs/demo/sft (28.9% greedy pass@1)
    python scripts/sweep.py run sweeps/claim_a.py && python scripts/sweep.py collect \
        runs/sweeps/claim_a && python scripts/report.py

Dr. GRPO (Liu et al., 2025) says GRPO's 1/|o| aggregation and std normalisation make
incorrect answers grow longer, and that its constant-length aggregation removes that
growth. Each method's experiment file as written, from the demo's SFT policy, for a short
budget (STEPS) with the same evaluation (256 held-out prompts, greedy pass@1 and pass@4)
and the rollout log every 10 steps (the lengths of correct and incorrect completions).
3-digit addition: completions of at most 6 tokens (4 digits + EOS), so a length effect
has little room to show.
"""

from jaxrl_frontier.sweeps import product, seeds

STEPS = 200
METHODS = [
    dict(config="configs/grpo_arith.py"),
    dict(config="configs/dr_grpo_arith.py"),
    dict(config="configs/dapo_arith.py"),
    {"config": "configs/grpo_arith.py", "objective.advantage": "rloo"},
]
COMMON = {
    "model.path": "runs/demo/sft",
    "train.steps": STEPS,
    "train.eval_every": 50,
    "train.checkpoint_every": 50,
    "train.log_every": 10,
    "train.rollout_log_every": 10,
    "eval.num_prompts": 256,
    "eval.pass_k": 4,
}


def get_sweep():
    return product([{**m, **COMMON} for m in METHODS], seeds(3))
