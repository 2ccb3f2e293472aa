"""The OPD teacher for worked column addition: configs/teacher_arith.py's 4-layer d=256
model (3.16M parameters, ~8x the student's) on data/tasks/column_addition.py.

    python scripts/train.py --config=configs/teacher_column_addition.py \
        --workdir=runs/teacher_column_addition

It stops at 90% greedy pass@1 on 256 held-out prompts (evaluated every 250 steps) or after
4,000 steps of 128 demonstrations. Check its last eval line
(`[sft] step N: eval/pass@1_greedy=...`) before distilling: it must be well above the
student's (configs/sft_column_addition.py stops at 30%).

Budget: at most 4,000 steps. Measured on a 2-core AMD EPYC CPU (AVX2, AVX-512; the teacher
behind docs/results.md's claims (b) and (c)): 94.1% greedy pass@1 at step 250, where it
stops; 6 min 48 s wall, against the student's 44.5% start.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.sft_teacher(presets.column_addition("sft"))
    return presets.finish(c, arg)
