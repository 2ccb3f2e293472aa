"""The C++ CPU kernels against their plain-XLA equivalents, and the fallbacks around them.

`decode_attention` (one decode step's grouped-query attention over the KV cache) is checked
against the model's two XLA paths (einsum and multiply-reduce) on shapes that take each of its code
paths: groups of 4 query heads and single heads, head dims 8 to 128, one slot to 143,
masked slots, and enough work to be shared out over the thread pool. Then the Sampler with
the kernel against the Sampler with plain XLA, on one device and on a (2, 2, 2) mesh.
"""

import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import left_padded_batch

from jaxrl_frontier import config as config_lib
from jaxrl_frontier import sharding as shd
from jaxrl_frontier.kernels import build
from jaxrl_frontier.kernels import decode_attention as kernel
from jaxrl_frontier.models.random_init import random_model
from jaxrl_frontier.models.transformer import (
    ModelConfig,
    decode_attention_einsum,
    decode_attention_reduce,
)
from jaxrl_frontier.sampling import Sampler, SamplingParams

NEG = -1e30  # the model's additive mask value (transformer._NEG_INF)


@pytest.fixture(scope="module", autouse=True)
def built_kernel():
    reason = kernel.load_error()
    if reason is not None:
        pytest.fail(f"the decode-attention kernel must build on the test machines: {reason}")


def attention_inputs(rows, kv_heads, group, slots, head_dim, masked=2, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((rows, kv_heads, group, head_dim), dtype=np.float32)
    k = rng.standard_normal((rows, kv_heads, slots, head_dim), dtype=np.float32)
    v = rng.standard_normal((rows, kv_heads, slots, head_dim), dtype=np.float32)
    bias = np.zeros((rows, slots), np.float32)
    bias[:, : min(masked, slots - 1)] = NEG  # left padding; every row keeps a real slot
    bias[0, slots // 2 :] = NEG  # one row masks a middle-to-end range too
    if slots > 1:
        bias[0, 0] = 0.0
    return tuple(jnp.asarray(x) for x in (q, k, v, bias))


@pytest.mark.parametrize(
    "rows, kv_heads, group, slots, head_dim",
    [
        (16, 2, 4, 143, 32),  # the tiny benchmark model, last chunk: one 4-head group
        (3, 2, 4, 5, 64),
        (2, 1, 1, 1, 8),  # one slot, one head
        (5, 3, 3, 9, 16),  # groups of 3: the single-head path only
        (2, 2, 6, 33, 128),  # one 4-head group plus two single heads, 4 vectors in p . v
        (4, 1, 8, 17, 40),  # head dim 40: a partial block of output vectors in p . v
        (64, 2, 4, 143, 64),  # 25M benchmark shape: work shared over the thread pool
    ],
)
def test_kernel_matches_reference(rows, kv_heads, group, slots, head_dim):
    q, k, v, bias = attention_inputs(rows, kv_heads, group, slots, head_dim)
    out = np.asarray(jax.jit(kernel.decode_attention)(q, k, v, bias))
    assert out.shape == (rows, kv_heads, group, head_dim) and out.dtype == np.float32
    for expected in (
        decode_attention_einsum(q, k, v, bias),
        decode_attention_reduce(q, k, v, bias),
    ):
        np.testing.assert_allclose(out, np.asarray(expected), rtol=2e-5, atol=2e-6)


def test_masked_slots_get_exactly_zero_weight():
    """A masked slot's value, however large, must not leak into the output (the kernel's
    exp returns exactly 0 below f32's underflow, as exp does)."""
    q, k, v, bias = attention_inputs(4, 2, 4, 12, 32, masked=5)
    poisoned = jnp.where((bias == NEG)[:, None, :, None], 1e30, v)
    out = np.asarray(jax.jit(kernel.decode_attention)(q, k, poisoned, bias))
    assert np.isfinite(out).all()
    expected = np.asarray(decode_attention_einsum(q, k, v, bias))
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-6)


def test_kernel_inside_a_scanned_loop_matches():
    """As the decode calls it: inside a jitted loop, on a cache updated in place each step."""

    def run(attention, q, k, v, bias):
        def step(i, carry):
            k, out = carry
            k = jax.lax.dynamic_update_slice_in_dim(k, out[:, :, :1] * 0.5, i, axis=2)
            return k, attention(q + 0.1 * out, k, v, bias)

        return jax.lax.fori_loop(0, 6, step, (k, jnp.zeros_like(q)))[1]

    args = attention_inputs(8, 2, 4, 20, 32)
    a = jax.jit(lambda *x: run(kernel.decode_attention, *x))(*args)
    b = jax.jit(lambda *x: run(decode_attention_einsum, *x))(*args)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


# ----------------------------------------------------------------------------- sampler

CFG = ModelConfig(
    vocab_size=96, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=8, num_kv_heads=2
)  # head dim 8, 4 query heads per kv head


def assert_same_rollout(a, b):
    np.testing.assert_array_equal(np.asarray(a.completion_tokens), np.asarray(b.completion_tokens))
    np.testing.assert_array_equal(np.asarray(a.lengths), np.asarray(b.lengths))
    np.testing.assert_allclose(np.asarray(a.policy_logp), np.asarray(b.policy_logp), atol=2e-5)
    np.testing.assert_allclose(np.asarray(a.sample_logp), np.asarray(b.sample_logp), atol=2e-5)


@pytest.mark.parametrize("greedy", [True, False])
def test_sampler_with_kernel_equals_plain_xla(greedy):
    model = random_model(CFG, seed=1, std=0.05, head_std=0.3)
    kw = dict(pad_id=0, batch_buckets=(6,), decode_chunks=2, steps_per_check=3)
    with_kernel = Sampler(model, **kw)  # 'auto' on CPU: the kernel
    plain = Sampler(model, decode_attention="xla", **kw)
    assert (with_kernel.decode_attention, plain.decode_attention) == ("cpu_kernel", "xla")
    params = SamplingParams(max_new_tokens=10, n=2, greedy=greedy, temperature=0.9)
    tokens, mask = left_padded_batch(3, 10, CFG.vocab_size, seed=0)
    key = jax.random.key(7)
    assert_same_rollout(
        with_kernel.generate(tokens, mask, params, key), plain.generate(tokens, mask, params, key)
    )


def test_sharded_sampler_with_kernel_equals_plain_xla():
    """On a (data 2, fsdp 2, tensor 2) mesh the kernel runs per device on its rows and kv
    heads (shard_map); the rollout equals the single-device plain-XLA one."""
    if jax.device_count() < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    mesh = shd.make_mesh((2, 2, 2))
    sharded = Sampler(
        shd.shard_model(random_model(CFG, seed=2, std=0.05, head_std=0.3), mesh),
        pad_id=0,
        mesh=mesh,
        batch_buckets=(4,),
        decode_chunks=1,
    )
    plain = Sampler(
        random_model(CFG, seed=2, std=0.05, head_std=0.3),
        pad_id=0,
        batch_buckets=(4,),
        decode_chunks=1,
        decode_attention="xla",
    )
    assert sharded.decode_attention == "cpu_kernel"
    params = SamplingParams(max_new_tokens=8, greedy=True)
    tokens, mask = left_padded_batch(4, 10, CFG.vocab_size, seed=3)
    a = sharded.generate(tokens, mask, params, jax.random.key(0))
    assert len(a.completion_tokens.sharding.device_set) == 8
    assert_same_rollout(a, plain.generate(tokens, mask, params, jax.random.key(0)))


# ----------------------------------------------------------------------------- fallbacks


def test_auto_falls_back_with_a_warning_and_explicit_choice_raises(monkeypatch):
    model = random_model(CFG, seed=0)
    monkeypatch.setattr(kernel, "load_error", lambda: "the kernel could not be built: no g++")
    with pytest.warns(UserWarning, match="falls back to plain XLA: .*no g\\+\\+"):
        assert Sampler(model, pad_id=0).decode_attention == "xla"
    with pytest.raises(ValueError, match="'cpu_kernel' cannot be used: .*no g\\+\\+"):
        Sampler(model, pad_id=0, decode_attention="cpu_kernel")
    with pytest.raises(ValueError, match="allowed: \\('auto', 'xla', 'cpu_kernel'\\)"):
        Sampler(model, pad_id=0, decode_attention="fast")


def test_auto_uses_xla_without_warning_where_the_kernel_does_not_apply(recwarn):
    """A bf16 cache or a head dim that is no multiple of 8: plain XLA, silently; asking for
    the kernel names the reason."""
    odd = CFG.replace(hidden_size=48, num_heads=4)  # head dim 12
    assert Sampler(random_model(odd, seed=0), pad_id=0).decode_attention == "xla"
    model = random_model(CFG, seed=0)
    assert Sampler(model, pad_id=0, cache_dtype="bfloat16").decode_attention == "xla"
    assert not [w for w in recwarn if "falls back" in str(w.message)]
    with pytest.raises(ValueError, match="float32 KV cache, this one is bfloat16"):
        Sampler(model, pad_id=0, cache_dtype="bfloat16", decode_attention="cpu_kernel")


def test_failed_build_reports_the_compiler_error(tmp_path, monkeypatch):
    (tmp_path / "broken.cc").write_text("this is not C++;\n")
    monkeypatch.setattr(build, "_SOURCE_DIR", tmp_path)
    monkeypatch.setenv("JAXRL_FRONTIER_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(build.KernelBuildError, match="building broken.cc failed"):
        build.build("broken")
    with pytest.raises(build.KernelBuildError, match="no kernel source"):
        build.build("missing")
    assert not list((tmp_path / "cache" / "kernels").glob("*.so"))  # nothing half-written


def test_build_is_cached_per_source_and_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXRL_FRONTIER_CACHE_DIR", str(tmp_path))
    first = build.build("decode_attention")
    stamp = first.stat().st_mtime_ns
    assert build.build("decode_attention") == first and first.stat().st_mtime_ns == stamp
    assert first.parent == tmp_path / "kernels" and first.name.startswith("decode_attention-")


def test_unwritable_cache_dir_falls_back_to_a_temporary_one(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache directory's parent should be")
    monkeypatch.setenv("JAXRL_FRONTIER_CACHE_DIR", str(blocked))
    assert build.cache_dir().parent.parent == Path(tempfile.gettempdir())


@pytest.mark.parametrize("part", ["attention", "matmul"])
def test_config_key_choices(part):
    config = config_lib.base_config()
    assert config.rollout[f"decode_{part}"] == "auto"
    config.rollout[f"decode_{part}"] = "fast"
    with pytest.raises(ValueError, match=f"rollout.decode_{part}"):
        config_lib.validate(config)
