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

The options are only passed where the running jaxlib knows them (probed once per backend with
a one-op compile); elsewhere, and on GPU / TPU, the compiler's defaults are used.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# backend platform -> options for the sampler's prefill and decode loop
ROLLOUT_OPTIONS: dict[str, dict[str, str]] = {
    "cpu": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_REDUCE"},
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


def rollout_compiler_options(platform: str | None = None) -> dict[str, str]:
    """The compiler options the samplers use on `platform` (default: jax's default backend);
    {} where there are none or this jaxlib does not know them."""
    platform = platform or jax.default_backend()
    options = ROLLOUT_OPTIONS.get(platform, {})
    if options and not _supported(platform, tuple(sorted(options.items()))):
        return {}
    return dict(options)
