"""GRPO on 3-digit addition with a small random Qwen3.5-MoE-shaped policy (docs/models.md).

    python scripts/train.py --config=configs/grpo_qwen3_5_arith.py --workdir=runs/grpo_qwen3_5

As `grpo_deepseek_v3_arith`, with the Qwen3.5 MoE architecture (`model.family = 'qwen3_5'`
with experts, run/build.py `_qwen3_5_keys`; models/hybrid.py): of 4 layers, three Gated
DeltaNet linear-attention layers (a 4-tap causal conv, then the gated delta rule over a
fixed-size [Dk, Dv] state per value head: 2 key heads and 4 value heads of 32) and every
4th a gated full-attention layer (4 query / 2 kv heads of 32, a quarter of each rotated,
an output gate), each followed by a mixture of 8 experts (top 2, softmax router, the
chosen gates renormalised) plus a shared expert behind its sigmoid gate. Trained from
scratch with a shaped reward (format and length besides correctness), so a random
policy's groups disagree from the first step; routing replay on (R3), the router's
load-balancing loss at 0.001. The hybrid runs its layers in a Python loop (`model.remat`
checkpoints each layer on its own); the sampler decodes the linear layers from their
fixed-size state.
`runlocal`: 2 layers (linear, then full attention), 4 experts, heads of 8.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.model.update(
        init="scratch", path="", family="qwen3_5", num_layers=4, head_dim=32,
        sliding_window_pattern=4,
    )  # fmt: skip
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
    if arg == "runlocal":  # the arithmetic warm start is a dense model: a random Qwen3.5
        c.model.update(init="scratch", path="", num_layers=2, head_dim=8, sliding_window_pattern=2)
        c.model.moe.update(num_experts=4, intermediate_size=32)
    return c
