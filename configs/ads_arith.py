"""GRPO with Adaptive Data Scheduling on 3-digit addition.

    python scripts/train.py --config=configs/ads_arith.py --workdir=runs/ads_arith

ADS ("Learning at the Right Pace: Adaptive Data Scheduling Improves LLM Reinforcement
Learning"): prompts are clustered by operation x operand digit counts (9 clusters for
addition of 1..3-digit operands; data.ads.clusters='kmeans' clusters prompt features by
seeded k-means instead, into data.ads.kmeans_k clusters); a distribution over clusters
moves toward those whose solve rate is near 0.5 (p_k <- 0.7 p_k + 0.3 s_k / sum_j s_j,
s_k = acc_k (1 - acc_k) + 0.01), and inside a cluster prompts last seen within 0.5 +- 0.17
are preferred. Logged: ads/p/<cluster>, ads/acc/<cluster>, ads/boundary_share.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.data.source = "ads"
    c.data.ads.update(pool=4, momentum=0.7, boundary=0.17, clusters="task")
    c.optimizer.update(lr=1e-4, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=300, minibatches=2, log_every=10, eval_every=100, checkpoint_every=50)
    return presets.finish(c, arg)
