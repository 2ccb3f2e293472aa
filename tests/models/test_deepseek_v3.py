"""DeepSeek-V3 against transformers' `DeepseekV3ForCausalLM` on the same tiny random weights.

One tiny random model serves the file (built by transformers in f32 with its eager
attention and eager experts): hidden 32, 3 layers (the first dense, `first_k_dense_replace`
1, then two mixtures of experts), 4 heads of multi-head latent attention (q latent 24, kv
latent 16, nope 8 + rope 8 per head, values 12, RoPE interleaved, YaRN 40x with DeepSeek's
mscale), 8 routed experts of width 16 in 4 groups, 2 groups kept, top 2, one shared
expert, routed_scaling_factor 2.5. Every parameter is redrawn, and so is the balancing
bias `e_score_correction_bias` (a buffer), so each feature moves the logits. Checked: the
logits on a left-padded batch in both expert forms, each DeepSeek feature moving them; save
-> transformers load -> the same tensors and logits, and our loader reads them back; our
sampler's greedy tokens equal transformers' `generate`.

Tolerance: the logits' scale is O(1-10); an f32 value here passes through some hundreds of
roundings of relative 6e-8 (three layers: norms, projections over at most 32 inputs,
softmaxes over at most 13 columns, 2 experts + 1 shared), which puts ours and
transformers' ~1e-6 of the scale apart; 1e-5 of the scale is the bound, and each variant
below moves the logits by more than 100 times it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import (
    assert_row_samplers_match_plain,
    assert_save_round_trip,
    hf_logits,
    left_padded_batch,
    randomize_adapters,
    rel_diff,
)
from flax import nnx
from tiny_deepseek import hf_model

from jaxrl_frontier.core import sharding
from jaxrl_frontier.models import hf, moe
from jaxrl_frontier.models.kv_cache import init_cache
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.sampling import Sampler, SamplingParams

REL_TOL = 1e-5  # max |ours - transformers| / max |logit| (module docstring)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(directory, torch model): the tiny random DeepSeek-V3 saved by transformers."""
    model = hf_model(seed=0)
    path = tmp_path_factory.mktemp("deepseek_v3")
    model.save_pretrained(path)
    return path, model


@pytest.fixture(scope="module")
def model(checkpoint):
    return hf.load(checkpoint[0])


def with_config(model, cfg, **params):
    """The model's weights under another config of the same shapes, with `params`
    ({'mlp.router_score_bias': value}) replacing MoE layer parameters."""
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    state = nnx.state(nnx.clone(model))
    for path, value in params.items():
        var = state["layers"]
        for part in path.split("."):
            var = var[part]
        var.set_value(np.full(var.get_value().shape, value, np.float32))
    return nnx.merge(nnx.graphdef(abstract), state)


def test_logit_parity_both_expert_forms_and_round_trip(checkpoint, model, tmp_path):

    path, torch_model = checkpoint
    cfg = model.cfg
    assert (cfg.family, cfg.first_k_dense_replace, cfg.num_experts) == ("deepseek_v3", 1, 8)
    assert (cfg.kv_lora_rank, cfg.q_lora_rank, cfg.rope_interleave) == (16, 24, True)
    assert (cfg.n_group, cfg.topk_group, cfg.shared_expert_intermediate_size) == (4, 2, 16)
    tokens, mask = left_padded_batch(length=12)
    ref = hf_logits(torch_model, tokens, mask)
    run = lambda m: np.asarray(jax.jit(lambda t, k: m(t, k))(tokens, mask))  # noqa: E731
    for impl in moe.EXPERT_IMPLS:
        diff = rel_diff(run(with_config(model, cfg.replace(moe_impl=impl))), ref, mask)
        print(f"{impl}: max |logit diff| / max |logit| = {diff:.1e}")
        assert diff < REL_TOL, impl

    # each DeepSeek feature moves the logits: the test is not blind to any of them
    variants = {
        "no group limit": with_config(model, cfg.replace(topk_group=4)),
        "no interleave": with_config(model, cfg.replace(rope_interleave=False)),
        "no YaRN": with_config(model, cfg.replace(rope_scaling=None)),
        "no scaling factor": with_config(model, cfg.replace(routed_scaling_factor=1.0)),
        "no correction bias": with_config(model, cfg, **{"mlp.router_score_bias": 0.0}),
        "no shared expert": with_config(model, cfg, **{"mlp.shared_down": 0.0}),
    }
    for name, other in variants.items():
        diff = rel_diff(run(other), ref, mask)
        print(f"{name}: {diff:.1e}")
        assert diff > 100 * REL_TOL, name

    assert_save_round_trip(model, torch_model, tmp_path, tokens, mask, REL_TOL)


PROMPTS = np.random.RandomState(1).randint(1, 128, size=(2, 6)).astype(np.int32)


def test_greedy_decode_equals_transformers(checkpoint, model):
    """10 greedy tokens after prompts of 6 (the sampler pads them to 8), the decode over the
    unstacked layers (the dense one, then the MoE ones) and their full per-head KV cache."""
    import torch

    sampler = Sampler(model, pad_id=0, prompt_buckets=(8,), record_routing=True)
    params = SamplingParams(max_new_tokens=10, greedy=True)
    rollout = sampler.generate(PROMPTS, np.ones_like(PROMPTS), params, jax.random.key(0))
    with torch.no_grad():
        ref = checkpoint[1].generate(
            torch.as_tensor(PROMPTS, dtype=torch.long), max_new_tokens=10, do_sample=False,
            attention_mask=torch.ones(PROMPTS.shape, dtype=torch.long), pad_token_id=0,
        )[:, 6:].numpy()  # fmt: skip
    np.testing.assert_array_equal(np.asarray(rollout.completion_tokens), ref)

    # the absorbed decode's log-probs are the full forward's (the learner's) up to f32
    # rounding, the cache holding R + Dr = 24 numbers per token and layer, not 2 H Dh = 128
    seq = rollout.sequences()
    logits = jax.jit(lambda t, m: model(t, m))(seq.tokens, seq.attention_mask)
    logp = jax.nn.log_softmax(logits[:, 7:-1], -1)
    full = np.take_along_axis(np.asarray(logp), np.asarray(seq.tokens)[:, 8:, None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(rollout.policy_logp), full, atol=1e-5)
    cfg = model.cfg
    latent, dense = model.init_cache(2, 18), init_cache(cfg.replace(kv_lora_rank=0), 2, 18)
    nbytes = lambda cache: sum(a.nbytes for a in cache.k + cache.v)  # noqa: E731
    per_token = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 4 * cfg.num_layers
    assert nbytes(latent) == 2 * 18 * per_token
    assert nbytes(dense) == 2 * 18 * 2 * cfg.num_heads * cfg.resolved_head_dim * 4 * cfg.num_layers
    print(f"cache bytes per token: latent {nbytes(latent) // 36}, full {nbytes(dense) // 36}")

    # routing replay: the experts the sampler recorded (MoE layers 1, 2; the dense layer 0
    # records none, -1) are the router's own in a full forward, and replayed ones are used
    routing = np.asarray(rollout.routing)  # [B, 8 + 10, L, k], -1 where nothing was fed
    assert (routing[:, :, 0] == -1).all()
    recorded = (routing[:, :, 1:] >= 0).all((-2, -1))
    graphdef, state = nnx.split(model)

    @jax.jit
    def experts_of(params, routing):
        m = nnx.merge(graphdef, params)
        stats = m.hidden_states(seq.tokens, seq.attention_mask, routing=routing, router_stats=True)
        return jnp.moveaxis(stats[2].experts, 0, 2), jnp.moveaxis(stats[2].own, 0, 2)

    own = np.asarray(experts_of(state, None)[0])
    np.testing.assert_array_equal(own[recorded], routing[recorded])
    flipped = np.where(recorded[:, :, None, None], (routing + 1) % 8, -1)
    used, router = (np.asarray(a)[:, :, 1:] for a in experts_of(state, flipped))
    np.testing.assert_array_equal(used[recorded], flipped[:, :, 1:][recorded])
    np.testing.assert_array_equal(used[~recorded], router[~recorded])  # no record: its own
    np.testing.assert_array_equal(router[:, :, 0], own[:, :, 1])  # layer 1's input: unmoved


def test_lora_on_latent_attention_decodes_and_exports(checkpoint, model, tmp_path):
    """Adapters on each latent-attention projection of every layer (q_a_proj, q_b_proj,
    kv_a_proj, kv_b_proj, o_proj) and on the dense first layer's gate_proj (the experts take
    none): with B = 0 the logits are the base's bitwise; with random B the unmerged forward
    equals the merged copy's, which saves and loads into transformers with the same logits
    (the parity bound); the absorbed decode, kv_b_proj's adapter folded into the query and
    the output, gives the full forward's greedy tokens and log-probs."""
    from transformers import AutoModelForCausalLM

    from jaxrl_frontier.models import lora

    targets = ("q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj", "o_proj", "gate_proj")
    graphdef, state = nnx.split(model)
    adapted_model = nnx.merge(graphdef, jax.tree.map(jnp.copy, state))
    lora.add_adapters(adapted_model, rank=2, alpha=4.0, targets=targets, key=jax.random.key(0))
    stacks = (adapted_model.dense_layers, adapted_model.layers)
    assert all(hasattr(s.attn, f"{t}_lora_a") for s in stacks for t in targets[:5])
    assert [hasattr(s.mlp, "gate_proj_lora_a") for s in stacks] == [True, False]
    with pytest.raises(ValueError, match=r"'k_proj', which .*LatentAttention.*'kv_b_proj'"):
        lora.add_adapters(model, rank=2, alpha=4.0, targets=("k_proj",), key=jax.random.key(0))
    tokens, mask = left_padded_batch(length=12)
    run = jax.jit(lambda m, t, k: m(t, k))
    base = np.asarray(run(model, tokens, mask))
    np.testing.assert_array_equal(np.asarray(run(adapted_model, tokens, mask)), base)
    randomize_adapters(adapted_model)
    adapted = np.asarray(run(adapted_model, tokens, mask))
    assert rel_diff(adapted, base, mask) > 100 * REL_TOL  # the adapters act
    merged = lora.merged(adapted_model)
    assert not lora.has_adapters(merged)
    assert rel_diff(np.asarray(run(merged, tokens, mask)), adapted, mask) < REL_TOL
    hf.save(merged, tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert rel_diff(hf_logits(back, tokens, mask), adapted, mask) < REL_TOL

    sampler = Sampler(adapted_model, pad_id=0, prompt_buckets=(8,))
    params = SamplingParams(max_new_tokens=10, greedy=True)
    rollout = sampler.generate(PROMPTS, np.ones_like(PROMPTS), params, jax.random.key(0))
    seq = rollout.sequences()
    logp = jax.nn.log_softmax(run(adapted_model, seq.tokens, seq.attention_mask)[:, 7:-1], -1)
    np.testing.assert_array_equal(np.argmax(logp, -1), np.asarray(rollout.completion_tokens))
    full = np.take_along_axis(np.asarray(logp), np.asarray(seq.tokens)[:, 8:, None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(rollout.policy_logp), full, atol=1e-5)


def test_continuous_partial_and_speculative_samplers_give_the_plain_decode(model):
    """The latent cache through the samplers that move rows: continuous batching (slots
    take rows at their own cache positions), partial rollouts and speculative rollouts (the policy's first 2
    layers, the dense one and an MoE one, as the draft; rejected drafts' latent slots
    rewritten) give the plain sampler's greedy tokens and log-probs."""
    from jaxrl_frontier.sampling import shallow_draft

    assert_row_samplers_match_plain(model, shallow_draft(model, 2), PROMPTS)
    with pytest.raises(ValueError, match=r"num_layers=1; must be in \[2, 3\]"):
        shallow_draft(model, 1)  # the dense layer alone: no MoE layer to stack


def test_expert_parallel_update_equals_one_device(model):
    """The update's form (grouped matmuls) with the experts split over 8 fake devices (one
    expert a device; the dense layer's MLP FSDP-sharded): the loss (with the router's
    load-balancing term) and every gradient equal one device's, and so does the greedy
    decode on the mesh."""
    mesh = sharding.make_mesh((1, 8, 1))
    ragged = with_config(model, model.cfg.replace(moe_impl="ragged"))
    graphdef, state = nnx.split(ragged)
    tokens, mask = map(jnp.asarray, left_padded_batch(batch=8, length=8))

    @jax.jit
    def loss_and_grads(params, tokens, mask):
        def loss(params):  # mean squared logits + the load-balancing loss (MoE layers)
            m = nnx.merge(graphdef, params)
            hidden, _, stats = m.hidden_states(tokens, mask, router_stats=True)
            balance = moe.router_losses(stats)["load_balance"]
            return jnp.mean(m.logits(hidden) ** 2) + 0.5 * balance

        return jax.value_and_grad(loss)(params)

    loss1, grads1 = loss_and_grads(state, tokens, mask)
    placed = jax.device_put(state, sharding.state_shardings(state, mesh))
    experts = placed["layers"]["mlp"]["expert_down"].get_value()
    assert experts.sharding.spec[1] == "fsdp"  # [L - 1, E, F, D]: the experts split
    loss8, grads8 = loss_and_grads(placed, *sharding.shard_batch((tokens, mask), mesh))
    # f32 sums in another order (psums over the devices): a few ulps of O(1) values
    np.testing.assert_allclose(loss8, loss1, rtol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads1), jax.tree.leaves(grads8)):
        name = jax.tree_util.keystr(path)
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6, rtol=1e-5, err_msg=name)
        if "router_score_bias" not in name:  # it only chooses experts: no gradient
            assert np.abs(np.asarray(a)).max() > 0, name

    params = SamplingParams(max_new_tokens=6, greedy=True)
    prompts = np.asarray(tokens), np.asarray(mask)
    one = Sampler(model, pad_id=0, prompt_buckets=(8,)).generate(
        *prompts, params, jax.random.key(0)
    )
    spread = Sampler(
        nnx.merge(nnx.graphdef(model), placed), pad_id=0, mesh=mesh, prompt_buckets=(8,)
    )
    eight = spread.generate(*prompts, params, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(eight.completion_tokens), one.completion_tokens)
    np.testing.assert_allclose(np.asarray(eight.policy_logp), one.policy_logp, atol=1e-5)


def test_config_mapping_and_parameter_count(checkpoint, model):
    torch_model = checkpoint[1]
    cfg = model.cfg
    assert hf.config_from_hf(hf.config_to_hf(cfg)) == cfg
    n = sum(p.numel() for p in torch_model.parameters())
    # ours also holds each MoE layer's balancing bias as a parameter (transformers: a buffer)
    assert hf.count_params(model) == cfg.num_params() == n + 2 * cfg.num_experts
    no_q_latent = hf.config_from_hf({**hf.config_to_hf(cfg), "q_lora_rank": None})
    assert no_q_latent.q_lora_rank == 0 and no_q_latent.num_params() < cfg.num_params()
    # the router's losses and metrics are over the 2 MoE layers, the dense one standing in
    # the [L] stack with no router
    _, _, stats = model.hidden_states(*map(jnp.asarray, left_padded_batch()), router_stats=True)
    assert stats.load.shape == (3, 8) and float(stats.assigned[0]) == 0
    moe_only = jax.tree.map(lambda a: a[1:], stats)
    for name, value in {**moe.router_losses(stats), **moe.router_metrics(stats)}.items():
        expected = {**moe.router_losses(moe_only), **moe.router_metrics(moe_only)}[name]
        np.testing.assert_allclose(value, expected, rtol=1e-6, err_msg=name)
    experts = jnp.moveaxis(stats.experts, 0, 2)
    other = experts.at[:, :, 1].set((experts[:, :, 1] + 1) % 8)  # layer 1 differs everywhere
    assert float(moe.routing_difference_share(experts, other)) == 0.5


def test_aux_loss_free_balancing_evens_the_load(model):
    """b_e += gamma sign(mean load - load_e): the formula on a small load, then 30 steps on
    one fixed batch of 256 tokens (gamma 0.02, the biases starting at 0) take the busiest
    MoE expert's load over the mean from above 1.6 to below 1.3 (measured 1.78 -> 1.09)."""
    bias, load = jnp.zeros((1, 4)), jnp.asarray([[0.0, 3.0, 1.0, 4.0]])  # mean 2
    step = np.float32(0.1) * np.array([[1, -1, 1, -1]], np.float32)
    np.testing.assert_array_equal(moe.balance_bias_update(bias, load, 0.1), step)

    m = with_config(model, model.cfg, **{"mlp.router_score_bias": 0.0})
    tokens = jnp.asarray(np.random.RandomState(3).randint(0, 128, size=(8, 32)), jnp.int32)
    graphdef = nnx.graphdef(m)

    @jax.jit
    def loads(params):
        stats = nnx.merge(graphdef, params).hidden_states(tokens, router_stats=True)[2]
        return stats

    def busiest(stats):  # max over the MoE layers of the busiest expert's load / mean
        load = np.asarray(stats.load[1:])
        return float((load.max(-1) / load.mean(-1)).max())

    stats = loads(nnx.state(m))
    before = busiest(stats)
    for _ in range(30):
        m.update_balance_bias(stats, gamma=0.02)
        stats = loads(nnx.state(m))
    print(f"busiest expert / mean load: {before:.2f} -> {busiest(stats):.2f}")
    assert before > 1.6 and busiest(stats) < 1.3


def test_shared_prompt_forward(model):
    """The update's shared-prompt forward (each group's prompt run once, latent attention's
    expanded heads attending to the group's prompt keys) equals the per-row forward."""
    rng = np.random.RandomState(5)
    prompt = np.repeat(rng.randint(1, 128, size=(2, 6)), 3, axis=0)  # 2 groups of 3 rows
    tokens = jnp.asarray(np.concatenate([prompt, rng.randint(1, 128, size=(6, 4))], 1))
    mask = jnp.ones_like(tokens)
    graphdef, state = nnx.split(model)

    @jax.jit
    def both(params):
        m = nnx.merge(graphdef, params)
        shared = m.hidden_states_shared_prompt(tokens, mask, prompt_len=6, group_size=3)
        return shared, m.hidden_states(tokens, mask)[0]

    shared, rows = map(np.asarray, both(state))
    np.testing.assert_allclose(shared, rows, atol=1e-5 * np.abs(rows).max())
