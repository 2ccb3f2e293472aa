"""The builders from a config (run/build.py) whose results need no model: the devices and
meshes of the roles, the tokenizer a config picks, the model config a `model` section
spells, the objective section, the schedule's horizon and the resume check on it."""

import jax
import pytest

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.models.tokenizer import CharTokenizer
from jaxrl_frontier.run import build
from jaxrl_frontier.run.config import base_config, resolve


def _config(**sections):
    """base_config() resolved, with {section: {key: value}} set."""
    c = resolve(base_config())
    for section, values in sections.items():
        c[section].update(values)
    return c


def _shape(mesh) -> dict[str, int]:
    return dict(mesh.shape)


def test_role_devices_split_the_last_rollout_devices_off():
    devices = jax.devices()  # 8 fake CPU devices, one process
    assert build.role_devices(_config()) == (devices, [])
    assert build.role_devices(_config(mesh=dict(num_devices=4))) == (devices[:4], [])
    train, rollout = build.role_devices(_config(rollout=dict(devices=2)))
    assert (train, rollout) == (devices[:6], devices[6:])
    # the first 4 devices only, then the last 3 of them to rollouts
    train, rollout = build.role_devices(_config(mesh=dict(num_devices=4), rollout=dict(devices=3)))
    assert (train, rollout) == (devices[:1], devices[1:4])


def test_one_mesh_serves_both_roles_without_rollout_devices():
    c = _config(mesh=dict(data=2, fsdp=-1, tensor=2))
    train, rollout = build.build_meshes(c)
    assert _shape(train) == dict(data=2, fsdp=2, sequence=1, tensor=2)
    assert rollout is train
    assert build.build_mesh(c).devices.tolist() == train.devices.tolist()


def test_a_sequence_axis_is_folded_into_fsdp_on_the_rollout_mesh():
    """mesh.sequence = 2 over 8 devices: the update's mesh (2, 2, 2, 1); the rollouts' has
    no sequence axis, its fsdp axis 2 x 2 = 4 over the same devices in the same order."""
    c = _config(mesh=dict(data=2, fsdp=2, sequence=2))
    train, rollout = build.build_meshes(c)
    assert _shape(train) == dict(data=2, fsdp=2, sequence=2, tensor=1)
    assert _shape(rollout) == dict(data=2, fsdp=4, sequence=1, tensor=1)
    assert rollout.devices.reshape(-1).tolist() == train.devices.reshape(-1).tolist()
    # fsdp index f * 2 + s of the rollout mesh is the training mesh's (f, s)
    assert rollout.devices[1, 3, 0, 0] == train.devices[1, 1, 1, 0]


def test_rollout_devices_get_a_mesh_of_their_own():
    c = _config(mesh=dict(data=-1), rollout=dict(devices=4, mesh=dict(data=1, fsdp=2, tensor=2)))
    train, rollout = build.build_meshes(c)
    devices = jax.devices()
    assert _shape(train) == dict(data=4, fsdp=1, sequence=1, tensor=1)
    assert train.devices.reshape(-1).tolist() == devices[:4]
    assert _shape(rollout) == dict(data=1, fsdp=2, sequence=1, tensor=2)
    assert rollout.devices.reshape(-1).tolist() == devices[4:]


def test_the_tokenizer_comes_from_its_path_the_models_export_or_the_characters(tmp_path):
    assert isinstance(build.build_tokenizer(_config()), CharTokenizer)
    assert build.build_tokenizer(_config()).vocab_size == CharTokenizer().vocab_size
    saved = tmp_path / "tok"
    CharTokenizer("abc").save(str(saved))
    small = CharTokenizer("abc").vocab_size
    assert small < CharTokenizer().vocab_size
    got = build.build_tokenizer(_config(tokenizer=dict(path=str(saved))))
    assert got.vocab_size == small and got.encode("cab") == CharTokenizer("abc").encode("cab")
    # a workdir of ours: the tokenizer of its export/
    workdir = tmp_path / "run"
    CharTokenizer("xy").save(str(workdir / "export"))
    got = build.build_tokenizer(_config(model=dict(path=str(workdir))))
    assert got.vocab_size == CharTokenizer("xy").vocab_size
    # a path with no saved tokenizer: the characters
    empty = tmp_path / "empty"
    empty.mkdir()
    got = build.build_tokenizer(_config(tokenizer=dict(path=str(empty))))
    assert got.vocab_size == CharTokenizer().vocab_size


def test_export_dir_is_a_workdirs_export_or_the_path_itself(tmp_path):
    assert build.export_dir("") == ""
    assert build.export_dir(str(tmp_path)) == str(tmp_path)
    (tmp_path / "export").mkdir()
    assert build.export_dir(str(tmp_path)) == str(tmp_path / "export")
    assert build.export_dir(str(tmp_path / "nope")) == str(tmp_path / "nope")


@pytest.mark.parametrize(
    "model, family",
    [
        (dict(), "llama"),
        (dict(qkv_bias=True), "qwen2"),
        (dict(qk_norm=True), "qwen3"),
        (dict(moe=dict(num_experts=4, num_experts_per_tok=2, intermediate_size=16)), "qwen3_moe"),
    ],
)
def test_the_model_section_spells_the_model_config(model, family):
    c = _config(model=dict(hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2))
    for key, value in model.items():
        if isinstance(value, dict):
            c.model[key].update(value)
        else:
            c.model[key] = value
    tok = CharTokenizer()
    cfg = build.model_config_from(c, tok)
    assert cfg.family == family
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads) == (
        32, 64, 4, 2,
    )  # fmt: skip
    assert cfg.vocab_size == tok.vocab_size  # model.vocab_size 0: the tokenizer's
    experts = c.model.moe.num_experts
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (
        (4, 2, 16) if experts else (0, 0, 0)
    )
    c.model.vocab_size = 512  # a padded vocabulary
    assert build.model_config_from(c, tok).vocab_size == 512


def test_a_scratch_gpt_oss_through_its_architecture_mapping():
    """`model.family = 'gpt_oss'`: the GPT-OSS fields, its layers alternating (or every
    sliding_window_pattern-th full), the experts from `model.moe`, RoPE unscaled; its
    config.json maps back to the same config. Without experts: a ConfigError at validation."""
    from conftest import config_error

    from jaxrl_frontier.models import hf

    moe = dict(num_experts=4, num_experts_per_tok=2, intermediate_size=16, impl="ragged")
    model = dict(family="gpt_oss", hidden_size=32, num_heads=4, num_kv_heads=2, num_layers=4)
    c = _config(model=dict(model, sliding_window=8, rope_theta=5e4))
    c.model.moe.update(moe)
    cfg = build.model_config_from(c, CharTokenizer())
    assert (cfg.family, cfg.num_experts, cfg.num_experts_per_tok) == ("gpt_oss", 4, 2)
    assert (cfg.moe_intermediate_size, cfg.moe_impl, cfg.norm_topk_prob) == (16, "ragged", True)
    assert cfg.attention_sinks and cfg.expert_bias and cfg.qkv_bias and cfg.o_bias
    assert (cfg.swiglu_limit, cfg.sliding_window, cfg.rope_theta) == (7.0, 8, 5e4)
    assert cfg.rope_scaling is None and cfg.sliding_layers == (True, False, True, False)
    back = hf.config_from_hf(hf.config_to_hf(cfg))  # the training choices are not HF keys
    assert back == cfg.replace(moe_impl="auto", remat=False)
    c.model.sliding_window_pattern = 4
    assert build.model_config_from(c, CharTokenizer()).sliding_layers == (True,) * 3 + (False,)
    c.model.moe.num_experts = 0
    assert "'model.family' = 'gpt_oss'" in config_error(c)


def test_a_scratch_deepseek_v3_in_its_proportions():
    """`model.family = 'deepseek_v3'`: latent attention of the score width h = head_dim 48
    (rope 16, nope = values 32, kv latent 128), a dense first layer, 8 experts in 4 groups
    with 2 kept, one shared expert, a sigmoid router; its config.json maps back. ConfigErrors
    at validation: no experts, one layer, a bias rate on a family without a bias."""
    from conftest import config_error

    from jaxrl_frontier.models import hf

    model = dict(family="deepseek_v3", hidden_size=64, num_heads=4, num_layers=3, head_dim=48)
    c = _config(model=model)
    c.model.moe.update(num_experts=8, num_experts_per_tok=2, intermediate_size=16)
    cfg = build.model_config_from(c, CharTokenizer())
    assert (cfg.family, cfg.num_kv_heads, cfg.resolved_head_dim) == ("deepseek_v3", 4, 48)
    assert (cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim) == (16, 32, 32)
    assert (cfg.kv_lora_rank, cfg.q_lora_rank, cfg.first_k_dense_replace) == (128, 0, 1)
    assert (cfg.router_scoring, cfg.n_group, cfg.topk_group) == ("sigmoid", 4, 2)
    assert (cfg.shared_expert_intermediate_size, cfg.shared_expert_gated) == (16, False)
    assert cfg.routed_scaling_factor == 2.5 and cfg.rope_interleave
    back = hf.config_from_hf(hf.config_to_hf(cfg))  # the training choices are not HF keys
    assert back == cfg.replace(remat=False)
    c.model.moe.num_experts = 4  # fewer than 8 experts: no groups
    assert build.model_config_from(c, CharTokenizer()).n_group == 1
    c.model.num_layers = 1
    assert "'model.family' = 'deepseek_v3' has a dense first layer" in config_error(c)
    c.model.moe.num_experts = 0
    assert "'model.family' = 'deepseek_v3' is a mixture of experts" in config_error(c)
    c = _config(model=dict(family="gpt_oss", num_layers=2))
    c.model.moe.update(num_experts=4, bias_update_rate=0.01)
    assert "'model.moe.bias_update_rate' = 0.01" in config_error(c)


def test_a_scratch_qwen3_5_dense_and_moe():
    """`model.family = 'qwen3_5'`: every sliding_window_pattern-th layer full attention (0:
    every 4th), linear layers of num_kv_heads key / num_heads value heads of head_dim, a
    quarter of a head rotated; with experts the MoE with a gated shared expert of an
    expert's width; both map back from their config.json and build a HybridTransformer."""
    from jaxrl_frontier.models import hf
    from jaxrl_frontier.models.hybrid import model_class

    model = dict(family="qwen3_5", hidden_size=32, num_heads=4, num_kv_heads=2, num_layers=4)
    c = _config(model=dict(model, head_dim=8))
    cfg = build.model_config_from(c, CharTokenizer())
    assert cfg.family == "qwen3_5_text" and model_class(cfg).__name__ == "HybridTransformer"
    assert cfg.linear_layers == (True, True, True, False) and cfg.rope_dim == 2
    assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads) == (2, 4)
    assert (cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.num_experts) == (8, 8, 0)
    assert hf.config_from_hf(hf.config_to_hf(cfg)) == cfg.replace(remat=False)
    c.model.sliding_window_pattern = 2
    c.model.moe.update(num_experts=4, num_experts_per_tok=2, intermediate_size=16)
    cfg = build.model_config_from(c, CharTokenizer())
    assert cfg.family == "qwen3_5_moe_text" and cfg.linear_layers == (True, False) * 2
    assert (cfg.num_experts, cfg.moe_intermediate_size) == (4, 16)
    assert (cfg.shared_expert_intermediate_size, cfg.shared_expert_gated) == (16, True)
    assert hf.config_from_hf(hf.config_to_hf(cfg)) == cfg.replace(remat=False)


def test_total_updates_is_the_schedules_horizon():
    rl = _config(train=dict(steps=10, epochs=2, minibatches=3))
    assert build.total_updates(rl) == 10 * 2 * 3
    sft = _config(train=dict(steps=10, epochs=2, minibatches=3))
    sft.mode = "sft"
    assert build.total_updates(sft) == 10


def test_a_resume_with_another_schedule_names_the_keys():
    saved = _config(train=dict(steps=10)).to_dict()
    build.check_resume_schedule(saved, _config(train=dict(steps=10)))  # the same: accepted
    build.check_resume_schedule({}, _config(optimizer=dict(lr=1.0)))  # nothing saved
    with pytest.raises(ConfigError, match=r"optimizer\.lr, optimizer\.warmup_steps changed"):
        build.check_resume_schedule(saved, _config(optimizer=dict(lr=1.0, warmup_steps=3)))
    # a constant schedule has no horizon: more steps are fine; a decay's horizon moves
    assert saved["optimizer"]["schedule"] == "constant"
    build.check_resume_schedule(saved, _config(train=dict(steps=20)))
    cosine = _config(train=dict(steps=10), optimizer=dict(schedule="cosine"))
    longer = _config(train=dict(steps=20), optimizer=dict(schedule="cosine"))
    with pytest.raises(ConfigError, match=r"\(10 -> 20 optimizer steps, the decay's horizon\)"):
        build.check_resume_schedule(cosine.to_dict(), longer)


def test_a_checkpoints_run_choices_reach_its_layers(tmp_path):
    """`model.init = 'hf'`: the config's training choices (here the MoE implementation and
    remat) are those of every layer, not only of the top module."""
    from conftest import random_model

    from jaxrl_frontier.models import hf
    from jaxrl_frontier.models.model_config import ModelConfig

    cfg = ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                      num_heads=2, num_kv_heads=1, family="qwen3_moe", qk_norm=True, num_experts=2,
                      num_experts_per_tok=1, moe_intermediate_size=4)  # fmt: skip
    hf.save(random_model(cfg), tmp_path)
    c = _config(model=dict(init="hf", path=str(tmp_path), remat="full"))
    c.model.moe.impl = "ragged"
    model = build.build_model("hf", str(tmp_path), c, CharTokenizer(), None, None, "float32")
    assert (model.cfg.remat, model.layers.mlp.cfg.moe_impl) == ("full", "ragged")
    assert model.layers.attn.cfg.remat == "full"


def test_an_mtp_draft_is_read_from_the_policys_checkpoint():
    """`rollout.speculative.draft = 'mtp'` with a policy not from a checkpoint is a config
    error naming the keys; any other draft loads no module."""
    from conftest import get_config

    from jaxrl_frontier.run.build import build_mtp_draft

    c = get_config("grpo_deepseek_v3_arith", {"rollout.speculative.draft": "mtp"})
    with pytest.raises(
        ConfigError,
        match=r"'rollout.speculative.draft' = 'mtp' .* model.init = 'hf' \(got 'scratch'\)",
    ):
        build_mtp_draft(c, None)
    c.rollout.speculative.draft = 2
    assert build_mtp_draft(c, None) is None
