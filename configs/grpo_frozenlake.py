"""GRPO on a 3x3 frozen lake (multi-turn: a move per turn, the board back after each).

    python scripts/train.py --config=configs/sft_frozenlake.py --workdir=runs/sft_frozenlake
    python scripts/train.py --config=configs/grpo_frozenlake.py --workdir=runs/grpo_frozenlake
    python scripts/train.py --config=configs/grpo_frozenlake.py:runlocal --workdir=/tmp/x

Episodes of `data/envs/gridworld.py` (one agent, a few holes, 6 turns), G = 8 episodes per
board; the reward is the episode return (1 on reaching the goal). GRPO's group baseline on
the returns (Shao et al., 2024), PPO-clipped ratio, token-mean over the action tokens only
(observations are context: loss mask 0). The warm start clones a uniformly random mover, so
the success rate starts near the random policy's (`gridworld.random_policy_success`).
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.frozenlake("rl")
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.optimizer.update(lr=3e-4, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=100, log_every=5, eval_every=25, checkpoint_every=25)
    c.eval.update(num_prompts=128, pass_k=2, batch=128)  # pass@2 also gives sampled success
    return presets.finish(c, arg)
