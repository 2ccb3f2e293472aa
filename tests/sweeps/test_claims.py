"""The results claims' statistics and loader (sweeps/claims.py): mean/std, standard-error
distance and Spearman's rho against numpy, curves and groups of hand-made runs, the
faster-or-higher verdict, and loading claim files (the repository's and broken ones)."""

import importlib.util
import math
import os

import numpy as np
import pytest

from jaxrl_frontier.sweeps import claims as stats
from jaxrl_frontier.sweeps.claims import DOES_NOT, INCONCLUSIVE, REPRODUCES

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def claim_file(key: str):
    """The module of sweeps/claim_<key>.py: its sweep and its analysis."""
    path = os.path.join(REPO, "sweeps", f"claim_{key}.py")
    spec = importlib.util.spec_from_file_location(f"claim_{key}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(seed, series, status="done", wall=60.0, step=10):
    return dict(seed=seed, series=series, status=status, wall_seconds=wall, step=step)


def test_statistics_match_numpy():
    a, b = [1.0, 2.0, 4.0], [0.5, 0.7, 0.2]
    m, s = stats.mean_std(a)
    assert m == pytest.approx(np.mean(a)) and s == pytest.approx(np.std(a, ddof=1))
    se = np.sqrt(np.var(a, ddof=1) / 3 + np.var(b, ddof=1) / 3)
    assert stats.differs(a, b) == pytest.approx((np.mean(a) - np.mean(b)) / se)
    # Spearman's rho with a tie: Pearson correlation of the average ranks
    x, y = [0.1, 0.4, 0.4, 0.9, 0.5], [1.0, 3.0, 2.0, 5.0, 4.0]
    rx, ry = [0, 1.5, 1.5, 4, 3], [0, 2, 1, 4, 3]
    assert claim_file("e").rank_correlation(x, y) == pytest.approx(np.corrcoef(rx, ry)[0, 1])
    assert stats.fmt([1.0, 2.0, 3.0]) == "2.000 ± 1.000"


def test_differs_of_equal_spreads_and_windows():
    assert stats.differs([2.0, 2.0], [1.0, 1.0]) == math.inf  # no spread, means differ
    assert stats.differs([1.0, 1.0], [1.0, 1.0]) == 0.0
    assert stats.mean_std([4.0]) == (4.0, 0.0)
    points = [[1, 1.0], [2, 2.0], [3, 3.0], [4, 7.0]]
    assert stats.window_mean(points, first=True, n=2) == 1.5
    assert stats.window_mean(points, first=False) == 4.0  # (2 + 3 + 7) / 3


def test_curves_and_groups_of_runs():
    a = run(0, {"r": [[1, 0.1], [2, 0.3], [3, 0.5]]})
    b = run(1, {"r": [[2, 0.5], [3, 0.9]]})
    failed = run(2, {"r": [[1, 1.0]]}, status="failed")
    curve = stats.mean_curve([a, b], "r")
    assert curve["steps"] == [2, 3] and curve["mean"] == pytest.approx([0.4, 0.7])
    assert curve["std"] == pytest.approx([np.std([0.3, 0.5], ddof=1), np.std([0.5, 0.9], ddof=1)])
    groups = stats.by_label([a, failed, b], lambda r: "even" if r["seed"] % 2 == 0 else "odd")
    assert groups == {"even": [a], "odd": [b]}  # the failed run left out
    assert not stats.enough_seeds(groups, ["even"])
    assert stats.enough_seeds({"x": [a, b, a]}, ["x"])
    assert stats.same_curves([a, b], [run(0, dict(a["series"])), run(1, {"r": []})], "r") == 1
    assert stats.last_value("r")(b) == 0.9
    _, labels, rows = stats.compare(
        [a, b], lambda r: f"s{r['seed']}", ["s1", "s0", "s9"], {"last": stats.last_value("r")}
    )
    assert labels == ["s1", "s0"]
    assert rows == [
        {"method": "s1", "seeds": "1", "last": "0.900 ± 0.000"},
        {"method": "s0", "seeds": "1", "last": "0.500 ± 0.000"},
    ]
    assert stats.wall_note({"x": [a, b]}) == (
        "2 runs of 10 steps; wall time 60 ± 0 s per run, 2.0 min in all (0.0 CPU-min)"
    )
    assert stats.config_stem({"config": "/repo/configs/grpo_arith.py:runlocal"}) == "grpo_arith"


@pytest.mark.parametrize(
    "better, lower, verdict",
    [([5.0, 6.0, 7.0], False, REPRODUCES), ([5.0, 6.0, 7.0], True, DOES_NOT)],
)
def test_verdict_faster_or_higher(better, lower, verdict):
    base = [1.0, 2.0, 3.0]  # z = 4 / sqrt(2/3) = 4.9
    got, text = stats.verdict_faster_or_higher(better, base, "A", "B", "pass@1", lower)
    assert got == verdict
    z = 4 / math.sqrt(2 / 3) * (-1 if lower else 1)
    assert text == f"pass@1: A 6.000 ± 1.000, B 2.000 ± 1.000 ({z:+.1f} SE in A's favour)"
    close, text = stats.verdict_faster_or_higher([2.5, 3.0], base, "A", "B", "x", False)
    assert close == INCONCLUSIVE and text.endswith(" — within 2 SE")


def test_the_repositorys_claims_load_and_a_broken_file_is_named(tmp_path):
    claims = stats.load_claims(os.path.join(REPO, "sweeps"))
    assert list(claims) == ["a", "b", "c", "d", "e", "f"]
    assert all(c.key == k and c.sweeps for k, c in claims.items())
    claim = stats.Claim(
        key="z",
        title="T",
        statement="S",
        sweeps=["sweeps/z.py", "sweeps/z.py:sft"],
        task="t",
        analyze=None,
        prerequisites=["make demo"],
        population=4,
    )
    assert claim.roots("runs") == ["runs/z", "runs/z_sft"]
    assert claim.commands() == [
        "make demo",
        "python scripts/sweep.py run sweeps/z.py --population 4",
        "python scripts/sweep.py collect runs/sweeps/z",
        "python scripts/sweep.py run sweeps/z.py:sft --population 4",
        "python scripts/sweep.py collect runs/sweeps/z_sft",
        "python scripts/report.py",
    ]
    assert stats.describe(claim).splitlines()[:4] == [
        "(z) T",
        "  S",
        "  task: t",
        "  redo: make demo",
    ]
    (tmp_path / "claim_x.py").write_text("CLAIM = 1\n")
    with pytest.raises(TypeError, match=r"claim_x.py: defines no CLAIM"):
        stats.load_claims(str(tmp_path))
