"""Sharding on 8 fake CPU devices (tests/conftest.py sets the XLA flag): sharded forwards
equal the single-device forward, weights really are split, hf.load places tensors sharded,
and bad meshes / batches fail with clear errors.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import left_padded_batch, random_model
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxrl_frontier.core import sharding
from jaxrl_frontier.models import hf
from jaxrl_frontier.models.model_config import ModelConfig

pytestmark = pytest.mark.skipif(
    jax.device_count() < 8,
    reason="needs 8 devices: XLA_FLAGS=--xla_force_host_platform_device_count=8 must be set "
    "before jax is imported (tests/conftest.py does it)",
)

# hidden 64, 4 heads, 2 kv heads, mlp 128, vocab 128: on a tensor axis of 4 the kv heads do
# not divide and stay replicated, everything else splits.
CFG = ModelConfig(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    qkv_bias=True,
    family="qwen2",
)
MESHES = [(8, 1, 1), (2, 2, 2), (1, 2, 4)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random qwen2-shaped checkpoint written by hf.save (no torch needed here)."""
    path = tmp_path_factory.mktemp("qwen2")
    hf.save(random_model(CFG, seed=3), path)
    return path


@pytest.fixture(scope="module")
def batch():
    return left_padded_batch(batch=8, length=10, seed=4)


@pytest.fixture(scope="module")
def reference_logits(checkpoint, batch):
    """Single-device (default placement) logits [B, T, V]."""
    model = hf.load(checkpoint)
    assert all(
        x.sharding.device_set == {jax.devices()[0]}
        for x in jax.tree.leaves(nnx.state(model, nnx.Param))
    )
    tokens, mask = batch
    fwd = nnx.jit(lambda m, t, a: m(t, a))
    return np.asarray(fwd(model, jnp.asarray(tokens), jnp.asarray(mask)))


def _param(model, *path):
    return dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))[tuple(path)]


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s)))
def test_sharded_forward_matches_single_device(shape, checkpoint, batch, reference_logits):
    mesh = sharding.make_mesh(shape)
    model = hf.load(checkpoint, mesh=mesh)  # placed directly into the mesh's shardings
    tokens, mask = batch
    logits = sharding.sharded_forward(model, mesh)(tokens, mask)

    assert logits.sharding.spec[0] is not None or shape[:2] == (1, 1)  # batch is split
    real = mask.astype(bool)
    diff = np.abs(np.asarray(logits) - reference_logits)[real].max()
    assert diff < 1e-5, f"mesh {shape}: sharded logits differ by {diff}"


def test_weights_are_split_2x2x2(checkpoint):
    mesh = sharding.make_mesh((2, 2, 2))
    model = hf.load(checkpoint, mesh=mesh)
    expected = {
        # [V, D]: the vocabulary over tensor x fsdp (vocab-parallel lookup and logits)
        ("embed",): P(("tensor", "fsdp"), None),
        # stacked layers [L, ...]: the layers axis is not split
        ("layers", "mlp", "gate_proj"): P(None, "fsdp", "tensor"),  # [L, D, F]
        ("layers", "mlp", "down_proj"): P(None, "tensor", "fsdp"),  # [L, F, D]
        ("layers", "attn", "q_proj"): P(None, "fsdp", "tensor", None),  # [L, D, H, Dh]
        ("layers", "attn", "k_proj"): P(None, "fsdp", "tensor", None),  # [L, D, K, Dh]
        ("layers", "attn", "o_proj"): P(None, "tensor", None, "fsdp"),  # [L, H, Dh, D]
        ("layers", "attn", "q_bias"): P(None, "tensor", None),  # [L, H, Dh]
        ("lm_head",): P(None, ("tensor", "fsdp")),  # [D, V]
        ("final_norm", "weight"): P(None),  # replicated
    }
    for path, spec in expected.items():
        x = _param(model, *path).get_value()
        assert x.sharding.spec == spec, (path, x.sharding.spec)
    for path in [("embed",), ("layers", "mlp", "gate_proj"), ("layers", "attn", "q_proj")]:
        x = _param(model, *path).get_value()
        shard = x.addressable_shards[0].data.shape
        assert np.prod(shard) == np.prod(x.shape) // 4, (path, shard, x.shape)
        assert all(s <= f for s, f in zip(shard, x.shape)) and shard != x.shape
    # describe() reports the same specs for logging
    described = sharding.describe(nnx.state(model))["layers.mlp.gate_proj"]
    assert described == str(P(None, "fsdp", "tensor"))


def test_indivisible_dims_replicate_1x2x4(checkpoint):
    """kv heads (2) do not divide tensor=4: replicated on that axis; hf.load and
    shard_model agree on every placement."""
    mesh = sharding.make_mesh((1, 2, 4))
    loaded = hf.load(checkpoint, mesh=mesh)
    k = _param(loaded, "layers", "attn", "k_proj").get_value()
    assert k.sharding.spec == P(None, "fsdp", None, None)
    q = _param(loaded, "layers", "attn", "q_proj").get_value()
    assert q.sharding.spec == P(None, "fsdp", "tensor", None)
    assert q.addressable_shards[0].data.shape == (2, 32, 1, 16)  # both layers, their shard

    placed = sharding.shard_model(hf.load(checkpoint), mesh)
    a = nnx.to_flat_state(nnx.state(loaded, nnx.Param))
    b = dict(nnx.to_flat_state(nnx.state(placed, nnx.Param)))
    for path, var in a:
        x, y = var.get_value(), b[path].get_value()
        assert x.sharding.spec == y.sharding.spec, path
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(path))


def test_sharded_model_saves_back(checkpoint, tmp_path, batch):
    """Saving gathers the shards: the saved tensors equal the loaded ones."""
    mesh = sharding.make_mesh((1, 2, 4))
    hf.save(hf.load(checkpoint, mesh=mesh), tmp_path)
    from safetensors.numpy import load_file

    a, b = load_file(checkpoint / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_mesh_errors():
    with pytest.raises(ValueError, match=r"does not divide the 8 available devices"):
        sharding.make_mesh((3, 1, 1))
    with pytest.raises(ValueError, match=r"uses 4 devices, but 8 are available"):
        sharding.make_mesh((2, 2, 1))
    with pytest.raises(ValueError, match=r"at most one entry may be -1"):
        sharding.make_mesh((-1, -1, 2))
    with pytest.raises(ValueError, match=r"must have 4 entries .* \(or 3: "):
        sharding.make_mesh((8, 1))
    with pytest.raises(ValueError, match=r"unknown mesh axes \['model'\]"):
        sharding.make_mesh({"model": 8})
    assert dict(sharding.make_mesh({"fsdp": 2, "data": -1}).shape) == {
        "data": 4,
        "fsdp": 2,
        "sequence": 1,
        "tensor": 1,
    }
    mesh = sharding.make_mesh((2, 2, 2))
    with pytest.raises(ValueError, match=r"batch dimension 6 is not divisible by the 4 devices"):
        sharding.shard_batch(np.zeros((6, 3)), mesh)


def test_a_population_axis_is_an_outer_block_of_the_mesh():
    """mesh population P > 1: an outermost 'population' axis of P blocks of consecutive
    devices, each of the given shape (its -1 takes the rest of a block); P = 1 leaves the
    four-axis mesh as it was. Logical rules never name it, so every spec replicates over it;
    the sampler's fold of the sequence axis keeps it."""
    plain = sharding.make_mesh((2, 2, 2))
    assert plain.axis_names == sharding.MESH_AXES and sharding.population_axis(plain) is None
    mesh = sharding.make_mesh((-1, 2, 1), population=2)
    assert dict(mesh.shape) == dict(population=2, data=2, fsdp=2, sequence=1, tensor=1)
    assert sharding.population_axis(mesh) == "population"
    assert list(mesh.devices[1].flat) == jax.devices()[4:]  # member block 1: devices 4..7
    assert sharding.make_mesh({"population": 4, "fsdp": 2}).shape["population"] == 4
    rows = sharding.logical_to_spec(("batch", None), (8, 32), mesh)
    assert rows == jax.sharding.PartitionSpec(("data", "fsdp"), None)
    assert sharding.logical_to_spec(("embed", "mlp"), (32, 64), mesh)[0] == "fsdp"
    assert sharding.batch_size_multiple(mesh) == 4  # a member's rows: its block's batch axes
    folded = sharding.fold_sequence(sharding.make_mesh((1, 2, 2, 1), population=2))
    assert dict(folded.shape) == dict(population=2, data=1, fsdp=4, sequence=1, tensor=1)
    assert list(folded.devices.flat) == jax.devices()
    with pytest.raises(ValueError, match=r"population axis 3 must be >= 1 and divide the 8"):
        sharding.make_mesh((-1, 1, 1), population=3)


def test_fsdp_gradient_keeps_no_full_weight_copy_per_device():
    """Stacked layers scanned under FSDP: the compiled gradient step on 8 fsdp devices holds
    each layer's gathered weights only while that layer runs, so its per-device temporaries
    are a few layers' weights, far under one full copy (with every layer gathered at once
    they hold at least one); each parameter's shard is 1/8 of it; same gradients."""
    cfg = ModelConfig(
        vocab_size=256,
        hidden_size=256,
        intermediate_size=1024,
        num_layers=16,
        num_heads=4,
        num_kv_heads=2,
        tie_word_embeddings=True,
    )
    model = random_model(cfg, seed=0)
    tokens, mask = left_padded_batch(batch=8, length=16, seed=0, vocab=cfg.vocab_size)

    def temps_and_grads(mesh):
        placed = sharding.shard_model(nnx.clone(model), mesh)
        graphdef, state = nnx.split(placed)
        param_sh = sharding.state_shardings(state, mesh)

        def loss(state, tokens, mask):
            logits = nnx.merge(graphdef, state)(tokens, mask)
            return jnp.mean(jax.nn.logsumexp(logits, axis=-1))

        step = jax.jit(jax.grad(loss), out_shardings=param_sh)
        data = sharding.shard_batch((tokens, mask), mesh)
        compiled = step.lower(state, *data).compile()
        return state, compiled.memory_analysis().temp_size_in_bytes, compiled(state, *data)

    weights = 4 * cfg.num_params()  # f32
    _, temps_1, grads_1 = temps_and_grads(sharding.make_mesh((1, 1, 1), jax.devices()[:1]))
    state_8, temps_8, grads_8 = temps_and_grads(sharding.make_mesh((1, 8, 1)))
    one_layer = 4 * (cfg.num_params() - cfg.vocab_size * cfg.hidden_size) // cfg.num_layers
    # buffers of the sharded weights' size (the scan's stacked residuals and gradients) and
    # a few layers' gathered weights (forward, backward, a layer's full gradient before its
    # reduce-scatter); not the 16 layers' full copy
    assert temps_8 < 2 * weights / 8 + 4 * one_layer, (temps_8, weights, one_layer)
    assert temps_8 < 0.4 * weights, (temps_8, weights)
    assert temps_8 < temps_1 / 4, (temps_8, temps_1)
    for path, var in nnx.to_flat_state(state_8):
        x = var.get_value()
        shard = x.addressable_shards[0].data
        if any("norm" in str(p) for p in path):  # norm scales: replicated (1-D per layer)
            continue
        assert shard.size * 8 == x.size, (path, shard.shape, x.shape)  # split 8-way
        if path[0] == "layers":
            assert shard.shape[0] == cfg.num_layers  # the layers axis itself is not split
    for a, b in zip(jax.tree.leaves(grads_1), jax.tree.leaves(grads_8)):  # same gradients
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=1e-6)


def test_gather_to_local_mesh_moves_the_values_on_device(checkpoint, count_compiles):
    """Weights on an fsdp mesh -> a mesh of the same devices in another shape (here, one
    process: every device is this process's), through the mesh stacked on a 'process' axis:
    the same values, laid out by the target mesh's rules; a target whose devices the
    stacking cannot place (another order) goes through the host and ends the same."""
    state = nnx.state(hf.load(checkpoint, mesh=sharding.make_mesh((1, 8, 1))))
    pool = list(jax.tree.leaves(state)[0].sharding.mesh.devices.flat)
    targets = {
        "stacked": sharding.make_mesh((2, 1, 4), pool),
        "host": sharding.make_mesh((2, 1, 4), pool[::-1]),
    }
    assert sharding.process_stacked_mesh(targets["stacked"], pool).shape == dict(
        process=1, data=2, fsdp=1, sequence=1, tensor=4
    )
    assert sharding.process_stacked_mesh(targets["host"], pool) is None
    for mesh in targets.values():
        moved = sharding.gather_to_local_mesh(state, mesh)
        want = sharding.state_shardings(state, mesh)
        for a, b, s in zip(jax.tree.leaves(state), jax.tree.leaves(moved), jax.tree.leaves(want)):
            assert b.sharding == s
            np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
    with count_compiles() as seen:  # the next step's gather: compiled once, reused
        sharding.gather_to_local_mesh(state, targets["stacked"])
    assert seen == []


def test_fold_sequence_keeps_the_devices_and_their_weight_split():
    """The rollouts' mesh (`fold_sequence`): data 1 x fsdp 2 x sequence 4 -> fsdp 8 on the
    same devices in the same order, so a weight split over ('fsdp', 'sequence') lands on the
    same device with the same slice, and 8 rows split one a device instead of repeating."""
    mesh = sharding.make_mesh((1, 2, 4, 1))
    folded = sharding.fold_sequence(mesh)
    assert dict(folded.shape) == dict(data=1, fsdp=8, sequence=1, tensor=1)
    assert folded.devices.ravel().tolist() == mesh.devices.ravel().tolist()
    assert sharding.fold_sequence(folded) is folded
    w = np.arange(16.0 * 3).reshape(16, 3)
    on_train = jax.device_put(w, jax.sharding.NamedSharding(mesh, P(("fsdp", "sequence"))))
    on_folded = jax.device_put(w, jax.sharding.NamedSharding(folded, P("fsdp")))
    for a, b in zip(on_train.addressable_shards, on_folded.addressable_shards, strict=True):
        assert a.device == b.device
        np.testing.assert_array_equal(a.data, b.data)
    rows = sharding.shard_batch({"tokens": np.arange(8)[:, None]}, folded)["tokens"]
    assert sorted(int(s.data[0, 0]) for s in rows.addressable_shards) == list(range(8))
