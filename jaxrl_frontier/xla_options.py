"""XLA compiler options of the rollout programs, by backend and matmul rows per device.

XLA:CPU hands matmuls, reductions and elementwise ops to YNNPACK fusions by default. For a
decode step its reductions are what keep attention over the KV cache fast, while its dots
below 64 rows run slower than XLA's own dot emitter; so CPU rollouts keep YNNPACK for
reductions, and for dots too from 64 rows (measured figures: docs/sampling.md). Other
backends keep XLA's defaults. An option set the installed XLA rejects warns once, with
XLA's reason, and the programs compile with the defaults.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp

_YNN = "xla_cpu_experimental_ynn_fusion_type"
# platform -> ((min_rows, options), ...), largest min_rows first
ROLLOUT_OPTIONS = {
    "cpu": (
        (64, {_YNN: "LIBRARY_FUSION_TYPE_REDUCE,LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}),
        (0, {_YNN: "LIBRARY_FUSION_TYPE_REDUCE"}),
    )
}


def rollout_compiler_options(platform: str, rows: int) -> tuple[tuple[str, str], ...]:
    """The options (sorted items) for a program on `platform` whose matmuls have `rows` rows
    per device; () for XLA's defaults."""
    for min_rows, options in ROLLOUT_OPTIONS.get(platform, ()):
        if rows >= min_rows:
            items = tuple(sorted(options.items()))
            return items if _accepted(platform, items) else ()
    return ()


@functools.cache
def _accepted(platform: str, options: tuple[tuple[str, str], ...]) -> bool:
    """Whether XLA compiles a one-op program with `options` (else one warning, the reason)."""
    device = jax.sharding.SingleDeviceSharding(jax.devices(platform)[0])
    try:
        fn = jax.jit(lambda x: x + 1, compiler_options=dict(options))
        fn.lower(jax.ShapeDtypeStruct((1,), jnp.float32, sharding=device)).compile()
    except Exception as e:  # XLA raises INVALID_ARGUMENT on an unknown option or value
        warnings.warn(
            f"XLA rejected the rollout compiler options {dict(options)} ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:300]}); rollout programs compile with XLA's defaults",
            stacklevel=3,
        )
        return False
    return True
