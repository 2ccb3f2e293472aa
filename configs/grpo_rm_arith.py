"""GRPO on 3-digit addition with a learned reward beside the verifiable one.

    python scripts/train.py --config=configs/grpo_rm_arith.py --workdir=runs/grpo_rm_arith \
        --config.model.path=runs/sft_arith \
        --config.reward_model.init=hf --config.reward_model.path=PATH_TO_A_CLASSIFIER

A reward model (a sequence classifier: an HF `*ForSequenceClassification` directory) scores
each completion with its prompt; its score, standardized over each prompt's group, is the
reward component `reward_model`, weighed with correctness in the sequence reward:
r = 1.0 * correctness + 0.5 * reward_model. Without a checkpoint (`runlocal`, or
`reward_model.init = random`) the reward model is a random one-label classifier of the
policy's shape: the wiring and the term's gradient, not a trained judge of answers.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.objective.update(advantage="grpo", weight="ppo_clip", aggregation="token_mean")
    c.objective.reward_weights = dict(correctness=1.0, reward_model=0.5)
    c.reward_model.update(init="random", normalize="group", max_len=64)
    c.optimizer.update(lr=1e-4, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=800, minibatches=2, log_every=10, eval_every=100, checkpoint_every=100)
    c.eval.update(num_prompts=256, pass_k=4)
    return presets.finish(c, arg)
