"""The OPD teacher for worked column addition: configs/teacher_arith.py's 4-layer d=256
model (3.16M parameters, ~8x the student's) on tasks/column_addition.py.

    python scripts/train.py --config=configs/teacher_column_addition.py \
        --workdir=runs/teacher_column_addition

It stops at 90% greedy pass@1 on 256 held-out prompts (evaluated every 250 steps) or after
4,000 steps of 128 demonstrations. Check its last eval line
(`[sft] step N: eval/pass@1_greedy=...`) before distilling: it must be well above the
student's (configs/sft_column_addition.py stops at 30%).

Budget: at most 4,000 steps. Measured on a 2-core AMD EPYC CPU (AVX2, FMA; shared with the
student's SFT for 5 of its minutes): 41.4% greedy pass@1 at step 250 and 100.0% at step
500, where it stops; 21 min 33 s wall in all (0.37-0.46 steps/s), against the student's
45.3% start.
"""

from jaxrl_frontier import presets


def get_config(arg=None):
    c = presets.column_addition("sft")
    c.model.update(
        hidden_size=256, intermediate_size=768, num_layers=4, num_heads=8, num_kv_heads=4
    )
    c.optimizer.update(lr=1e-3, warmup_steps=100, schedule="cosine")
    c.train.update(
        steps=4000,
        sft_batch=128,
        log_every=50,
        eval_every=250,
        checkpoint_every=250,
        stop_at_pass1=0.9,
    )
    c.eval.update(num_prompts=256, batch=128, pass_k=1)
    return presets.finish(c, arg)
