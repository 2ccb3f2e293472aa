"""DAPO with its loop-level parts on 3-digit addition: dynamic sampling and overlong shaping.

    python scripts/train.py --config=configs/dapo_dynamic_arith.py --workdir=runs/dapo_dyn

DAPO ("DAPO: An Open-Source LLM Reinforcement Learning System at Scale"): clip-higher
(eps_low=0.2, eps_high=0.28), token-mean aggregation, no KL, and
- dynamic sampling (data.source='dynamic'): groups whose rewards are all equal are dropped
  and fresh prompts drawn until the batch holds data.prompt_batch groups with signal, at
  most data.dynamic.max_draws draws a step (dynamic/draws, dynamic/filled_zero_signal);
- soft overlong punishment over the last rollout.overlong_cache tokens of the budget (the
  'overlong' reward component, weight 1 beside correctness). rollout.mask_truncated=True
  masks cut-off completions out of the loss instead.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.28)
    c.objective.aggregation = "token_mean"
    c.objective.kl_coef = 0.0
    c.objective.reward_weights = dict(correctness=1.0, overlong=1.0)
    c.data.source = "dynamic"
    c.data.dynamic.max_draws = 4
    c.rollout.overlong_cache = 1  # of 6 tokens: R_len = -1 at 6 (4-digit sums + EOS are 5)
    c.optimizer.update(lr=1e-4, warmup_steps=5)
    c.train.update(
        steps=300, epochs=1, minibatches=2, log_every=10, eval_every=100, checkpoint_every=50
    )
    return presets.finish(c, arg)
