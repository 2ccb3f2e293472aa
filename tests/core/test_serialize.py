"""core/serialize.py: an array through JSON text comes back bit for bit, dtype and shape kept."""

import json

import numpy as np

from jaxrl_frontier.core.serialize import array_from_text, array_to_text


def test_arrays_round_trip_exactly_through_json():
    floats = np.array([[0.1, -0.0, np.nan], [np.inf, 1e-45, -3.5]], np.float32)
    for x in (floats, np.array([[1, -2, 3], [4, 5, -128]], np.int8), np.array([True, False])):
        text = json.loads(json.dumps({"x": array_to_text(x)}))["x"]
        y = array_from_text(text)
        assert y.dtype == x.dtype and y.shape == x.shape
        assert y.tobytes() == x.tobytes()  # -0.0 and the NaN's bits included
    scalar = array_from_text(array_to_text(7))
    assert scalar.shape == () and scalar == 7
    assert array_to_text([1, 2]).isascii()
