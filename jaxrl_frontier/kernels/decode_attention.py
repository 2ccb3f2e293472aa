"""One decode step's grouped-query attention over the KV cache as a CPU kernel.

    out[b, h, g] = softmax_s(q[b, h, g] . k[b, h, s] / sqrt(D) + bias[b, s]) @ v[b, h]

XLA:CPU runs this step as broadcast-multiply-reduce fusions that sweep each (row, kv head)
block of the cache once per query head of the group; measured by ablation, that was a
quarter of a decode step (tiny model at 16 rows, 25M model at 64 rows). The kernel
(`decode_attention.cc`) reads each block once, scores the group's queries together and
shares the blocks out over XLA's intra-op threads. The same math in plain XLA:
`transformer.decode_attention_einsum` and `decode_attention_reduce` (what tests compare with).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_frontier.kernels import build

TARGET = "jaxrl_frontier_DecodeAttention"
_SOURCE = "decode_attention"


def inapplicable_reason(*, platform: str, dtype, head_dim: int) -> str | None:
    """Why the kernel cannot serve a decode on this backend with this KV-cache dtype and
    head dim (None: it can)."""
    if platform != "cpu":
        return f"the kernel is for CPU, the sampler runs on {platform!r}"
    if jnp.dtype(dtype) != jnp.float32:
        return f"the kernel reads a float32 KV cache, this one is {jnp.dtype(dtype).name}"
    if head_dim % 8:
        return f"the kernel needs a head dim that is a multiple of 8, not {head_dim}"
    return None


def load_error() -> str | None:
    """Builds and registers the kernel (once per process); the reason it failed, or None."""
    return build.load_error(_SOURCE, ("DecodeAttention",))


def decode_attention(q: jax.Array, k: jax.Array, v: jax.Array, bias: jax.Array) -> jax.Array:
    """q [B, K, G, D]; k, v [B, K, S, D] float32 (the cache); bias [B, S] additive.
    Returns f32 [B, K, G, D]. The kernel must be loaded (`load_error()` is None)."""
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    return jax.ffi.ffi_call(TARGET, out)(q.astype(jnp.float32), k, v, bias.astype(jnp.float32))
