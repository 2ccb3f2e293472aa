"""GRPO on SmolLM2-135M-Instruct (a real pretrained checkpoint) on reasoning-gym arithmetic.

    python scripts/fetch_model.py smollm2-135m-instruct      # once
    python scripts/train.py --config=configs/smollm2_reasoning.py --workdir=runs/smol \
        --config.optimizer.lr=1e-5

The model is fetched by name (`model.path = 'smollm2-135m-instruct'`: docs/models.md); the
task is reasoning-gym's `basic_arithmetic` with two terms of one or two digits (`task.kwargs`), a
question the model answers in its own chat template (its system prompt included), asked to
put the answer in <answer>...</answer> tags. Scored by reasoning-gym's checker; the model
never writes the tags at first, so the last number it writes is scored when it gives none
(`fallback = 'last_number'`) and a format reward (weight 0.5) pulls toward the tags.
Rollouts stop at <|im_end|>, the token that ends its turn. Measured on a 2-core CPU (51
min) with `--config.optimizer.lr=1e-5`: held-out greedy pass@1 on 512 unseen problems 12.2%
-> 25.4% in 40 steps (docs/models.md).

`runlocal`: the same model and task, 2 steps of 2 prompts x 4 completions of 16 tokens.
"""

from jaxrl_frontier.run import presets

MODEL = "smollm2-135m-instruct"
TASK = dict(
    datasets="basic_arithmetic",
    dataset_kwargs=dict(
        basic_arithmetic=dict(min_terms=2, max_terms=2, min_digits=1, max_digits=2)
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
    c.optimizer.update(lr=2e-6, warmup_steps=5, max_grad_norm=1.0)
    c.train.update(steps=40, minibatches=1, log_every=1, eval_every=40, checkpoint_every=10)
    c.eval.update(num_prompts=512, batch=128, pass_k=1)  # 512 unseen problems
    c = presets.finish(c, arg)
    if arg == "runlocal":  # after the shrink: the real model again, at short lengths
        c.model.update(init="hf", path=MODEL, hidden_size=576, intermediate_size=1536)
        c.data.prompt_batch = 2
        c.rollout.max_new_tokens = 16
        c.train.update(steps=2, log_every=1, eval_every=2, checkpoint_every=2, rollout_log_every=1)
        c.eval.update(num_prompts=4, batch=4, pass_k=1)
    return c
