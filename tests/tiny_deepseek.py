"""The tiny random DeepSeek-V3 of the tests: its transformers config (hidden 32, 3 layers,
the first dense, 4 heads of latent attention, 8 routed experts in 4 groups, a shared
expert; tests/models/test_deepseek_v3.py describes it whole), the same shape as our
`ModelConfig`, and the redraw of a transformers model's weights that makes every parameter
move the logits."""

from jaxrl_frontier.models.architectures import config_from_hf

HF_DEEPSEEK = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=48,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=8,
    kv_lora_rank=16,
    q_lora_rank=24,
    qk_rope_head_dim=8,
    v_head_dim=12,
    qk_nope_head_dim=8,
    n_group=4,
    topk_group=2,
    num_experts_per_tok=2,
    first_k_dense_replace=1,
    routed_scaling_factor=2.5,
    max_position_embeddings=2560,  # 40x the original 64 (YaRN)
    eos_token_id=None,  # generate's 10 tokens all count (the default eos is token 1)
    rope_parameters=dict(
        rope_type="yarn",
        rope_theta=10000.0,
        factor=40.0,
        beta_fast=32,
        beta_slow=1,
        mscale=1.0,
        mscale_all_dim=1.0,
        original_max_position_embeddings=64,
    ),  # fmt: skip
)
CFG = config_from_hf(
    {**HF_DEEPSEEK, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
)


def redrawn(model):
    """A transformers model with every parameter redrawn (from torch's global generator),
    so each one moves the logits."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if "norm" in name else 0.3 * p.normal_())
        for layer in model.model.layers:  # the balancing bias: a buffer, not a parameter
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.3)
    return model


def hf_model(seed: int, **overrides):
    """A transformers `DeepseekV3ForCausalLM` of `HF_DEEPSEEK` (and `overrides`) in f32 with
    eager attention and experts, drawn after torch seed `seed` (`redrawn`)."""
    import torch
    import transformers

    config = transformers.DeepseekV3Config(
        **{**HF_DEEPSEEK, **overrides},
        attn_implementation="eager",
        experts_implementation="eager",
    )
    torch.manual_seed(seed)
    return redrawn(transformers.AutoModelForCausalLM.from_config(config).eval())
