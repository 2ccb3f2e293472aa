"""GRPO on 3-digit addition with a small random GPT-OSS-shaped policy (docs/models.md).

    python scripts/train.py --config=configs/grpo_gpt_oss_arith.py --workdir=runs/grpo_gpt_oss

As `grpo_moe_arith`, with the GPT-OSS architecture (`model.family = 'gpt_oss'`): attention
with biases on q, k, v and o and a learned sink logit per head in every softmax, layers
alternating a sliding window of 8 tokens (shorter than a prompt and its answer) and full
attention, and every MLP a mixture of 8 biased experts (top 2, the softmax over the chosen
logits) gated by the clamped SwiGLU. Trained from scratch with a shaped reward (format and
length besides correctness), so a random policy's groups disagree from the first step;
routing replay on (R3), the router's load-balancing loss at GPT-OSS's 0.001. The sampler
decodes the sliding layers from rings of their window (models/sliding_cache.py). RoPE is
unscaled (a scratch model has no pretrained context for YaRN to extend); a GPT-OSS
checkpoint (`model.init = 'hf'`) brings its own YaRN. `runlocal`: 4 experts, a window of 4.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.model.update(init="scratch", path="", family="gpt_oss", sliding_window=8)
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
    if arg == "runlocal":  # the arithmetic warm start is a dense model: a random GPT-OSS instead
        c.model.update(init="scratch", path="", sliding_window=4)
        c.model.moe.update(num_experts=4, intermediate_size=32)
    return c
