"""models/attention.py against numpy: grouped-query softmax attention with an additive
bias, in both key layouts and every implementation the CPU runs; the one-query decode step;
Gemma's scale and soft-cap; the segment mask and its bias, by hand."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.models import attention as attn

B, T, S, H, K, DH = 2, 3, 5, 4, 2, 8  # 4 query heads over 2 kv heads


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, H, DH)).astype(np.float32)
    k = rng.standard_normal((B, S, K, DH)).astype(np.float32)
    v = rng.standard_normal((B, S, K, DH)).astype(np.float32)
    allowed = rng.random((B, T, S)) < 0.7
    allowed[..., 0] = True  # every query sees a key
    return q, k, v, allowed


def _numpy_attention(q, k, v, allowed, scale=None, softcap=None, sinks=None):
    """softmax(q k^T scale (soft-capped) + mask) v, head h reading kv head h // (H / K);
    with sinks [H], exp(sink_h) joins each of head h's denominators."""
    out = np.zeros_like(q)
    for b in range(B):
        for h in range(H):
            kv = h // (H // K)
            s = q[b, :, h] @ k[b, :, kv].T * (DH**-0.5 if scale is None else scale)
            if softcap is not None:
                s = softcap * np.tanh(s / softcap)
            s = np.where(allowed[b], s, -np.inf)
            m = s.max(-1, keepdims=True)
            p = np.exp(s - m)
            denominator = p.sum(-1, keepdims=True)
            if sinks is not None:
                denominator = denominator + np.exp(sinks[h] - m)
            out[b, :, h] = (p / denominator) @ v[b, :, kv]
    return out


@pytest.mark.parametrize("impl", ["xla", "dot_product"])
def test_attention_equals_numpy_in_both_key_layouts(impl):
    q, k, v, allowed = _inputs()
    bias = attn.mask_to_bias(jnp.asarray(allowed))
    want = _numpy_attention(q, k, v, allowed)
    got = attn.attention(q, k, v, bias, impl=impl)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    cache_layout = attn.attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), bias, "bksd", impl=impl)
    np.testing.assert_allclose(np.asarray(cache_layout), want, rtol=1e-5, atol=1e-6)


def test_scale_and_softcap_and_the_one_query_decode_step():
    q, k, v, allowed = _inputs(1)
    bias = attn.mask_to_bias(jnp.asarray(allowed))
    want = _numpy_attention(q, k, v, allowed, scale=0.2, softcap=1.5)
    got = attn.attention(q, k, v, bias, impl="xla", scale=0.2, softcap=1.5)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="soft-capping"):
        attn.attention(q, k, v, bias, impl="dot_product", softcap=1.5)
    # one query over the cache layout: the broadcast-and-reduce path
    one = attn.attention(q[:, :1], k.swapaxes(1, 2), v.swapaxes(1, 2), bias[:, :, :, :1], "bksd")
    plain = _numpy_attention(q, k, v, allowed)
    np.testing.assert_allclose(np.asarray(one), plain[:, :1], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="allowed"):
        attn.attention(q, k, v, bias, impl="flash")


def test_segment_mask_and_bias_by_hand():
    seg = jnp.asarray([[1, 1, 2, 0]])  # two segments and an empty slot
    same = np.asarray(attn.same_segment(seg))[0]
    np.testing.assert_array_equal(
        same,
        [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]],  # empty keys never visible
    )
    bias = np.asarray(attn.mask_to_bias(jnp.asarray(same[None].astype(bool))))
    assert bias.shape == (1, 1, 1, 4, 4) and bias.dtype == np.float32
    np.testing.assert_array_equal(bias[0, 0, 0] == 0.0, same.astype(bool))
    assert bias[0, 0, 0, 0, 2] == -1e30  # finite: a fully masked row gives a uniform softmax


def test_attention_sinks_in_every_path_that_takes_them():
    """GPT-OSS's sinks: 'xla' in both key layouts and the one-query decode step equal the
    numpy loop with exp(sink) in each denominator (sinks far apart, so a head mixed up with
    another fails); jax.nn.dot_product_attention refuses them."""
    q, k, v, allowed = _inputs(2)
    bias = attn.mask_to_bias(jnp.asarray(allowed))
    sinks = np.asarray([-1.0, 0.5, 2.0, 4.0], np.float32)
    want = _numpy_attention(q, k, v, allowed, sinks=sinks)
    assert np.abs(want - _numpy_attention(q, k, v, allowed)).max() > 0.1  # the sinks matter
    got = attn.attention(q, k, v, bias, impl="xla", sinks=jnp.asarray(sinks))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    kc, vc = k.swapaxes(1, 2), v.swapaxes(1, 2)
    cache_layout = attn.attention(q, kc, vc, bias, "bksd", impl="xla", sinks=jnp.asarray(sinks))
    np.testing.assert_allclose(np.asarray(cache_layout), want, rtol=1e-5, atol=1e-6)
    one = attn.attention(q[:, :1], kc, vc, bias[:, :, :, :1], "bksd", sinks=jnp.asarray(sinks))
    np.testing.assert_allclose(np.asarray(one), want[:, :1], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="sinks.*model.attention"):
        attn.attention(q, k, v, bias, impl="dot_product", sinks=jnp.asarray(sinks))
