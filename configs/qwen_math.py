"""GRPO on a real Hugging Face model (Qwen2.5-0.5B-Instruct) and JSONL math, on GPU/TPU.

    python scripts/train.py --config=configs/qwen_math.py --workdir=runs/qwen_math \
        --config.model.path=/models/Qwen2.5-0.5B-Instruct \
        --config.task.kwargs.path=/data/gsm8k_train.jsonl

Nothing is downloaded: the model directory (config.json, *.safetensors, tokenizer.json)
and the JSONL file are local paths. Prompts are rendered in the model's chat template
(`task.chat_template`) and rollouts stop at its <|im_end|>. The mesh shards parameters over
fsdp and heads over tensor; `runlocal` swaps in a tiny model (data/warm_starts/math, its
SFT on the repo's sample JSONL) and that sample.
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.mesh.update(data=1, fsdp=-1, tensor=1)
    c.tokenizer.kind = "hf"
    c.tokenizer.path = "/models/Qwen2.5-0.5B-Instruct"
    c.model.init = "hf"
    c.model.path = "/models/Qwen2.5-0.5B-Instruct"
    c.model.dtype = "bfloat16"
    c.task.name = "jsonl_math"
    c.task.kwargs = dict(path="data/sample_math.jsonl")
    c.task.chat_template = True  # the Instruct model's own template (its tokenizer_config.json)
    c.data.update(prompt_batch=32, max_prompt_len=256)
    c.rollout.update(group_size=8, max_new_tokens=512, temperature=1.0)
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.28)
    c.objective.kl_coef = 0.001
    c.optimizer.update(lr=1e-6, warmup_steps=10, max_grad_norm=1.0, grad_accum=4)
    c.train.update(steps=500, minibatches=4, log_every=1, eval_every=50, checkpoint_every=25)
    c.eval.update(num_prompts=256, batch=64, pass_k=4)
    if arg == "runlocal":  # the tiny warm start (char tokenizer) on the sample JSONL
        c.tokenizer.update(kind="char", path="")
        c.task.chat_template = False  # the char tokenizer has no template
        c.model.dtype = "float32"
        c.mesh.update(data=-1, fsdp=1, tensor=1)
        c.data.max_prompt_len = 160
        c.rollout.max_new_tokens = 64  # the sample's worked solutions (its warm start's)
        c.optimizer.grad_accum = 1
    return presets.finish(c, arg)
