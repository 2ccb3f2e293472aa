"""GRPO on 3-digit addition with a small random DeepSeek-V3-shaped policy (docs/models.md).

    python scripts/train.py --config=configs/grpo_deepseek_v3_arith.py --workdir=runs/grpo_dsv3

As `grpo_gpt_oss_arith`, with the DeepSeek-V3 architecture (`model.family = 'deepseek_v3'`,
run/build.py `_deepseek_v3_keys`): multi-head latent attention (4 heads scoring 32 nope + 16
rope dims, values 32, keys and values from a 128-wide latent), a dense first layer, then a
mixture of 8 experts (top 2 within the best 2 of 4 groups, sigmoid scores, gates x 2.5) plus
one shared expert. Load balancing is DeepSeek-V3's auxiliary-loss-free strategy: no balance
loss (objective.router_aux_coef 0); after every update each expert's selection bias moves by
u = 0.001 toward the mean load (`model.moe.bias_update_rate`; logged as
`train/moe/bias_abs_max`). Trained from scratch with a shaped reward (format and length
besides correctness), so a random policy's groups disagree from the first step; routing
replay on (R3). `runlocal`: 4 experts (no groups), heads of 8 + 4 dims.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.model.update(init="scratch", path="", family="deepseek_v3", head_dim=48)
    c.model.moe.update(
        num_experts=8,
        num_experts_per_tok=2,
        intermediate_size=128,
        routing_replay="rollout",
        bias_update_rate=0.001,
    )
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.objective.reward_weights = dict(correctness=1.0, format=0.5, length=0.1)
    c.objective.update(router_aux_coef=0.0, router_z_coef=0.0)
    c.optimizer.update(lr=1e-3, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=800, minibatches=2, log_every=10, eval_every=100, checkpoint_every=100)
    c.eval.update(num_prompts=256, pass_k=4)
    c = presets.finish(c, arg)
    if arg == "runlocal":  # the arithmetic warm start is a dense model: a random DeepSeek-V3
        c.model.update(init="scratch", path="", head_dim=12)
        c.model.moe.update(num_experts=4, intermediate_size=32)
    return c
