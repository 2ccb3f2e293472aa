"""One GRPO step on the random tiny Qwen2-shaped model: the rl benchmark's shapes.

    python benchmarks/bench.py rl --config=benchmarks/configs/grpo_random_qwen2.py
    python benchmarks/bench.py rl --config=benchmarks/configs/grpo_random_qwen2.py \\
        --config.rollout.max_new_tokens=64 --config.data.prompt_batch=4
    python scripts/train.py --config=benchmarks/configs/grpo_random_qwen2.py --workdir=/tmp/g \\
        --config.train.steps=2

(Through scripts/train.py the char tokenizer reads the prompts; the model's 512 rows are more
than its alphabet, and ids past it decode as U+FFFD: a random model's completions, scored 0.)

2 prompts x 8 completions (`data.prompt_batch`, `rollout.group_size`) of 32 new tokens,
prompts left-padded to 16 positions, no KL term (`objective.kl_coef` = 0, TRL's default
beta), one update per step on the sampler's log-probs (TRL at one iteration). The model
runs at the trainer's defaults (layers scanned, einsum attention): on the 2-core AMD EPYC
`--config.model.scan_unroll=0` measured the same step time within noise.
"""

import importlib.util
import os

# the sibling file by path: this config also runs through scripts/train.py, where the
# repository root (and so the `benchmarks` package) is not on sys.path
_spec = importlib.util.spec_from_file_location(
    "random_qwen2", os.path.join(os.path.dirname(os.path.abspath(__file__)), "random_qwen2.py")
)
random_qwen2 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(random_qwen2)


def get_config(arg=None):
    c = random_qwen2.get_config(arg or "tiny")
    c.mesh.num_devices = 1
    c.task.kwargs = dict(max_digits=3)
    c.data.prompt_batch = 2
    c.rollout.group_size = 8
    c.rollout.max_new_tokens = 32
    c.objective.kl_coef = 0.0
    c.train.recompute_old_logp = False
    c.eval.at_start = False
    return c
