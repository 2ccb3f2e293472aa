"""sampling/ops.py: truncation and the inverse-CDF draw by hand, the sampled distribution
against NumPy (chi-square), per-row keys, dropout masks, stop tokens."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.sampling import SamplingParams, sample_logits
from jaxrl_frontier.sampling.ops import (
    inverse_cdf,
    is_stop,
    log_prob,
    mlp_dropout_mask,
    row_keys,
    truncate_logits,
)

LOGITS = np.array([2.0, 1.5, 1.2, 0.9, 0.4, 0.0, -0.3, -0.8, -1.5, -3.0], np.float32)


def truncated_probs_np(logits, temperature, top_k, top_p, min_p):
    """Reference: softmax(logits / T) restricted to the top-k, then top-p, then min-p set."""
    z = logits / temperature
    order = np.argsort(-z)
    keep = np.ones_like(z, bool)
    if top_k:
        keep[order[top_k:]] = False
    p = np.where(keep, np.exp(z - z.max()), 0.0)
    p /= p.sum()
    if top_p < 1:
        mass = 0.0
        for i in order:
            if keep[i] and mass >= top_p:
                keep[i] = False
            mass += p[i]
    p = np.where(keep, p, 0.0)
    keep &= p >= min_p * p.max()
    p = np.where(keep, p, 0.0)
    return p / p.sum()


def chi2_upper(df: int, z: float = 4.265) -> float:
    """Wilson-Hilferty approximation of the chi-square upper quantile (z=4.265: p=1e-5)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


@pytest.mark.parametrize(
    "temperature, top_k, top_p, min_p",
    [
        (1.0, 0, 1.0, 0.0),
        (0.6, 5, 1.0, 0.0),
        (1.4, 0, 0.8, 0.0),
        (1.0, 0, 1.0, 0.15),
        (0.8, 6, 0.9, 0.05),
    ],
)
def test_sample_logits_distribution(temperature, top_k, top_p, min_p):
    num = 50_000
    params = SamplingParams(
        max_new_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p
    )
    logits = jnp.broadcast_to(jnp.asarray(LOGITS), (num, LOGITS.size))
    tokens, logp = sample_logits(logits, jax.random.key(11), params)
    tokens, logp = np.asarray(tokens), np.asarray(logp)
    expected = truncated_probs_np(LOGITS.astype(np.float64), temperature, top_k, top_p, min_p)
    counts = np.bincount(tokens, minlength=LOGITS.size)
    kept = expected > 0
    assert counts[~kept].sum() == 0, "a truncated token was sampled"
    stat = np.sum((counts[kept] - num * expected[kept]) ** 2 / (num * expected[kept]))
    assert stat < chi2_upper(int(kept.sum()) - 1), (stat, counts, num * expected)
    np.testing.assert_allclose(logp, np.log(expected[tokens]), atol=1e-5)


def test_truncation_by_hand():
    p = np.array([0.4, 0.3, 0.2, 0.1])  # probabilities, descending
    z = jnp.asarray(np.log(p), jnp.float32)[None]
    kept = lambda out: np.isfinite(np.asarray(out))[0].tolist()
    truncate = jax.jit(truncate_logits, static_argnames=("top_k", "top_p", "min_p"))
    assert kept(truncate(z, top_k=2)) == [True, True, False, False]
    assert kept(truncate(z, top_p=0.7)) == [True, True, False, False]  # 0.4 + 0.3
    assert kept(truncate(z, top_p=0.71)) == [True, True, True, False]
    assert kept(truncate(z, min_p=0.5)) == [True, True, True, False]  # >= 0.2
    assert kept(truncate(z, top_k=3, top_p=0.5)) == [True, True, False, False]
    ties = jnp.asarray([[1.0, 2.0, 2.0, 0.0]])
    assert kept(truncate(ties, top_k=1)) == [False, True, True, False]  # ties kept
    np.testing.assert_array_equal(truncate(z), z)  # nothing on


def test_inverse_cdf_and_log_prob_by_hand():
    p = np.array([0.2, 0.0, 0.3, 0.5], np.float32)  # token 1 has no mass
    with np.errstate(divide="ignore"):
        q = jnp.asarray(np.log(np.tile(p, (4, 1))))
    token, logq = jax.jit(inverse_cdf)(q, jnp.asarray([0.1, 0.2, 0.45, 0.99], jnp.float32))
    assert np.asarray(token).tolist() == [0, 2, 2, 3]  # CDF 0.2, 0.2, 0.5, 1.0
    np.testing.assert_allclose(logq, np.log(p[[0, 2, 2, 3]]), rtol=1e-5)
    logits = jnp.asarray([[0.0, math.log(3.0)]])  # p = 1/4, 3/4
    np.testing.assert_allclose(log_prob(logits, jnp.asarray([1])), [math.log(0.75)], rtol=1e-6)


def test_row_keys_from_a_first_row_are_the_whole_batchs_rows():
    key = jax.random.key(5)
    whole = [jax.random.key_data(k) for k in row_keys(key, 4)]
    part = [jax.random.key_data(k) for k in row_keys(key, 2, first_row=2)]
    for w, s in zip(whole, part):
        np.testing.assert_array_equal(w[2:], s)
    assert not np.array_equal(whole[0][0], whole[1][0])  # mask and stream keys differ


def test_dropout_mask_and_stop_tokens():
    keys = jax.random.split(jax.random.key(0), 3)
    mask = np.asarray(mlp_dropout_mask(keys, 0.75, num_layers=2, hidden=64))
    assert mask.shape == (2, 3, 64) and set(np.unique(mask)) <= {0.0, 4.0}
    assert 0 < np.count_nonzero(mask) < mask.size
    np.testing.assert_array_equal(mlp_dropout_mask(keys, 0.75, 2, 64), mask)  # keyed
    stops = jnp.asarray([2, 7, -1, -1])
    np.testing.assert_array_equal(is_stop(jnp.asarray([[2, 3], [7, -2]]), stops), [[1, 0], [1, 0]])
