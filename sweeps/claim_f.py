"""Claim (f): a fixed KL coefficient vs one that moves with the run (a schedule, a controller).

    make demo    # the SFT start, runs/demo/sft
    python scripts/sweep.py run sweeps/claim_f.py && python scripts/sweep.py collect \
        runs/sweeps/claim_f && python scripts/report.py

LLMZero ("LLMZero: Discovering Adaptive Training Strategies for RL Post-Training via LLM
Agents") finds that the regularisation knobs of good runs move with the training dynamics.
configs/grpo_arith.py from the demo's SFT policy with a KL penalty to that policy, three
ways, the same 200 steps and evaluation (256 held-out prompts):

    fixed        objective.kl_coef = 0.05
    schedule     schedules.objective.kl_coef = cosine(0.05, 0.005)      0.05 -> 0.005
    controller   controllers.objective.kl_coef = adaptive_kl(0.02, init=0.05)
                 (PPO's adaptive penalty: up while train/kl_ref is above 0.02, down below;
                 with the fixed 0.05 it rises from 0.016 to 0.05 in 40 steps)
"""

from jaxrl_frontier.sweeps import product, seeds

COMMON = {
    "config": "configs/grpo_arith.py",
    "model.path": "runs/demo/sft",
    "train.steps": 200,
    "train.eval_every": 50,
    "train.checkpoint_every": 50,
    "train.log_every": 10,
    "eval.num_prompts": 256,
    "eval.pass_k": 4,
}
ARMS = [
    {"objective.kl_coef": 0.05},
    {"schedules.objective.kl_coef": "cosine(0.05, 0.005)"},
    {"controllers.objective.kl_coef": "adaptive_kl(0.02, init=0.05)"},
]


def get_sweep():
    return product(ARMS, seeds(3), [COMMON])
