"""GRPO on 3-digit addition with LoRA adapters on every projection, from the SFT warm start.

    python scripts/train.py --config=configs/grpo_arith_lora.py --workdir=runs/grpo_arith_lora \
        --config.model.path=runs/sft_arith

As `grpo_arith`, but only rank-8 adapters (alpha 16) on q/k/v/o and gate/up/down are trained
(Hu et al., 2021: y = x W + (alpha / r) x A B, B = 0 at the start); the base weights stay
frozen and serve as the KL reference, the checkpoints hold the adapters and their optimizer
state, and the export merges them into the weights (Hugging Face format). LoRA's usual
learning rate is about 10x the full fine-tune's.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.objective.kl_coef = 0.01  # against the frozen base (the adapters off)
    c.model.lora.update(rank=8, alpha=16.0)
    c.optimizer.update(lr=1e-3, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=800, minibatches=2, log_every=10, eval_every=100, checkpoint_every=100)
    c.eval.update(num_prompts=256, pass_k=4)
    return presets.finish(c, arg)
