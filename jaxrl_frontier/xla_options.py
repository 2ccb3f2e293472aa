"""Per-function XLA compiler options for the rollout hot path (`jax.jit(compiler_options=)`).

XLA:CPU (jaxlib 0.10) hands matmuls, reductions and elementwise ops to YNNPACK fusions by
default. For a decode step that is the wrong split: YNNPACK's dots at 16 to 32 rows run ~4x
below XLA's own dot emitter (0.34 ms vs 0.09 ms for a [16, 256] x [256, 768] matmul), while
its reductions are what keep attention over the KV cache fast (without them XLA:CPU emits a
column-reduction loop for `p . v` that made a whole rollout 2x slower). So rollouts on CPU
keep YNNPACK for reductions only. Measured with `scripts/bench.py sampler` on the tiny
Qwen2-shaped model, median ms per decoded token, side by side in one process:

    rows            16      32      64      256
    XLA default     5.26    8.27    11.33   31.1
    reductions      4.42    6.87    11.18   28.7

From 64 rows a matmul up, YNNPACK's individual dots beat XLA's emitter again ([64, 512] x
[512, 1536]: 80 vs 37 GFLOP/s; [16, 512] x [512, 1536]: 25 vs 36), so a program whose
matmuls have at least `min_rows` rows per device also gets them. Whole rollouts, side by
side in one process (median of per-round ratios, reductions + dots over reductions only):
16 rows 0.84x (tiny) and 0.87x (25M), 32 rows 0.89x, 64 rows 1.03x (tiny) and 1.08x (25M,
128 new tokens), 256 rows 1.08x (tiny, 16 new tokens). A prefill's matmuls have rows x
prompt length rows, so it is nearly always over the line.

The options are only passed where the running jaxlib knows them (probed once per backend with
a one-op compile); elsewhere, and on GPU / TPU, the compiler's defaults are used.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_YNN = "xla_cpu_experimental_ynn_fusion_type"

# backend platform -> ((min_rows, options), ...), largest min_rows first: a program whose
# matmuls have `rows` rows per device gets the first entry with min_rows <= rows.
ROLLOUT_OPTIONS: dict[str, tuple[tuple[int, dict[str, str]], ...]] = {
    "cpu": (
        (64, {_YNN: "LIBRARY_FUSION_TYPE_REDUCE,LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}),
        (0, {_YNN: "LIBRARY_FUSION_TYPE_REDUCE"}),
    ),
}


@functools.cache
def _supported(platform: str, options: tuple[tuple[str, str], ...]) -> bool:
    """Whether this jaxlib's compiler for `platform` accepts `options` (one tiny compile)."""
    one_device = jax.sharding.SingleDeviceSharding(jax.devices(platform)[0])
    fn = jax.jit(lambda x: x + 1, compiler_options=dict(options))
    try:
        fn.lower(jax.ShapeDtypeStruct((1,), jnp.float32, sharding=one_device)).compile()
    except Exception:  # an unknown option or enum value: XLA raises INVALID_ARGUMENT
        return False
    return True


def rollout_compiler_options(platform: str | None = None, rows: int = 1) -> dict[str, str]:
    """The compiler options for a rollout program on `platform` (default: jax's default
    backend) whose matmuls have `rows` rows per device (a decode step: its batch rows; a
    prefill: rows x prompt length); {} where there are none or this jaxlib does not know
    them."""
    platform = platform or jax.default_backend()
    for min_rows, options in ROLLOUT_OPTIONS.get(platform, ()):
        if rows >= min_rows:
            if not _supported(platform, tuple(sorted(options.items()))):
                return {}
            return dict(options)
    return {}
