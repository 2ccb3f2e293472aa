"""Qwen3.5 (models/hybrid.py, models/qwen3_5.py) against transformers' `Qwen3_5ForCausalLM`
and `Qwen3_5MoeForCausalLM` on the same tiny random weights.

One tiny random model per variant (built by transformers in f32, eager attention, every
parameter redrawn by `conftest.redrawn`): hidden 32, 3 layers (linear, full, linear),
4 query / 2 kv heads of 16 (a quarter rotated), linear attention with 2 key heads of 8 and 4
value heads of 8, a 4-tap conv; dense: MLP 48; MoE: 4 experts of 16, top 2, a gated shared
expert of 24. Checked: the logits on a left-padded batch; save -> transformers load -> the
same tensors and logits, and our loader reads them back; our `Sampler`'s greedy tokens
equal transformers' `generate`, its log-probs the full forward's, and a linear layer's cache
does not grow with the completion; the gradient of a log-prob loss equals transformers'
autograd; a hub-style multimodal directory loads; a packed row gives each sequence's logits
alone; the gradient with each layer rematerialized; LoRA on each layer kind and its
merged export; the refusal of a sequence axis.

Tolerance: the logits' scale is O(1-10); an f32 value passes through some hundreds of
roundings (norms, projections over at most 64 inputs, a delta rule summed in chunks by us
and by transformers in another order), which puts ours and transformers' ~1e-6 of the
scale apart: 1e-5 of the scale is the bound.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import (
    assert_save_round_trip,
    hf_logits,
    left_padded_batch,
    randomize_adapters,
    redrawn,
    rel_diff,
)
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.models import hf, moe
from jaxrl_frontier.models.hybrid import HybridTransformer
from jaxrl_frontier.models.model_forms import reconfigured
from jaxrl_frontier.sampling import Sampler, SamplingParams

HF_QWEN3_5 = dict(
    vocab_size=128,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    eos_token_id=None,  # generate's tokens all count
)
VARIANTS = {
    "dense": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(intermediate_size=48)),
    "moe": (
        "Qwen3_5MoeTextConfig",
        "Qwen3_5MoeForCausalLM",
        dict(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=24,
        ),
    ),  # fmt: skip
}
REL_TOL = 1e-5  # max |ours - transformers| / max |logit| (module docstring)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def checkpoint(request, tmp_path_factory):
    """(variant, directory, torch model, our model, our jitted forward): the tiny random
    Qwen3.5 saved by transformers and loaded by `hf.load`; the forward is shared by the
    tests (one compile per input shape)."""
    import transformers

    config_cls, model_cls, extra = VARIANTS[request.param]
    config = getattr(transformers, config_cls)(**HF_QWEN3_5, **extra)
    config._attn_implementation = "eager"
    model = redrawn(getattr(transformers, model_cls)(config).eval(), 0.1)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    ours = hf.load(path)
    graphdef, state = nnx.split(ours)
    forward = jax.jit(lambda state, t, m: nnx.merge(graphdef, state)(t, m))
    return request.param, path, model, ours, lambda t, m: np.asarray(forward(state, t, m))


def test_logit_parity_and_round_trip(checkpoint, tmp_path):

    variant, path, torch_model, model, forward = checkpoint
    cfg = model.cfg
    assert isinstance(model, HybridTransformer)
    assert cfg.family == {"dense": "qwen3_5_text", "moe": "qwen3_5_moe_text"}[variant]
    assert cfg.linear_layers == (True, False, True) and cfg.rope_dim == 4
    assert cfg.num_experts == (4 if variant == "moe" else 0)
    tokens, mask = left_padded_batch(batch=2, length=18)  # the decode test's shape
    ref = hf_logits(torch_model, tokens, mask)
    diff = rel_diff(forward(tokens, mask), ref, mask)
    print(f"{variant}: max |logit diff| / max |logit| = {diff:.1e}")
    assert diff < REL_TOL

    assert_save_round_trip(model, torch_model, tmp_path, tokens, mask, REL_TOL)


PROMPTS = np.random.RandomState(1).randint(1, 128, size=(2, 6)).astype(np.int32)


def test_greedy_decode_equals_transformers(checkpoint):
    """10 greedy tokens after prompts of 6 (the sampler left-pads them to 8): the prefill
    runs the delta rule chunk-parallel, each decode step token by token from the cache's
    conv and delta states."""
    import torch

    variant, _, torch_model, model, forward = checkpoint
    if variant != "dense":  # the MoE's decode is this code with the MoE's MLP: its compile
        pytest.skip("is left out to keep the file fast (the MoE logits are checked above)")
    sampler = Sampler(model, pad_id=0, prompt_buckets=(8,), decode_phases=1)
    params = SamplingParams(max_new_tokens=10, greedy=True)
    rollout = sampler.generate(PROMPTS, np.ones_like(PROMPTS), params, jax.random.key(0))
    with torch.no_grad():
        ref = torch_model.generate(
            torch.as_tensor(PROMPTS, dtype=torch.long), max_new_tokens=10, do_sample=False,
            attention_mask=torch.ones(PROMPTS.shape, dtype=torch.long), pad_token_id=0,
        )[:, 6:].numpy()  # fmt: skip
    np.testing.assert_array_equal(np.asarray(rollout.completion_tokens), ref)

    # the decode's log-probs are the full (chunk-parallel) forward's up to f32 rounding
    seq = rollout.sequences()
    logits = forward(seq.tokens, seq.attention_mask)
    logp = jax.nn.log_softmax(logits[:, 7:-1], -1)
    full = np.take_along_axis(np.asarray(logp), np.asarray(seq.tokens)[:, 8:, None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(rollout.policy_logp), full, atol=1e-4)
    # and the full forward's greedy tokens over the rollout are the decode's
    greedy = np.argmax(np.asarray(logits[:, 7:-1]), -1)
    np.testing.assert_array_equal(greedy, np.asarray(seq.tokens)[:, 8:])


def nbytes(a) -> int:
    return int(np.prod(a.shape)) * a.dtype.itemsize


def layer_bytes(cache, i: int) -> int:
    """Layer i's cache bytes: keys, values and a linear layer's conv and delta states."""
    parts = (cache.k[i], cache.v[i], cache.conv[i], cache.delta[i])
    return sum(nbytes(a) for a in parts if a is not None)


def test_linear_layer_cache_is_fixed_size(checkpoint):
    """A linear layer's state (conv window + delta matrix) is the same size at 8 and at 512
    slots; an attention layer's keys and values grow with the slots."""
    cfg = checkpoint[3].cfg
    short, long = (jax.eval_shape(lambda n=n: checkpoint[3].init_cache(2, n)) for n in (8, 512))
    for i, linear in enumerate(cfg.linear_layers):
        if linear:
            state = (cfg.linear_conv_kernel_dim - 1) * 64 + 4 * 8 * 8  # conv C = 64; Hv Dk Dv
            assert layer_bytes(short, i) == layer_bytes(long, i) == 2 * 4 * state
        else:
            assert layer_bytes(long, i) == 64 * layer_bytes(short, i)
    assert nbytes(long.k[0]) == 0  # a linear layer's k holds no slots
    assert cfg.num_params() == hf.count_params(checkpoint[3])


def test_packed_row_gives_each_sequence_alone(checkpoint):
    """Two sequences packed in one row (then padding): each one's logits are its own
    forward's, within the parity bound (the linear layers restart their conv window and
    delta state at the second; the attention layers attend within each)."""
    if checkpoint[0] != "dense":
        pytest.skip("one variant is enough (an MoE update is never packed)")
    model = checkpoint[3]
    vocab = model.cfg.vocab_size
    a, b = (np.random.RandomState(s).randint(1, vocab, size=n) for s, n in ((1, 7), (2, 5)))
    tokens = np.concatenate([a, b, [0, 0]])[None]
    segments = np.array([[1] * 7 + [2] * 5 + [0] * 2])
    positions = np.concatenate([np.arange(7), np.arange(5), [0, 0]])[None]
    hidden, _ = model.hidden_states(
        jnp.asarray(tokens), positions=jnp.asarray(positions), segment_ids=jnp.asarray(segments)
    )
    packed = np.asarray(model.logits(hidden))[0]
    for sid, seq in ((1, a), (2, b)):
        alone = np.asarray(model(jnp.asarray(seq[None]), jnp.ones((1, len(seq)), jnp.int32)))[0]
        scale = np.abs(alone).max()
        assert np.abs(packed[segments[0] == sid] - alone).max() < REL_TOL * scale, sid


def test_lora_on_each_layer_kind_and_its_merged_export(checkpoint, tmp_path):
    """Adapters on a full-attention layer's q_proj and o_proj, a linear layer's in_proj_qkv
    and out_proj, every MLP's gate_proj: each layer holds its own where it has the weight
    (unstacked); with B = 0 the logits are the base's bitwise; with random B the unmerged
    forward equals the merged copy's, which saves and loads into transformers with the
    same logits (the parity bound)."""
    from transformers import AutoModelForCausalLM

    from jaxrl_frontier.models import lora

    if checkpoint[0] != "dense":
        pytest.skip("one variant is enough (the experts take no adapters)")
    _, _, _, base, _ = checkpoint
    targets = ("q_proj", "o_proj", "in_proj_qkv", "out_proj", "gate_proj")
    graphdef, state = nnx.split(base)
    model = nnx.merge(graphdef, jax.tree.map(jnp.copy, state))
    lora.add_adapters(model, rank=2, alpha=4.0, targets=targets, key=jax.random.key(0))
    have = [sorted(n[: -len("_lora_a")] for n in vars(layer.attn) if n.endswith("_lora_a"))
            for layer in model.layers]  # fmt: skip
    assert have == [["in_proj_qkv", "out_proj"], ["o_proj", "q_proj"], ["in_proj_qkv", "out_proj"]]
    assert all(hasattr(layer.mlp, "gate_proj_lora_a") for layer in model.layers)
    tokens, mask = left_padded_batch(batch=2, length=18)
    np.testing.assert_array_equal(np.asarray(model(tokens, mask)), np.asarray(base(tokens, mask)))
    randomize_adapters(model)
    adapted = np.asarray(model(tokens, mask))
    assert rel_diff(adapted, np.asarray(base(tokens, mask)), mask) > 1e-3  # the adapters act
    merged = lora.merged(model)
    assert not lora.has_adapters(merged)
    assert rel_diff(np.asarray(merged(tokens, mask)), adapted, mask) < REL_TOL
    hf.save(merged, tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert rel_diff(hf_logits(back, tokens, mask), adapted, mask) < REL_TOL


def test_sequence_axis_is_refused(checkpoint):
    """A mesh's sequence axis refuses, naming why."""
    if checkpoint[0] != "dense":
        pytest.skip("one variant is enough")
    model = checkpoint[3]
    # a sequence axis: refused (the recurrence runs along the whole row), not run whole
    mesh = sharding.make_mesh({"fsdp": 4, "sequence": 2})
    state = nnx.state(model)
    placed = nnx.merge(
        nnx.graphdef(model), jax.device_put(state, sharding.state_shardings(state, mesh))
    )
    with pytest.raises(ValueError, match="'mesh.sequence' = 2.*delta state and conv window"):
        placed.hidden_states(jnp.ones((8, 4), jnp.int32))


def test_multimodal_checkpoint_loads_its_language_model(checkpoint, tmp_path):
    """A hub-style `Qwen3_5(Moe)ForConditionalGeneration` directory (the text config under
    `text_config`, tensors under `model.language_model.`, a vision tower and `mtp.*` layers
    beside them) loads as the same language model."""
    import json

    from safetensors.numpy import load_file, save_file

    variant, path, _, model, _ = checkpoint
    text = json.loads((path / "config.json").read_text())
    name = {"dense": "Qwen3_5ForConditionalGeneration", "moe": "Qwen3_5MoeForConditionalGeneration"}
    config = {"architectures": [name[variant]], "model_type": text["model_type"][: -len("_text")],
              "text_config": text, "vision_config": {"depth": 1}}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = {
        n.replace("model.", "model.language_model.", 1) if n.startswith("model.") else n: a
        for n, a in load_file(path / "model.safetensors").items()
    }
    extra = np.zeros((2, 2), np.float32)
    save_file({**tensors, "model.visual.proj.weight": extra, "mtp.fc.weight": extra},
              tmp_path / "model.safetensors")  # fmt: skip
    loaded = hf.load(tmp_path)
    assert loaded.cfg == model.cfg
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(loaded))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_update_gradient_equals_transformers(checkpoint):
    """The gradient of the update's kind of loss (the summed log-probs of a left-padded
    batch's real next tokens) in every parameter equals transformers' autograd: the
    chunk-parallel delta rule's backward through the whole hybrid stack. (Dense only: the
    MoE's compile is left out to keep the file fast.)"""
    import torch

    from jaxrl_frontier.models.qwen3_5 import hybrid_tensor_specs

    variant, _, torch_model, model, _ = checkpoint
    if variant != "dense":
        pytest.skip("one variant is enough")
    tokens, mask = left_padded_batch(batch=2, length=18)
    weight = (mask[:, :-1] * mask[:, 1:]).astype(np.float32)  # real token -> real next token
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    torch_model.zero_grad()
    logits = torch_model(
        input_ids=torch.as_tensor(tokens, dtype=torch.long),
        attention_mask=torch.as_tensor(mask, dtype=torch.long),
        position_ids=torch.as_tensor(positions, dtype=torch.long),
    ).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    picked = logp.gather(-1, torch.as_tensor(tokens[:, 1:, None], dtype=torch.long))[..., 0]
    (picked * torch.as_tensor(weight)).sum().backward()
    ref = {n: p.grad.numpy() for n, p in torch_model.named_parameters()}

    # and with each layer rematerialized (model.remat = 'full': its activations recomputed
    # in the backward, one jax.checkpoint per layer of the Python loop): the same gradient
    for remat in ("none", "full"):
        graphdef, state = nnx.split(reconfigured(model, model.cfg.replace(remat=remat)))

        def loss(state, graphdef=graphdef):
            lp = jax.nn.log_softmax(nnx.merge(graphdef, state)(tokens, mask)[:, :-1], -1)
            return jnp.sum(jnp.take_along_axis(lp, tokens[:, 1:, None], -1)[..., 0] * weight)

        checkpoints = str(jax.make_jaxpr(loss)(state)).count("remat2[")  # jax.checkpoint
        assert checkpoints == (len(model.layers) if remat == "full" else 0), checkpoints
        grads = dict(nnx.to_flat_state(jax.jit(jax.grad(loss))(state)))
        worst = {}  # per tensor: max |ours - transformers| / max |transformers|
        for spec in hybrid_tensor_specs(model.cfg):
            ours = spec.to_hf(np.asarray(grads[spec.path].get_value()))
            theirs = ref[spec.hf_name]
            worst[spec.hf_name] = np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-30)
        name = max(worst, key=worst.get)
        print(f"gradients (remat {remat}): worst {name} {worst[name]:.1e} of its largest entry")
        assert worst[name] < 1e-4


def _moe_only(checkpoint):
    if checkpoint[0] != "moe":
        pytest.skip("the MoE variant's test")
    return checkpoint[3]


def _loss(graphdef, tokens, mask, routing=None):
    """Mean squared logits + the load-balancing loss, the experts replaying `routing`
    (or routed by the router): a gradient through every parameter."""

    def loss(params):
        m = nnx.merge(graphdef, params)
        hidden, _, stats = m.hidden_states(tokens, mask, routing=routing, router_stats=True)
        balance = moe.router_losses(stats)["load_balance"]
        return jnp.mean(m.logits(hidden) ** 2) + 0.5 * balance, stats.experts

    return jax.jit(jax.value_and_grad(loss, has_aux=True))


def test_routing_replay_routes_to_the_recorded_experts(checkpoint):
    """As Qwen3-MoE's (tests/models/test_moe.py): replaying the model's own routing picks
    the same experts with the same gates, so the same outputs; replaying others routes each
    token there, with the current router's gates at them.

    The same outputs: bitwise op by op (eager: checked by hand), within f32 rounding under
    jit: the replayed and the unforced forwards are two programs, which XLA
    fuses differently, and under the suite's fast-compile flags (LLVM -O0 and the elemental
    emitters, tests/conftest.py) the two round differently: 9.3e-6 of a final hidden of
    scale ~3 here (0 under XLA's default flags, or either flag alone). The replay itself
    changes nothing: a layer's gates with its own experts forced are bitwise its own."""
    model = _moe_only(checkpoint)
    graphdef, state = nnx.split(model)
    tokens, mask = map(jnp.asarray, left_padded_batch(batch=2, length=6))

    @jax.jit
    def forward(params, routing):
        m = nnx.merge(graphdef, params)
        return m.hidden_states(tokens, mask, routing=routing, router_stats=True)[::2]

    plain, own = forward(state, None)
    recorded = jnp.moveaxis(own.experts, 0, 2)  # [B, T, L, k]
    again, stats = forward(state, recorded)
    np.testing.assert_array_equal(stats.experts, own.experts)
    assert float(jnp.abs(again - plain).max()) <= REL_TOL * float(jnp.abs(plain).max())
    x = jax.random.normal(jax.random.key(0), (2, 6, model.cfg.hidden_size))
    layer = model.layers[0].mlp
    _, experts, gates = layer.route(x)
    _, forced_experts, forced_gates = layer.route(x, experts)
    np.testing.assert_array_equal(forced_experts, experts)
    np.testing.assert_array_equal(forced_gates, gates)

    forced = (recorded + 1) % model.cfg.num_experts  # other experts everywhere
    moved, stats = forward(state, forced)
    np.testing.assert_array_equal(jnp.moveaxis(stats.experts, 0, 2), forced)
    np.testing.assert_array_equal(stats.own[0], own.experts[0])  # layer 0's input: unmoved
    assert float(moe.routing_difference_share(forced, recorded, mask)) == 1.0
    assert float(jnp.abs(moved - plain).max()) > 0.1


def test_expert_parallel_update_equals_one_device(checkpoint):
    """The update's form (grouped matmuls) on 8 fake devices, data 2 x fsdp 4 (the file's
    4 experts: 1 a device over fsdp; the rows over both axes), replaying a routing: the
    loss (with the load-balancing term), the experts used and every gradient equal one
    device's, and so do the greedy decode's tokens on the mesh. (fsdp 4 x tensor 2, the
    experts' width over tensor, hung twice under load and passed once alone: docs/models.md,
    Qwen3.5 "Not yet".)

    Tolerance: the 8-device program is another f32 evaluation of the same sums (psums over
    the devices, other fusions: see the replay test for what a refusion alone moves), so
    the parity's bounds apply: the loss within 1e-5 relative, each gradient tensor within
    1e-4 of its largest entry (the gradient parity's bound)."""
    model = _moe_only(checkpoint)
    mesh = sharding.make_mesh((2, 4, 1))
    ragged = nnx.graphdef(reconfigured(model, model.cfg.replace(moe_impl="ragged")))
    state = nnx.state(model)
    tokens, mask = map(jnp.asarray, left_padded_batch(batch=8, length=8))
    cfg = model.cfg
    routing = jax.random.randint(jax.random.key(1), (8, 8, cfg.num_layers, 2), 0, 2)
    routing = jnp.concatenate([routing, routing + 2], axis=-1)[..., ::2]  # 2 distinct of 4
    (loss1, experts1), grads1 = _loss(ragged, tokens, mask, routing)(state)
    placed = jax.device_put(state, sharding.state_shardings(state, mesh))
    down = placed["layers"][0]["mlp"]["expert_down"].get_value()  # [E, F, D]
    assert down.sharding.spec[0] == "fsdp"  # [E, F, D]: the experts split
    rows = sharding.shard_batch((tokens, mask, routing), mesh)
    (loss8, experts8), grads8 = _loss(ragged, *rows)(placed)
    np.testing.assert_array_equal(experts8, experts1)
    np.testing.assert_array_equal(jnp.moveaxis(experts1, 0, 2), routing)
    np.testing.assert_allclose(loss8, loss1, rtol=1e-5)
    flat1, flat8 = nnx.to_flat_state(grads1), dict(nnx.to_flat_state(grads8))
    for path, a in flat1:
        a, b = np.asarray(a.get_value()), np.asarray(flat8[path].get_value())
        assert np.abs(a).max() > 0, path  # every parameter gets a gradient
        assert np.abs(b - a).max() <= 1e-4 * np.abs(a).max(), path

    params = SamplingParams(max_new_tokens=6, greedy=True)
    prompts = np.asarray(tokens), np.asarray(mask)
    one = Sampler(model, pad_id=0, prompt_buckets=(8,)).generate(
        *prompts, params, jax.random.key(0)
    )
    spread = Sampler(nnx.merge(nnx.graphdef(model), placed), pad_id=0, mesh=mesh,
                     prompt_buckets=(8,))  # fmt: skip
    eight = spread.generate(*prompts, params, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(eight.completion_tokens), one.completion_tokens)
    np.testing.assert_allclose(np.asarray(eight.policy_logp), one.policy_logp, atol=1e-5)


def test_tensor_parallel_linear_heads_equal_one_device(checkpoint):
    """The dense model on 8 fake devices, fsdp 4 x tensor 2: the linear layers' value-head
    parameters split over `tensor` (2 of the 4 value heads a device), the attention heads
    too; the update's kind of loss and every gradient equal one device's (the bounds of
    `test_expert_parallel_update_equals_one_device`)."""
    if checkpoint[0] != "dense":
        pytest.skip("one variant is enough")
    model = checkpoint[3]
    mesh = sharding.make_mesh((1, 4, 2))
    graphdef, state = nnx.split(model)
    tokens, mask = map(jnp.asarray, left_padded_batch(batch=8, length=8))

    @jax.jit
    def loss_and_grads(params, tokens, mask):
        loss = lambda p: jnp.mean(nnx.merge(graphdef, p)(tokens, mask) ** 2)  # noqa: E731
        return jax.value_and_grad(loss)(params)

    loss1, grads1 = loss_and_grads(state, tokens, mask)
    placed = jax.device_put(state, sharding.state_shardings(state, mesh))
    linear = placed["layers"][0]["attn"]
    assert linear["out_proj"].get_value().sharding.spec[0] == "tensor"
    assert linear["in_proj_z"].get_value().sharding.spec[1] == "tensor"
    assert linear["A_log"].get_value().sharding.spec[0] == "tensor"
    loss8, grads8 = loss_and_grads(placed, *sharding.shard_batch((tokens, mask), mesh))
    np.testing.assert_allclose(loss8, loss1, rtol=1e-5)
    flat8 = dict(nnx.to_flat_state(grads8))
    for path, a in nnx.to_flat_state(grads1):
        a, b = np.asarray(a.get_value()), np.asarray(flat8[path].get_value())
        assert np.abs(a).max() > 0, path
        assert np.abs(b - a).max() <= 1e-4 * np.abs(a).max(), path
