"""GRPO on a local Gemma 3 instruct model (e.g. gemma-3-1b-it) and JSONL math, on GPU/TPU.

    python scripts/train.py --config=configs/gemma3_math.py --workdir=runs/gemma3_math \
        --config.model.path=/models/gemma-3-1b-it \
        --config.task.kwargs.path=/data/gsm8k_train.jsonl

Nothing is downloaded: the model directory (config.json, *.safetensors, tokenizer.json,
tokenizer_config.json) and the JSONL file are local paths. Prompts are rendered in Gemma's
own chat template (`task.chat_template`: <start_of_turn>user ... <end_of_turn>) and
rollouts stop where it closes the model's turn (<end_of_turn>). The model's sliding-window
layers decode from rings of their window (docs/models.md, Gemma). Gemma 3 keeps its
embeddings tied over a 262k vocabulary: the output layer runs vocab-parallel in chunks.
`runlocal` builds a tiny random Gemma 3 (2 layers, one sliding with a 16-token window and
one global; the char tokenizer) on the repo's sample JSONL: it runs the architecture
through the trainer, it does not learn (a random policy earns no reward).
"""

from jaxrl_frontier.run.config import presets


def get_config(arg=None):
    c = presets.arithmetic("rl")
    c.mesh.update(data=1, fsdp=-1, tensor=1)
    c.tokenizer.kind = "hf"
    c.tokenizer.path = "/models/gemma-3-1b-it"
    c.model.init = "hf"
    c.model.path = "/models/gemma-3-1b-it"
    c.model.dtype = "bfloat16"
    c.task.name = "jsonl_math"
    c.task.kwargs = dict(path="data/sample_math.jsonl")
    c.task.chat_template = True  # Gemma's template (its tokenizer_config.json)
    c.data.update(prompt_batch=32, max_prompt_len=256)
    c.rollout.update(group_size=8, max_new_tokens=512, temperature=1.0)
    c.objective.advantage = "grpo"
    c.objective.weight = "ppo_clip"
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.28)
    c.objective.kl_coef = 0.001
    c.optimizer.update(lr=1e-6, warmup_steps=10, max_grad_norm=1.0, grad_accum=4)
    c.train.update(steps=500, minibatches=4, log_every=1, eval_every=50, checkpoint_every=25)
    c.eval.update(num_prompts=256, batch=64, pass_k=4)
    if arg == "runlocal":  # the char tokenizer has no template
        c.tokenizer.update(kind="char", path="")
        c.task.chat_template = False
        c.mesh.update(data=-1, fsdp=1, tensor=1)
        c.data.max_prompt_len = 160
        c.rollout.max_new_tokens = 24
    c = presets.finish(c, arg)
    if arg == "runlocal":  # after the shrink: a tiny random Gemma 3, not the warm start
        c.model.update(init="scratch", path="", dtype="float32", family="gemma3_text")
        c.model.update(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2)
        c.model.update(num_kv_heads=1, head_dim=16, sliding_window=16, sliding_window_pattern=2)
    return c
