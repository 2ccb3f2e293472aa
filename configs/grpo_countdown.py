"""GRPO on Countdown: combine the given numbers into an expression equal to the target.

    python scripts/train.py --config=configs/grpo_countdown.py --workdir=runs/grpo_countdown

Rewards: correctness (safe parser: each number at most once, exact value), format
(parseable expression), length. Starts from scratch unless model.init/path are set
(a warm start: configs/sft_arith.py with --config.task.name=countdown).
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.task.name = "countdown"
    c.task.kwargs = dict()
    c.data.update(prompt_batch=16, max_prompt_len=32)
    c.rollout.update(group_size=8, max_new_tokens=24)
    c.model.init = "scratch"
    c.model.path = ""
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.reward_weights = dict(correctness=1.0, format=0.1)
    c.optimizer.update(lr=1e-4, warmup_steps=5)
    c.train.update(steps=500, minibatches=2, log_every=10, eval_every=100, checkpoint_every=50)
    return presets.finish(c, arg)
