"""Arrays as JSON text, exactly: for host state that rides in a checkpoint's JSON metadata
(rows in flight, batches produced ahead of the learner)."""

from __future__ import annotations

import base64
import io

import numpy as np


def array_to_text(x) -> str:
    """base64 of the array's .npy bytes: dtype, shape and every bit kept."""
    buf = io.BytesIO()
    np.save(buf, np.asarray(x), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def array_from_text(text: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False)
