"""GD^2PO on 3-digit addition with conflicting rewards: correctness against brevity.

    python scripts/train.py --config=configs/gd2po_arith.py --workdir=runs/gd2po_arith

GD^2PO ("GD^2PO: Mitigating Multi-Reward Conflicts via Group-Dynamic reward-Decoupled
Policy Optimization"): each reward component is normalised within its group (GDPO); a
rollout whose weighted components' advantages disagree in sign is masked (mode='hard'), the
group reweighted by its kept fraction. The brevity reward (the task's 'length': 1 - chars /
max_chars) pulls toward short answers, correctness toward the right number of digits: they
conflict whenever a wrong answer is shorter than a right one. Logged: reward/correctness,
reward/length (per-component curves), diag/conflict_share (the rows hard masking drops).
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.objective.advantage = "gd2po"
    c.objective.advantage_kwargs = dict(mode="hard")
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.objective.reward_weights = dict(correctness=1.0, length=0.5)
    c.optimizer.update(lr=1e-4, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=300, minibatches=2, log_every=10, eval_every=100, checkpoint_every=50)
    return presets.finish(c, arg)
