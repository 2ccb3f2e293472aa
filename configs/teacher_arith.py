"""The OPD teacher: a larger char model trained by SFT on 3-digit addition, run to a
target far above the student's (the demo's SFT start, ~30% greedy pass@1).

    python scripts/train.py --config=configs/teacher_arith.py --workdir=runs/teacher_arith
    python scripts/train.py --config=configs/opd_arith.py --workdir=runs/opd_arith

4 layers, d=256, MLP 768, 8 heads (3.16M parameters, ~8x the 2-layer d=128 student's
0.4M), the student's char tokenizer and task, lr 1e-3 with a cosine decay. Unlike
sft_arith, whose `train.stop_at_pass1=0.3` picks an RL start mid-way, the teacher stops
only at 90% greedy pass@1 on 256 held-out prompts (evaluated every 250 steps) or after
4,000 steps of 128 demonstrations.

Budget: at most 4,000 steps. Measured on a 2-core AMD EPYC CPU (shared with other jobs):
81.2% greedy pass@1 at step 250 and 98.0% at step 500, where it stops; 9 min 20 s wall
in all (0.6-0.9 steps/s), against the student's 28.9% start. Check the teacher before
distilling: its last eval line (`[sft] step N: eval/pass@1_greedy=...`) must be well above
the student's.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.sft_teacher(presets.arithmetic("sft"))
    return presets.finish(c, arg)
