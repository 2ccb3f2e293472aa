"""SFT warm start for the code problems: the char model learns the reference completions.

    python scripts/train.py --config=configs/sft_code.py --workdir=runs/sft_code
    python scripts/train.py --config=configs/grpo_code.py --workdir=runs/grpo_code

Task `code_problems` (data/code_problems.jsonl: 28 small Python functions, each a header, a
comment saying what it returns and `return`, with 4 unit tests; 25 train, 3 held out). The
held-out greedy pass@1 runs each completion against its tests in the sandbox
(data/rewards/sandbox.py), never in the trainer's process.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.sft_start(presets.code("sft"))
    c.train.update(steps=600, stop_at_pass1=0.0, eval_every=100, checkpoint_every=100)
    return presets.finish(c, arg)
