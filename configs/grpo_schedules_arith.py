"""GRPO on 3-digit addition with regularisation that moves during the run: a KL coefficient
on a cosine schedule and an entropy bonus under a feedback controller.

    python scripts/train.py --config=configs/grpo_schedules_arith.py \
        --workdir=runs/grpo_schedules_arith --config.model.path=runs/sft_arith

LLMZero ("LLMZero: Discovering Adaptive Training Strategies for RL Post-Training via LLM
Agents") finds that the regularisation knobs of good runs move with the training dynamics
instead of staying fixed. Here (docs/methods.md, "Schedules and controllers"):

    kl_coef(s)       = 0.005 + 0.045 (1 + cos(pi s / N)) / 2     0.05 at step 0, 0.005 at N
    entropy_coef     + 0.001 per step while the token entropy is below 0.5 - 0.1,
                     - 0.001 while above 0.5 + 0.1, within [0, 0.01]

Each value is logged as schedule/<key>; the reference model loads since kl_coef rises
above 0; the controller's state is checkpointed. Any other key of `schedules.*` or
`controllers.*` is set the same way, e.g. `--config.schedules.rollout.temperature='linear(1.0, 0.7)'`.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.schedules.objective.kl_coef = "cosine(0.05, 0.005)"
    c.controllers.objective.entropy_coef = dict(
        kind="entropy", target=0.5, band=0.1, step=0.001, ceiling=0.01
    )
    c.optimizer.update(lr=1e-4, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=800, minibatches=2, log_every=10, eval_every=100, checkpoint_every=100)
    c.eval.update(num_prompts=256, pass_k=4)
    return presets.finish(c, arg)
