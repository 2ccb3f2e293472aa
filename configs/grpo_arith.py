"""GRPO on 3-digit addition, from the SFT warm start.

    python scripts/train.py --config=configs/grpo_arith.py --workdir=runs/grpo_arith \
        --config.model.path=runs/sft_arith

GRPO (Shao et al., 2024): A = (r - mean_g) / (std_g + eps), PPO-clipped ratio weight,
token-mean aggregation.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.optimizer.update(lr=1e-4, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=800, minibatches=2, log_every=10, eval_every=100, checkpoint_every=100)
    c.eval.update(num_prompts=256, pass_k=4)
    return presets.finish(c, arg)
