"""`ModelConfig`: a decoder's architecture hyperparameters (names follow Hugging Face's
config.json), and the tables its string fields name: the gate activations, the remat
policies, the layer types and the MoE implementations. The layers (`layers.py`,
`transformer.py`, `moe.py`), the caches and the checkpoint readers all read it; it reads
none of them.

A family is a choice of these fields, never a name the layers test: Gemma's are the block
after `scan_unroll`, GPT-OSS's `o_bias`, `attention_sinks`, `expert_bias` and
`swiglu_limit`, DeepSeek-V3's the block after `swiglu_alpha` (docs/models.md).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.models.attention import ATTENTION_IMPLS, SINK_IMPLS

MOE_IMPLS = ("auto", "ragged", "dense")  # ModelConfig.moe_impl (models/moe.py: expert_impl)
MOE_DISPATCH = ("gather", "all_to_all")  # ModelConfig.moe_dispatch (models/moe.py)
ROUTER_SCORING = ("softmax", "sigmoid")  # ModelConfig.router_scoring (models/moe.py)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture hyperparameters (names follow Hugging Face's config.json)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None  # None -> hidden_size // num_heads
    rope_theta: float = 10000.0
    # None, or a sorted tuple of (key, value) items of HF's rope_scaling dict (hashable).
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    # > 0: a sequence classifier (HF `*ForSequenceClassification`, a reward model): a score
    # head [D, num_labels] read at each row's last real token in place of the LM head
    num_labels: int = 0
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3
    max_position_embeddings: int = 4096
    dtype: str = "float32"  # compute dtype: float32 | bfloat16
    param_dtype: str = "float32"
    family: str = "llama"  # llama | qwen2 | qwen3 (the HF architecture written back on save)
    # recompute each block in the backward pass (jax.checkpoint of the scanned body): False /
    # 'none', True / 'full' (keep only each block's input), 'dots_saveable' (keep the matmul
    # outputs too)
    remat: bool | str = False
    attention: str = "xla"  # the attention implementation (`ATTENTION_IMPLS`)
    # layers per iteration of the scanned forward (`jax.lax.scan`'s unroll): 1 is a loop over
    # the layers (least compile time); 0 unrolls them all (no loop: its per-layer slicing of
    # the saved activations and their zero-filled [L, ...] buffers are gone)
    scan_unroll: int = 1
    # ---- Gemma 2 / 3 (docs/models.md); the defaults are the Llama / Qwen behaviour
    hidden_act: str = "silu"  # the MLP's gate activation (`ACTIVATIONS`)
    norm_plus_one: bool = False  # RMSNorm scales by (1 + w) (w stored around 0)
    embed_scale: bool = False  # embeddings times sqrt(hidden_size), in the compute dtype
    # scores scaled by query_pre_attn_scalar ** -0.5 instead of head_dim ** -0.5
    query_pre_attn_scalar: float | None = None
    # RMSNorms on the attention output and the MLP output (HF post_attention_layernorm and
    # post_feedforward_layernorm), the MLP's input norm being HF pre_feedforward_layernorm
    sandwich_norms: bool = False
    attn_logit_softcap: float | None = None  # scores -> c * tanh(scores / c) (Gemma 2)
    final_logit_softcap: float | None = None  # logits -> c * tanh(logits / c) (Gemma 2)
    # per layer "full_attention" | "sliding_attention" (None: all full); a sliding layer's
    # query sees the keys of the last `sliding_window` slots, itself included
    layer_types: tuple[str, ...] | None = None
    sliding_window: int | None = None
    rope_local_theta: float | None = None  # sliding layers' RoPE base, unscaled (None: rope_theta)
    # mixture of experts (Qwen3-MoE; models/moe.py): num_experts > 0 replaces every layer's
    # MLP by a router over that many SwiGLU experts of moe_intermediate_size, each token
    # going to num_experts_per_tok of them; 0 keeps the dense MLP
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # renormalise the k gates to sum to 1
    # Qwen2-MoE: a shared SwiGLU expert of this width every token goes through, its output
    # scaled by sigmoid(x w_g); 0: none (Qwen3-MoE)
    shared_expert_intermediate_size: int = 0
    # the experts' matmuls: ragged (grouped) | dense (every expert on every token) | auto
    # (ragged on TPU, dense elsewhere: models/moe.py expert_impl)
    moe_impl: str = "auto"
    # experts split over devices: how tokens reach them (`MOE_DISPATCH`): gather (the
    # expert group's tokens on every device, dropless) | all_to_all (each assignment sent to
    # its expert's device, at most C per device pair: `moe.all_to_all_capacity`)
    moe_dispatch: str = "gather"
    moe_capacity_factor: float = 0.0  # all_to_all: C = ceil(f tokens k / devices); 0 dropless
    # ---- GPT-OSS (docs/models.md); the defaults are the other families' behaviour
    o_bias: bool = False  # a bias on the attention output (with qkv_bias: HF attention_bias)
    # a learned logit per query head that joins every softmax's denominator and adds no
    # value (HF `sinks`): softmax over [scores, sink], the sink's column dropped
    attention_sinks: bool = False
    expert_bias: bool = False  # biases on the router and on the experts' three projections
    # None: the experts' gate is silu(g) * u; c: GPT-OSS's clamped SwiGLU,
    # (clip(u, -c, c) + 1) * g' * sigmoid(swiglu_alpha * g') with g' = min(g, c)
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702
    # ---- DeepSeek-V3 (docs/models.md); the defaults are the other families' behaviour
    # multi-head latent attention (layers.LatentAttention) where kv_lora_rank > 0: keys and
    # values up-projected per head from a normed latent of this width, plus one rope key
    # shared by the heads; head_dim is then qk_nope_head_dim + qk_rope_head_dim (the score's
    # width) and num_kv_heads = num_heads
    kv_lora_rank: int = 0
    q_lora_rank: int = 0  # > 0: q through a normed latent of this width (0: one q_proj)
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = False  # RoPE pairs (x0, x1), (x2, x3), ... (HF rope_interleave)
    # the first k layers keep the dense MLP (`Transformer.dense_layers`), the rest are MoE
    first_k_dense_replace: int = 0
    # the router: "softmax" (Qwen-MoE, GPT-OSS) | "sigmoid" (DeepSeek-V3: sigmoid scores,
    # experts chosen by score + a correction bias, group-limited: moe.group_limited_gates)
    router_scoring: str = "softmax"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    shared_expert_gated: bool = True  # Qwen2-MoE's sigmoid gate on the shared expert
    # ---- Qwen3.5 (docs/models.md; models/hybrid.py): layer_types "linear_attention" layers
    # are Gated DeltaNet (models/linear_attention.py) with these heads and widths, a causal
    # depthwise conv of linear_conv_kernel_dim taps, and the chunk-parallel delta rule's
    # chunk (models/delta_rule.py); the full layers gate their output by sigmoid of a second
    # half of q_proj (attn_output_gate) and rotate the first partial_rotary_factor of a head
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    linear_chunk_size: int = 64
    partial_rotary_factor: float = 1.0
    attn_output_gate: bool = False

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype={self.dtype!r}; allowed: 'float32', 'bfloat16'")
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention={self.attention!r}; allowed: {ATTENTION_IMPLS}")
        if self.scan_unroll < 0:
            raise ValueError(f"scan_unroll={self.scan_unroll}; must be >= 0 (0: every layer)")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat={self.remat!r}; allowed: {tuple(REMAT_POLICIES)}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act={self.hidden_act!r}; allowed: {tuple(ACTIVATIONS)}")
        if self.layer_types is not None:
            bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
            if bad or not self.layer_types:
                raise ValueError(f"layer_types={self.layer_types}: each one of {LAYER_TYPES}")
            # a config replaced to fewer layers (a shallow draft: the first layers) keeps
            # their types; to more (a separate critic), the pattern repeats
            types = tuple(
                self.layer_types[i % len(self.layer_types)] for i in range(self.num_layers)
            )
            object.__setattr__(self, "layer_types", types)
            if "sliding_attention" in self.layer_types and not (self.sliding_window or 0) > 0:
                raise ValueError(
                    f"sliding_window={self.sliding_window}; layer_types has sliding layers, "
                    "which need a window > 0"
                )
        self._check_experts_and_latent_attention()
        if any(self.linear_layers) and not (
            self.linear_num_key_heads > 0
            and self.linear_num_value_heads % self.linear_num_key_heads == 0
            and self.linear_key_head_dim > 0
            and self.linear_value_head_dim > 0
            and self.linear_conv_kernel_dim >= 1
            and self.linear_chunk_size >= 1
        ):
            raise ValueError(
                "linear_attention layers need linear_num_key_heads > 0 dividing "
                "linear_num_value_heads, key and value head dims > 0, a conv kernel >= 1 "
                "and linear_chunk_size >= 1"
            )
        if self.attention_sinks and self.attention not in SINK_IMPLS:
            raise ConfigError(
                f"config key 'model.attention' = {self.attention!r}: this model has attention "
                f"sinks (GPT-OSS), which jax.nn.dot_product_attention cannot add to its "
                f"softmax; choose one of {SINK_IMPLS}"
            )
        if (
            self.rope_local_theta is not None
            and dict(self.rope_scaling or ()).get("rope_type") == "yarn"
        ):
            raise ValueError(
                "rope_scaling type 'yarn' with rope_local_theta is not supported: YaRN scales "
                "the rotated q and k of every layer, a sliding layer's local RoPE is unscaled"
            )

    def _check_experts_and_latent_attention(self) -> None:
        """A mixture of experts' fields: the top-k, the router, the expert groups, latent
        attention's shapes (DeepSeek-V3) and the dense first layers, the implementation."""
        if self.num_experts and not (
            0 < self.num_experts_per_tok <= self.num_experts and self.moe_intermediate_size > 0
        ):
            raise ValueError(
                f"num_experts={self.num_experts} needs 0 < num_experts_per_tok "
                f"({self.num_experts_per_tok}) <= num_experts and moe_intermediate_size "
                f"({self.moe_intermediate_size}) > 0"
            )
        if self.router_scoring not in ROUTER_SCORING:
            raise ValueError(f"router_scoring={self.router_scoring!r}; allowed: {ROUTER_SCORING}")
        if self.num_experts % self.n_group or not 0 < self.topk_group <= self.n_group:
            raise ValueError(
                f"n_group={self.n_group} must divide num_experts={self.num_experts} and "
                f"0 < topk_group={self.topk_group} <= n_group"
            )
        if self.kv_lora_rank and not (
            self.num_kv_heads == self.num_heads
            and self.resolved_head_dim == self.qk_nope_head_dim + self.qk_rope_head_dim
            and self.v_head_dim <= self.resolved_head_dim
        ):
            raise ValueError(
                "latent attention (kv_lora_rank > 0) needs num_kv_heads = num_heads, head_dim "
                "= qk_nope_head_dim + qk_rope_head_dim and v_head_dim <= head_dim"
            )
        if not 0 <= self.first_k_dense_replace < self.num_layers or (
            self.first_k_dense_replace and not self.num_experts
        ):
            raise ValueError(
                f"first_k_dense_replace={self.first_k_dense_replace}: the dense layers before "
                f"a mixture of experts' layers, 0 <= k < num_layers={self.num_layers}"
            )
        if self.moe_impl not in MOE_IMPLS:
            raise ValueError(f"moe_impl={self.moe_impl!r}; allowed: {MOE_IMPLS}")
        if self.moe_dispatch not in MOE_DISPATCH:
            raise ValueError(f"moe_dispatch={self.moe_dispatch!r}; allowed: {MOE_DISPATCH}")
        if self.moe_capacity_factor < 0:
            raise ValueError(f"moe_capacity_factor={self.moe_capacity_factor}; must be >= 0")

    @property
    def sliding_layers(self) -> tuple[bool, ...]:
        """Per layer: True for a sliding-window layer."""
        types = self.layer_types or ("full_attention",) * self.num_layers
        return tuple(t == "sliding_attention" for t in types)

    @property
    def linear_layers(self) -> tuple[bool, ...]:
        """Per layer: True for a linear-attention (Gated DeltaNet) layer (Qwen3.5)."""
        types = self.layer_types or ("full_attention",) * self.num_layers
        return tuple(t == "linear_attention" for t in types)

    @property
    def per_layer_attention(self) -> bool:
        """Layers differ in window or RoPE base (then `layer_attention_inputs` is scanned)."""
        return any(self.sliding_layers)

    @property
    def rope_dim(self) -> int:
        """The rotated width of a query or key head (latent attention: qk_rope_head_dim;
        Qwen3.5: the first partial_rotary_factor of the head)."""
        if self.kv_lora_rank:
            return self.qk_rope_head_dim
        return int(self.resolved_head_dim * self.partial_rotary_factor)

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    def replace(self, **kwargs) -> ModelConfig:
        return dataclasses.replace(self, **kwargs)

    def num_params(self) -> int:
        d, f, v, hd = (
            self.hidden_size,
            self.intermediate_size,
            self.vocab_size,
            self.resolved_head_dim,
        )
        attn = d * hd * (self.num_heads * 2 + self.num_kv_heads * 2)
        if self.qkv_bias:
            attn += hd * (self.num_heads + 2 * self.num_kv_heads)
        if self.qk_norm:
            attn += 2 * hd
        attn += d * self.o_bias + self.num_heads * self.attention_sinks
        attn += d * self.num_heads * hd * self.attn_output_gate  # Qwen3.5: a gate per head
        if self.kv_lora_rank:  # latent attention's projections and latent norms instead
            h, r, rq, dv = self.num_heads, self.kv_lora_rank, self.q_lora_rank, self.v_head_dim
            attn = (d * rq + rq + rq * h * hd) if rq else d * h * hd
            attn += d * (r + self.qk_rope_head_dim) + r
            attn += r * h * (self.qk_nope_head_dim + dv) + h * dv * d
        dense_mlp = mlp = 3 * d * f
        if self.num_experts:  # the router and the experts instead
            fs = self.shared_expert_intermediate_size
            mlp = d * self.num_experts * (1 + 3 * self.moe_intermediate_size)
            # biases: the router's [E], the gate's and up's [E, F], the down's [E, D]
            mlp += self.expert_bias * self.num_experts * (1 + 2 * self.moe_intermediate_size + d)
            mlp += (3 * d * fs + d * self.shared_expert_gated) * bool(fs)
            mlp += self.num_experts * (self.router_scoring == "sigmoid")  # the balancing bias
        norms = (4 if self.sandwich_norms else 2) * d
        emb = v * d * (1 if self.tie_word_embeddings else 2)
        dense = self.first_k_dense_replace  # DeepSeek-V3's first layers: dense MLPs
        layers = (self.num_layers - dense) * (attn + mlp + norms) + dense * (
            attn + dense_mlp + norms
        )
        layers += sum(self.linear_layers) * (self._linear_attention_params() - attn)
        return layers + emb + d

    def _linear_attention_params(self) -> int:
        """A Gated DeltaNet layer's parameters (models/linear_attention.py): the q, k, v, z,
        b, a projections, the conv, dt_bias, A_log, the gated norm and out_proj."""
        d, hv, dv = self.hidden_size, self.linear_num_value_heads, self.linear_value_head_dim
        ch = 2 * self.linear_num_key_heads * self.linear_key_head_dim + hv * dv
        return (
            d * ch + 2 * d * hv * dv + 2 * d * hv + self.linear_conv_kernel_dim * ch + 2 * hv + dv
        )


# ModelConfig.hidden_act (HF `hidden_act` / `hidden_activation`) -> the MLP's gate activation
ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),  # Gemma's GeGLU
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
}

# ModelConfig.remat -> the jax.checkpoint policy of the scanned body (None: no remat)
REMAT_POLICIES = {
    False: None,
    "none": None,
    True: jax.checkpoint_policies.nothing_saveable,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
}

# HF `layer_types` values ("linear_attention": Qwen3.5's Gated DeltaNet layers)
LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")
