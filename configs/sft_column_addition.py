"""SFT warm start on worked column addition (32-token completions): the OPD student.

    python scripts/train.py --config=configs/sft_column_addition.py \
        --workdir=runs/sft_column_addition

The demo's 2-layer d=128 char model and optimiser (configs/sft_arith.py) on
data/tasks/column_addition.py: "123+459=" -> "3+9+0=12,2+5+1=08,1+4+0=05,0582". Like sft_arith
it stops at the first eval with greedy pass@1 >= 30%, a start with room to improve for
the distillation that follows (configs/opd_column_addition.py). Measured on a 2-core AMD
EPYC CPU (the student behind docs/results.md's claims (b) and (c)): greedy pass@1 on 128
held-out prompts reaches 44.5% at step 240, where it stops (about 1.6 min wall).
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.sft_start(presets.column_addition("sft"))
    return presets.finish(c, arg)
