"""Qwen3-MoE: HF parity (logits, greedy decode, save -> transformers), the experts' two
forms, expert parallelism on 8 fake CPU devices, the router's losses and metrics, routing
replay at the model level.

One tiny random Qwen3-MoE (transformers, 8 experts, top 2, 2 layers, hidden 32) serves
every test of the file, so its programs compile once.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import (
    assert_row_samplers_match_plain,
    hf_logits,
    left_padded_batch,
    noisy_copy,
    redrawn,
)
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.models import hf, model_forms, moe
from jaxrl_frontier.sampling import Sampler, SamplingParams

HF_MOE = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(directory, torch model): a random tiny Qwen3-MoE saved by transformers."""
    import transformers

    config = transformers.Qwen3MoeConfig(**HF_MOE, attn_implementation="eager")
    model = redrawn(transformers.AutoModelForCausalLM.from_config(config).eval(), 0.2)
    path = tmp_path_factory.mktemp("qwen3_moe")
    model.save_pretrained(path)
    return path, model


@pytest.fixture(scope="module")
def model(checkpoint):
    return hf.load(checkpoint[0])


def _max_diff(a, b, mask) -> float:
    return float(np.abs(a - b)[mask.astype(bool)].max())


def test_hf_parity_both_forms_and_save_round_trip(checkpoint, model, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    path, torch_model = checkpoint
    assert model.cfg.family == "qwen3_moe" and model.cfg.num_experts == 8
    with safe_open(str(path / "model.safetensors"), "np") as f:  # transformers' disk layout
        assert "model.layers.1.mlp.experts.7.down_proj.weight" in f.keys()
    tokens, mask = left_padded_batch(length=10)
    ref = hf_logits(torch_model, tokens, mask)
    scale = float(np.abs(ref).max())
    for impl in moe.EXPERT_IMPLS:
        m = model_forms.reconfigured(model, model.cfg.replace(moe_impl=impl))
        assert m.layers.mlp.cfg.moe_impl == impl  # the layers run it, not the top module only
        got = np.asarray(m(jnp.asarray(tokens), jnp.asarray(mask)))
        assert _max_diff(got, ref, mask) < 1e-5 * scale, impl

    # save (sharded into several files) -> transformers and our loader read the same model
    hf.save(model, tmp_path, max_shard_size="40KB", base_config=hf.read_config(path))
    assert (tmp_path / hf.INDEX_FILE).exists()
    back = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(back).__name__ == "Qwen3MoeForCausalLM"
    assert _max_diff(hf_logits(back, tokens, mask), ref, mask) < 1e-5 * scale
    again = hf.load(tmp_path)
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_config_mapping_and_refused_options():
    cfg = hf.config_from_hf({**HF_MOE, "architectures": ["Qwen3MoeForCausalLM"]})
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (8, 2, 16)
    assert hf.config_from_hf(hf.config_to_hf(cfg)) == cfg
    # transformers 5 writes `num_local_experts`; the Hub's configs `num_experts`
    alt = {k: v for k, v in HF_MOE.items() if k != "num_experts"}
    assert hf.config_from_hf({**alt, "num_local_experts": 8, "model_type": "qwen3_moe"}) == cfg
    for key, value in (("decoder_sparse_step", 2), ("mlp_only_layers", [0])):
        with pytest.raises(ValueError, match=key):
            hf.config_from_hf({**HF_MOE, "model_type": "qwen3_moe", key: value})
    assert (
        cfg.num_params()
        == 8 * 2 * 32 * 3 * 16
        + 2 * 32 * 8
        + cfg.replace(num_experts=0, intermediate_size=0).num_params()
    )


PROMPTS = np.random.RandomState(1).randint(1, 128, size=(2, 6)).astype(np.int32)
GREEDY = SamplingParams(max_new_tokens=8, greedy=True)


def test_continuous_partial_and_speculative_samplers_give_the_plain_decode(model):
    """The experts through the samplers that move rows (no routing record): continuous
    batching, partial rollouts and speculative rollouts (a noisy copy of the policy as the draft) give the
    plain sampler's greedy tokens and log-probs."""
    assert_row_samplers_match_plain(model, noisy_copy(model), PROMPTS)


@pytest.fixture(scope="module")
def rollout(model):
    """A greedy rollout of PROMPTS (left-padded to 8) recording its routing."""
    sampler = Sampler(model, pad_id=0, prompt_buckets=(8,), record_routing=True)
    return sampler.generate(PROMPTS, np.ones_like(PROMPTS), GREEDY, jax.random.key(0))


def test_greedy_decode_equals_transformers(checkpoint, rollout):
    import torch

    with torch.no_grad():
        ref = checkpoint[1].generate(
            torch.as_tensor(PROMPTS, dtype=torch.long), max_new_tokens=8, do_sample=False,
            attention_mask=torch.ones(PROMPTS.shape, dtype=torch.long), pad_token_id=0,
        )[:, 6:].numpy()  # fmt: skip
    np.testing.assert_array_equal(np.asarray(rollout.completion_tokens), ref)


def _loss(graphdef, tokens, mask, coef=0.5):
    """Mean squared logits + coef x the load-balancing loss: a gradient through the experts,
    the gates and the router."""

    def loss(params):
        m = nnx.merge(graphdef, params)
        hidden, _, stats = m.hidden_states(tokens, mask, router_stats=True)
        return jnp.mean(m.logits(hidden) ** 2) + coef * moe.router_losses(stats)["load_balance"]

    return jax.jit(jax.value_and_grad(loss))


def test_expert_parallel_update_and_decode_equal_one_device(checkpoint, model):
    """The update's form (grouped matmuls, 1 expert per device: the N min(k, 1) rows bound)
    in the forward + gradient; the decode in the CPU default (dense), by both dispatches."""
    mesh = sharding.make_mesh((1, 8, 1))
    graphdef, state = nnx.split(model)
    ragged = nnx.graphdef(model_forms.reconfigured(model, model.cfg.replace(moe_impl="ragged")))
    tokens, mask = map(jnp.asarray, left_padded_batch(batch=8, length=6))
    loss1, grads1 = _loss(ragged, tokens, mask)(state)
    sharded = jax.device_put(state, sharding.state_shardings(state, mesh))
    rows = sharding.shard_batch((tokens, mask), mesh)
    loss8, grads8 = _loss(ragged, *rows)(sharded)
    # f32 sums in another order (a psum over the devices): a few ulps of O(1) values
    np.testing.assert_allclose(loss8, loss1, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads1), jax.tree.leaves(grads8)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6, rtol=1e-5)

    # loading onto the mesh reads each device's experts only, into the same placement
    loaded = nnx.state(hf.load(checkpoint[0], mesh=mesh))
    for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(loaded)):
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim)
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
    # every device holds 1 of the 8 experts of each layer, and nothing gathers them
    experts = sharded["layers"]["mlp"]["expert_gate"].get_value()
    assert experts.sharding.spec[1] == "fsdp"
    assert {s.data.nbytes for s in experts.addressable_shards} == {experts.nbytes // 8}
    fwd = jax.jit(lambda p, t, m: nnx.merge(graphdef, p)(t, m))
    mem = fwd.lower(sharded, *rows).compile().memory_analysis()
    expert_bytes = sum(sharded["layers"]["mlp"][k].get_value().nbytes for k in
                       ("expert_gate", "expert_up", "expert_down"))  # fmt: skip
    other_bytes = sum(x.nbytes for x in jax.tree.leaves(sharded)) - expert_bytes
    assert mem.argument_size_in_bytes < other_bytes + expert_bytes / 8 + 4096
    assert mem.temp_size_in_bytes < expert_bytes / 4  # no gathered copy of the experts

    params = SamplingParams(max_new_tokens=6, greedy=True)
    prompts = np.asarray(tokens), np.asarray(mask)
    one = Sampler(model, pad_id=0, prompt_buckets=(8,)).generate(
        *prompts, params, jax.random.key(0)
    )
    placed = nnx.merge(graphdef, sharded)
    eight = Sampler(placed, pad_id=0, mesh=mesh, prompt_buckets=(8,)).generate(
        *prompts, params, jax.random.key(0)
    )
    np.testing.assert_array_equal(np.asarray(eight.completion_tokens), one.completion_tokens)
    np.testing.assert_allclose(np.asarray(eight.policy_logp), one.policy_logp, atol=1e-5)
    placed.cfg = placed.cfg.replace(moe_dispatch="all_to_all")  # dropless: the same decode
    a2a = Sampler(placed, pad_id=0, mesh=mesh, prompt_buckets=(8,)).generate(
        *prompts, params, jax.random.key(0)
    )
    np.testing.assert_array_equal(np.asarray(a2a.completion_tokens), one.completion_tokens)
    np.testing.assert_allclose(np.asarray(a2a.policy_logp), one.policy_logp, atol=1e-5)


def _dispatch_inputs(seed=0, rows=8, t=6, d=16, e=8, k=2, f=8):
    """x [rows, t, d], experts / gates [rows, t, k] (a softmax top-k of random logits, so
    some experts are crowded) and the stacked expert weights, f32."""
    keys = jax.random.split(jax.random.key(seed), 5)
    x = jax.random.normal(keys[0], (rows, t, d))
    logits = jax.random.normal(keys[1], (rows, t, e)) + jnp.arange(e) * 0.4  # skewed load
    experts, gates = moe.top_k_gates(logits, k, norm=True)
    weights = [0.3 * jax.random.normal(keys[2 + i], shape) for i, shape in
               enumerate([(e, d, f), (e, d, f), (e, f, d)])]  # fmt: skip
    return x, experts, gates, moe.ExpertWeights(*weights)


def _kept_by_hand(experts, devices, local, capacity):
    """numpy [rows, t, k] bool: 'all_to_all' keeps an assignment when fewer than `capacity`
    earlier assignments (token-major, then k) of its device's rows went to its expert's
    device."""
    e = np.asarray(experts)
    kept = np.zeros(e.shape, bool)
    for block in np.split(np.arange(e.shape[0]), devices):  # each device's own rows
        seen = np.zeros(devices, int)
        for idx in np.ndindex(len(block), *e.shape[1:]):
            where = (block[idx[0]], *idx[1:])
            dest = e[where] // local
            kept[where] = seen[dest] < capacity
            seen[dest] += 1
    return kept


@pytest.mark.parametrize("impl", ["ragged", "dense"])
def test_all_to_all_dispatch_equals_one_device_and_drops_past_capacity(impl):
    """'all_to_all' dispatch on 8 fsdp devices (1 expert each): dropless (capacity factor
    0) it gives the one-device output and gradient; with factor 0.5 (C = ceil(0.5 x 6 x 2 /
    8) = 1 assignment per device pair) it gives the one-device output with the dropped
    assignments' gates zeroed, dropped as counted by hand."""
    fn = moe.EXPERT_IMPLS[impl]
    mesh = sharding.make_mesh((1, 8, 1))
    x, experts, gates, weights = _dispatch_inputs()
    rows = sharding.shard_batch((x, experts, gates), mesh)
    placed = jax.device_put(weights, sharding.NamedSharding(mesh, sharding.PartitionSpec("fsdp")))

    def run(dispatch, factor, x, experts, gates, weights):
        return moe.expert_parallel(fn, x, experts, gates, weights, dispatch, factor)[0]

    def loss(dispatch, factor):
        def f(x, weights, experts, gates):
            return jnp.sum(run(dispatch, factor, x, experts, gates, weights) ** 2)

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))

    one = loss("gather", 0.0)(x, weights, experts, gates)
    spread = loss("all_to_all", 0.0)(rows[0], placed, *rows[1:])
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(spread), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5)

    assert moe.all_to_all_capacity(6, 2, 8, 1, 0.5) == 1
    kept = _kept_by_hand(experts, devices=8, local=1, capacity=1)
    assert 0 < kept.mean() < 1  # some assignments dropped, some kept
    a2a = jax.jit(functools.partial(moe.expert_parallel, fn, dispatch="all_to_all",
                                    capacity_factor=0.5))  # fmt: skip
    dropped, count = a2a(*rows, placed)
    by_hand = run("gather", 0.0, x, experts, jnp.where(kept, gates, 0.0), weights)
    np.testing.assert_allclose(np.asarray(dropped), np.asarray(by_hand), rtol=1e-5, atol=1e-6)
    assert float(count) == (~kept).sum()


def test_all_to_all_buffers_are_bounded_by_the_device_own_tokens():
    """64 tokens a device, 8 experts over 8 devices, top 2: the gather dispatch holds the
    group's 512 tokens on every device; all-to-all at capacity factor 1.25 holds 8 x 20
    assignment rows. The compiled forward + gradient's temporaries per device fall by more
    than 2x (measured: 991 KB -> 401 KB)."""
    mesh = sharding.make_mesh((1, 8, 1))
    x, experts, gates, weights = _dispatch_inputs(rows=8, t=64, d=64, f=32)
    rows = sharding.shard_batch((x, experts, gates), mesh)
    placed = jax.device_put(weights, sharding.NamedSharding(mesh, sharding.PartitionSpec("fsdp")))

    def temporaries(dispatch, factor):
        def f(x, weights):
            y, _ = moe.expert_parallel(moe.experts_ragged, x, *rows[1:], weights, dispatch, factor)
            return jnp.sum(y**2)

        program = jax.jit(jax.grad(f, argnums=(0, 1))).lower(rows[0], placed).compile()
        return program.memory_analysis().temp_size_in_bytes

    gather, a2a = temporaries("gather", 0.0), temporaries("all_to_all", 1.25)
    assert a2a * 2 < gather, (gather, a2a)


@jax.jit
def _router_numbers(logits, mask, a, b):
    experts, gates = moe.top_k_gates(logits, 1, norm=False)
    stats = jax.tree.map(lambda x: x[None], moe.router_stats(logits, experts, mask, 4))
    pairs = ((a, a), (a, b), (a, b, jnp.asarray([[1, 0]])))
    shares = [moe.routing_difference_share(*p) for p in pairs]
    return experts, gates, moe.router_losses(stats), moe.router_metrics(stats), shares


def test_router_losses_and_metrics_by_hand():
    # one layer, 3 tokens (the last masked out), 4 experts, k = 1
    probs = [[0.7, 0.1, 0.1, 0.1], [0.1, 0.6, 0.2, 0.1], [0, 0, 0, 1.0]]
    a = jnp.asarray([[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]])  # [B=1, T=2, L=2, k=2]
    b = a.at[0, 1, 0].set(jnp.asarray([5, 4])).at[0, 1, 1].set(jnp.asarray([6, 0]))
    experts, gates, out, m, shares = _router_numbers(
        jnp.log(jnp.asarray([probs])), jnp.asarray([[1, 1, 0]]), a, b
    )
    np.testing.assert_array_equal(experts[0, :, 0], [0, 1, 3])
    np.testing.assert_allclose(gates[0, :2, 0], [0.7, 0.6], rtol=1e-6)
    f, p = np.array([0.5, 0.5, 0, 0]), np.array([0.8, 0.7, 0.3, 0.2]) / 2
    np.testing.assert_allclose(out["load_balance"], 4 * np.sum(f * p), rtol=1e-6)
    # the probabilities sum to 1: logsumexp(log p) = 0 on each counted token
    np.testing.assert_allclose(out["z"], 0.0, atol=1e-6)
    np.testing.assert_allclose([m["moe/load_max"], m["moe/load_min"]], [2.0, 0.0])
    h = lambda q: -np.sum(np.asarray(q) * np.log(q))
    want = (h(probs[0]) + h(probs[1])) / 2
    np.testing.assert_allclose(m["moe/router_entropy"], want, rtol=1e-5)
    # a vs a; a vs b (1 of 4 token-layers differs as a set: [4, 5] vs [5, 4] does not);
    # a vs b on token 0 only
    np.testing.assert_array_equal(shares, [0.0, 0.25, 0.0])


def _hand_moe(layer, x, forced):
    """A Qwen3-MoE layer's MLP written out per token: the forced experts' weights gathered,
    gates = the router's renormalised probabilities there."""
    probs = jax.nn.softmax(x @ layer.router[...], -1)
    g = jnp.take_along_axis(probs, forced, -1)
    g = g / g.sum(-1, keepdims=True)
    wg, wu, wd = (
        getattr(layer, n)[...][forced] for n in ("expert_gate", "expert_up", "expert_down")
    )
    h = jax.nn.silu(jnp.einsum("btd,btkdf->btkf", x, wg)) * jnp.einsum("btd,btkdf->btkf", x, wu)
    return jnp.einsum("btkf,btkfd,btk->btd", h, wd, g)


def test_routing_replay_routes_to_the_recorded_experts(model):
    graphdef, state = nnx.split(model)
    tokens, mask = map(jnp.asarray, left_padded_batch(batch=2, length=6))

    @jax.jit
    def forward(params, routing):
        m = nnx.merge(graphdef, params)
        return m.hidden_states(tokens, mask, routing=routing, router_stats=True)[::2]

    plain, own = forward(state, None)
    recorded = jnp.moveaxis(own.experts, 0, 2)  # [B, T, L, k]
    # replaying the model's own routing changes nothing
    np.testing.assert_array_equal(forward(state, recorded)[0], plain)
    forced = (recorded + 3) % 8  # other experts everywhere
    _, stats = forward(state, forced)
    np.testing.assert_array_equal(jnp.moveaxis(stats.experts, 0, 2), forced)
    assert float(moe.routing_difference_share(forced, recorded, mask)) == 1.0

    replayed = lambda p: jnp.sum(forward(p, forced)[0])
    by_hand = lambda p: jnp.sum(_hand_forward(nnx.merge(graphdef, p), tokens, mask, forced))
    g1, g2 = jax.jit(jax.grad(replayed))(state), jax.jit(jax.grad(by_hand))(state)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)
    assert float(jnp.abs(g1["layers"]["mlp"]["router"].get_value()).max()) > 0


def _hand_forward(m, tokens, mask, forced):
    """The model's forward with each layer's MLP replaced by `_hand_moe` (Python loop)."""
    from jaxrl_frontier.models.attention import mask_to_bias
    from jaxrl_frontier.models.layers import positions_from_mask, rope_inv_freq
    from jaxrl_frontier.models.model_forms import unstack_layers

    m = unstack_layers(m)
    t = tokens.shape[1]
    bias = mask_to_bias(jnp.tril(jnp.ones((t, t), bool))[None] & mask.astype(bool)[:, None, :])
    pos, inv = positions_from_mask(mask), rope_inv_freq(m.cfg)
    x = m.embed[...][tokens]
    for i, layer in enumerate(m.layers):
        a, _ = layer.attn(layer.input_norm(x), pos, inv, bias)
        x = x + a
        x = x + _hand_moe(layer.mlp, layer.post_attn_norm(x), forced[:, :, i])
    return m.final_norm(x)


def test_sampler_records_the_routing_the_update_replays(model, rollout):
    """The sampler's recorded experts (prefill and decode) are the experts a full forward
    over the rollout's sequences picks (f32: the cached decode and the full forward agree
    here), and a forward replaying them routes every recorded token exactly there."""
    seq = rollout.sequences()
    routing = np.asarray(rollout.routing)
    assert routing.shape == (2, 8 + 8, 2, 2) and routing.dtype == np.int16
    want = np.asarray(seq.attention_mask).astype(bool)  # 2 padding slots per prompt
    want[np.arange(2), 8 + np.asarray(rollout.lengths) - 1] = False  # the last is never fed
    np.testing.assert_array_equal((routing >= 0).all((-2, -1)), want)
    np.testing.assert_array_equal((routing >= 0).any((-2, -1)), want)

    graphdef, state = nnx.split(model)

    @jax.jit
    def experts_of(params, routing):
        m = nnx.merge(graphdef, params)
        stats = m.hidden_states(seq.tokens, seq.attention_mask, routing=routing, router_stats=True)
        return jnp.moveaxis(stats[2].experts, 0, 2), jnp.moveaxis(stats[2].own, 0, 2)

    own = np.asarray(experts_of(state, None)[0])
    assert float(moe.routing_difference_share(own, routing, want)) == 0.0
    flipped = np.where(want[:, :, None, None], (routing + 1) % 8, -1)  # other experts
    used, router = map(np.asarray, experts_of(state, flipped))
    np.testing.assert_array_equal(used[want], flipped[want])  # exactly the replayed experts
    np.testing.assert_array_equal(used[~want], router[~want])  # no record: the router's own
    assert float(moe.routing_difference_share(router, flipped, want)) > 0.5


def test_lora_on_the_experts_is_refused(model):
    from jaxrl_frontier.models import lora

    with pytest.raises(ValueError, match="model.lora.targets.*gate_proj.*MoE"):
        lora.add_adapters(model, rank=2, alpha=4.0, targets=("gate_proj",), key=jax.random.key(0))


def test_qwen2_moe_shared_expert_parity_and_round_trip(tmp_path):
    """Qwen2-MoE: qkv biases, no qk-norm, a sigmoid-gated shared expert beside the routed
    ones, norm_topk_prob off."""
    import torch
    import transformers

    keep = {k: v for k, v in HF_MOE.items() if k != "norm_topk_prob"}
    config = transformers.Qwen2MoeConfig(
        **keep, shared_expert_intermediate_size=24, attn_implementation="eager"
    )
    torch.manual_seed(1)
    ref_model = redrawn(transformers.AutoModelForCausalLM.from_config(config).eval(), 0.2, 1)
    ref_model.save_pretrained(tmp_path / "in")
    tokens, mask = left_padded_batch(length=10)
    ref = hf_logits(ref_model, tokens, mask)
    model = hf.load(tmp_path / "in")
    cfg = model.cfg
    assert (cfg.family, cfg.qkv_bias, cfg.qk_norm, cfg.norm_topk_prob) == (
        "qwen2_moe", True, False, False,
    )  # fmt: skip
    assert cfg.shared_expert_intermediate_size == 24
    assert (
        hf.count_params(model) == cfg.num_params() == sum(p.numel() for p in ref_model.parameters())
    )
    scale = float(np.abs(ref).max())
    got = np.asarray(model(jnp.asarray(tokens), jnp.asarray(mask)))
    assert _max_diff(got, ref, mask) < 1e-5 * scale
    hf.save(model, tmp_path / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "out", attn_implementation="eager"
    ).eval()
    assert type(back).__name__ == "Qwen2MoeForCausalLM"
    assert _max_diff(hf_logits(back, tokens, mask), ref, mask) < 1e-5 * scale


# ------------------------------------------------------------ replay in the passes and R2


def _hand_logp(m, tokens, mask, forced):
    """log p(tokens[t] | tokens[<t]) [B, T] (0 at t = 0) of `_hand_forward` with the
    experts `forced` [B, T, L, k]; where forced < 0 (no record: padding), the router's own
    (a padding token's output reaches no real token, but a NaN from experts its router
    gives probability 0 would: 0 x NaN in the attention)."""
    own = jnp.moveaxis(m.hidden_states(tokens, mask, router_stats=True)[2].experts, 0, 2)
    forced = jnp.where(forced >= 0, forced, own)
    logits = m.logits(_hand_forward(m, tokens, mask, forced))
    logp = jax.nn.log_softmax(logits[:, :-1], -1)
    logp = jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
    return jnp.pad(logp, ((0, 0), (1, 0))), own


_hand_logp_jit = jax.jit(lambda graphdef, p, *a: _hand_logp(nnx.merge(graphdef, p), *a),
                         static_argnums=0)  # fmt: skip


def test_behaviour_pass_replays_the_rollout_routing_and_the_reference_does_not(model, rollout):
    """With R3 the behaviour pass scores the rollout under its recorded experts (here other
    experts than the router's: the log-probs of `_hand_forward` with those experts), and the
    update's forward routes to exactly them; the reference pass, its own router's (the
    plain forward's)."""
    from types import SimpleNamespace

    from jaxrl_frontier.rl.learn.forward import apply_hidden, make_logp_fn
    from jaxrl_frontier.rl.produce.passes import PASSES

    seq = rollout.sequences()
    recorded = np.asarray(rollout.routing)
    flipped = np.where(recorded >= 0, (recorded + 3) % 8, -1).astype(np.int16)
    exp = SimpleNamespace(tokens=seq.tokens, attention_mask=seq.attention_mask,
                          dropout_keys=None, routing=jnp.asarray(flipped))  # fmt: skip
    graphdef, state = nnx.split(model)
    logp_fn = make_logp_fn(graphdef, completion_len=8)
    context = dict(policy_logp_fn=logp_fn, replay_routing=True)
    behaviour = np.asarray(PASSES.get("behaviour")(**context).fn(state, exp))
    reference = np.asarray(PASSES.get("reference")(**context).fn(state, exp))
    scored = np.asarray(seq.loss_mask) > 0
    hand = np.asarray(_hand_logp_jit(graphdef, state, seq.tokens, seq.attention_mask, flipped)[0])
    own = np.asarray(logp_fn(state, seq.tokens, seq.attention_mask))
    # f32 forwards summed in another order: |logp| < 10, a few ulps of the logits each
    np.testing.assert_allclose(behaviour[scored], hand[scored], atol=2e-5)
    np.testing.assert_array_equal(reference[scored], own[scored])
    assert np.abs(behaviour - own)[scored].max() > 0.1  # the replay changed the routing

    # the update's forward (`rl_loss` runs `apply_hidden(router=True)`): on every recorded
    # token exactly the replayed experts, as sets (and in order)
    update_forward = jax.jit(apply_hidden(graphdef, router=True))
    stats = update_forward(state, seq.tokens, seq.attention_mask, None, jnp.asarray(flipped))[2]
    used = np.moveaxis(np.asarray(stats.experts), 0, 2)
    on = recorded >= 0
    np.testing.assert_array_equal(np.sort(used, -1)[on], np.sort(flipped, -1)[on])


class _Perturb:
    """An 'optimizer' that adds `delta` (params-shaped) at every update, whatever the
    gradient: the update u runs at theta_0 + u delta, known by hand."""

    def __init__(self, delta):
        self.init = lambda params: optax.EmptyState()
        self.update = lambda grads, state, params=None: (delta, state)


def test_first_update_replay_keeps_the_first_routing_across_minibatches(model):
    """R2, 2 epochs x 2 minibatches of 2 rows: the record is the router's top-k at the
    step's starting weights; the router weights then move by a fixed delta at every update,
    so the later minibatches' own routing differs (routing_diff_share > 0) while their
    loss is the hand-built one under the recorded experts."""
    import dataclasses

    from jaxrl_frontier.core.errors import ConfigError
    from jaxrl_frontier.rl.experience import Experience
    from jaxrl_frontier.rl.learn.learner import Learner, LearnerOptions, minibatch_order
    from jaxrl_frontier.rl.learn.train_step import init_train_state

    graphdef, params0 = nnx.split(model)
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    params0 = jax.device_put(params0, sharding.state_shardings(params0, mesh))
    noise = lambda path, x: (
        2.0 * jax.random.normal(jax.random.key(3), x.shape)
        if "router" in jax.tree_util.keystr(path) else jnp.zeros_like(x)
    )  # fmt: skip
    delta = jax.tree_util.tree_map_with_path(noise, params0)
    tx = _Perturb(delta)
    # the update donates its state: a copy, so the module's model keeps its weights
    state = init_train_state(tx, jax.tree.map(jnp.copy, params0), mesh, jax.random.key(0))
    objective = dict(weight="ppo_clip", weight_kwargs=dict(eps_low=100.0, eps_high=100.0),
                     aggregation="token_mean", advantage="grpo")  # fmt: skip
    options = LearnerOptions(objective=objective, rows=4, group_size=1, completion_len=6,
                             epochs=2, minibatches=2, routing_replay="first_update")  # fmt: skip
    learner = Learner(graphdef, tx, state, options, mesh=mesh, model_cfg=model.cfg)

    tokens, mask = map(jnp.asarray, left_padded_batch(batch=4, length=12))
    loss_mask = (mask * (jnp.arange(12) >= 6)).astype(jnp.float32)
    adv = jnp.asarray([1.0, -0.5, 0.7, -1.2])[:, None] * loss_mask
    z = jnp.zeros(4, jnp.int32)
    exp = Experience(tokens=tokens, attention_mask=mask, loss_mask=loss_mask,
                     old_logp=-5.0 * loss_mask, advantages=adv, rewards=jnp.zeros((4, 1)),
                     prompt_index=z, group_id=jnp.arange(4), policy_version=z,
                     turn_index=jnp.zeros((4, 12), jnp.int32))  # fmt: skip

    first = np.asarray(learner.first_routing(exp.update_batch()))
    own0 = model.hidden_states(tokens, mask, router_stats=True)[2].experts
    np.testing.assert_array_equal(
        first,
        np.where(np.asarray(mask)[..., None, None] > 0, np.moveaxis(np.asarray(own0), 0, 2), -1),
    )

    keys = list(jax.random.split(jax.random.key(1), 2))  # one per epoch's permutation
    metrics = learner.update(exp, iter(keys).__next__)
    shares = [float(m["moe/routing_diff_share"]) for m in metrics]
    assert shares[0] == 0.0 and min(shares[1:]) > 0.2, shares

    # the 2nd minibatch of epoch 0 ran at theta_0 + delta on the rows order[2:]
    rows = minibatch_order(keys[0], 4, 1)[2:]
    p1 = jax.tree.map(jnp.add, params0, delta)
    t, mk, lm, a = tokens[rows], mask[rows], loss_mask[rows], adv[rows]

    def hand_loss(forced):  # ppo_clip never clipping: -sum(m r A) / sum(m), r = p / e^-5
        logp, own = _hand_logp_jit(graphdef, p1, t, mk, forced)
        return float(-jnp.sum(lm * jnp.exp(logp + 5.0) * a) / jnp.sum(lm)), own

    replayed, own_routing = hand_loss(first[rows])
    own = hand_loss(own_routing)[0]
    logged = float(metrics[1]["loss"])
    # ratios O(1) from log-probs a few f32 ulps apart: the loss within 1e-5 of its scale
    assert abs(logged - replayed) < 1e-5 * max(1.0, abs(replayed)), (logged, replayed)
    assert abs(logged - own) > 1e-3, (logged, own)

    with pytest.raises(ConfigError, match="allowed values are.*first_update"):
        bad = dataclasses.replace(options, routing_replay="first_epoch")
        Learner(graphdef, tx, state, bad, mesh=mesh, model_cfg=model.cfg)
    with pytest.raises(ConfigError, match="num_experts = 0"):
        moe.check_routing_replay("rollout", 0)
