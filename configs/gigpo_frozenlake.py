"""GiGPO on the 3x3 frozen lake: episode- and step-level group advantages.

    python scripts/train.py --config=configs/sft_frozenlake.py --workdir=runs/sft_frozenlake
    python scripts/train.py --config=configs/gigpo_frozenlake.py --workdir=runs/gigpo_frozenlake
    python scripts/train.py --config=configs/gigpo_frozenlake.py:runlocal --workdir=/tmp/x

As configs/grpo_frozenlake.py, with per-turn credit (`env.credit = 'gigpo'`, GiGPO: "Group-in-
Group Policy Optimization for LLM Agent Training"): A(t) = A_E(episode) + step_weight *
A_S(t), where A_S compares the discounted returns (`env.gamma`) of the turns taken from the
same anchor state across the group's episodes, normalised by `env.scale`.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.frozenlake("rl")
    c.env.update(credit="gigpo", gamma=0.95, step_weight=1.0, scale="mean")
    c.objective.advantage = "grpo"  # the episode term A_E and the metrics' group baseline
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.optimizer.update(lr=3e-4, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=100, log_every=5, eval_every=25, checkpoint_every=25)
    c.eval.update(num_prompts=128, pass_k=2, batch=128)
    return presets.finish(c, arg)
