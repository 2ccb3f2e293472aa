"""Qwen3.5 checkpoints (transformers' `Qwen3_5ForCausalLM`, model_type "qwen3_5_text", and
`Qwen3_5MoeForCausalLM`, "qwen3_5_moe_text"): their config.json <-> `ModelConfig`
(`Qwen35Architecture`, registered in architectures.py) and their tensor names
(`hybrid_tensor_specs`, read by hf.py). The model is models/hybrid.py.

A layer's tensors, by kind (HF [out, in] Linear weights, ours [in, out]):

    linear_attn.in_proj_qkv [C, D], in_proj_z [Hv Dv, D], in_proj_b, in_proj_a [Hv, D],
        conv1d.weight [C, 1, Kc] -> ours [Kc, C], dt_bias, A_log [Hv], norm.weight [Dv],
        out_proj [D, Hv Dv]                                     (C = 2 Hk Dk + Hv Dv)
    self_attn.q_proj [H 2 Dh, D] -> [D, H, 2 Dh] (per head: query, then gate), k_proj,
        v_proj [K Dh, D], o_proj [D, H Dh], q_norm, k_norm [Dh]

then `mlp.*` as Llama's, or the MoE's router, per-expert tensors, `mlp.shared_expert.*` and
`mlp.shared_expert_gate.weight` (transformers 5 fuses the experts in memory and writes these
per-expert names on disk, as for Qwen2-MoE). The hub's multimodal
`Qwen3_5(Moe)ForConditionalGeneration` checkpoints load as their language model (its
`text_config`, its `model.language_model.*` tensors) and save back as the text model.
"""

from __future__ import annotations

import dataclasses

from jaxrl_frontier.models.hf_keys import require as _require
from jaxrl_frontier.models.hf_keys import shared_to_hf
from jaxrl_frontier.models.kv_cache import linear_dims
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.tensor_map import TensorSpec, expert_specs, tensor_specs


@dataclasses.dataclass(frozen=True)
class Qwen35Architecture:
    """Qwen3.5 text, dense (moe=False) or MoE; the fields architectures.py reads of an
    `Architecture` (registry name, model_type = `ModelConfig.family`, MoE tensor naming)."""

    name: str
    model_type: str
    moe: bool = False
    expert_tensors: str = "per_expert"
    default_max_positions: int = 32768
    # Qwen3_5(Moe)ForConditionalGeneration (the hub's checkpoints): the language model's
    # config is `text_config`, its tensors `model.language_model.*` (hf.py reads only
    # those: not the vision tower nor the `mtp.*` layers); saved back as the text model
    multimodal: bool = False

    def config_from_hf(self, hf: dict) -> ModelConfig:
        """config.json dict (transformers 5 style, `rope_parameters`) -> ModelConfig."""
        if self.multimodal:
            text = dict(_require(hf, "text_config"))
            text.setdefault("tie_word_embeddings", hf.get("tie_word_embeddings", False))
            causal = dataclasses.replace(
                self, name=self.name.replace("ForConditionalGeneration", "ForCausalLM"),
                model_type=self.model_type + "_text", multimodal=False,
            )  # fmt: skip
            return causal.config_from_hf(text)
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json: hidden_act={hf['hidden_act']!r}; only 'silu'")
        if hf.get("attention_bias", False):
            raise ValueError(f"config.json: attention_bias=True is not supported for {self.name}")
        if not hf.get("attn_output_gate", True):
            raise ValueError(
                f"config.json: attn_output_gate=False is not supported for {self.name}"
            )
        params = dict(hf.get("rope_parameters") or {})
        if params.get("rope_type", "default") != "default":
            raise ValueError(
                f"config.json: rope_parameters.rope_type={params['rope_type']!r}; {self.name} "
                "supports only 'default'"
            )
        layers = int(_require(hf, "num_hidden_layers"))
        types = hf.get("layer_types") or [
            "full_attention" if (i + 1) % int(hf.get("full_attention_interval", 4)) == 0
            else "linear_attention" for i in range(layers)
        ]  # fmt: skip
        heads = int(_require(hf, "num_attention_heads"))
        experts = {}
        if self.moe:
            width = int(_require(hf, "moe_intermediate_size"))
            experts = dict(
                num_experts=int(_require(hf, "num_experts")),
                num_experts_per_tok=int(_require(hf, "num_experts_per_tok")),
                moe_intermediate_size=width,
                norm_topk_prob=True,  # the router always renormalises its top k
                shared_expert_intermediate_size=int(
                    _require(hf, "shared_expert_intermediate_size")
                ),
            )
        return ModelConfig(
            vocab_size=int(_require(hf, "vocab_size")),
            hidden_size=int(_require(hf, "hidden_size")),
            intermediate_size=int(hf.get("intermediate_size") or experts["moe_intermediate_size"]),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or 256),
            rope_theta=float(params.get("rope_theta", hf.get("rope_theta", 10000.0))),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qk_norm=True,
            max_position_embeddings=int(
                hf.get("max_position_embeddings", self.default_max_positions)
            ),
            family=self.model_type,
            norm_plus_one=True,
            layer_types=tuple(types),
            linear_num_key_heads=int(hf.get("linear_num_key_heads", 16)),
            linear_num_value_heads=int(hf.get("linear_num_value_heads", 32)),
            linear_key_head_dim=int(hf.get("linear_key_head_dim", 128)),
            linear_value_head_dim=int(hf.get("linear_value_head_dim", 128)),
            linear_conv_kernel_dim=int(hf.get("linear_conv_kernel_dim", 4)),
            partial_rotary_factor=float(
                params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25))
            ),
            attn_output_gate=True,
            **experts,
        )

    def config_to_hf(self, cfg: ModelConfig, torch_dtype: str) -> dict:
        """ModelConfig -> config.json dict (transformers 5's keys)."""
        if not (any(cfg.linear_layers) and cfg.attn_output_gate and cfg.norm_plus_one):
            raise ValueError(
                "a Qwen3.5 checkpoint has linear-attention layers, gated attention and (1 + w) "
                "norms: this ModelConfig cannot be written as one"
            )
        hf = {
            **shared_to_hf(self.name, self.model_type, cfg, torch_dtype),
            "head_dim": cfg.resolved_head_dim,
            "hidden_act": "silu",
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": cfg.rope_theta,
                "partial_rotary_factor": cfg.partial_rotary_factor,
            },
            "attention_bias": False,
            "layer_types": list(cfg.layer_types),
            "linear_num_key_heads": cfg.linear_num_key_heads,
            "linear_num_value_heads": cfg.linear_num_value_heads,
            "linear_key_head_dim": cfg.linear_key_head_dim,
            "linear_value_head_dim": cfg.linear_value_head_dim,
            "linear_conv_kernel_dim": cfg.linear_conv_kernel_dim,
        }
        if self.moe:
            hf.update(
                num_experts=cfg.num_experts,
                num_experts_per_tok=cfg.num_experts_per_tok,
                moe_intermediate_size=cfg.moe_intermediate_size,
                shared_expert_intermediate_size=cfg.shared_expert_intermediate_size,
                output_router_logits=False,
            )
        else:
            hf["intermediate_size"] = cfg.intermediate_size
        return hf


QWEN3_5 = (
    Qwen35Architecture("Qwen3_5ForCausalLM", "qwen3_5_text"),
    Qwen35Architecture("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", moe=True),
    # read only: saved back as the ForCausalLM of their language model
    Qwen35Architecture("Qwen3_5ForConditionalGeneration", "qwen3_5", multimodal=True),
    Qwen35Architecture(
        "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe", moe=True, multimodal=True
    ),
)


def checkpoint_specs(cfg: ModelConfig, expert_tensors: str = "per_expert") -> list[TensorSpec]:
    """Every HF tensor of a checkpoint of `cfg`: `hybrid_tensor_specs` for a model with
    linear-attention layers, else `tensor_map.tensor_specs`."""
    if any(cfg.linear_layers):
        return hybrid_tensor_specs(cfg)
    return tensor_specs(cfg, expert_tensors)


def hybrid_tensor_specs(cfg: ModelConfig) -> list[TensorSpec]:
    """The tensors of a Qwen3.5 checkpoint, in HF's order (module docstring); each fills one
    per-layer parameter of `hybrid.HybridTransformer` (paths ("layers", i, ...))."""
    d, v = cfg.hidden_size, cfg.vocab_size
    specs = [TensorSpec("model.embed_tokens.weight", ("embed",), (v, d), (v, d), False)]
    for i, linear in enumerate(cfg.linear_layers):
        pre, at = f"model.layers.{i}.", ("layers", i)
        specs.append(TensorSpec(pre + "input_layernorm.weight", (*at, "input_norm", "weight"),
                                (d,), (d,), False))  # fmt: skip
        specs += _linear_specs(cfg, pre, at) if linear else _attention_specs(cfg, pre, at)
        specs.append(TensorSpec(pre + "post_attention_layernorm.weight",
                                (*at, "post_attn_norm", "weight"), (d,), (d,), False))  # fmt: skip
        specs += _mlp_specs(cfg, pre, at)
    specs.append(TensorSpec("model.norm.weight", ("final_norm", "weight"), (d,), (d,), False))
    if cfg.num_labels:
        n = cfg.num_labels
        specs.append(TensorSpec("score.weight", ("score",), (n, d), (d, n), True))
    elif not cfg.tie_word_embeddings:
        specs.append(TensorSpec("lm_head.weight", ("lm_head",), (v, d), (d, v), True))
    return specs


def _linear_specs(cfg: ModelConfig, pre: str, at: tuple) -> list[TensorSpec]:
    d, kc = cfg.hidden_size, cfg.linear_conv_kernel_dim
    _, _, hv, dv, ch = linear_dims(cfg)
    la, ours = pre + "linear_attn.", (*at, "attn")
    return [
        TensorSpec(la + "in_proj_qkv.weight", (*ours, "in_proj_qkv"), (ch, d), (d, ch), True),
        TensorSpec(la + "in_proj_z.weight", (*ours, "in_proj_z"), (hv * dv, d), (d, hv * dv), True),
        TensorSpec(la + "in_proj_b.weight", (*ours, "in_proj_b"), (hv, d), (d, hv), True),
        TensorSpec(la + "in_proj_a.weight", (*ours, "in_proj_a"), (hv, d), (d, hv), True),
        # [C, 1, Kc] transposed is [Kc, 1, C]: ours [Kc, C]
        TensorSpec(la + "conv1d.weight", (*ours, "conv"), (ch, 1, kc), (kc, ch), True),
        TensorSpec(la + "dt_bias", (*ours, "dt_bias"), (hv,), (hv,), False),
        TensorSpec(la + "A_log", (*ours, "A_log"), (hv,), (hv,), False),
        TensorSpec(la + "norm.weight", (*ours, "norm", "weight"), (dv,), (dv,), False),
        TensorSpec(la + "out_proj.weight", (*ours, "out_proj"), (d, hv * dv), (hv * dv, d), True),
    ]


def _attention_specs(cfg: ModelConfig, pre: str, at: tuple) -> list[TensorSpec]:
    d, h, k, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.resolved_head_dim
    sa, ours = pre + "self_attn.", (*at, "attn")
    return [
        TensorSpec(sa + "q_proj.weight", (*ours, "q_proj"), (2 * h * hd, d), (d, h, 2 * hd), True),
        TensorSpec(sa + "k_proj.weight", (*ours, "k_proj"), (k * hd, d), (d, k, hd), True),
        TensorSpec(sa + "v_proj.weight", (*ours, "v_proj"), (k * hd, d), (d, k, hd), True),
        TensorSpec(sa + "o_proj.weight", (*ours, "o_proj"), (d, h * hd), (h, hd, d), True),
        TensorSpec(sa + "q_norm.weight", (*ours, "q_norm", "weight"), (hd,), (hd,), False),
        TensorSpec(sa + "k_norm.weight", (*ours, "k_norm", "weight"), (hd,), (hd,), False),
    ]


def _mlp_specs(cfg: ModelConfig, pre: str, at: tuple) -> list[TensorSpec]:
    """The dense MLP's three projections, or the MoE's tensors (`tensor_map.expert_specs`,
    moved from a stacked parameter's layer slice to this layer's own parameters)."""
    if not cfg.num_experts:
        d, f, mlp = cfg.hidden_size, cfg.intermediate_size, (*at, "mlp")
        return [
            TensorSpec(pre + "mlp.gate_proj.weight", (*mlp, "gate_proj"), (f, d), (d, f), True),
            TensorSpec(pre + "mlp.up_proj.weight", (*mlp, "up_proj"), (f, d), (d, f), True),
            TensorSpec(pre + "mlp.down_proj.weight", (*mlp, "down_proj"), (d, f), (f, d), True),
        ]
    out = []
    for spec in expert_specs(cfg, pre):  # paths ("layers", "mlp", name), experts at index e
        out.append(dataclasses.replace(spec, path=(*at, *spec.path[1:]), layer=None))
    return out
