"""SC-GRPO on 3-digit addition: GRPO credit reweighted by self-conditioning.

    python scripts/train.py --config=configs/sc_grpo_arith.py --workdir=runs/sc_grpo_arith

SC-GRPO ("Learning from Own Solutions: Self-Conditioned Credit Assignment for Reinforcement
Learning with Verifiable Rewards"): the self-conditioned log-prob pass puts the group's
first verified solution s before each completion and computes, per completion
token, KL_t = KL(pi(. | x, y<t) || pi(. | x, s, y<t)) summed over the vocabulary (in chunks
of rollout.sc_vocab_chunk entries). The sc_grpo weight here is the row-relative form,
w_t = max(0, 1 + coef * (k_t / mean_row(k) - 1)), k_t = min(KL_t, max_kl): on this task the
SFT start reads the [prompt | solution | completion] context off its training distribution
(KL_t ~8 nats a token on solved groups, docs/methods.md), and the plain 1 + coef * k_t would
mostly scale the step size. Rows of prompts with no verified solution keep w = 1.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.objective.advantage = "grpo"
    c.objective.weight = "sc_grpo"
    c.objective.weight_kwargs = dict(coef=1.0, max_kl=10.0, relative=True)
    c.objective.aggregation = "token_mean"
    c.optimizer.update(lr=1e-4, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=300, minibatches=2, log_every=10, eval_every=100, checkpoint_every=50)
    return presets.finish(c, arg)
