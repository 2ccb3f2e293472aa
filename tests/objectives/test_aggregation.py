"""objectives/aggregation.py: every aggregation against NumPy, and each term of its formula
needed (at its default parameters, against a NumPy transcription of its docstring, on inputs
where leaving out any one term changes the result by far more than the tolerance)."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.objectives import AGGREGATIONS

MARGIN = 10  # an ablated formula must miss the full one by 10x the tolerance


def rel_gap(got, want):
    """max |got - want| / max |want|; a NaN where `want` is finite counts as infinitely far."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    d = np.where(np.isnan(got - want), np.inf, np.abs(got - want))
    return d.max() / max(np.abs(want).max(), 1e-30)


def check_term(fn_ref_pairs, ref, term, tol):
    """Each (got, ref-args) pair matches the full reference within `tol`; leaving `term` out
    of the reference misses it by more than MARGIN * tol on at least one of them."""
    gaps = []
    for got, args in fn_ref_pairs:
        full = ref(*args)
        assert rel_gap(got, full) < tol, (np.asarray(got), full)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            gaps.append(rel_gap(ref(*args, off={term}), full))
    assert max(gaps) > MARGIN * tol, f"no case on which {term!r} changes the result: {gaps}"


B, T = 4, 5
# completion lengths 4, 2, 0 (an empty row), 1; "single": one valid token (where the floors
# max(Z, 1) meet Z = 1); "empty": no valid token at all
AGG_MASKS = {
    "ragged": np.array(
        [[0, 1, 1, 1, 1], [0, 1, 1, 0, 0], [0, 0, 0, 0, 0], [0, 1, 0, 0, 0]], np.float32
    ),
    "single": np.zeros((B, T), np.float32),
    "empty": np.zeros((B, T), np.float32),
}
AGG_MASKS["single"][1, 2] = 1.0
# positive, so no sum cancels: each aggregate is within 20 * eps_f32 = 2.4e-6 of its value
AGG_X = np.random.default_rng(0).uniform(0.5, 1.5, (B, T)).astype(np.float32)
AGG_TOL = 1e-5


def ref_aggregate(name, x, m, off=()):
    """N / Z from the docstring (C = T by default); `off` names terms to leave out."""
    x, m = np.asarray(x, np.float64), np.asarray(m, np.float64)
    mx = x if "mask" in off else m * x
    n_b = m.sum(1)
    rows = B if "valid_rows" in off else (n_b > 0).sum()
    if name == "token_mean":
        N, Z = mx.sum(), (m.size if "valid_tokens" in off else m.sum())
    elif name == "seq_mean_token_mean":
        row_len = T if "row_length" in off else n_b if "row_guard" in off else np.maximum(n_b, 1)
        N, Z = (mx.sum(1) / row_len).sum(), rows
    elif name == "seq_mean_token_sum":
        N, Z = mx.sum(), rows
    elif name == "seq_mean_token_sum_norm":
        N, Z = mx.sum(), rows * (1 if "C" in off else T)
    else:
        raise AssertionError(name)
    return N / (Z if "z_guard" in off else max(Z, 1))


AGG_TERMS = {
    "token_mean": ("mask", "valid_tokens", "z_guard"),
    "seq_mean_token_mean": ("mask", "row_length", "row_guard", "valid_rows", "z_guard"),
    "seq_mean_token_sum": ("mask", "valid_rows", "z_guard"),
    "seq_mean_token_sum_norm": ("mask", "valid_rows", "C", "z_guard"),
}


@pytest.mark.parametrize("name,term", [(n, t) for n, ts in AGG_TERMS.items() for t in ts])
def test_aggregation_needs_each_term_at_its_defaults(name, term):
    assert set(AGG_TERMS) == set(AGGREGATIONS.names())
    fn = AGGREGATIONS.get(name)
    pairs = [(fn(jnp.asarray(AGG_X), jnp.asarray(m)), (name, AGG_X, m)) for m in AGG_MASKS.values()]
    check_term(pairs, ref_aggregate, term, AGG_TOL)


MASK = np.array([[0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 1, 1]], np.float32)


def test_aggregations_match_numpy():
    x = np.random.default_rng(1).normal(size=(3, 6)).astype(np.float32)
    mask = MASK.copy()  # [3, 6]
    mask[1] = 0.0  # an empty row is not counted as a sequence
    rows = [b for b in range(3) if mask[b].sum() > 0]
    expected = {
        "token_mean": (mask * x).sum() / mask.sum(),
        "seq_mean_token_mean": np.mean([(mask[b] * x[b]).sum() / mask[b].sum() for b in rows]),
        "seq_mean_token_sum": np.mean([(mask[b] * x[b]).sum() for b in rows]),
        "seq_mean_token_sum_norm": np.mean([(mask[b] * x[b]).sum() for b in rows]) / 8,
    }
    assert set(expected) == set(AGGREGATIONS.names())
    for name, value in expected.items():
        kw = {"max_completion_len": 8} if name.endswith("norm") else {}
        got = AGGREGATIONS.get(name)(jnp.asarray(x), jnp.asarray(mask), **kw)
        np.testing.assert_allclose(got, value, rtol=1e-5, err_msg=name)
    # C defaults to the row width
    got = AGGREGATIONS.get("seq_mean_token_sum_norm")(jnp.asarray(x), jnp.asarray(mask))
    np.testing.assert_allclose(got, expected["seq_mean_token_sum"] / 6, rtol=1e-5)
