"""The config sections of the models: `tokenizer`, the policy's `model` and the `teacher`."""

from __future__ import annotations

import dataclasses

from jaxrl_frontier.core import records
from jaxrl_frontier.core.records import key, section
from jaxrl_frontier.models.model_config import MOE_DISPATCH, MOE_IMPLS
from jaxrl_frontier.models.moe import ROUTING_REPLAY


@dataclasses.dataclass(frozen=True)
class TokenizerSection:
    """`tokenizer`: the character tokenizer or a local tokenizer.json."""

    kind: str = key(
        "char", "char | hf (path: a directory with tokenizer.json)", choices=("char", "hf")
    )
    path: str = key("", "the tokenizer's directory, or a pretrained checkpoint's name")

    def __post_init__(self):
        records.check(self, "tokenizer")


@dataclasses.dataclass(frozen=True)
class MoeSection:
    """`model.moe`: mixture of experts (models/moe.py, Qwen3-MoE). num_experts > 0 replaces
    each layer's MLP by a softmax top-k router over that many SwiGLU experts of
    `intermediate_size` (split over the mesh's fsdp axis: expert parallelism); `impl`: the
    experts' matmuls (auto: ragged grouped matmuls on TPU, dense elsewhere). The router's
    training terms are objective.router_aux_coef / router_z_coef. A checkpoint (model.init =
    hf) brings its own shape; `impl` still applies. routing_replay: none | rollout (R3: the
    sampler records each token's experts per layer; the update and the policy's behaviour /
    mismatch passes route each token there, the gates from the current router; the reference
    and teacher route with their own routers) | first_update (R2: the step's rows routed once
    at its starting weights, replayed by every minibatch and epoch). dispatch (experts split
    over devices): gather (every device gathers its expert group's tokens; dropless) |
    all_to_all (each assignment sent to its expert's device and back, at most
    ceil(capacity_factor tokens k / devices) a device pair, the rest dropped; capacity_factor
    0: sized so none is). bias_update_rate (a sigmoid router's balancing bias, DeepSeek-V3's
    `e_score_correction_bias`; "Auxiliary-Loss-Free Load Balancing Strategy for
    Mixture-of-Experts", Wang et al. 2024): u > 0 moves it after each optimizer step by
    b_e <- b_e + u sign(mean load - load_e) from the minibatch's loads (no gradient, no
    optimizer); 0 keeps it fixed."""

    num_experts: int = key(0, "experts a layer (0: the dense MLP)", low=0)
    num_experts_per_tok: int = key(2, "experts a token is routed to (k)", low=0, low_open=True)
    intermediate_size: int = key(64, "an expert's MLP width", low=0, low_open=True)
    norm_topk_prob: bool = key(True, "renormalise the top-k gates to sum to 1")
    impl: str = key("auto", "the experts' matmuls", choices=MOE_IMPLS)
    routing_replay: str = key(
        "none",
        "replay the rollout's or first update's routing",
        choices=ROUTING_REPLAY,
    )
    dispatch: str = key("gather", "how tokens reach their experts", choices=MOE_DISPATCH)
    capacity_factor: float = key(0.0, "all_to_all's capacity (0: dropless)", low=0)
    bias_update_rate: float = key(
        0.0, "deepseek_v3: u, the balancing bias's step after each update (0: off)", low=0
    )


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraSection:
    """`model.lora`: LoRA (models/lora.py, Hu et al. 2021). rank > 0 trains rank-r adapters on
    the `targets` projections beside the frozen weights (RL): y = x W + (alpha / rank) x A B.
    Only the adapters and their optimizer state are trained and checkpointed; the reference
    policy is the frozen base; the export merges them into the weights. A hybrid model
    (Qwen3.5) also takes its linear layers' `in_proj_qkv`, `in_proj_z` and `out_proj`."""

    rank: int = key(0, "the adapters' rank (0: no adapters)", low=0)
    alpha: float = key(16.0, "the adapters' scale numerator", low=0, low_open=True)
    targets: tuple = key(LORA_TARGETS, "the projections that get adapters")


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """`model`: the policy's shape, initialisation, dtype, remat and LoRA adapters.

    family: the architecture of a scratch model: "" (llama, qwen2 with qkv_bias, qwen3 with
    qk_norm) | gemma2 | gemma3_text (Gemma's norms, GeGLU, embedding scale, soft-caps /
    qk-norm, sliding-window layers: docs/models.md) | gpt_oss (attention sinks, biases,
    sliding and full layers alternating, `moe` experts with biases and the clamped SwiGLU) |
    deepseek_v3 (multi-head latent attention, a dense first layer, then `moe`'s experts
    behind a sigmoid router with a balancing bias, plus a shared expert: run/build.py
    `_deepseek_v3_keys`) | qwen3_5 (Gated DeltaNet linear-attention layers and every
    sliding_window_pattern-th layer gated full attention; with `moe` experts, a gated shared
    expert beside them: run/build.py `_qwen3_5_keys`);
    a model read from a checkpoint keeps the checkpoint's. remat: recompute in the backward pass (memory for FLOPs), per scanned
    block: none | full (keep only each block's input) | dots_saveable (keep the matmul
    outputs, recompute the rest). attention, of a forward over many tokens (prefill, update,
    scoring; a decode step's one query has its own): xla (einsums) | dot_product
    (jax.nn.dot_product_attention, XLA) | cudnn (its fused cuDNN kernel: a GPU and
    model.dtype bfloat16) | ring (ring attention over mesh.sequence: K/V blocks passed
    around the axis, [T/s, T/s] scores at a time; xla without a sequence axis; docs/scaling.md
    "Long rows"). scan_unroll: layers per iteration of the scanned forward: 1 loops over them
    (least compile time), 0 unrolls them all (faster updates for models of a few layers;
    longer compiles)."""

    init: str = key(
        "scratch",
        "scratch | hf (path: a checkpoint directory or name) | checkpoint (path: a workdir)",
        choices=("scratch", "hf", "checkpoint"),
    )
    path: str = key("", "the checkpoint the weights are read from")
    vocab_size: int = key(0, "0: the tokenizer's", low=0)
    hidden_size: int = key(128, "the residual width", low=0, low_open=True)
    intermediate_size: int = key(384, "the MLP width", low=0, low_open=True)
    num_layers: int = key(2, "transformer blocks", low=0, low_open=True)
    num_heads: int = key(4, "query heads", low=0, low_open=True)
    num_kv_heads: int = key(2, "key/value heads", low=0, low_open=True)
    head_dim: int = key(0, "0: hidden_size // num_heads", low=0)
    rope_theta: float = key(10000.0, "RoPE's base", low=0, low_open=True)
    tie_word_embeddings: bool = key(True, "the LM head is the embedding")
    qkv_bias: bool = key(False, "biases on q, k, v (qwen2)")
    qk_norm: bool = key(False, "RMSNorm on q and k per head (qwen3)")
    max_position_embeddings: int = key(512, "the longest row", low=0, low_open=True)
    dtype: str = key("float32", "the compute dtype", choices=("float32", "bfloat16"))
    family: str = key(
        "",
        "a scratch model's architecture",
        choices=("", "gemma2", "gemma3_text", "gpt_oss", "deepseek_v3", "qwen3_5"),
    )
    sliding_window: int = key(
        4096, "gemma, gpt_oss: a sliding layer's last keys", low=0, low_open=True
    )
    sliding_window_pattern: int = key(
        0, "gemma, gpt_oss, qwen3_5: every this-th layer is global (0: the family's)", low=0
    )
    remat: str = key(
        "none", "recompute in the backward pass", choices=("none", "full", "dots_saveable")
    )
    attention: str = key(
        "xla", "a long forward's attention", choices=("xla", "dot_product", "cudnn", "ring")
    )
    scan_unroll: int = key(1, "layers per scan iteration (0: every layer)", low=0)
    moe: MoeSection = section(MoeSection, "mixture of experts")
    lora: LoraSection = section(LoraSection, "LoRA adapters")

    def __post_init__(self):
        records.check(self, "model")


@dataclasses.dataclass(frozen=True)
class TeacherSection:
    """`teacher`: the OPD teacher model (none by default)."""

    init: str = key(
        "none", "where its weights come from", choices=("none", "scratch", "hf", "checkpoint")
    )
    path: str = key("", "its checkpoint")
    dtype: str = key("float32", "its compute dtype", choices=("float32", "bfloat16"))
    # several teachers: a row's teacher is the one its example's tag names, the teacher at
    # `path` for every other tag (rl/produce/passes.py, `teacher_pass`)
    by_tag: dict = key({}, "several teachers: {tag: checkpoint}, by the example's tag")
    tokenizer: str = key(
        "policy",
        "policy (it reads the student's tokens: one vocabulary) | own (its checkpoint's: "
        "the completion re-tokenized, rl/produce/cross_tokenizer.py)",
        choices=("policy", "own"),
    )
    token_ratio: float = key(
        2.0, "tokenizer 'own': its completion budget per student token", low=0, low_open=True
    )
    tag_key: str = key("dataset", "the example field holding its tag (teacher.by_tag)")

    def __post_init__(self):
        records.check(self, "teacher")
