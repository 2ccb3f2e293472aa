"""GPT-OSS against transformers' `GptOssForCausalLM` on the same tiny random weights.

One tiny random model serves the file (built by transformers in f32 with its eager
attention and eager experts, the reference code): hidden 32, 2 layers (a sliding window of
4 tokens, then full attention), 4 query heads over 2 kv heads of 8, 8 experts of width 16,
top 2, and transformers' default RoPE, YaRN 32x over 4,096 positions with `truncate` off.
Every parameter is redrawn (sinks, router and expert biases included) and `swiglu_limit` is
0.5, so both clamps of the experts' SwiGLU bind. Checked: logits on a left-padded batch of
12 tokens (past the window) in both expert forms, each GPT-OSS feature moving them; save ->
transformers load -> the same logits; our sampler's greedy tokens (the decode with sinks
over the sliding layer's ring cache) equal transformers' `generate`, and the routing it
records is what the update's forward replays; the update's forward and gradient with the
experts split over 8 fake devices (and with their width over `tensor`) equal one device's,
and so does the decode on the mesh; the config mapping, the parameter count and the
refused attention.

Tolerance: the logits' scale is ~7; an f32 value here passes through some hundreds of
roundings of relative 6e-8 (two layers: norms, projections over 32 inputs, softmaxes over
at most 13 columns, 2 experts), which puts ours and transformers' ~1e-6 of the scale apart
(measured 8e-7); 1e-5 of the scale is the bound, and each variant below moves the logits
by more than 100 times it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import (
    assert_row_samplers_match_plain,
    hf_logits,
    left_padded_batch,
    noisy_copy,
    redrawn,
    rel_diff,
)
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.models import hf, moe
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.sampling import Sampler, SamplingParams

HF_GPT_OSS = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_local_experts=8,
    num_experts_per_tok=2,
    sliding_window=4,
    max_position_embeddings=256,
    swiglu_limit=0.5,
)
REL_TOL = 1e-5  # max |ours - transformers| / max |logit| (module docstring)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(directory, torch model): the tiny random GPT-OSS saved by transformers."""
    import transformers

    config = transformers.GptOssConfig(
        **HF_GPT_OSS, attn_implementation="eager", experts_implementation="eager"
    )
    model = redrawn(transformers.AutoModelForCausalLM.from_config(config).eval(), 0.3)
    path = tmp_path_factory.mktemp("gpt_oss")
    model.save_pretrained(path)
    return path, model


@pytest.fixture(scope="module")
def model(checkpoint):
    return hf.load(checkpoint[0])


def with_config(model, cfg, **params):
    """The model's weights under another config of the same shapes (every layer reads the
    new one), with `params` ({'attn.sinks': value}) replacing layer parameters."""
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    state = nnx.state(nnx.clone(model))  # new variables: the model's own stay as they are
    for path, value in params.items():
        var = state["layers"]
        for part in path.split("."):
            var = var[part]
        var.set_value(jnp.full_like(var.get_value(), value))
    return nnx.merge(nnx.graphdef(abstract), state)


def test_logit_parity_both_expert_forms_and_round_trip(checkpoint, model, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    path, torch_model = checkpoint
    cfg = model.cfg
    assert (cfg.family, cfg.sliding_layers, cfg.num_experts) == ("gpt_oss", (True, False), 8)
    assert dict(cfg.rope_scaling)["rope_type"] == "yarn" and cfg.swiglu_limit == 0.5
    tokens, mask = left_padded_batch(length=12)  # 12 > window 4; 0 to 6 padding slots
    ref = hf_logits(torch_model, tokens, mask)
    run = lambda m: np.asarray(jax.jit(lambda t, k: m(t, k))(tokens, mask))  # noqa: E731
    for impl in moe.EXPERT_IMPLS:
        diff = rel_diff(run(with_config(model, cfg.replace(moe_impl=impl))), ref, mask)
        print(f"{impl}: max |logit diff| / max |logit| = {diff:.1e}")
        assert diff < REL_TOL, impl

    # each GPT-OSS feature moves the logits: the test is not blind to any of them
    variants = {
        "no window": with_config(model, cfg.replace(sliding_window=64)),
        "no YaRN": with_config(model, cfg.replace(rope_scaling=None)),
        "no clamp": with_config(model, cfg.replace(swiglu_limit=1e9)),
        "no sinks": with_config(model, cfg, **{"attn.sinks": -1e30}),
        "no router bias": with_config(model, cfg, **{"mlp.router_bias": 0.0}),
        "no output bias": with_config(model, cfg, **{"attn.o_bias": 0.0}),
    }
    for name, other in variants.items():
        assert rel_diff(run(other), ref, mask) > 100 * REL_TOL, name

    # our save (sharded) -> transformers loads the same model; our loader reads it back
    hf.save(model, tmp_path, max_shard_size="20KB", base_config=hf.read_config(path))
    weight_map = hf.read_config(tmp_path)  # config.json
    assert weight_map["rope_parameters"]["rope_type"] == "yarn"
    back = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(back).__name__ == "GptOssForCausalLM"
    assert back.config.layer_types == torch_model.config.layer_types
    with torch.no_grad():  # the fused experts written back interleaved, as transformers reads
        for (name, a), (_, b) in zip(torch_model.named_parameters(), back.named_parameters()):
            torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
    assert rel_diff(hf_logits(back, tokens, mask), ref, mask) < REL_TOL
    again = hf.load(tmp_path)
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    # a scratch model's unscaled RoPE is written so that transformers does not take its
    # YaRN default: its export gives our logits there
    plain = variants["no YaRN"]
    hf.save(plain, tmp_path / "plain")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "plain", attn_implementation="eager")
    assert back.config.rope_parameters["rope_type"] == "default"
    ours = run(plain)
    assert rel_diff(hf_logits(back.eval(), tokens, mask), ours, mask) < REL_TOL


PROMPTS = np.random.RandomState(1).randint(1, 128, size=(2, 6)).astype(np.int32)


def test_greedy_decode_equals_transformers_and_its_routing_replays(checkpoint, model):
    """10 greedy tokens after prompts of 6 (the sampler pads them to 8): the decode runs
    sinks over the sliding layer's ring of 4 slots (it wraps 4 times) and the full layer's
    cache. The experts the sampler recorded are the router's own choice in a full forward
    over the rollout (f32), and replaying other experts routes each recorded token there."""
    import torch

    sampler = Sampler(model, pad_id=0, prompt_buckets=(8,), record_routing=True)
    assert sampler.ring_cache
    params = SamplingParams(max_new_tokens=10, greedy=True)
    rollout = sampler.generate(PROMPTS, np.ones_like(PROMPTS), params, jax.random.key(0))
    with torch.no_grad():
        ref = checkpoint[1].generate(
            torch.as_tensor(PROMPTS, dtype=torch.long), max_new_tokens=10, do_sample=False,
            attention_mask=torch.ones(PROMPTS.shape, dtype=torch.long), pad_token_id=0,
        )[:, 6:].numpy()  # fmt: skip
    np.testing.assert_array_equal(np.asarray(rollout.completion_tokens), ref)

    seq = rollout.sequences()
    routing = np.asarray(rollout.routing)  # [B, 8 + 10, L, k], -1 where nothing was fed
    recorded = (routing >= 0).all((-2, -1))
    graphdef, state = nnx.split(model)

    @jax.jit
    def experts_of(params, routing):
        m = nnx.merge(graphdef, params)
        stats = m.hidden_states(seq.tokens, seq.attention_mask, routing=routing, router_stats=True)
        return jnp.moveaxis(stats[2].experts, 0, 2), jnp.moveaxis(stats[2].own, 0, 2)

    own = np.asarray(experts_of(state, None)[0])
    np.testing.assert_array_equal(own[recorded], routing[recorded])
    flipped = np.where(recorded[:, :, None, None], (routing + 1) % 8, -1)
    used, router = map(np.asarray, experts_of(state, flipped))
    np.testing.assert_array_equal(used[recorded], flipped[recorded])  # the replayed experts
    np.testing.assert_array_equal(used[~recorded], router[~recorded])  # no record: its own
    np.testing.assert_array_equal(router[:, :, 0], own[:, :, 0])  # layer 0's input: unmoved


def test_continuous_partial_and_speculative_samplers_give_the_plain_decode(model):
    """Sinks and the sliding window through the samplers that move rows: continuous
    batching, partial and speculative rollouts (a noisy copy of the policy as the draft), both on
    full caches, give the plain sampler's greedy tokens over its ring of 4 slots."""
    assert Sampler(model, pad_id=0).ring_cache
    assert_row_samplers_match_plain(model, noisy_copy(model), PROMPTS)


def _loss(graphdef, tokens, mask):
    """Mean squared logits + the load-balancing loss: a gradient through every parameter
    (the biases and sinks included), the experts and the router."""

    def loss(params):
        m = nnx.merge(graphdef, params)
        hidden, _, stats = m.hidden_states(tokens, mask, router_stats=True)
        return jnp.mean(m.logits(hidden) ** 2) + 0.5 * moe.router_losses(stats)["load_balance"]

    return jax.jit(jax.value_and_grad(loss))


@pytest.mark.parametrize("mesh_shape", [(1, 8, 1), (1, 4, 2)], ids=["fsdp8", "fsdp4_tensor2"])
def test_expert_parallel_update_equals_one_device(model, mesh_shape):
    """The update's form (grouped matmuls) split over 8 fake devices: 1 expert a device, or
    2 experts a device with their width split over `tensor` (the down projection's bias
    then added once, not once per width shard): the loss and every gradient equal one
    device's. On fsdp 8 the greedy decode (the CPU's dense form) equals one device's too."""
    mesh = sharding.make_mesh(mesh_shape)
    ragged = with_config(model, model.cfg.replace(moe_impl="ragged"))
    graphdef, state = nnx.split(ragged)
    tokens, mask = map(jnp.asarray, left_padded_batch(batch=8, length=8))
    loss1, grads1 = _loss(graphdef, tokens, mask)(state)
    placed = jax.device_put(state, sharding.state_shardings(state, mesh))
    experts = placed["layers"]["mlp"]["expert_down_bias"].get_value()
    assert experts.sharding.spec[1] == "fsdp"  # [L, E, D]: the experts split
    if mesh_shape[2] > 1:
        assert placed["layers"]["mlp"]["expert_gate_bias"].get_value().sharding.spec[2] == "tensor"
    loss8, grads8 = _loss(graphdef, *sharding.shard_batch((tokens, mask), mesh))(placed)
    # f32 sums in another order (psums over the devices): a few ulps of O(1) values
    np.testing.assert_allclose(loss8, loss1, rtol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads1), jax.tree.leaves(grads8)):
        name = jax.tree_util.keystr(path)
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6, rtol=1e-5, err_msg=name)
        assert np.abs(np.asarray(a)).max() > 0, name  # every parameter gets a gradient
    if mesh_shape[2] > 1:
        return
    # the decode on the mesh (fsdp: the layers scanned over stacked full caches, no rings)
    params = SamplingParams(max_new_tokens=6, greedy=True)
    prompts = np.asarray(tokens), np.asarray(mask)
    one = Sampler(model, pad_id=0, prompt_buckets=(8,)).generate(
        *prompts, params, jax.random.key(0)
    )
    spread = Sampler(
        nnx.merge(nnx.graphdef(model), placed), pad_id=0, mesh=mesh, prompt_buckets=(8,)
    )
    assert not spread.ring_cache
    eight = spread.generate(*prompts, params, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(eight.completion_tokens), one.completion_tokens)
    np.testing.assert_allclose(np.asarray(eight.policy_logp), one.policy_logp, atol=1e-5)


def test_config_mapping_parameter_count_and_refused_attention(checkpoint, model):
    torch_model = checkpoint[1]
    cfg = model.cfg
    assert hf.config_from_hf(hf.config_to_hf(cfg)) == cfg
    n = sum(p.numel() for p in torch_model.parameters())
    assert hf.count_params(model) == cfg.num_params() == n
    # keys a config.json omits take transformers' GptOssConfig defaults
    shapes = {k: v for k, v in HF_GPT_OSS.items() if k not in ("sliding_window", "swiglu_limit")}
    bare = hf.config_from_hf({**shapes, "architectures": ["GptOssForCausalLM"]})
    assert (bare.sliding_window, bare.swiglu_limit, bare.rope_theta) == (128, 7.0, 150000.0)
    assert dict(bare.rope_scaling)["factor"] == 32.0 and bare.o_bias and bare.attention_sinks
    mxfp4 = {**shapes, "model_type": "gpt_oss", "quantization_config": {"quant_method": "mxfp4"}}
    with pytest.raises(ValueError, match="quantization_config.*'mxfp4'.*dequantize"):
        hf.config_from_hf(mxfp4)  # OpenAI's release: experts in MXFP4 blocks
    # jax.nn.dot_product_attention cannot take the sinks: refused, naming the key
    for impl in ("dot_product", "cudnn"):
        with pytest.raises(ConfigError, match="model.attention.*sinks"):
            cfg.replace(attention=impl)
    assert cfg.replace(attention="ring").attention == "ring"
