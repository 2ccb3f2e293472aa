"""GRPO with Dynamic Rollout Editing on 3-digit addition.

    python scripts/train.py --config=configs/dre_arith.py --workdir=runs/dre_arith

DRE ("Dynamic Rollout Editing for Reducing Overthinking in RL-Trained Reasoning Models"):
a correct completion that keeps generating after its answer (here: trailing characters the
checker tolerates, e.g. "579  ") is cut to its shortest verified prefix plus the stop token,
re-scored, its behaviour log-probs recomputed by a forward (the behaviour pass), and
preferred in its group by the 'dre' reward component (rollout.dre_bonus). Logged:
dre/edited, dre/tokens_after_answer_before / _after.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.2)
    c.objective.aggregation = "token_mean"
    c.rollout.editors = ("dre",)
    c.rollout.dre_bonus = 0.1
    c.objective.reward_weights = dict(correctness=1.0, dre=1.0)
    c.optimizer.update(lr=1e-4, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=300, minibatches=2, log_every=10, eval_every=100, checkpoint_every=50)
    return presets.finish(c, arg)
