"""PPO with a learned critic on 3-digit addition, from the SFT warm start.

    python scripts/train.py --config=configs/ppo_arith.py --workdir=runs/ppo_arith \
        --config.model.path=runs/sft_arith

PPO (Schulman et al., 2017) with GAE (Schulman et al., 2016): a value head on the policy's
final hidden states (critic.kind='head'; 'model' for a separate small transformer) gives
V per completion token, A = GAE(gamma, lambda) over the completion tokens (whitened over the
batch), the PPO-clipped ratio weight, and the clipped value loss trained with the policy
(rl/methods/ppo.py). Two epochs of two minibatches per rollout batch.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.objective.advantage = "gae"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.critic.update(kind="head", gamma=1.0, lam=0.95, value_clip=0.2, value_coef=0.5, lr=1e-3)
    c.optimizer.update(lr=1e-4, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(
        steps=800, epochs=2, minibatches=2, log_every=10, eval_every=100, checkpoint_every=100
    )
    c.eval.update(num_prompts=256, pass_k=4)
    return presets.finish(c, arg)
