"""Aggregations (`objective.aggregation`): how per-token terms become one loss, agg(x) = N(x) / Z.

N is additive over rows and Z a function of the mask only, so gradient accumulation is
exact: each microbatch's loss with the whole batch's Z (`losses.aggregation_denominator`) sums to
the whole batch's loss.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxrl_frontier.core.registry import Registry

Array = jax.Array
sg = jax.lax.stop_gradient

AGGREGATIONS = Registry("aggregation", key="objective.aggregation")


# Every aggregation is a ratio  agg(x) = N(x) / Z  with
#   N(x) = sum_{b,t} c[b,t] x[b,t]   additive over rows (c depends on row b's own mask only),
#   Z    = a function of the mask alone.
# The registered entry is fn(x_bt, mask_bt, **kwargs) -> N(x) / Z; `fn.numerator` and
# `fn.denominator(mask_bt, **kwargs)` are its two parts. Summing N over microbatches and
# dividing by the full batch's Z is then exactly the full-batch aggregate (and gradient),
# whatever token counts the microbatches hold: `aggregation_denominator`, `loss_fn(denominator=)`.
# "Rows" are rows with at least one valid token.


def register_aggregation(name: str, denominator: Callable[..., Array]) -> Callable:
    """Register `numerator(x_bt, mask_bt, **kw) -> scalar` (additive over rows) with its
    `denominator(mask_bt, **kw) -> scalar`; the entry is `fn(x, mask, **kw) = N / Z`."""

    def decorator(numerator: Callable[..., Array]) -> Callable[..., Array]:
        @functools.wraps(numerator)
        def aggregate(x_bt: Array, mask_bt: Array, **kwargs) -> Array:
            return numerator(x_bt, mask_bt, **kwargs) / denominator(mask_bt, **kwargs)

        aggregate.numerator = numerator
        aggregate.denominator = denominator
        return AGGREGATIONS.register(name)(aggregate)

    return decorator


def _valid_rows(mask_bt: Array, **_) -> Array:
    """Z = number of rows with a valid token (at least 1)."""
    return jnp.maximum(jnp.sum(jnp.sum(mask_bt, axis=1) > 0), 1).astype(jnp.float32)


def _valid_tokens(mask_bt: Array, **_) -> Array:
    """Z = number of valid tokens (at least 1)."""
    return jnp.maximum(jnp.sum(mask_bt), 1.0)


def _valid_rows_times_c(mask_bt: Array, max_completion_len: int | None = None) -> Array:
    """Z = rows * C, C = max_completion_len (None: the row width T, a constant too)."""
    C = mask_bt.shape[1] if max_completion_len is None else max_completion_len
    return _valid_rows(mask_bt) * C


@register_aggregation("token_mean", denominator=_valid_tokens)
def token_mean(x_bt: Array, mask_bt: Array) -> Array:
    """sum m*L / sum m: every valid token of the batch counts once (DAPO). Config keys: none.

    N = sum_{b,t} m L, Z = sum_{b,t} m.
    """
    return jnp.sum(mask_bt * x_bt)


@register_aggregation("seq_mean_token_mean", denominator=_valid_rows)
def seq_mean_token_mean(x_bt: Array, mask_bt: Array) -> Array:
    """mean_b (sum_t m*L / sum_t m): each sequence counts once (GRPO, GSPO). Config keys: none.

    N = sum_b (sum_t m L / sum_t m), Z = rows.
    """
    return jnp.sum(jnp.sum(mask_bt * x_bt, axis=1) / jnp.maximum(jnp.sum(mask_bt, axis=1), 1.0))


@register_aggregation("seq_mean_token_sum", denominator=_valid_rows)
def seq_mean_token_sum(x_bt: Array, mask_bt: Array) -> Array:
    """mean_b (sum_t m*L): longer sequences weigh more. Config keys: none.

    N = sum_{b,t} m L, Z = rows.
    """
    return jnp.sum(mask_bt * x_bt)


@register_aggregation("seq_mean_token_sum_norm", denominator=_valid_rows_times_c)
def seq_mean_token_sum_norm(
    x_bt: Array, mask_bt: Array, max_completion_len: int | None = None
) -> Array:
    """mean_b (sum_t m*L) / C, C a constant: the max completion length (Dr. GRPO).

    N = sum_{b,t} m L, Z = rows * C.
    Config keys: max_completion_len=None (None: the row width T, also a constant).
    Liu et al. 2025 (Understanding R1-Zero-Like Training: A Critical Perspective).
    """
    del max_completion_len  # only in Z
    return jnp.sum(mask_bt * x_bt)
