"""GRPO on 3-digit addition with a small random Qwen3-MoE policy (docs/models.md).

    python scripts/train.py --config=configs/grpo_moe_arith.py --workdir=runs/grpo_moe_arith

As `grpo_arith`, but every layer's MLP is a mixture of 8 SwiGLU experts with a softmax
top-2 router (`model.moe`, models/moe.py), trained from scratch (no MoE warm start exists):
the reward is shaped (format and length besides correctness) so that a random policy's
groups disagree from the first step. The router's load-balancing loss enters at
`objective.router_aux_coef` (Qwen3-MoE's 0.001), its z-loss at `router_z_coef`; the update
logs the experts' load (moe/load_max, moe/load_min over the mean) and the router entropy.
Routing replay (`model.moe.routing_replay = 'rollout'`, R3): the sampler records each
token's experts per layer and the update routes every token there, the gates from the
current router; moe/routing_diff_share is the share of recorded (token, layer) pairs whose
update-time top-k differs from the rollout's. On a mesh the experts are split over the fsdp
axis (expert parallelism).
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.model.update(init="scratch", path="")
    c.model.moe.update(
        num_experts=8, num_experts_per_tok=2, intermediate_size=128, routing_replay="rollout"
    )
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.objective.reward_weights = dict(correctness=1.0, format=0.5, length=0.1)
    c.objective.update(router_aux_coef=0.001, router_z_coef=0.0)
    c.optimizer.update(lr=1e-3, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=800, minibatches=2, log_every=10, eval_every=100, checkpoint_every=100)
    c.eval.update(num_prompts=256, pass_k=4)
    c = presets.finish(c, arg)
    if arg == "runlocal":  # the arithmetic warm start is a dense model: a random MoE instead
        c.model.update(init="scratch", path="")
        c.model.moe.update(num_experts=4, intermediate_size=32)
    return c
