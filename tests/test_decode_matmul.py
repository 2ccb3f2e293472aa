"""The C++ decode-matmul kernel against `x @ w`, the packed model against the plain one, the
Sampler with the kernel against the Sampler with XLA's matmuls, and when it is (not) used.

Shapes cover each code path of `decode_matmul.cc`: row counts that are and are not
multiples of its 6-row tile (1 to 130), one panel and many, K from 1 to 1536, and work small
enough to run on the calling thread and large enough to be shared out over the pool.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import left_padded_batch
from flax import nnx

from jaxrl_frontier import sharding as shd
from jaxrl_frontier.kernels import decode_matmul as kernel
from jaxrl_frontier.models.random_init import random_model
from jaxrl_frontier.models.transformer import ModelConfig, Transformer, map_projections
from jaxrl_frontier.sampling import Sampler, SamplingParams


@pytest.fixture(scope="module", autouse=True)
def built_kernel():
    reason = kernel.load_error()
    if reason is not None:
        pytest.fail(f"the decode-matmul kernel must build on the test machines: {reason}")


@pytest.mark.parametrize(
    "rows, k, n",
    [
        (1, 8, 16),  # one row, one panel: the calling thread only
        (5, 1, 32),  # K = 1, a 5-row tail
        (6, 64, 48),  # exactly one 6-row tile
        (16, 256, 768),  # the tiny benchmark model's MLP at 16 rows: over the pool
        (23, 33, 64),  # odd K, 3 tiles and a 5-row tail
        (64, 512, 1536),  # the 25M model's MLP at 64 rows
        (130, 96, 160),  # 21 tiles and a 4-row tail, 10 panels
        (2, 1536, 512),  # a down projection's long K
    ],
)
def test_kernel_matches_matmul(rows, k, n):
    rng = np.random.default_rng(rows * 1000 + k + n)
    x = rng.standard_normal((rows, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32)
    packed = kernel.pack(jnp.asarray(w))
    assert packed.panels.shape == (n // 16, k, 16)
    out = jax.jit(kernel.decode_matmul)(jnp.asarray(x), packed.panels)
    expected = x.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_kernel_under_vmap():
    """Mapped rows join the matmul's rows (one call); mapped weights run one call each."""
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((3, 4, 32), dtype=np.float32))  # [V, M, K]
    w = jnp.asarray(rng.standard_normal((2, 32, 48), dtype=np.float32))
    panels = kernel.pack(w[0]).panels
    out = jax.jit(jax.vmap(kernel.decode_matmul, in_axes=(0, None)))(x, panels)
    np.testing.assert_allclose(np.asarray(out), np.asarray(x @ w[0]), rtol=1e-5, atol=1e-5)
    both = jax.vmap(lambda w: kernel.pack(w).panels)(w)
    out = jax.jit(jax.vmap(kernel.decode_matmul, in_axes=(None, 0)))(x[0], both)
    np.testing.assert_allclose(np.asarray(out), np.asarray(x[0] @ w), rtol=1e-5, atol=1e-5)
    hlo = jax.jit(jax.vmap(kernel.decode_matmul, in_axes=(0, None))).lower(x, panels).as_text()
    assert hlo.count("jaxrl_frontier_DecodeMatmul") == 1 and "while" not in hlo


@pytest.mark.parametrize(
    "shape, in_dims",
    [
        ((3, 32), 1),  # one chunk: the calling thread only
        ((512, 1536), 1),  # the 25M model's gate: 96 panels in 12 chunks over the pool
        ((1536, 512), 1),  # its down projection
        ((8, 4, 64, 16), 2),  # an o_proj [H, Dh, D] shape, contracting two dims
        ((256, 2, 3, 16), 1),  # several output dims
    ],
)
def test_pack_handler_matches_the_xla_transpose(shape, in_dims):
    w = jnp.asarray(np.random.default_rng(len(shape)).standard_normal(shape, dtype=np.float32))
    packed, reference = (
        jax.jit(kernel.pack, static_argnums=1)(w, in_dims),
        kernel.pack_reference(w, in_dims),
    )
    assert (packed.shape, packed.in_dims) == (reference.shape, reference.in_dims)
    np.testing.assert_array_equal(np.asarray(packed.panels), np.asarray(reference.panels))


def test_pack_layout_and_round_trip():
    """panels[t, k, j] = w[k, 16 t + j]; an o_proj [H, Dh, D] contracts its first two dims."""
    w = jnp.arange(3 * 32, dtype=jnp.float32).reshape(3, 32)
    packed = kernel.pack(w)
    np.testing.assert_array_equal(np.asarray(packed.panels[1, 2]), np.asarray(w[2, 16:32]))
    np.testing.assert_array_equal(np.asarray(packed.unpack()), np.asarray(w))
    o_proj = jnp.asarray(np.random.default_rng(0).standard_normal((4, 8, 16), dtype=np.float32))
    packed = kernel.pack(o_proj, in_dims=2)
    assert (packed.panels.shape, packed.shape, packed.in_dims) == ((1, 32, 16), (4, 8, 16), 2)
    np.testing.assert_array_equal(np.asarray(packed.unpack()), np.asarray(o_proj))
    assert packed[...] is packed and packed.astype(jnp.float32) is packed
    with pytest.raises(ValueError, match="16-column panels; \\(8, 24\\) has 24 columns"):
        kernel.pack(jnp.zeros((8, 24)))
    with pytest.raises(TypeError, match="computes in float32, not bfloat16"):
        packed.astype(jnp.bfloat16)
    with pytest.raises(ValueError, match="packed for 2 input dims, used with 1"):
        packed.dense_matmul(jnp.zeros((1, 32)), contract=1)


CFG = ModelConfig(
    vocab_size=96, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=8, num_kv_heads=2
)  # projections with 64, 16 and 96 outputs


def test_packed_model_equals_plain_model_on_a_cached_step():
    """`map_projections(model, pack)`: every projection in the kernel, embeddings and norms
    untouched; the prefill and a one-token cached step give the plain model's logits."""
    model = random_model(CFG, seed=3, std=0.1, head_std=0.3)
    packed = map_projections(model, kernel.pack)
    layer = packed.layers[0]
    assert isinstance(layer.attn.o_proj[...], kernel.PackedWeight)
    assert layer.attn.o_proj[...].in_dims == 2 and layer.mlp.down_proj[...].in_dims == 1
    assert not isinstance(packed.embed[...], kernel.PackedWeight)
    tokens, mask = left_padded_batch(5, 7, CFG.vocab_size, seed=4)

    @nnx.jit
    def prefill_and_step(m: Transformer, tokens, mask):
        cache = m.init_cache(tokens.shape[0], tokens.shape[1] + 1)
        logits, cache = m(tokens, mask, cache=cache)
        step, _ = m(
            tokens[:, -1:],
            jnp.ones_like(mask[:, :1]),
            positions=jnp.sum(mask, axis=1, keepdims=True),
            cache=cache,
        )
        return logits, step

    for got, want in zip(
        prefill_and_step(packed, tokens, mask), prefill_and_step(model, tokens, mask)
    ):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5)


@pytest.mark.parametrize("greedy", [True, False])
def test_sampler_with_kernel_equals_xla_matmuls(greedy):
    model = random_model(CFG, seed=1, std=0.05, head_std=0.3)
    kw = dict(pad_id=0, batch_buckets=(6,), decode_chunks=2, steps_per_check=3)
    with_kernel = Sampler(model, **kw)  # 'auto' on CPU, f32, one device: the kernel
    plain = Sampler(model, decode_matmul="xla", **kw)
    assert (with_kernel.decode_matmul, plain.decode_matmul) == ("cpu_kernel", "xla")
    params = SamplingParams(max_new_tokens=10, n=2, greedy=greedy, temperature=0.9)
    tokens, mask = left_padded_batch(3, 10, CFG.vocab_size, seed=0)
    key = jax.random.key(7)
    a = with_kernel.generate(tokens, mask, params, key)
    b = plain.generate(tokens, mask, params, key)
    np.testing.assert_array_equal(np.asarray(a.completion_tokens), np.asarray(b.completion_tokens))
    np.testing.assert_allclose(np.asarray(a.policy_logp), np.asarray(b.policy_logp), atol=2e-5)
    np.testing.assert_allclose(np.asarray(a.sample_logp), np.asarray(b.sample_logp), atol=2e-5)


def test_when_the_kernel_is_used(monkeypatch, recwarn):
    """'auto' takes XLA silently where the kernel does not apply (bf16, projections without
    16-column panels, a mesh of several devices); asking for it there names the reason; a
    failed build warns under 'auto'; a bad choice lists the allowed ones."""
    assert (
        Sampler(random_model(CFG.replace(dtype="bfloat16"), seed=0), pad_id=0).decode_matmul
        == "xla"
    )
    odd = CFG.replace(intermediate_size=40)
    assert Sampler(random_model(odd, seed=0), pad_id=0).decode_matmul == "xla"
    assert not [w for w in recwarn if "falls back" in str(w.message)]
    with pytest.raises(ValueError, match="multiple of 16 outputs, not \\[40\\]"):
        Sampler(random_model(odd, seed=0), pad_id=0, decode_matmul="cpu_kernel")
    with pytest.raises(ValueError, match="allowed: \\('auto', 'xla', 'cpu_kernel'\\)"):
        Sampler(random_model(CFG, seed=0), pad_id=0, decode_matmul="fast")
    if jax.device_count() >= 2:
        mesh = shd.make_mesh((2, 1, 1), jax.devices()[:2])
        sharded = shd.shard_model(random_model(CFG, seed=0), mesh)
        assert Sampler(sharded, pad_id=0, mesh=mesh).decode_matmul == "xla"
        with pytest.raises(ValueError, match="one device's whole weights, .* has 2"):
            Sampler(sharded, pad_id=0, mesh=mesh, decode_matmul="cpu_kernel")
    monkeypatch.setattr(kernel, "load_error", lambda: "the kernel could not be built: no g++")
    with pytest.warns(UserWarning, match="decode_matmul falls back to plain XLA: .*no g\\+\\+"):
        assert Sampler(random_model(CFG, seed=0), pad_id=0).decode_matmul == "xla"
