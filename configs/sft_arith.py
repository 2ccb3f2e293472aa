"""SFT warm start: a tiny char model learns 3-digit addition from demonstrations.

    python scripts/train.py --config=configs/sft_arith.py --workdir=runs/sft_arith
    python scripts/train.py --config=configs/sft_arith.py:runlocal --workdir=/tmp/sft

The budget puts greedy pass@1 near 50%, where the binary-reward group signal p(1-p) is
largest for the RL stage that follows (configs/grpo_arith.py). The run ends by exporting
the policy in Hugging Face format to <workdir>/export. The recipe: presets.sft_start.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.sft_start(presets.arithmetic("sft"))
    return presets.finish(c, arg)
