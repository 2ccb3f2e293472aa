"""Dr. GRPO on 3-digit addition: no std normalisation, constant-length aggregation.

    python scripts/train.py --config=configs/dr_grpo_arith.py --workdir=runs/dr_grpo_arith

Dr. GRPO (Liu et al., 2025): A = r - mean_g; the loss divides by a constant C (the max
completion length) instead of each sequence's own length, removing GRPO's length bias.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.objective.advantage = "dr_grpo"
    c.objective.weight = "ppo_clip"
    c.objective.aggregation = "seq_mean_token_sum_norm"
    c.objective.aggregation_kwargs = dict(max_completion_len=c.rollout.max_new_tokens)
    c.optimizer.update(lr=1e-4, warmup_steps=5)
    c.train.update(steps=300, minibatches=2, log_every=10, eval_every=100, checkpoint_every=50)
    return presets.finish(c, arg)
