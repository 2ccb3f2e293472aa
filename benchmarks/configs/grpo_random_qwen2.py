"""One GRPO step on the random tiny Qwen2-shaped model: the rl benchmark's shapes.

    python benchmarks/bench.py rl --config=benchmarks/configs/grpo_random_qwen2.py
    python benchmarks/bench.py rl --config=benchmarks/configs/grpo_random_qwen2.py \\
        --config.rollout.max_new_tokens=64 --config.data.prompt_batch=4

2 prompts x 8 completions (`data.prompt_batch`, `rollout.group_size`) of 32 new tokens,
prompts left-padded to 16 positions, no KL term (`objective.kl_coef` = 0, TRL's default
beta), one update per step on the sampler's log-probs (TRL at one iteration).
"""

from benchmarks.configs import random_qwen2


def get_config(arg=None):
    c = random_qwen2.get_config(arg or "tiny")
    c.mesh.num_devices = 1
    c.task.kwargs = dict(max_digits=3)
    c.data.prompt_batch = 2
    c.rollout.group_size = 8
    c.rollout.max_new_tokens = 32
    c.objective.kl_coef = 0.0
    c.train.recompute_old_logp = False
    c.eval.at_start = False
    return c
