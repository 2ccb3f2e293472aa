"""benchmarks/memory.py through the dispatcher: the Learner's update compiled on 2 fake
devices for the tiny model, its per-device bytes against the hand count."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# random_qwen2:tiny's shape as a tied Llama: V 512, D 256, F 768, 4 layers, 8 / 2 heads of 32
V, D, F, L, HEAD, KV = 512, 256, 768, 4, 32, 2
LAYER = D * D * 2 + 2 * D * KV * HEAD + 3 * D * F + 2 * D  # q, o; k, v; the MLP; two norms
PARAMS = V * D + L * LAYER + D  # tied embedding, the layers, the final norm
NORMS = (2 * L + 1) * D  # 1-D weights: replicated, every other weight split over fsdp


def test_update_bytes_per_device_by_hand(tmp_path):
    out = tmp_path / "memory.json"
    cmd = [sys.executable, "benchmarks/bench.py", "memory", "--model", "tiny", "--devices", "2",
           "--rows", "4", "--seq", "16", "--prompt-len", "8", "--group-size", "2",
           "--no-compare", "--out", str(out)]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    result = json.loads(out.read_text())
    row = result["fsdp_2"]
    assert result["benchmark"] == "memory" and result["devices"] == 2
    assert row["params"] == PARAMS == 3_148_032 and row["mesh"] == dict(
        data=1, fsdp=2, sequence=1, tensor=1
    )
    # f32 parameters: half of each split weight, every norm whole
    assert row["params_bytes"] == 4 * (PARAMS - NORMS) // 2 + 4 * NORMS
    # AdamW's two moments placed like the parameters, plus two int32 step counts
    assert row["opt_state_bytes"] == 2 * row["params_bytes"] + 8
    update = row["programs"]["update"]
    state = row["total_bytes"] + 16  # + step, the rng key (2 x uint32), skipped
    # the arguments: the state and this device's 2 rows x 16 of the five update fields
    assert update["arguments"] == state + 2 * 16 * 4 * 5
    assert update["aliased"] == state  # the whole state donated
    assert update["peak"] == (
        update["arguments"] + update["temporaries"] + update["outputs"] - update["aliased"]
    )
    assert row["estimate"]["params"] == 4 * PARAMS // 2  # the arithmetic splits the norms too
    assert "1_device" not in result


def test_frontier_moe_plans_by_hand():
    """benchmarks/memory_plan.py against the counts by hand (docs/scaling.md, "Frontier MoE
    shapes"), and DeepSeek-V3's P against `ModelConfig.num_params` of the same config."""
    from flax import nnx

    from benchmarks import memory_plan as mp
    from jaxrl_frontier.models import hf
    from jaxrl_frontier.models.multi_token import MultiTokenPredictor

    # DeepSeek-V3: MLA 11,010,048 + 1,536 + 37,748,736 (q) + 4,128,768 + 512 + 16,777,216
    # (kv) + 117,440,512 (o) + 14,336 (norms) = 187,121,664 a layer; 3 dense MLPs of
    # 396,361,728; 58 MoE MLPs of 1,835,008 + 256 (router, bias) + 257 x 44,040,192
    # (experts, shared); embedding and head 2 x 129,280 x 7,168; the final norm 7,168
    attn, expert, router = 187_121_664, 44_040_192, 1_835_264
    rest = 2 * 129_280 * 7_168 + 7_168 + 3 * (attn + 396_361_728)
    total, active = mp.deepseek_v3_params()
    assert total == rest + 58 * (attn + router + 257 * expert) == 671_026_419_200
    assert active == rest + 58 * (attn + router + 9 * expert) == 37_552_297_472
    hf_config = dict(  # DeepSeek-V3's config.json, its keys for these shapes
        architectures=["DeepseekV3ForCausalLM"], vocab_size=129280, hidden_size=7168,
        intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61,
        first_k_dense_replace=3, num_attention_heads=128, q_lora_rank=1536, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256,
        n_shared_experts=1, num_experts_per_tok=8,
    )  # fmt: skip
    cfg = hf.config_from_hf(hf_config)
    assert cfg.num_params() == total
    # its MTP module: one MoE layer, enorm, hnorm, shared_head.norm and eh_proj [2 D, D],
    # against the module's own parameters at this shape (abstract: nothing allocated)
    mtp, _ = mp.deepseek_v3_mtp_params()
    assert mtp == attn + router + 257 * expert + 3 * 7_168 + 2 * 7_168**2 == 11_610_068_224
    module = nnx.eval_shape(lambda: MultiTokenPredictor(cfg, rngs=nnx.Rngs(0)))
    assert hf.count_params(module) == mtp
    cache = mp.deepseek_v3_cache()  # (512 + 64) x 2 x 61; 128 x (192 + 128) x 2 x 61
    assert (cache["per_token"], cache["llama_per_token"]) == (70_272, 4_997_120)

    # Qwen3.5-397B-A17B: 15 gated-attention layers of 4,096 x (16,384 + 512 + 512 + 8,192)
    # + 512; 45 DeltaNet layers of 4,096 x (12,288 + 8,192 + 128 + 8,192) + 12,288 x 4 + 128
    # + 128; 60 x (router 4,096 x 512, shared expert 3 x 4,096 x 1,024 and its gate 4,096,
    # norms 8,192); 512 experts (10 active) of 3 x 4,096 x 1,024; 2 x 248,320 x 4,096 + 4,096
    full, delta = 104_858_112, 118_014_208
    layer = 2_097_152 + 12_582_912 + 4_096 + 8_192
    rest = 15 * full + 45 * delta + 60 * layer + 2 * 248_320 * 4_096 + 4_096
    total, active = mp.qwen3_5_params()
    assert total == rest + 60 * 512 * 12_582_912 == 396_346_350_336
    assert active == rest + 60 * 10 * 12_582_912 == 17_349_040_896
    cache = mp.qwen3_5_cache()
    # conv (4 - 1) x (2 x 2,048 + 8,192); delta rule 64 heads x 128 x 128; 45 layers, bf16
    assert (cache["conv_state"], cache["delta_state"]) == (36_864, 1_048_576)
    assert cache["per_row"] == 45 * (36_864 + 1_048_576) * 2 == 97_689_600
    assert (cache["per_token"], cache["llama_per_token"]) == (15 * 2_048, 60 * 2_048)
    row = mp.plan((total, active), cache, [262_144])
    assert row["cache"]["rows"]["262144"]["bytes"] == 97_689_600 + 262_144 * 30_720
    v5p = row["layouts"]["v5p-64"]  # 32 chips: 16 P / 32 = 198 GB, past a chip's 95 GB
    assert v5p["full_fine_tune"] == dict(bytes=16 * total // 32, fits=False)
    assert v5p["lora_base"] == dict(bytes=4 * total // 32, fits=True)  # 49.5 GB
    assert row["full_fine_tune_devices"] == {"v5e-8": 397, "8xH100": 80, "v5p-64": 67}
