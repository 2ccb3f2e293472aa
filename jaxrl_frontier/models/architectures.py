"""Hugging Face architectures: the `ARCHITECTURES` registry (HF `architectures[0]` ->
`Architecture`) and the map between an HF config.json and `ModelConfig`, both directions.
LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM share tensor names; they differ in
config fields (qkv bias, qk-norm). Gemma2ForCausalLM and Gemma3ForCausalLM
(`GemmaArchitecture`) add the Gemma fields of `ModelConfig` and two norms per layer;
GptOssForCausalLM (`GptOssArchitecture`) the GPT-OSS fields, a mixture of experts whose
tensors are fused per layer; DeepseekV3ForCausalLM (`DeepseekV3Architecture`) latent
attention, dense first layers and a sigmoid group-limited router."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.models import moe
from jaxrl_frontier.models.hf_keys import require as _require
from jaxrl_frontier.models.hf_keys import shape_from_hf as _shape
from jaxrl_frontier.models.hf_keys import shared_to_hf
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.qwen3_5 import QWEN3_5  # Qwen3.5 (hybrid): its own module

ARCHITECTURES = Registry("Hugging Face architecture")


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
    if kind not in ("linear", "llama3", "yarn"):
        raise ValueError(
            f"config.json: rope_scaling type {kind!r} is not supported; supported: "
            "default, linear, llama3, yarn"
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
    # how its checkpoints name the experts' tensors (`tensor_map.EXPERT_TENSORS`): one set
    # per expert (Qwen-MoE), or a layer's experts fused (GPT-OSS)
    expert_tensors: str = "per_expert"

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
            **_shape(hf, heads, head_dim),
            num_layers=int(_require(hf, "num_hidden_layers")),
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
            **shared_to_hf(self.name, self.model_type, cfg, torch_dtype),
            "intermediate_size": cfg.intermediate_size,
            "head_dim": cfg.resolved_head_dim,
            "hidden_act": "silu",
            "rope_theta": cfg.rope_theta,
            "rope_scaling": dict(cfg.rope_scaling) if cfg.rope_scaling else None,
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
    *QWEN3_5,
):
    ARCHITECTURES.register(_arch.name)(_arch)


@dataclasses.dataclass(frozen=True)
class GemmaArchitecture(Architecture):
    """Gemma 2 (`version` 2: attention and final logit soft-capping, layers alternating
    sliding / full, one RoPE base) and Gemma 3 text (3: qk-norm, `layer_types` or
    `sliding_window_pattern`, a local RoPE base `rope_local_base_freq` for the sliding
    layers, the global base and its `rope_scaling` for the full ones)."""

    version: int = 2
    # Gemma3ForConditionalGeneration: the language model's config is `text_config` (keys it
    # omits take transformers' Gemma3TextConfig defaults, as hub files rely on), its
    # tensors are `language_model.model.*`; the vision tower is not read
    multimodal: bool = False

    def config_from_hf(self, hf: dict) -> ModelConfig:
        """config.json dict (transformers 4 or 5 style) -> ModelConfig; unsupported options
        raise, naming the key."""
        if self.multimodal:
            text = dict(_require(hf, "text_config"))
            text.setdefault("tie_word_embeddings", hf.get("tie_word_embeddings", True))
            text = {**GEMMA3_TEXT_DEFAULTS, **text, "architectures": ["Gemma3ForCausalLM"]}
            return ARCHITECTURES.get("Gemma3ForCausalLM").config_from_hf(text)
        act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
        if act != "gelu_pytorch_tanh":
            raise ValueError(
                f"config.json: hidden_activation={act!r}; {self.name} supports only "
                "'gelu_pytorch_tanh'"
            )
        for key in ("attention_bias", "use_bidirectional_attention"):
            if hf.get(key):
                raise ValueError(f"config.json: {key}={hf[key]!r} is not supported for {self.name}")
        if self.version == 3 and hf.get("attn_logit_softcapping") is not None:
            raise ValueError(
                "config.json: attn_logit_softcapping is not supported for Gemma3ForCausalLM "
                "(transformers ignores it there; set it to null)"
            )
        layers = int(_require(hf, "num_hidden_layers"))
        global_theta, scaling, local_theta = self._rope(hf)
        heads = int(_require(hf, "num_attention_heads"))
        head_dim = int(hf.get("head_dim") or int(_require(hf, "hidden_size")) // heads)
        return ModelConfig(
            **_shape(hf, heads, head_dim),
            num_layers=layers,
            rope_theta=global_theta,
            rope_scaling=scaling,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", True)),
            qk_norm=self.qk_norm,
            max_position_embeddings=int(
                hf.get("max_position_embeddings", self.default_max_positions)
            ),
            family=self.model_type,
            hidden_act=act,
            norm_plus_one=True,
            embed_scale=True,
            query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
            sandwich_norms=True,
            attn_logit_softcap=_float_or_none(hf.get("attn_logit_softcapping")),
            final_logit_softcap=_float_or_none(hf.get("final_logit_softcapping")),
            layer_types=self._layer_types(hf, layers),
            sliding_window=int(_require(hf, "sliding_window")),
            rope_local_theta=local_theta,
        )

    def _layer_types(self, hf: dict, layers: int) -> tuple[str, ...]:
        """HF `layer_types`, else Gemma 2's alternation (layer 0 sliding) or Gemma 3's
        `sliding_window_pattern` (every pattern-th layer full; 6 by default)."""
        if hf.get("layer_types"):
            return tuple(hf["layer_types"])
        period = 2 if self.version == 2 else int(hf.get("sliding_window_pattern") or 6)
        return tuple(
            "sliding_attention" if (i + 1) % period else "full_attention" for i in range(layers)
        )

    def _rope(self, hf: dict):
        """(global theta, global rope_scaling items or None, local theta or None)."""
        params = hf.get("rope_parameters") or {}
        if "full_attention" in params or "sliding_attention" in params:  # transformers 5
            full = dict(params.get("full_attention") or {})
            local = dict(params.get("sliding_attention") or {})
            if local.get("rope_type", "default") != "default":
                raise ValueError(
                    "config.json: rope_parameters.sliding_attention.rope_type="
                    f"{local['rope_type']!r}; only 'default' is supported for sliding layers"
                )
            theta, scaling = _rope_from_hf({"rope_parameters": full})
            local_theta = local.get("rope_theta")
        else:
            theta, scaling = _rope_from_hf(hf)
            local_theta = hf.get("rope_local_base_freq")
        if self.version == 2:
            local_theta = None  # one base for every layer
        elif local_theta is None:
            local_theta = 10000.0  # transformers' Gemma 3 default
        if not hf.get("rope_theta") and not params and self.version == 3:
            theta = 1_000_000.0  # transformers' Gemma 3 global default
        return theta, scaling, None if local_theta is None else float(local_theta)

    def config_to_hf(self, cfg: ModelConfig, torch_dtype: str) -> dict:
        """ModelConfig -> config.json dict (transformers 4 key style, plus `layer_types`)."""
        hf = super().config_to_hf(cfg, torch_dtype)
        for key in ("hidden_act", "use_sliding_window"):
            hf.pop(key, None)
        hf.update(
            hidden_activation=cfg.hidden_act,
            query_pre_attn_scalar=_int_if_whole(cfg.query_pre_attn_scalar),  # HF: an int
            attn_logit_softcapping=cfg.attn_logit_softcap,
            final_logit_softcapping=cfg.final_logit_softcap,
            sliding_window=cfg.sliding_window,
            layer_types=list(cfg.layer_types or ("full_attention",) * cfg.num_layers),
            attention_bias=False,
        )
        if self.version == 3:
            hf["rope_local_base_freq"] = cfg.rope_local_theta or cfg.rope_theta
        return hf


def _int_if_whole(x):
    return int(x) if x is not None and float(x).is_integer() else x


def _float_or_none(x) -> float | None:
    return None if x is None else float(x)


# transformers' Gemma3TextConfig defaults (the keys a hub `text_config` may omit)
GEMMA3_TEXT_DEFAULTS = dict(
    vocab_size=262208,
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=26,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    query_pre_attn_scalar=256,
    sliding_window=4096,
    max_position_embeddings=131072,
    rms_norm_eps=1e-6,
)

for _arch in (
    GemmaArchitecture("Gemma2ForCausalLM", "gemma2", "never", False, 8192, version=2),
    GemmaArchitecture("Gemma3ForCausalLM", "gemma3_text", "never", True, 131072, version=3),
    # read only: saved back as the Gemma3ForCausalLM of its language model
    GemmaArchitecture(
        "Gemma3ForConditionalGeneration", "gemma3", "never", True, 131072, 3, multimodal=True
    ),
):
    ARCHITECTURES.register(_arch.name)(_arch)


@dataclasses.dataclass(frozen=True)
class GptOssArchitecture(Architecture):
    """GPT-OSS (gpt-oss-20b, gpt-oss-120b): biases on q, k, v and o (`attention_bias`),
    attention sinks, layers alternating sliding (`sliding_window`) and full attention,
    YaRN RoPE, and every layer's MLP a mixture of `num_local_experts` experts of width
    `intermediate_size` with a biased router (softmax over the top-k logits) and biased
    experts gated by the clamped SwiGLU (`swiglu_limit`, `swiglu_alpha`). Keys a config.json
    omits take transformers' `GptOssConfig` defaults."""

    def config_from_hf(self, hf: dict) -> ModelConfig:
        """config.json dict (transformers 4 or 5 style) -> ModelConfig; OpenAI's release
        (experts in MXFP4 blocks) is refused, naming its `quantization_config`."""
        if hf.get("quantization_config"):
            method = dict(hf["quantization_config"]).get("quant_method")
            raise ValueError(
                f"config.json: quantization_config (quant_method={method!r}) is not supported: "
                "the experts must be stored unquantized (gate_up_proj, down_proj); dequantize "
                "the checkpoint first (transformers: Mxfp4Config(dequantize=True), then "
                "save_pretrained)"
            )
        hf = {**GPT_OSS_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
        if not (hf.get("rope_parameters") or hf.get("rope_scaling")):
            hf["rope_parameters"] = GPT_OSS_ROPE  # transformers' default: YaRN 32x
        if "rope_theta" not in hf and "rope_theta" not in hf.get("rope_parameters", {}):
            hf["rope_parameters"] = {**hf["rope_parameters"], "rope_theta": GPT_OSS_THETA}
        theta, scaling = _rope_from_hf(hf)
        heads = int(_require(hf, "num_attention_heads"))
        layers = int(_require(hf, "num_hidden_layers"))
        width = int(_require(hf, "intermediate_size"))  # an expert's
        bias = bool(hf["attention_bias"])
        types = hf.get("layer_types") or [
            "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)
        ]  # transformers' default: layer 0 sliding, then alternating
        return ModelConfig(
            **_shape(hf, heads, int(hf.get("head_dim") or int(hf["hidden_size"]) // heads)),
            num_layers=layers,
            rope_theta=theta,
            rope_scaling=scaling,
            rms_norm_eps=float(hf["rms_norm_eps"]),
            tie_word_embeddings=bool(hf["tie_word_embeddings"]),
            qkv_bias=bias,
            o_bias=bias,
            max_position_embeddings=int(hf["max_position_embeddings"]),
            family=self.model_type,
            layer_types=tuple(types),
            sliding_window=int(hf["sliding_window"]),
            num_experts=int(_require(hf, "num_local_experts")),
            num_experts_per_tok=int(hf["num_experts_per_tok"]),
            moe_intermediate_size=width,
            norm_topk_prob=True,  # softmax over the top-k logits = the renormalised top-k
            attention_sinks=True,
            expert_bias=True,
            swiglu_limit=float(hf["swiglu_limit"]),
            swiglu_alpha=float(hf["swiglu_alpha"]),
        )

    def config_to_hf(self, cfg: ModelConfig, torch_dtype: str) -> dict:
        """ModelConfig -> config.json dict (GptOssConfig's keys; RoPE as transformers 5's
        `rope_parameters`, which would otherwise default to YaRN 32x, and `rope_theta`)."""
        if not (cfg.attention_sinks and cfg.expert_bias and cfg.num_experts):
            raise ValueError(
                "a GPT-OSS checkpoint has attention sinks and biased experts: this "
                "ModelConfig (attention_sinks, expert_bias, num_experts) cannot be written as one"
            )
        scaling = dict(cfg.rope_scaling or {"rope_type": "default"})
        return {
            **shared_to_hf(self.name, self.model_type, cfg, torch_dtype),
            "intermediate_size": cfg.moe_intermediate_size,  # an expert's width
            "head_dim": cfg.resolved_head_dim,
            "num_local_experts": cfg.num_experts,
            "num_experts_per_tok": cfg.num_experts_per_tok,
            "attention_bias": cfg.qkv_bias,
            "sliding_window": cfg.sliding_window,
            "layer_types": list(cfg.layer_types or ("full_attention",) * cfg.num_layers),
            "swiglu_limit": cfg.swiglu_limit,
            "swiglu_alpha": cfg.swiglu_alpha,
            "rope_theta": cfg.rope_theta,
            "rope_parameters": {**scaling, "rope_theta": cfg.rope_theta},
            "output_router_logits": False,
        }


GPT_OSS_THETA = 150000.0  # transformers' GptOssConfig.default_theta
GPT_OSS_ROPE = dict(
    rope_type="yarn",
    factor=32.0,
    beta_fast=32.0,
    beta_slow=1.0,
    truncate=False,
    original_max_position_embeddings=4096,
)
# transformers' GptOssConfig defaults (the keys a config.json may omit)
GPT_OSS_DEFAULTS = dict(
    sliding_window=128,
    tie_word_embeddings=False,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    num_experts_per_tok=4,
    swiglu_alpha=1.702,
    swiglu_limit=7.0,
    attention_bias=True,
)

ARCHITECTURES.register("GptOssForCausalLM")(
    GptOssArchitecture(
        "GptOssForCausalLM", "gpt_oss", "never", False, 131072, moe=True, expert_tensors="fused"
    )
)


@dataclasses.dataclass(frozen=True)
class DeepseekV3Architecture(Architecture):
    """DeepSeek-V3 (and its R1 / V3.1 checkpoints): multi-head latent attention
    (`kv_lora_rank`, `q_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`,
    `rope_interleave`), the first `first_k_dense_replace` layers dense, the others a mixture
    of `n_routed_experts` with a sigmoid, group-limited router (`n_group`, `topk_group`,
    `e_score_correction_bias`, `routed_scaling_factor`) and `n_shared_experts` ungated shared
    experts. The multi-token-prediction layers (`num_nextn_predict_layers`, after the
    decoder layers) are not the policy's: `hf.load_mtp` reads one as a speculative draft
    (models/multi_token.py); transformers reads none."""

    def config_from_hf(self, hf: dict) -> ModelConfig:
        if hf.get("attention_bias", False):
            raise ValueError("config.json: attention_bias=True is not supported for DeepSeek-V3")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json: hidden_act={hf['hidden_act']!r}; only 'silu'")
        if hf.get("quantization_config"):
            raise ValueError(
                "config.json: quantization_config (DeepSeek's FP8 release) is not supported: "
                "dequantize the checkpoint to bf16 first"
            )
        theta, scaling = _rope_from_hf(hf)
        heads = int(_require(hf, "num_attention_heads"))
        nope, rope = int(_require(hf, "qk_nope_head_dim")), int(_require(hf, "qk_rope_head_dim"))
        moe_width = int(_require(hf, "moe_intermediate_size"))
        return ModelConfig(
            **{**_shape(hf, heads, nope + rope), "num_kv_heads": heads},
            num_layers=int(_require(hf, "num_hidden_layers")),
            rope_theta=theta,
            rope_scaling=scaling,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            family=self.model_type,
            kv_lora_rank=int(_require(hf, "kv_lora_rank")),
            q_lora_rank=int(hf.get("q_lora_rank") or 0),
            qk_nope_head_dim=nope,
            qk_rope_head_dim=rope,
            v_head_dim=int(_require(hf, "v_head_dim")),
            rope_interleave=bool(hf.get("rope_interleave", True)),
            first_k_dense_replace=int(hf.get("first_k_dense_replace") or 0),
            num_experts=int(_require(hf, "n_routed_experts")),
            num_experts_per_tok=int(_require(hf, "num_experts_per_tok")),
            moe_intermediate_size=moe_width,
            norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
            shared_expert_intermediate_size=moe_width * int(hf.get("n_shared_experts") or 0),
            shared_expert_gated=False,
            router_scoring="sigmoid",
            n_group=int(hf.get("n_group") or 1),
            topk_group=int(hf.get("topk_group") or 1),
            routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
        )

    def config_to_hf(self, cfg: ModelConfig, torch_dtype: str) -> dict:
        if not (cfg.kv_lora_rank and cfg.num_experts and cfg.router_scoring == "sigmoid"):
            raise ValueError(
                "a DeepSeek-V3 checkpoint has latent attention and a sigmoid-routed mixture "
                "of experts: this ModelConfig cannot be written as one"
            )
        shared = cfg.shared_expert_intermediate_size // cfg.moe_intermediate_size
        scaling = dict(cfg.rope_scaling or {"rope_type": "default"})
        return {
            **shared_to_hf(self.name, self.model_type, cfg, torch_dtype),
            "intermediate_size": cfg.intermediate_size,
            "moe_intermediate_size": cfg.moe_intermediate_size,
            "kv_lora_rank": cfg.kv_lora_rank,
            "q_lora_rank": cfg.q_lora_rank or None,
            "qk_nope_head_dim": cfg.qk_nope_head_dim,
            "qk_rope_head_dim": cfg.qk_rope_head_dim,
            "v_head_dim": cfg.v_head_dim,
            "rope_interleave": cfg.rope_interleave,
            "first_k_dense_replace": cfg.first_k_dense_replace,
            "n_routed_experts": cfg.num_experts,
            "n_shared_experts": shared,
            "num_experts_per_tok": cfg.num_experts_per_tok,
            "n_group": cfg.n_group,
            "topk_group": cfg.topk_group,
            "norm_topk_prob": cfg.norm_topk_prob,
            "routed_scaling_factor": cfg.routed_scaling_factor,
            "hidden_act": "silu",
            "attention_bias": False,
            "rope_theta": cfg.rope_theta,
            "rope_parameters": {**scaling, "rope_theta": cfg.rope_theta},
            "num_nextn_predict_layers": 0,
        }


ARCHITECTURES.register("DeepseekV3ForCausalLM")(
    DeepseekV3Architecture("DeepseekV3ForCausalLM", "deepseek_v3", "never", False, 4096, moe=True)
)


# Sequence classifiers (`Qwen2ForSequenceClassification`, a reward model): the causal
# model's body with a score head in place of the LM head (`ModelConfig.num_labels`).
CLASSIFIER = "ForSequenceClassification"
# the classifier class transformers names for a model_type, where it is not the causal
# model's name with the suffix swapped
_CLASSIFIER_NAMES = {"gemma3_text": "Gemma3TextForSequenceClassification"}


def is_classifier(hf: dict) -> bool:
    """Whether a config.json dict is a sequence classifier's."""
    return any(str(n).endswith(CLASSIFIER) for n in hf.get("architectures") or [])


def architecture_for(hf: dict) -> Architecture:
    """The registry entry for a config.json dict (by `architectures[0]`, else `model_type`;
    a sequence classifier by its `model_type`: the causal model's body)."""
    names = hf.get("architectures") or []
    if names and not is_classifier(hf):
        name = names[0]
    else:  # some exports omit `architectures`; fall back to model_type
        by_type = {}
        for n in ARCHITECTURES:
            by_type.setdefault(ARCHITECTURES.get(n).model_type, n)
        name = by_type.get(hf.get("model_type"), f"model_type={hf.get('model_type')!r}")
    if name not in ARCHITECTURES:
        raise ValueError(
            f"unsupported architecture {name!r}; supported: {', '.join(ARCHITECTURES.names())}"
        )
    return ARCHITECTURES.get(name)


def architecture_of(cfg: ModelConfig) -> Architecture:
    """The registry entry a `ModelConfig` is saved as (by `family`, the HF `model_type`)."""
    for name in ARCHITECTURES:
        if ARCHITECTURES.get(name).model_type == cfg.family:
            return ARCHITECTURES.get(name)
    raise ValueError(
        f"ModelConfig.family={cfg.family!r} has no HF architecture; known: "
        f"{sorted(ARCHITECTURES.get(n).model_type for n in ARCHITECTURES)}"
    )


def config_from_hf(hf: dict) -> ModelConfig:
    """A config.json dict -> ModelConfig (compute and parameter dtypes f32; a sequence
    classifier's `num_labels` from its `id2label`, else `num_labels`)."""
    cfg = architecture_for(hf).config_from_hf(hf)
    if not is_classifier(hf):
        return cfg
    labels = len(hf["id2label"]) if hf.get("id2label") else int(hf.get("num_labels", 2))
    return cfg.replace(num_labels=labels)


def config_to_hf(cfg: ModelConfig, torch_dtype: str | None = None) -> dict:
    """ModelConfig -> a config.json dict that transformers and vLLM load."""
    arch = architecture_of(cfg)
    hf = arch.config_to_hf(cfg, torch_dtype or cfg.param_dtype)
    if cfg.num_labels:
        name = arch.name.replace("ForCausalLM", CLASSIFIER)
        hf["architectures"] = [_CLASSIFIER_NAMES.get(cfg.family, name)]
        hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(cfg.num_labels)}
        hf["label2id"] = {f"LABEL_{i}": i for i in range(cfg.num_labels)}
    return hf
