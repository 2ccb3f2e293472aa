"""GRPO on SmolLM2-135M-Instruct (a real pretrained checkpoint) on reasoning-gym arithmetic.

    python scripts/fetch_model.py smollm2-135m-instruct      # once
    python scripts/train.py --config=configs/smollm2_reasoning.py --workdir=runs/smol \
        --config.optimizer.lr=1e-5

The model is fetched by name (`model.path = 'smollm2-135m-instruct'`: docs/models.md); the
task is reasoning-gym's `basic_arithmetic` with two terms of one or two digits (`task.kwargs`,
`presets.pretrained_rl`), a question the model answers in its own chat template (its system
prompt included), asked to put the answer in <answer>...</answer> tags. Scored by
reasoning-gym's checker; the model never writes the tags at first, so the last number it
writes is scored when it gives none (`fallback = 'last_number'`) and a format reward (weight
0.5) pulls toward the tags. Rollouts stop at <|im_end|>, the token that ends its turn.
Measured on a 2-core CPU (51 min) with `--config.optimizer.lr=1e-5`: held-out greedy pass@1
on 512 unseen problems 12.2% -> 25.4% in 40 steps (docs/models.md).

`runlocal`: the same model and task, 2 steps of 2 prompts x 4 completions of 16 tokens.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.pretrained_rl("smollm2-135m-instruct", max_digits=2, arg=arg)
    c.model.update(
        hidden_size=576, intermediate_size=1536
    )  # the checkpoint's (it loads its own shape)
    c.optimizer.lr = 2e-6
    c.train.update(steps=40, eval_every=40)
    c.eval.num_prompts = 512  # 512 unseen problems
    c = presets.finish_pretrained(c, arg)
    if arg == "runlocal":
        c.data.prompt_batch = 2
    return c
