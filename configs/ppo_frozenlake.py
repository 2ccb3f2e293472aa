"""PPO with a learned critic on a 3x3 frozen lake (multi-turn: a move per turn).

    python scripts/train.py --config=configs/sft_frozenlake.py --workdir=runs/sft_frozenlake
    python scripts/train.py --config=configs/ppo_frozenlake.py --workdir=runs/ppo_frozenlake
    python scripts/train.py --config=configs/ppo_frozenlake.py:runlocal --workdir=/tmp/x

The episodes of configs/grpo_frozenlake.py; instead of a group baseline, a value head on
the policy's final hidden states (critic.kind='head') gives V at every action token and
GAE (gamma 0.95, lambda 0.9) runs over the action tokens with each turn's reward on its last
token (rl/methods/ppo.py; observations are context: no advantage, no value loss). PPO-clipped
ratio, the clipped value loss trained with the policy (its own Adam, lr 1e-3).
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.frozenlake("rl")
    c.objective.advantage = "gae"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.critic.update(kind="head", gamma=0.95, lam=0.9, value_clip=0.2, value_coef=0.5, lr=1e-3)
    c.optimizer.update(lr=3e-4, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=100, log_every=5, eval_every=25)
    c.train.checkpoint_every = 25
    c.eval.update(num_prompts=128, pass_k=2, batch=128)
    return presets.finish(c, arg)
