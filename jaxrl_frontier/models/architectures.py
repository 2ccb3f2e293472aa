"""Hugging Face architectures: the `ARCHITECTURES` registry (HF `architectures[0]` ->
`Architecture`) and the map between an HF config.json and `ModelConfig`, both directions.
LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM share tensor names; they differ in
config fields (qkv bias, qk-norm)."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.models import moe
from jaxrl_frontier.models.layers import ModelConfig

ARCHITECTURES = Registry("Hugging Face architecture")


def _require(hf: dict, key: str):
    if key not in hf:
        raise ValueError(f"config.json: missing required key {key!r}")
    return hf[key]


def _rope_from_hf(hf: dict) -> tuple[float, tuple[tuple[str, Any], ...] | None]:
    """(rope_theta, rope_scaling items) from either config style.

    transformers < 5 writes `rope_theta` and `rope_scaling` at the top level; transformers
    5 writes one `rope_parameters` dict holding `rope_theta` and the scaling fields.
    """
    params = dict(hf.get("rope_parameters") or {})
    theta = float(hf.get("rope_theta", params.pop("rope_theta", 10000.0)))
    scaling = dict(hf.get("rope_scaling") or params)
    if "type" in scaling and "rope_type" not in scaling:  # the pre-4.45 key
        scaling["rope_type"] = scaling.pop("type")
    scaling.pop("type", None)
    kind = scaling.get("rope_type", "default")
    if kind == "default":
        return theta, None
    if kind not in ("linear", "llama3"):
        raise ValueError(
            f"config.json: rope_scaling type {kind!r} is not supported; supported: "
            "default, linear, llama3"
        )
    return theta, tuple(sorted(scaling.items()))


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One supported HF architecture: how its config.json maps to a `ModelConfig`.

    qkv_bias: "always" (Qwen2: q/k/v carry biases, no config key) or "never" (Llama,
      Qwen3; `attention_bias=True` there also adds an o_proj bias, which we do not have).
    """

    name: str  # HF `architectures[0]`, e.g. "Qwen3ForCausalLM"
    model_type: str  # HF `model_type`, also our `ModelConfig.family`
    qkv_bias: str  # "always" | "never"
    qk_norm: bool
    default_max_positions: int
    moe: bool = False  # every layer's MLP a mixture of experts (models/moe.py)

    def config_from_hf(self, hf: dict) -> ModelConfig:
        """config.json dict -> ModelConfig (unsupported options raise, naming the key)."""
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(
                f"config.json: hidden_act={hf['hidden_act']!r}; only 'silu' is supported"
            )
        if self.qkv_bias == "never" and hf.get("attention_bias", False):
            raise ValueError(
                f"config.json: attention_bias=True is not supported for {self.name} "
                "(it adds an o_proj bias the Transformer does not have)"
            )
        if hf.get("mlp_bias", False):
            raise ValueError(f"config.json: mlp_bias=True is not supported for {self.name}")
        if hf.get("use_sliding_window", False):
            raise ValueError(
                f"config.json: use_sliding_window=True is not supported for {self.name}"
            )
        theta, scaling = _rope_from_hf(hf)
        heads = int(_require(hf, "num_attention_heads"))
        # explicit always (Qwen3 sets it apart from hidden / heads; Qwen2 configs omit it)
        head_dim = int(hf.get("head_dim") or int(_require(hf, "hidden_size")) // heads)
        return ModelConfig(
            vocab_size=int(_require(hf, "vocab_size")),
            hidden_size=int(_require(hf, "hidden_size")),
            intermediate_size=int(_require(hf, "intermediate_size")),
            num_layers=int(_require(hf, "num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rope_theta=theta,
            rope_scaling=scaling,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=self.qkv_bias == "always",
            qk_norm=self.qk_norm,
            max_position_embeddings=int(
                hf.get("max_position_embeddings", self.default_max_positions)
            ),
            family=self.model_type,
            **(moe.config_from_hf(hf) if self.moe else {}),
        )

    def config_to_hf(self, cfg: ModelConfig, torch_dtype: str) -> dict:
        """ModelConfig -> config.json dict, in the pre-5 key style every loader reads."""
        hf = {
            "architectures": [self.name],
            "model_type": self.model_type,
            "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads,
            "num_key_value_heads": cfg.num_kv_heads,
            "head_dim": cfg.resolved_head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": cfg.rms_norm_eps,
            "rope_theta": cfg.rope_theta,
            "rope_scaling": dict(cfg.rope_scaling) if cfg.rope_scaling else None,
            "max_position_embeddings": cfg.max_position_embeddings,
            "tie_word_embeddings": cfg.tie_word_embeddings,
            "attention_dropout": 0.0,
            # both spellings: transformers >= 5 reads `dtype`, older versions and vLLM `torch_dtype`
            "torch_dtype": torch_dtype,
            "dtype": torch_dtype,
        }
        if self.qkv_bias == "never":
            hf["attention_bias"] = False
        if self.model_type == "llama":
            hf["mlp_bias"] = False
        else:
            hf["use_sliding_window"] = False
        if self.moe:
            hf.update(moe.config_to_hf(cfg))
        return hf


for _arch in (
    Architecture("LlamaForCausalLM", "llama", "never", False, 2048),
    Architecture("Qwen2ForCausalLM", "qwen2", "always", False, 32768),
    Architecture("Qwen3ForCausalLM", "qwen3", "never", True, 32768),
    Architecture("Qwen3MoeForCausalLM", "qwen3_moe", "never", True, 32768, moe=True),
    Architecture("Qwen2MoeForCausalLM", "qwen2_moe", "always", False, 32768, moe=True),
):
    ARCHITECTURES.register(_arch.name)(_arch)


def architecture_for(hf: dict) -> Architecture:
    """The registry entry for a config.json dict (by `architectures[0]`, else `model_type`)."""
    names = hf.get("architectures") or []
    if names:
        name = names[0]
    else:  # some exports omit `architectures`; fall back to model_type
        by_type = {ARCHITECTURES.get(n).model_type: n for n in ARCHITECTURES}
        name = by_type.get(hf.get("model_type"), f"model_type={hf.get('model_type')!r}")
    if name not in ARCHITECTURES:
        raise ValueError(
            f"unsupported architecture {name!r}; supported: {', '.join(ARCHITECTURES.names())}"
        )
    return ARCHITECTURES.get(name)


def _architecture_for_family(family: str) -> Architecture:
    for name in ARCHITECTURES:
        if ARCHITECTURES.get(name).model_type == family:
            return ARCHITECTURES.get(name)
    raise ValueError(
        f"ModelConfig.family={family!r} has no HF architecture; known: "
        f"{sorted(ARCHITECTURES.get(n).model_type for n in ARCHITECTURES)}"
    )


def config_from_hf(hf: dict) -> ModelConfig:
    """A config.json dict -> ModelConfig (compute and parameter dtypes f32)."""
    return architecture_for(hf).config_from_hf(hf)


def config_to_hf(cfg: ModelConfig, torch_dtype: str | None = None) -> dict:
    """ModelConfig -> a config.json dict that transformers and vLLM load."""
    return _architecture_for_family(cfg.family).config_to_hf(cfg, torch_dtype or cfg.param_dtype)
