"""GRPO on small code problems scored by running the completion's code in the sandbox.

    python scripts/train.py --config=configs/sft_code.py --workdir=runs/sft_code
    python scripts/train.py --config=configs/grpo_code.py --workdir=runs/grpo_code
    python scripts/train.py --config=configs/grpo_code.py:runlocal --workdir=/tmp/x

Task `code_problems` (data/code_problems.jsonl): complete `def f(...): # <what it returns>
return` so that f passes the row's unit tests. The completion is model-written code, so the
task's scorer is the sandboxed one (`rewards.scorer = 'auto'` picks it): each completion runs
in a locked-down subprocess with `rewards.cpu_seconds`, `rewards.wall_seconds`,
`rewards.memory_mb` and no network, `rewards.workers` at a time; a completion that hangs,
crashes or escapes scores 0. Rewards: correctness (every test passes), format (f returned a
value for every test), length. Starts from the SFT warm start (configs/sft_code.py).
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.code("rl")
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.objective.reward_weights = dict(correctness=1.0, format=0.1)
    c.optimizer.update(lr=1e-4, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=200, log_every=10, eval_every=50, checkpoint_every=50)
    c.eval.update(num_prompts=64, pass_k=4)
    return presets.finish(c, arg)
