"""Ring attention (`model.attention = 'ring'`, `attention.ring_attention`) over the mesh's
`sequence` axis, on 8 fake CPU devices:

- its output and its gradient w.r.t. q, k, v equal 'xla' on the same mesh (f32, rtol 1e-5)
  at sequence 4 (alone, with fsdp 2, with tensor 2): causal with padding, packed rows
  (segment ids), a sliding window narrower than a block (skipped blocks), soft-capped
  scores with a scale, attention sinks (GPT-OSS: each joins its query's denominator once,
  not once per block of the ring; with heads over `tensor`, each device's own heads'),
  grouped-query heads throughout;
- without a sequence axis it is 'xla' (no collective in the program, the same values);
- a Gemma-2-shaped Transformer (sliding and full layers, soft-cap) with 'ring' on
  fsdp 2 x sequence 4 gives one device's hidden states and parameter gradient, on padded
  and on packed rows;
- rows the axis does not divide are a ValueError naming `model.attention`; 'ring' is a
  valid `model.attention`.
(`test_context_parallel.py` measures the compiled update's temporaries at 16k tokens.)
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SMALL_MODEL, random_model
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.models import attention as attn
from jaxrl_frontier.models.model_config import ModelConfig

B, T, H, K, DH = 2, 16, 4, 2, 8  # 4 positions a device at sequence 4; 2 query heads a kv head
FSDP_SEQ, SEQ, SEQ_TENSOR = (1, 2, 4, 1), (1, 1, 4, 1), (1, 1, 4, 2)
# two packed rows: segments 1.., 0 on empty slots (a trailing empty run, one at the start)
SEGMENTS = np.array(
    [[0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 3], [1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0]],
    np.int32,
)  # fmt: skip


def _mesh(shape):
    return sharding.make_mesh(shape, jax.devices()[: int(np.prod(shape))])


def _inputs(mesh, case):
    """q, k, v [B, T, ., DH] and the RowMask of `case`, placed rows over fsdp, positions
    over sequence."""
    rng = np.random.default_rng(0)
    q = rng.normal(size=(B, T, H, DH)).astype(np.float32)
    k, v = (rng.normal(size=(B, T, K, DH)).astype(np.float32) for _ in range(2))
    valid = np.ones((B, T), bool)
    valid[0, :3] = False  # a left-padded prompt
    valid[1, 11:] = False  # a right-padded completion
    seg = SEGMENTS if case == "packed" else None
    if seg is not None:
        valid = seg > 0
    put = lambda x: jax.device_put(x, sharding.activation_sharding(mesh, x, positions=True))  # noqa: E731
    seg = None if seg is None else put(seg)
    window = jnp.int32(3) if case == "window" else None  # < 4 positions a block: some skipped
    return (put(q), put(k), put(v)), attn.RowMask(put(valid), seg, window)


# per case, `attention`'s score options (sinks as a tuple: the programs are cached by them)
SCORES = {"softcap": dict(softcap=2.0, scale=0.3), "sinks": dict(sinks=(-1.0, 0.5, 2.0, 4.0))}


@functools.cache
def _program(impl, scores=()):
    """jit of (masked weighted sum of the output, output) and its gradient w.r.t. q, k, v;
    the sum reads only queries that see a key (a padding query: 0 under 'ring', the row's
    mean value under 'xla', never read by the model)."""

    options = {k: jnp.asarray(v) if isinstance(v, tuple) else v for k, v in scores}

    def loss(q, k, v, mask):
        out = attn.attention(q, k, v, mask, impl=impl, **options)
        seen = mask.bias()[:, 0, 0].max(-1) > -1  # [B, T]: the query sees some key
        weights = jnp.cos(jnp.arange(out.size, dtype=jnp.float32)).reshape(out.shape)
        return jnp.sum(jnp.where(seen[..., None, None], out * weights, 0.0)), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


@pytest.mark.parametrize(
    "shape, case",
    [
        (SEQ, "padded"),
        (FSDP_SEQ, "padded"),
        (SEQ_TENSOR, "padded"),
        (FSDP_SEQ, "packed"),
        (FSDP_SEQ, "window"),
        (FSDP_SEQ, "softcap"),
        (SEQ_TENSOR, "sinks"),
    ],
    ids=["seq4", "fsdp2_seq4", "seq4_tensor2", "packed", "window", "softcap", "sinks"],
)
def test_ring_equals_xla_output_and_gradient(shape, case):
    mesh = _mesh(shape)
    (q, k, v), mask = _inputs(mesh, case)
    scores = tuple(SCORES.get(case, {}).items())
    (l0, out0), g0 = _program("xla", scores)(q, k, v, mask)
    (l1, out1), g1 = _program("ring", scores)(q, k, v, mask)
    seen = np.asarray(mask.bias()[:, 0, 0].max(-1) > -1)
    assert not seen.all()  # padding queries are there, and left out below
    # f32 softmax over at most 16 keys, summed in another order: ~1e-7 apart
    np.testing.assert_allclose(np.asarray(out1)[seen], np.asarray(out0)[seen], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5)
    for name, a, b in zip("qkv", g0, g1, strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=2e-6, err_msg=name)
    assert out1.sharding.spec[1] == "sequence"  # the output stays split by position


def test_ring_without_a_sequence_axis_is_xla():
    """On fsdp 2 (sequence 1) 'ring' runs 'xla': no collective-permute, the same values."""
    mesh = _mesh((1, 2, 1, 1))
    (q, k, v), mask = _inputs(mesh, "packed")
    ring = _program("ring")
    assert "collective-permute" not in ring.lower(q, k, v, mask).compile().as_text()
    (l0, out0), g0 = _program("xla")(q, k, v, mask)
    (l1, out1), g1 = ring(q, k, v, mask)
    np.testing.assert_array_equal(np.asarray(out1), np.asarray(out0))
    for a, b in zip(g0, g1, strict=True):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


def test_rows_the_axis_does_not_divide_are_a_value_error():
    mesh = _mesh(SEQ)
    x = jnp.zeros((1, 6, 2, 4))
    with pytest.raises(ValueError, match=r"model.attention='ring'.* must divide the rows' 6"):
        attn.ring_attention(x, x, x, attn.RowMask(jnp.ones((1, 6), bool)), mesh)


# Gemma-2-shaped: a sliding layer (window 3) and a full one, soft-capped scores, a query
# pre-attention scalar; every path of the ring in one model
GEMMA = dict(
    layer_types=("sliding_attention", "full_attention"),
    sliding_window=3,
    attn_logit_softcap=5.0,
    query_pre_attn_scalar=16.0,
)


@functools.cache
def _model_program(packed):
    """jit of value-and-gradient w.r.t. the parameters of a masked sum of the hidden
    states, with the hidden states (the graphdef, with its config, static)."""

    def loss(params, graphdef, tokens, mask, segments, positions):
        model = nnx.merge(graphdef, params)
        seg = segments if packed else None
        hidden, _ = model.hidden_states(tokens, mask, positions=positions, segment_ids=seg)
        weights = jnp.sin(jnp.arange(hidden.size, dtype=jnp.float32)).reshape(hidden.shape)
        return jnp.sum(hidden * weights * mask[..., None]), hidden

    return jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)


def _rows(packed):
    """(tokens, mask, segment ids, positions) [B, T]: padded rows (a left-padded prompt, a
    right-padded completion) or the packed rows of SEGMENTS (positions restart in each)."""
    segments = SEGMENTS
    if packed:
        mask = (segments > 0).astype(np.int32)
        starts = np.concatenate([np.ones((B, 1), bool), segments[:, 1:] != segments[:, :-1]], 1)
        index = np.broadcast_to(np.arange(T), (B, T))
        positions = index - np.maximum.accumulate(np.where(starts, index, 0), axis=1)
    else:
        mask = np.ones((B, T), np.int32)
        mask[0, :3] = 0
        mask[1, 11:] = 0
        positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
    tokens = np.where(mask, np.random.default_rng(1).integers(1, 64, (B, T)), 0)
    return tokens.astype(np.int32), mask, segments, positions.astype(np.int32)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_model_with_ring_on_a_sequence_axis_equals_one_device(packed):
    from jaxrl_frontier.models.transformer import Transformer

    cfg = ModelConfig(vocab_size=64, **SMALL_MODEL, **GEMMA)
    graphdef, params = nnx.split(random_model(cfg))
    ring_cfg = cfg.replace(attention="ring")
    ring_graphdef = nnx.graphdef(nnx.eval_shape(lambda: Transformer(ring_cfg, rngs=nnx.Rngs(0))))
    rows = _rows(packed)
    (l0, h0), g0 = _model_program(packed)(params, graphdef, *rows)

    mesh = _mesh(FSDP_SEQ)
    placed = jax.device_put(params, sharding.state_shardings(params, mesh))
    data = sharding.shard_batch(rows, mesh)
    program = _model_program(packed).lower(placed, ring_graphdef, *data).compile()
    assert "collective-permute" in program.as_text()  # the ring's hops
    (l1, h1), g1 = program(placed, *data)
    real = rows[1].astype(bool)
    np.testing.assert_allclose(np.asarray(h1)[real], np.asarray(h0)[real], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)


def test_ring_is_a_valid_model_attention_key():
    from jaxrl_frontier.run import build
    from jaxrl_frontier.run.config import base_config, validate

    c = base_config()
    c.model.attention = "ring"
    c.mesh.sequence = 4
    validate(c, num_devices=8)
    assert build.model_config_from(c, build.build_tokenizer(c)).attention == "ring"
