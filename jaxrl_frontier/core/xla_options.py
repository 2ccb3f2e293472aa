"""XLA options of the rollout programs by backend and matmul rows per device: on CPU, YNNPACK
for reductions (the cache attention), for dots too below 8 rows and from 64; elsewhere the
defaults. A set XLA rejects warns once with XLA's reason (figures: docs/sampling.md)."""

import functools
import warnings

import jax

_YNN, _REDUCE = "xla_cpu_experimental_ynn_fusion_type", "LIBRARY_FUSION_TYPE_REDUCE"
_DOTS = _REDUCE + ",LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"
# platform -> ((min_rows, options), ...), largest min_rows first. On CPU, XLA's own dot
# emitter beats YNNPACK's from 8 to 63 rows, but from 2 to 7 rows a dot with a large weight
# falls far off its speed (a tied LM head [B, D] x [V, D]^T: 15x slower than YNNPACK at
# Gemma 3's 262k vocabulary, 2 rows), so the fewest rows take YNNPACK's dots too.
ROLLOUT_OPTIONS = {"cpu": ((64, {_YNN: _DOTS}), (8, {_YNN: _REDUCE}), (0, {_YNN: _DOTS}))}


def rollout_compiler_options(platform: str, rows: int) -> tuple[tuple[str, str], ...]:
    """Sorted option items for a program whose matmuls have `rows` rows per device."""
    options = next((o for m, o in ROLLOUT_OPTIONS.get(platform, ()) if rows >= m), {})
    items = tuple(sorted(options.items()))
    return items if not items or _accepted(platform, items) else ()


@functools.cache
def _accepted(platform: str, options: tuple[tuple[str, str], ...]) -> bool:
    try:  # a one-op compile; XLA raises INVALID_ARGUMENT on an unknown option or value
        x = jax.device_put(0.0, jax.devices(platform)[0])
        jax.jit(lambda y: y + 1, compiler_options=dict(options)).lower(x).compile()
    except Exception as e:
        reason = f"{dict(options)} ({type(e).__name__}: {str(e).splitlines()[0][:300]})"
        warnings.warn(f"XLA rejected rollout options {reason}; using defaults", stacklevel=3)
        return False
    return True
