"""Random Qwen2-shaped models (qkv bias, GQA, rope theta 1e6) for the sampler benchmark.

    python benchmarks/bench.py sampler --config=benchmarks/configs/random_qwen2.py:tiny
    python benchmarks/bench.py sampler --config=benchmarks/configs/random_qwen2.py:25m \\
        --config.rollout.max_new_tokens=64

Variants (the `:ARG`): tiny (3.2M parameters), 25m (26.2M), 0.5b (Qwen2.5-0.5B's shape,
494M, bf16: for a GPU), smollm2 (SmolLM2-135M-Instruct's shape, Llama-like: no qkv bias,
rope theta 1e5, tied, f32: the real checkpoint's cost where its file is not at hand). Prompts of `data.max_prompt_len` = 16 tokens, completions of
`rollout.max_new_tokens` = 128, sampling at temperature 1 without truncation.
"""

from jaxrl_frontier.run import config as config_lib

MODELS = {
    "tiny": dict(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=768,
        num_layers=4,
        num_heads=8,
        num_kv_heads=2,
        tie_word_embeddings=False,
    ),
    "25m": dict(  # 24.1M in the blocks + 2.1M embeddings
        vocab_size=2048,
        hidden_size=512,
        intermediate_size=1536,
        num_layers=8,
        num_heads=8,
        num_kv_heads=2,
        tie_word_embeddings=False,
    ),
    "0.5b": dict(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        tie_word_embeddings=True,
        dtype="bfloat16",
    ),
    "smollm2": dict(  # 106.2M in the blocks + 28.3M tied embedding = 134.5M
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        tie_word_embeddings=True,
        qkv_bias=False,
        rope_theta=100_000.0,
        max_position_embeddings=8192,
    ),
}


def get_config(arg=None):
    name = arg or "tiny"
    if name not in MODELS:
        raise ValueError(f"random_qwen2.py: unknown variant {name!r}; allowed: {sorted(MODELS)}")
    c = config_lib.base_config()
    shape = dict(qkv_bias=True, rope_theta=1_000_000.0, max_position_embeddings=4096)
    c.model.update(init="scratch", **{**shape, **MODELS[name]})
    c.data.max_prompt_len = 16
    c.rollout.update(max_new_tokens=128, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    return c
