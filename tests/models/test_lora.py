"""LoRA (models/lora.py): the adapters live in the forward, train alone, checkpoint alone, and merge
into Hugging Face weights that transformers reads back with the adapted model's logits."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import FAST, RL, get_config, hf_logits, left_padded_batch
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.models import hf, lora
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.model_forms import unstack_layers
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.rl.learn.loss import with_base
from jaxrl_frontier.rl.learn.train_step import init_train_state
from jaxrl_frontier.run.config import validate
from jaxrl_frontier.train.checkpoint import Checkpointer

CFG = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2
)
ALL = tuple(lora.TARGETS)
forward = nnx.jit(lambda model, *args, **kw: model(*args, **kw))  # one compile, not op by op


def adapted(cfg=CFG, rank=4, alpha=8.0, targets=ALL, seed=0, b_scale=0.05):
    """(model with adapters whose B is random, so the update is not 0, base logits fn)."""
    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    lora.add_adapters(model, rank=rank, alpha=alpha, targets=targets, key=jax.random.key(seed))
    graphdef, state = nnx.split(model)
    adapters, base = lora.split(state)
    keys = iter(jax.random.split(jax.random.key(seed + 1), 64))

    def randomise(path, x):
        if "_lora_b" in jax.tree_util.keystr(path):
            return b_scale * jax.random.normal(next(keys), x.shape, x.dtype)
        return x

    adapters = jax.tree_util.tree_map_with_path(randomise, adapters)
    return nnx.merge(graphdef, lora.combine(base, adapters)), graphdef, base, adapters


def test_adapters_start_as_the_base_and_take_the_weight_axes():
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    tokens = jnp.arange(12).reshape(2, 6)
    before = np.asarray(forward(model, tokens))
    lora.add_adapters(model, rank=4, alpha=8.0, targets=ALL, key=jax.random.key(1))
    np.testing.assert_array_equal(
        np.asarray(forward(model, tokens)), before
    )  # B = 0: exactly the base
    attn, mlp = model.layers.attn, model.layers.mlp
    assert attn.q_proj_lora_a.shape == (2, 32, 4) and attn.q_proj_lora_b.shape == (2, 4, 4, 8)
    assert attn.o_proj_lora_a.shape == (2, 4, 8, 4) and attn.o_proj_lora_b.shape == (2, 4, 32)
    assert mlp.down_proj_lora_a.get_metadata()["logical_axes"] == ("layers", "mlp", None)
    assert mlp.down_proj_lora_b.get_metadata()["logical_axes"] == ("layers", None, "embed")
    assert attn.lora_scale == 2.0
    # PEFT's init of A: uniform in +-1/sqrt(fan_in)
    a = np.asarray(mlp.down_proj_lora_a[...])
    assert np.abs(a).max() <= 1 / np.sqrt(64) and np.abs(a).max() > 0.9 / np.sqrt(64)


def test_merged_weights_are_base_plus_scaled_a_b():
    model, _, base, adapters = adapted(rank=4, alpha=8.0)
    merged = lora.merged(model)
    assert not lora.has_adapters(merged) and lora.has_adapters(model)
    scale = 8.0 / 4
    for name, (sub, _) in lora.TARGETS.items():
        w0 = np.asarray(getattr(getattr(base["layers"], sub), name).get_value())
        a = np.asarray(getattr(getattr(model.layers, sub), f"{name}_lora_a")[...])
        b = np.asarray(getattr(getattr(model.layers, sub), f"{name}_lora_b")[...])
        for layer in range(CFG.num_layers):
            a2 = a[layer].reshape(-1, a.shape[-1])  # [in, r]
            b2 = b[layer].reshape(b.shape[1], -1)  # [r, out]
            want = w0[layer] + scale * (a2 @ b2).reshape(w0[layer].shape)
            got = np.asarray(getattr(getattr(merged.layers, sub), name)[...])[layer]
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=name)
    tokens = jnp.arange(12).reshape(2, 6) % 64
    np.testing.assert_allclose(forward(merged, tokens), forward(model, tokens), atol=1e-5)
    # the model keeps its own adapters and weights
    w_after = model.layers.attn.q_proj[...]
    np.testing.assert_array_equal(w_after, base["layers"]["attn"]["q_proj"].get_value())


def test_only_the_targets_get_adapters():
    model, *_ = adapted(targets=("q_proj", "down_proj"))
    names = {
        jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.LoRAParam))
    }
    assert {n.split("'")[-2] for n in names} == {
        "q_proj_lora_a",
        "q_proj_lora_b",
        "down_proj_lora_a",
        "down_proj_lora_b",
    }
    with pytest.raises(ValueError, match=r"model\.lora\.targets.*unknown \['qkv'\]"):
        lora.check_targets(("q_proj", "qkv"))


def test_gradient_touches_only_adapters_and_the_reference_is_the_base():
    model, graphdef, base, adapters = adapted()
    tokens = jnp.arange(16).reshape(2, 8) % 64

    def loss_of(params, batch, denominator=None, frozen=None):
        return jnp.mean(nnx.merge(graphdef, params)(batch) ** 2), {}

    adapters_loss = lambda a: with_base(loss_of)(a, tokens, frozen={"base": base})[0]
    grads = jax.jit(jax.grad(adapters_loss))(adapters)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(grads)]
    assert len(paths) == 2 * len(ALL) and all("_lora_" in p for p in paths)
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))
    # the full gradient's adapter part is the same: the base is only read
    full = jax.jit(jax.grad(lambda p: loss_of(p, tokens)[0]))(lora.combine(base, adapters))
    # Two programs sum the same products in other orders: each element is off by at most
    # ~n eps of the largest terms it sums (n <= 64, the widest contraction here, eps = 2^-23),
    # so the bound scales with the leaf's magnitude, not each element's (an element near 0 has
    # no relative precision to keep).
    for g, f in zip(jax.tree.leaves(grads), jax.tree.leaves(lora.split(full)[0])):
        np.testing.assert_allclose(g, f, rtol=1e-6, atol=64 * 2**-23 * float(np.abs(f).max()))
    # reference = the base's own arrays (no copy) with B = 0: the base model's logits
    ref = lora.reference(base, adapters)
    ref_base = lora.split(ref)[1]
    assert all(x is y for x, y in zip(jax.tree.leaves(ref_base), jax.tree.leaves(base)))
    plain = Transformer(CFG, rngs=nnx.Rngs(0))  # the same seed: the same base weights
    np.testing.assert_array_equal(forward(nnx.merge(graphdef, ref), tokens), forward(plain, tokens))


def test_the_decode_path_runs_the_adapters_unmerged():
    """The sampler's decode runs `unstack_layers(model)` over a KV cache: with adapters in
    the forward its logits are the merged model's, with no merge."""
    model, graphdef, base, adapters = adapted()
    tokens = jnp.arange(10).reshape(2, 5) % 64

    @nnx.jit
    def decode_step(m):  # prefill 5 tokens, then one cached step
        logits, cache = m(tokens, cache=m.init_cache(2, 8))
        return m(tokens[:, -1:], positions=jnp.full((2, 1), 5), cache=cache)[0]

    got = decode_step(unstack_layers(model))
    np.testing.assert_allclose(got, decode_step(lora.merged(model)), atol=1e-5)
    base_step = decode_step(nnx.merge(graphdef, lora.reference(base, adapters)))
    assert float(jnp.abs(got - base_step).max()) > 1e-3


def _disk_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def test_checkpoint_holds_the_adapters_and_their_optimizer_state(tmp_path):
    """On disk a LoRA checkpoint is the adapters' bytes x 3 (params, Adam's mu and nu), the
    model's without LoRA its weights' x 3 (~1/20 here, at rank 4 on every projection)."""
    cfg = CFG.replace(vocab_size=256, hidden_size=128, intermediate_size=384)
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    tx = optax.adamw(1e-3)
    _, _, base, adapters = adapted(cfg, rank=4)
    noise = lambda t: jax.tree.map(lambda x: jax.random.normal(jax.random.key(3), x.shape), t)
    sizes = {}
    for name, params in (("full", base), ("lora", adapters)):  # full: the model without LoRA
        params = jax.device_put(params, sharding.state_shardings(params, mesh))
        state = init_train_state(tx, params, mesh, jax.random.key(0))
        state = state.replace(opt_state=noise(state.opt_state))  # incompressible, as trained
        ckpt = Checkpointer(str(tmp_path / name), async_save=False)
        ckpt.save(1, state, {})
        ckpt.close()
        sizes[name] = (_disk_bytes(tmp_path / name), 3 * lora.num_bytes(params))
    # rank r on q, k, v, o, gate, up, down of 2 layers: r x (in + out) each, f32
    d, f, r, hd = 128, 384, 4, 32
    per_layer = r * ((d + 4 * hd) + 2 * (d + 2 * hd) + (4 * hd + d) + 3 * (d + f))
    assert lora.num_bytes(adapters) == 4 * 2 * per_layer
    # orbax's zstd takes ~10% off random f32; its metadata is tens of kB
    for name, (disk, payload) in sizes.items():
        assert 0.8 * payload <= disk <= payload + 100_000, (name, disk, payload)
    assert sizes["lora"][0] < sizes["full"][0] / 5


def test_merged_export_loads_in_transformers_with_the_adapted_logits(hf_checkpoints, tmp_path):
    from transformers import AutoModelForCausalLM

    path, _ = hf_checkpoints("qwen2")
    model = hf.load(path)
    lora.add_adapters(model, rank=4, alpha=8.0, targets=ALL, key=jax.random.key(0))
    graphdef, state = nnx.split(model)
    adapters, base = lora.split(state)
    adapters = jax.tree_util.tree_map_with_path(
        lambda p, x: (
            0.1 * jax.random.normal(jax.random.key(7), x.shape)
            if "_lora_b" in jax.tree_util.keystr(p)
            else x
        ),
        adapters,
    )
    model = nnx.merge(graphdef, lora.combine(base, adapters))
    tokens, mask = left_padded_batch()
    ours = np.asarray(forward(model, tokens, mask))
    base_logits = np.asarray(
        forward(nnx.merge(graphdef, lora.reference(base, adapters)), tokens, mask)
    )
    real = mask.astype(bool)
    assert np.abs(ours - base_logits)[real].max() > 1e-2  # the adapters move the logits
    out = tmp_path / "merged"
    hf.save(lora.merged(model), out, base_config=hf.read_config(path))
    torch_model = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    got = hf_logits(torch_model, tokens, mask)
    assert np.abs(got - ours)[real].max() < 1e-4


def test_lora_config_checks():
    c = get_config("grpo_arith_lora")
    validate(c, num_devices=1)
    c.mode = "sft"
    with pytest.raises(ConfigError, match=r"'model\.lora\.rank' = 8: adapters train in mode='rl'"):
        validate(c, num_devices=1)
    c = get_config("grpo_arith_lora", {"model.lora.alpha": 0.0})
    with pytest.raises(ConfigError, match=r"'model\.lora\.alpha' = 0\.0"):
        validate(c, num_devices=1)


def test_lora_rl_run_trains_adapters_only(tmp_path):
    """Two RL steps: the state and its optimizer hold adapters only, the base weights stay
    bitwise as built, the adapters move, the export is base + scaled A B."""
    from jaxrl_frontier.run.trainer import Trainer

    c = get_config("grpo_arith_lora", {**FAST, **RL, "train.steps": 2})
    tr = Trainer(c, str(tmp_path))
    base0 = [np.asarray(x) for x in jax.tree.leaves(tr.roles.base_params)]
    adapters0 = [np.asarray(x) for x in jax.tree.leaves(tr.state.params)]
    summary = tr.run()
    assert summary["step"] == 2 and int(tr.state.skipped) == 0
    paths = [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tr.state.params)
    ]
    assert paths and all("_lora_" in p for p in paths)
    mu = tr.state.opt_state[1][0].mu  # clip_by_global_norm, adamw's scale_by_adam
    assert jax.tree.structure(mu) == jax.tree.structure(tr.state.params)
    for x, y in zip(base0, jax.tree.leaves(tr.roles.base_params)):
        np.testing.assert_array_equal(x, y)
    moved = [
        float(np.abs(x - np.asarray(y)).max())
        for x, y in zip(adapters0, jax.tree.leaves(tr.state.params))
    ]
    assert max(moved) > 0
    exported = hf.load(os.path.join(tmp_path, "export"))
    want = lora.merged(nnx.merge(tr.roles.graphdef, tr.step.learner.policy_params()))
    for x, y in zip(jax.tree.leaves(nnx.state(exported)), jax.tree.leaves(nnx.state(want))):
        np.testing.assert_allclose(x, y, atol=1e-6)


def test_adapters_are_sharded_like_their_weights():
    """On a (1, fsdp 4, tensor 2) mesh of fake devices: A's input dims and B's output dims
    take the weight's mesh axes, the rank axis is replicated."""
    from jax.sharding import PartitionSpec as Spec

    mesh = sharding.make_mesh((1, 4, 2), jax.devices()[:8])
    model = Transformer(CFG, rngs=nnx.Rngs(0))
    lora.add_adapters(model, rank=4, alpha=8.0, targets=ALL, key=jax.random.key(1))
    sharding.shard_model(model, mesh)
    attn, mlp = model.layers.attn, model.layers.mlp
    spec = lambda v: v[...].sharding.spec
    assert spec(attn.q_proj) == Spec(None, "fsdp", "tensor", None)
    assert spec(attn.q_proj_lora_a) == Spec(None, "fsdp", None)
    assert spec(attn.q_proj_lora_b) == Spec(None, None, "tensor", None)
    assert spec(attn.o_proj_lora_a) == Spec(None, "tensor", None, None)
    assert spec(mlp.down_proj_lora_b) == Spec(None, None, "fsdp")
