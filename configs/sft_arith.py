"""SFT warm start: a tiny char model learns 3-digit addition from demonstrations.

    python scripts/train.py --config=configs/sft_arith.py --workdir=runs/sft_arith
    python scripts/train.py --config=configs/sft_arith.py:runlocal --workdir=/tmp/sft

The budget puts greedy pass@1 near 50%, where the binary-reward group signal p(1-p) is
largest for the RL stage that follows (configs/grpo_arith.py). The run ends by exporting
the policy in Hugging Face format to <workdir>/export.
"""

from jaxrl_frontier import presets


def get_config(arg=None):
    c = presets.arithmetic("sft")
    c.optimizer.update(lr=3e-3, warmup_steps=50, schedule="constant")
    # Stop at the first eval with pass@1 >= 30%: the phase transition where the carries click
    # comes at a different step with every float rounding, the start of RL should not.
    c.train.update(
        steps=1500,
        sft_batch=128,
        log_every=20,
        eval_every=20,
        checkpoint_every=100,
        stop_at_pass1=0.3,
    )
    c.eval.update(num_prompts=128, batch=128)
    c.eval.pass_k = 1
    return presets.finish(c, arg)
