"""DAPO on 3-digit addition: clip-higher and token-level aggregation.

    python scripts/train.py --config=configs/dapo_arith.py --workdir=runs/dapo_arith

DAPO (Yu et al., 2025): asymmetric clip eps_low=0.2, eps_high=0.28 (more room for
low-probability tokens to rise, against entropy collapse), token_mean aggregation, no KL.
The number of zero-variance groups per batch is logged (rollout/zero_variance_groups);
`configs/dapo_dynamic_arith.py` adds DAPO's dynamic sampling (data.source='dynamic'), which
replaces them with groups that carry signal.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.28)
    c.objective.aggregation = "token_mean"
    c.objective.kl_coef = 0.0
    c.optimizer.update(lr=1e-4, warmup_steps=5)
    c.train.update(
        steps=300, epochs=1, minibatches=2, log_every=10, eval_every=100, checkpoint_every=50
    )
    return presets.finish(c, arg)
