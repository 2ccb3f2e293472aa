"""The config sections of the models: tokenizer, policy model and teacher."""

from __future__ import annotations

import ml_collections


def tokenizer_section() -> ml_collections.ConfigDict:
    """`tokenizer`: the character tokenizer or a local tokenizer.json."""
    # kind: char | hf (path: a directory with tokenizer.json)
    s = ml_collections.ConfigDict(dict(kind="char", path=""))
    return s


def model_section() -> ml_collections.ConfigDict:
    """`model`: the policy's shape, initialisation, dtype, remat and LoRA adapters."""
    s = ml_collections.ConfigDict()
    s.init = "scratch"  # scratch | hf (path = HF dir) | checkpoint (path = workdir)
    s.path = ""
    s.vocab_size = 0  # 0: the tokenizer's
    s.hidden_size = 128
    s.intermediate_size = 384
    s.num_layers = 2
    s.num_heads = 4
    s.num_kv_heads = 2
    s.head_dim = 0  # 0: hidden_size // num_heads
    s.rope_theta = 10000.0
    s.tie_word_embeddings = True
    s.qkv_bias = False
    s.qk_norm = False
    s.max_position_embeddings = 512
    s.dtype = "float32"  # compute dtype: float32 | bfloat16
    # the architecture of a scratch model: "" (llama, qwen2 with qkv_bias, qwen3 with
    # qk_norm) | gemma2 | gemma3_text (Gemma's norms, GeGLU, embedding scale, soft-caps /
    # qk-norm, sliding-window layers: docs/models.md); a model read from a checkpoint keeps
    # the checkpoint's
    s.family = ""
    s.sliding_window = 4096  # gemma: a sliding layer's keys (its last this many tokens)
    s.sliding_window_pattern = 0  # gemma: every this-th layer is global (0: 2 / 6, HF's)
    # recompute in the backward pass (memory for FLOPs), per scanned block: none | full (keep
    # only each block's input) | dots_saveable (keep the matmul outputs, recompute the rest)
    s.remat = "none"
    # the attention of a forward over many tokens (prefill, update, scoring; a decode step's
    # one query has its own): xla (einsums) | dot_product (jax.nn.dot_product_attention, XLA)
    # | cudnn (its fused cuDNN kernel: a GPU and model.dtype bfloat16) | ring (ring attention
    # over mesh.sequence: K/V blocks passed around the axis, [T/s, T/s] scores at a time;
    # xla without a sequence axis; docs/scaling.md "Long rows")
    s.attention = "xla"
    # layers per iteration of the scanned forward: 1 loops over them (least compile time), 0
    # unrolls them all (faster updates for models of a few layers; longer compiles)
    s.scan_unroll = 1
    # mixture of experts (models/moe.py, Qwen3-MoE): num_experts > 0 replaces each layer's MLP
    # by a softmax top-k router over that many SwiGLU experts of `intermediate_size` (split
    # over the mesh's fsdp axis: expert parallelism); `impl`: the experts' matmuls (auto:
    # ragged grouped matmuls on TPU, dense elsewhere). The router's training terms are
    # objective.router_aux_coef / router_z_coef. A checkpoint (model.init = hf) brings its
    # own shape; `impl` still applies. routing_replay: none | rollout (R3: the sampler
    # records each token's experts per layer; the update and the policy's behaviour /
    # mismatch passes route each token there, the gates from the current router; the
    # reference and teacher route with their own routers) | first_update (R2: the step's
    # rows routed once at its starting weights, replayed by every minibatch and epoch).
    # dispatch (experts split over devices): gather (every device gathers its expert group's
    # tokens; dropless) | all_to_all (each assignment sent to its expert's device and back,
    # at most ceil(capacity_factor tokens k / devices) a device pair, the rest dropped;
    # capacity_factor 0: sized so none is)
    s.moe = dict(
        num_experts=0,
        num_experts_per_tok=2,
        intermediate_size=64,
        norm_topk_prob=True,
        impl="auto",
        routing_replay="none",
        dispatch="gather",
        capacity_factor=0.0,
    )
    # LoRA (models/lora.py, Hu et al. 2021): rank > 0 trains rank-r adapters on the `targets`
    # projections beside the frozen weights (RL): y = x W + (alpha / rank) x A B. Only the
    # adapters and their optimizer state are trained and checkpointed; the reference policy
    # is the frozen base; the export merges them into the weights.
    s.lora = dict(
        rank=0,
        alpha=16.0,
        targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    )
    return s


def teacher_section() -> ml_collections.ConfigDict:
    """`teacher`: the OPD teacher model (none by default)."""
    # init: none | scratch | hf | checkpoint
    s = ml_collections.ConfigDict(dict(init="none", path="", dtype="float32"))
    return s


# The allowed values of this layer's keys with a closed set of them (run/config.py checks).
CHOICES: dict[str, tuple] = {
    "tokenizer.kind": ("char", "hf"),
    "model.init": ("scratch", "hf", "checkpoint"),
    "model.dtype": ("float32", "bfloat16"),
    "model.family": ("", "gemma2", "gemma3_text"),
    "model.remat": ("none", "full", "dots_saveable"),
    "model.attention": ("xla", "dot_product", "cudnn", "ring"),
    "model.moe.impl": ("auto", "ragged", "dense"),
    "model.moe.routing_replay": ("none", "rollout", "first_update"),  # moe.ROUTING_REPLAY
    "model.moe.dispatch": ("gather", "all_to_all"),  # model_config.MOE_DISPATCH
    "teacher.init": ("none", "scratch", "hf", "checkpoint"),
    "teacher.dtype": ("float32", "bfloat16"),
}

# This layer's numeric keys: (low, high, low inclusive, high inclusive); None = open.
RANGES: dict[str, tuple] = {
    "model.hidden_size": (0, None, False, None),
    "model.intermediate_size": (0, None, False, None),
    "model.num_layers": (0, None, False, None),
    "model.num_heads": (0, None, False, None),
    "model.num_kv_heads": (0, None, False, None),
    "model.head_dim": (0, None, True, None),
    "model.vocab_size": (0, None, True, None),
    "model.rope_theta": (0, None, False, None),
    "model.max_position_embeddings": (0, None, False, None),
    "model.scan_unroll": (0, None, True, None),  # 0: every layer
    "model.sliding_window": (0, None, False, None),
    "model.sliding_window_pattern": (0, None, True, None),  # 0: the family's
    "model.lora.rank": (0, None, True, None),  # 0: no adapters
    "model.moe.num_experts": (0, None, True, None),  # 0: the dense MLP
    "model.moe.num_experts_per_tok": (0, None, False, None),
    "model.moe.intermediate_size": (0, None, False, None),
    "model.moe.capacity_factor": (0, None, True, None),  # 0: dropless
    "model.lora.alpha": (0, None, False, None),
}
