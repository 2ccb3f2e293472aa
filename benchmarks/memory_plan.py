r"""Memory plans of two frontier MoE shapes from formulas, nothing built or compiled:
DeepSeek-V3 (671B, multi-head latent attention) and Qwen3.5-397B-A17B (3 of every 4 layers
Gated DeltaNet). docs/scaling.md, "Frontier MoE shapes", holds the tables.

    python benchmarks/bench.py plan                            # artifacts/plan.json
    python benchmarks/bench.py plan --tokens 4096,131072

Per shape: P and the parameters a token activates; the bytes of the state per device on the
layouts docs/scaling.md uses (a TPU v5e-8, an 8 x H100 node, a TPU v5p-64 of 32 chips: fsdp
over all of them) for a full fine-tune (f32 parameters + Adam, 16 P / S), a LoRA base (4 P / S) and
the sampler's bf16 weights (2 P / S); and the decode cache of one row, bf16, against a
Llama-shaped cache of the same depth (every layer a plain per-head K and V cache).

    DeepSeek-V3 ("DeepSeek-V3 Technical Report", arXiv 2412.19437 sec. 2.1.1): a token
      caches its normed kv latent [kv_lora_rank] and its rope key [qk_rope_head_dim] per
      layer: (512 + 64) x 2 bytes x 61 layers = 70,272 bytes; Llama-shaped: per head a key
      of nope + rope and a value of v_head_dim, 128 x (192 + 128) x 2 x 61 = 4,997,120.
    Qwen3.5 (Gated DeltaNet: "Gated Delta Networks: Improving Mamba2 with Delta Rule", Yang
      et al. 2024): a DeltaNet layer's state is fixed whatever the row's length, the causal
      conv's last (kernel - 1) inputs [kernel - 1, 2 key_dim + value_dim] (transformers
      keeps kernel columns) plus the delta-rule matrix per value head [key_dim_head x
      value_dim_head]; a full-attention layer caches K and V of its kv heads. Row of T
      tokens: L_delta x state + T x L_full x 2 x kv_heads x head_dim x 2 bytes; Llama-shaped:
      the full layers' K and V in all L layers.

The shapes: DeepSeek-V3 is transformers' `DeepseekV3Config()` defaults (its config.json);
Qwen3.5-397B-A17B is its model card's architecture table (hidden 4,096, 60 layers laid out
15 x (3 Gated DeltaNet + 1 full attention), 512 experts of width 1,024, 10 routed + 1
shared, 32 query / 2 kv heads of 256, linear attention 16 qk / 64 v heads of 128, vocabulary
248,320) with transformers' Qwen3.5-MoE defaults where the card is silent (conv kernel 4,
shared expert width = expert width, the gated q projection, untied embeddings); the
multi-token-prediction layers and Qwen3.5's vision tower are left out of P, and DeepSeek-V3's
MTP module, which the speculative sampler can draft with, is counted on its own
(`mtp_module`).
"""

from __future__ import annotations

import argparse
import math

DEEPSEEK_V3 = dict(  # transformers.DeepseekV3Config() = deepseek-ai/DeepSeek-V3's config.json
    vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
    num_layers=61, dense_layers=3, num_heads=128, q_lora_rank=1536, kv_lora_rank=512,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, routed_experts=256,
    shared_experts=1, experts_per_tok=8,
)  # fmt: skip
QWEN3_5_397B = dict(  # Qwen/Qwen3.5-397B-A17B's model card (module docstring)
    vocab_size=248320, hidden_size=4096, num_layers=60, full_attention_interval=4,
    num_heads=32, num_kv_heads=2, head_dim=256, linear_num_key_heads=16,
    linear_num_value_heads=64, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, num_experts=512, experts_per_tok=10, moe_intermediate_size=1024,
    shared_expert_intermediate_size=1024,
)  # fmt: skip
# the layouts of docs/scaling.md, "Choosing the layout": (chips, bytes of memory a chip)
LAYOUTS = {"v5e-8": (8, 16e9), "8xH100": (8, 80e9), "v5p-64": (32, 95e9)}
BF16 = 2


def deepseek_v3_params(s: dict = DEEPSEEK_V3) -> tuple[int, int]:
    """(P, the parameters one token activates). A layer: latent attention (q_a [D, rq] and
    its norm, q_b [rq, H (nope + rope)], kv_a [D, r + rope] and its norm, kv_b [r, H (nope +
    v)], o [H v, D]) and two norms; the first `dense_layers` a SwiGLU of 3 D F, the others a
    router [D, E] and its balancing bias [E], E experts and the shared ones of 3 D F_e each
    (k of the E active); untied embedding and head 2 V D, a final norm D."""
    d, h, rq, r = s["hidden_size"], s["num_heads"], s["q_lora_rank"], s["kv_lora_rank"]
    nope, rope, v = s["qk_nope_head_dim"], s["qk_rope_head_dim"], s["v_head_dim"]
    attn = d * rq + rq + rq * h * (nope + rope) + d * (r + rope) + r + r * h * (nope + v)
    attn += h * v * d + 2 * d  # o_proj; the two norms
    expert, e = 3 * d * s["moe_intermediate_size"], s["routed_experts"]
    dense = 3 * d * s["intermediate_size"]
    router = d * e + e
    moe_layers, dense_layers = s["num_layers"] - s["dense_layers"], s["dense_layers"]
    rest = 2 * s["vocab_size"] * d + d + dense_layers * (attn + dense)
    total = rest + moe_layers * (attn + router + (e + s["shared_experts"]) * expert)
    active = rest + moe_layers * (attn + router + (s["experts_per_tok"] + 1) * expert)
    return total, active


def deepseek_v3_mtp_params(s: dict = DEEPSEEK_V3) -> tuple[int, int]:
    """(P, the parameters one token activates) of DeepSeek-V3's multi-token-prediction
    module as the speculative sampler drafts with it (models/multi_token.py): one MoE layer
    as above, its three norms (enorm, hnorm, shared_head.norm) and eh_proj [2 D, D]; the
    embedding and head are the policy's, not counted again."""
    d = s["hidden_size"]
    one_layer = dict(s, num_layers=1, dense_layers=0, vocab_size=0)
    total, active = deepseek_v3_params(one_layer)
    own = 3 * d + 2 * d * d - d  # (the final norm is counted in the one layer's total)
    return total + own, active + own


def qwen3_5_params(s: dict = QWEN3_5_397B) -> tuple[int, int]:
    """(P, the parameters one token activates). A full-attention layer (gated attention):
    q [D, 2 H hd] (queries and their output gate), k, v [D, K hd], o [H hd, D], q and k norms
    [hd]; a Gated DeltaNet layer: in_proj_qkv [D, 2 key_dim + value_dim], in_proj_z [D,
    value_dim], in_proj_b, in_proj_a [D, Hv], the depthwise conv [2 key_dim + value_dim,
    kernel], dt_bias and A_log [Hv], the gated norm [value_dim_head], out_proj [value_dim, D];
    every layer two norms and a router [D, E], E experts and a shared one of 3 D F_e, the
    shared one's gate [D, 1] (k of the E active); untied embedding and head, a final norm."""
    d, hd = s["hidden_size"], s["head_dim"]
    full_layers = s["num_layers"] // s["full_attention_interval"]
    delta_layers = s["num_layers"] - full_layers
    full = d * 2 * s["num_heads"] * hd + 2 * d * s["num_kv_heads"] * hd
    full += s["num_heads"] * hd * d + 2 * hd
    key_dim = s["linear_num_key_heads"] * s["linear_key_head_dim"]
    value_dim = s["linear_num_value_heads"] * s["linear_value_head_dim"]
    conv = 2 * key_dim + value_dim
    hv = s["linear_num_value_heads"]
    delta = d * (conv + value_dim + 2 * hv) + conv * s["linear_conv_kernel_dim"] + 2 * hv
    delta += s["linear_value_head_dim"] + value_dim * d
    e, expert = s["num_experts"], 3 * d * s["moe_intermediate_size"]
    moe = d * e + 3 * d * s["shared_expert_intermediate_size"] + d + 2 * d  # + the norms
    rest = full_layers * full + delta_layers * delta + 2 * s["vocab_size"] * d + d
    total = rest + s["num_layers"] * (moe + e * expert)
    active = rest + s["num_layers"] * (moe + s["experts_per_tok"] * expert)
    return total, active


def deepseek_v3_cache(s: dict = DEEPSEEK_V3) -> dict:
    """Decode-cache bytes (bf16): per token, fixed per row (none), and a Llama-shaped cache
    of the same depth per token (module docstring)."""
    per_token = s["num_layers"] * (s["kv_lora_rank"] + s["qk_rope_head_dim"]) * BF16
    key = s["qk_nope_head_dim"] + s["qk_rope_head_dim"]
    llama = s["num_layers"] * s["num_heads"] * (key + s["v_head_dim"]) * BF16
    return dict(per_token=per_token, per_row=0, llama_per_token=llama)


def qwen3_5_cache(s: dict = QWEN3_5_397B) -> dict:
    """Decode-cache bytes (bf16): per token (the full-attention layers' K and V), fixed per
    row (the DeltaNet layers' conv and delta-rule states) and a Llama-shaped cache of the
    same depth per token (every layer a full-attention one; module docstring)."""
    full_layers = s["num_layers"] // s["full_attention_interval"]
    delta_layers = s["num_layers"] - full_layers
    kv = 2 * s["num_kv_heads"] * s["head_dim"] * BF16  # a layer's K and V of one token
    key_dim = s["linear_num_key_heads"] * s["linear_key_head_dim"]
    value_dim = s["linear_num_value_heads"] * s["linear_value_head_dim"]
    conv = (s["linear_conv_kernel_dim"] - 1) * (2 * key_dim + value_dim)
    delta = s["linear_num_value_heads"] * s["linear_key_head_dim"] * s["linear_value_head_dim"]
    return dict(
        per_token=full_layers * kv,
        per_row=delta_layers * (conv + delta) * BF16,
        conv_state=conv,
        delta_state=delta,
        llama_per_token=s["num_layers"] * kv,
    )


def plan(params: tuple[int, int], cache: dict, tokens: list[int]) -> dict:
    """One shape's plan: P and its active share, the state's bytes per device on each of
    `LAYOUTS` (whether it fits the device), the devices of each kind a full fine-tune's
    state alone needs (ceil(16 P / memory): no activations, gathered layers or cache), and
    one row's decode cache at each length in `tokens` against the Llama-shaped cache
    (bytes, and the ratio)."""
    total, active = params
    out = dict(params=total, active_params=active, layouts={}, full_fine_tune_devices={})
    for name, (devices, memory) in LAYOUTS.items():
        parts = dict(full_fine_tune=16 * total, lora_base=4 * total, bf16_weights=2 * total)
        out["layouts"][name] = {
            k: dict(bytes=v // devices, fits=v / devices <= memory) for k, v in parts.items()
        }
        out["full_fine_tune_devices"][name] = math.ceil(16 * total / memory)
    out["cache"] = dict(cache, rows={})
    for t in tokens:
        row = cache["per_row"] + t * cache["per_token"]
        llama = t * cache["llama_per_token"]
        out["cache"]["rows"][str(t)] = dict(bytes=row, llama_bytes=llama, ratio=llama / row)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tokens",
        default="4096,32768,131072,262144",
        help="comma-separated row lengths (prompt + completion) of the decode cache",
    )


def bench_plan(args) -> dict:
    """Frontier MoE shapes' state and decode cache per device, from formulas (no compile)."""
    tokens = [int(t) for t in args.tokens.split(",")]
    mtp, mtp_active = deepseek_v3_mtp_params()
    v3 = plan(deepseek_v3_params(), deepseek_v3_cache(), tokens)
    v3["mtp_module"] = dict(params=mtp, active_params=mtp_active, bf16_bytes=BF16 * mtp)
    return {
        "deepseek-v3": v3,
        "qwen3.5-397b-a17b": plan(qwen3_5_params(), qwen3_5_cache(), tokens),
    }
