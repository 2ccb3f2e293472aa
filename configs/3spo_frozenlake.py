"""3SPO on the 3x3 frozen lake: state-score step rewards compared at anchor states.

    python scripts/train.py --config=configs/sft_frozenlake.py --workdir=runs/sft_frozenlake
    python scripts/train.py --config=configs/3spo_frozenlake.py --workdir=runs/3spo_frozenlake
    python scripts/train.py --config=configs/3spo_frozenlake.py:runlocal --workdir=/tmp/x

As configs/grpo_frozenlake.py, with per-turn credit (`env.credit = '3spo'`, 3SPO:
State-Score-Supervised Policy Optimization for LLM Agents, on GiGPO's anchor groups):
A(t) = A_E(episode) + step_weight * norm_anchor(R(s_t, s_t+1)), where R rewards novel
moves and moves to states the policy has rarely succeeded from, scored from the run's own
history. `data.source = 'sspo'` keeps that history (checkpointed with the run) and draws
each batch's boards by 3SPO's allocation n(s0) = ceil(G_max S(s0)) of their start states.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.frozenlake("rl")
    c.env.update(credit="3spo", step_weight=1.0, scale="mean")
    c.env.sspo = dict(alpha=1.0, xi=10.0, zeta=0.1, g_max=8, omega_k=0.1)
    c.data.source = "sspo"
    c.data.sspo = dict(pool=4, allocate=True)
    c.objective.advantage = "grpo"  # the metrics' group baseline; the update reads 3SPO's
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.optimizer.update(lr=3e-4, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=100, log_every=5, eval_every=25, checkpoint_every=25)
    c.eval.update(num_prompts=128, pass_k=2, batch=128)
    return presets.finish(c, arg)
