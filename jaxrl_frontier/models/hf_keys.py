"""The config.json keys every Hugging Face family reads and writes alike: its shape, read by
each architecture's `config_from_hf` (architectures.py, qwen3_5.py), and the keys each
`config_to_hf` writes before its family's own."""

from __future__ import annotations

from jaxrl_frontier.models.model_config import ModelConfig


def require(hf: dict, key: str):
    """hf[key], or an error naming the missing key."""
    if key not in hf:
        raise ValueError(f"config.json: missing required key {key!r}")
    return hf[key]


def shape_from_hf(hf: dict, heads: int, head_dim: int) -> dict[str, int]:
    """The `ModelConfig` shape fields every architecture reads alike from config.json."""
    return dict(
        vocab_size=int(require(hf, "vocab_size")),
        hidden_size=int(require(hf, "hidden_size")),
        intermediate_size=int(require(hf, "intermediate_size")),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=head_dim,
    )


def shared_to_hf(name: str, model_type: str, cfg: ModelConfig, torch_dtype: str) -> dict:
    """The config.json keys of every family: its class and type, the model's shape, the
    norm's epsilon, the positions, whether the embeddings are tied, and the dtype."""
    return {
        "architectures": [name],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_dropout": 0.0,
        # both spellings: transformers >= 5 reads `dtype`, older versions and vLLM `torch_dtype`
        "torch_dtype": torch_dtype,
        "dtype": torch_dtype,
    }
