"""GRPO on Gemma-3-270M (the base checkpoint, fetched by name) on reasoning-gym arithmetic.

    python scripts/fetch_model.py gemma-3-270m      # once (Gemma Terms of Use)
    python scripts/train.py --config=configs/gemma3_reasoning.py --workdir=runs/gemma3

The model's 262,144-token vocabulary is the point of this config: its log-probs and entropy
run through the output layer in chunks of 256 positions (objectives/logprobs.py), so the
update never holds a [B, T, V] array of the batch (docs/models.md: the compiled bytes); its five sliding-window layers of 512 to one global
decode from rings of 512 slots. Prompts are written in Gemma's chat template (from the
published tokenizer, `<start_of_turn>user ... <end_of_turn>`); rollouts stop at
`<end_of_turn>` or `<eos>`. The task: reasoning-gym's `basic_arithmetic` with two one-digit
terms, the answer asked in <answer>...</answer> tags, the last number scored when there are
none, and a format reward. `runlocal`: 2 steps of 4 prompts x 4 completions of 16 tokens.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.pretrained_rl("gemma-3-270m", max_digits=1, arg=arg)
    c.model.update(
        hidden_size=640, intermediate_size=2048
    )  # the checkpoint's (it loads its own shape)
    c.optimizer.lr = 1e-5
    c.train.update(steps=60, eval_every=30)
    c.eval.update(num_prompts=128, batch=64)
    # runlocal: 4 prompts, groups that disagree at both steps (a gradient at step 2)
    return presets.finish_pretrained(c, arg)
