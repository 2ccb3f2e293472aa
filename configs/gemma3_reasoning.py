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

from jaxrl_frontier.run import presets

MODEL = "gemma-3-270m"
TASK = dict(
    datasets="basic_arithmetic",
    dataset_kwargs=dict(
        basic_arithmetic=dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)
    ),
    answer_format="tags",
    fallback="last_number",
    max_completion_chars=512,
)


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.mesh.update(data=-1, fsdp=1, tensor=1)
    c.tokenizer.update(kind="hf", path=MODEL)
    c.model.update(init="hf", path=MODEL, dtype="float32")
    c.task.update(name="reasoning_gym", chat_template=True)
    c.task.kwargs = dict(TASK)
    c.data.update(prompt_batch=4, max_prompt_len=128)
    c.rollout.update(group_size=8, max_new_tokens=96, temperature=1.0)
    c.objective.update(advantage="grpo", weight="ppo_clip", kl_coef=0.0)
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.28)
    c.objective.reward_weights = dict(correctness=1.0, format=0.5)
    c.optimizer.update(lr=1e-5, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=60, minibatches=1, log_every=1, eval_every=30, checkpoint_every=10)
    c.eval.update(num_prompts=128, batch=64, pass_k=1)
    c = presets.finish(c, arg)
    if arg == "runlocal":  # after the shrink: the real model again, at short lengths
        c.model.update(init="hf", path=MODEL, hidden_size=640, intermediate_size=2048)
        c.data.prompt_batch = 4  # groups that disagree at both steps: a gradient at step 2
        c.rollout.max_new_tokens = 16
        c.train.update(steps=2, log_every=1, eval_every=2, checkpoint_every=2, rollout_log_every=1)
        c.eval.update(num_prompts=4, batch=4, pass_k=1)
    return c
