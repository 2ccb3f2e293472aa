"""A decode step's projection matmuls (few rows times every weight) as a CPU kernel.

    out [M, N] = x [M, K] @ w [K, N],   w packed once per rollout into panels [N/16, K, 16]

A decode step multiplies a handful of rows (the batch) by every weight matrix. XLA:CPU's
dot emitter runs these at one core's ~35 to 40 GFLOP/s however many threads it has; the
kernel (`decode_matmul.cc`) streams each 16-column panel of a packed weight in order and
shares the panels out over XLA's intra-op threads. The sampler packs the projections once
per decode program (`transformer.map_projections(model, pack)`), outside the token loop:
one pass over the weights per rollout, and a packed copy as large as the f32 projections
while the decode runs. The same math in plain XLA: `x @ w` (what tests compare with).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from jaxrl_frontier.kernels import build

TARGET = "jaxrl_frontier_DecodeMatmul"
PACK_TARGET = "jaxrl_frontier_DecodeMatmulPack"
_SOURCE = "decode_matmul"
PANEL = 16  # output columns per packed panel (decode_matmul.cc's kPanel)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedWeight:
    """A projection weight in the kernel's panel layout, standing in for the weight array in
    a decode-only copy of the model (`transformer.map_projections`).

    panels: f32 [N/16, K, 16], K = prod(shape[:in_dims]), N = prod(shape[in_dims:]).
    shape: the weight's own shape (e.g. q_proj's [D, H, Dh]); in_dims: how many of its
    leading dims are contracted (`transformer.dense`'s `contract`).

    It answers the few array methods the model's layers use on a weight (`w[...]`,
    `w.astype(f32)`, `w.shape`, `w.dtype`) and does its product with `dense_matmul`.
    """

    panels: jax.Array
    shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
    in_dims: int = dataclasses.field(metadata=dict(static=True))

    @property
    def dtype(self):
        return self.panels.dtype

    def __getitem__(self, key):
        if key is Ellipsis:
            return self
        raise TypeError("a PackedWeight is read whole (w[...]); unpack() it to index")

    def astype(self, dtype):
        if jnp.dtype(dtype) != self.dtype:
            raise TypeError(
                f"the decode-matmul kernel computes in float32, not {jnp.dtype(dtype).name}"
            )
        return self

    def dense_matmul(self, x: jax.Array, contract: int) -> jax.Array:
        """x [M, K] -> [M, N] (the kernel)."""
        if contract != self.in_dims:
            raise ValueError(f"weight packed for {self.in_dims} input dims, used with {contract}")
        return decode_matmul(x, self.panels)

    def unpack(self) -> jax.Array:
        """The weight in its own layout and shape."""
        return jnp.transpose(self.panels, (1, 0, 2)).reshape(self.shape)


def _pack_dims(w: jax.Array, in_dims: int) -> tuple[int, int]:
    k, n = math.prod(w.shape[:in_dims]), math.prod(w.shape[in_dims:])
    if n % PANEL:
        raise ValueError(f"decode_matmul packs {PANEL}-column panels; {w.shape} has {n} columns")
    return k, n


def pack(w: jax.Array, in_dims: int = 1) -> PackedWeight:
    """A weight [*in, *out] (its first `in_dims` dims contracted) -> `PackedWeight`, packed
    by the kernel's own handler over XLA's threads (the kernel must be loaded:
    `load_error()` is None)."""
    k, n = _pack_dims(w, in_dims)
    out = jax.ShapeDtypeStruct((n // PANEL, k, PANEL), jnp.float32)
    # under vmap (a weight per mapped element), one call per element
    call = jax.ffi.ffi_call(PACK_TARGET, out, vmap_method="sequential")
    panels = call(w.astype(jnp.float32).reshape(k, n))
    return PackedWeight(panels=panels, shape=tuple(w.shape), in_dims=in_dims)


def pack_reference(w: jax.Array, in_dims: int = 1) -> PackedWeight:
    """`pack` in plain XLA, a transpose: what the packing handler is tested against. On
    XLA:CPU it runs at ~1.6 GB/s on one thread, several times slower than the handler."""
    k, n = _pack_dims(w, in_dims)
    panels = w.astype(jnp.float32).reshape(k, n // PANEL, PANEL).transpose(1, 0, 2)
    return PackedWeight(panels=panels, shape=tuple(w.shape), in_dims=in_dims)


def inapplicable_reason(*, platform: str, dtype, columns, devices: int = 1) -> str | None:
    """Why the kernel cannot serve a decode on this backend, in this compute dtype, for
    projections with these output column counts, over `devices` devices (None: it can)."""
    if platform != "cpu":
        return f"the kernel is for CPU, the sampler runs on {platform!r}"
    if jnp.dtype(dtype) != jnp.float32:
        return f"the kernel computes in float32, the model in {jnp.dtype(dtype).name}"
    bad = sorted({int(n) for n in columns if n % PANEL})
    if bad:
        return f"the kernel needs projections with a multiple of {PANEL} outputs, not {bad}"
    if devices > 1:
        return f"the kernel runs on one device's whole weights, the sampler's mesh has {devices}"
    return None


def load_error() -> str | None:
    """Builds and registers the kernel (once per process); the reason it failed, or None."""
    return build.load_error(_SOURCE, ("DecodeMatmul", "DecodeMatmulPack"))


@jax.custom_batching.custom_vmap
def decode_matmul(x: jax.Array, panels: jax.Array) -> jax.Array:
    """x [M, K]; panels f32 [N/16, K, 16] (`pack`). Returns f32 [M, N]. The kernel must be
    loaded (`load_error()` is None). Under `jax.vmap` (the speculative sampler runs the
    model per row) the mapped rows join the matmul's rows: one call, not one per row."""
    m, n = x.shape[0], panels.shape[0] * PANEL
    out = jax.ShapeDtypeStruct((m, n), jnp.float32)
    return jax.ffi.ffi_call(TARGET, out)(x.astype(jnp.float32), panels)


@decode_matmul.def_vmap
def _decode_matmul_vmap(axis_size, in_batched, x, panels):
    x_batched, panels_batched = in_batched
    if panels_batched:  # a different weight per mapped element: one call each
        if not x_batched:
            x = jnp.broadcast_to(x, (axis_size, *x.shape))
        return jax.lax.map(lambda args: decode_matmul(*args), (x, panels)), True
    if not x_batched:
        return decode_matmul(x, panels), False
    rows = decode_matmul(x.reshape(-1, x.shape[-1]), panels)  # [V * M, N]
    return rows.reshape(*x.shape[:-1], rows.shape[-1]), True
