"""SFT warm start for the frozen lake: clone a uniformly random mover.

    python scripts/train.py --config=configs/sft_frozenlake.py --workdir=runs/sft_frozenlake
    python scripts/train.py --config=configs/sft_frozenlake.py:runlocal --workdir=/tmp/sft

A char model from scratch almost never writes a move word, so an RL run on it would see no
reward. Each board's demonstration is one of up / down / left / right drawn uniformly
(`env.demonstrations`), so the policy learns to move at random: its success rate is the
random policy's, the floor configs/grpo_frozenlake.py and configs/3spo_frozenlake.py start
from. Ends by exporting the policy to <workdir>/export.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.frozenlake("sft")
    c.optimizer.update(lr=3e-3, warmup_steps=10, schedule="constant")
    c.train.update(steps=60, sft_batch=64, log_every=10, eval_every=60, checkpoint_every=60)
    c.eval.update(num_prompts=128, batch=128, pass_k=1)
    return presets.finish(c, arg)
