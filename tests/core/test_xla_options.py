"""core/xla_options.py: the rollout programs' XLA options by backend and matmul rows."""

import pytest

from jaxrl_frontier.core import xla_options


def test_rollout_compiler_options_and_rejected_ones_warn_once(monkeypatch):
    """CPU rollouts: YNNPACK for reductions, and for dots too below 8 matmul rows per device
    and from 64; other backends: XLA's defaults. An option set XLA rejects warns once,
    naming XLA's reason, and gives the defaults."""
    ynn = "xla_cpu_experimental_ynn_fusion_type"
    reduce = ((ynn, "LIBRARY_FUSION_TYPE_REDUCE"),)
    dots = ((ynn, "LIBRARY_FUSION_TYPE_REDUCE,LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"),)
    for rows, want in ((1, dots), (7, dots), (8, reduce), (63, reduce), (64, dots)):
        assert xla_options.rollout_compiler_options("cpu", rows) == want, rows
    assert xla_options.rollout_compiler_options("gpu", 64) == ()
    monkeypatch.setitem(xla_options.ROLLOUT_OPTIONS, "cpu", ((0, {"xla_cpu_no_such_flag": "1"}),))
    with pytest.warns(UserWarning, match=r"xla_cpu_no_such_flag.*INVALID_ARGUMENT") as seen:
        assert xla_options.rollout_compiler_options("cpu", 1) == ()
        assert xla_options.rollout_compiler_options("cpu", 8) == ()
    assert len(seen) == 1
