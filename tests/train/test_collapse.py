"""After an eval (train/collapse.py): the rise-and-collapse detector on hand-made curves,
the best-policy export and the collapse record (the early stop through the trainer is in
tests/rl/test_diagnostics.py, beside the run whose compiled programs it shares)."""

import ml_collections
import pytest

from jaxrl_frontier.run.config import sections
from jaxrl_frontier.train import collapse as cl

STEPS = [0, 10, 20, 30, 40, 50]


def _curve(values):
    return list(zip(STEPS, values))


def test_collapse_detector_fires_on_rise_then_fall():
    det = cl.CollapseDetector(rise=0.05, drop=0.05, patience=2)
    got = det.check(_curve([0.1, 0.3, 0.5, 0.3, 0.2]))
    assert got == dict(collapse_at=40, peak_step=20, peak=0.5, next_budget=23)
    assert det.check(_curve([0.1, 0.3, 0.5, 0.3])) is None  # one low eval: not yet
    assert det.check(_curve([0.1, 0.5, 0.3, 0.48])) is None  # recovered within `drop`


def test_collapse_detector_stays_quiet_on_monotone_and_noisy_flat_curves():
    det = cl.CollapseDetector(rise=0.05, drop=0.05, patience=2)
    assert det.check(_curve([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])) is None
    assert det.check(_curve([0.1, 0.2, 0.2, 0.3, 0.3, 0.4])) is None  # plateaus, no fall
    assert det.check(_curve([0.30, 0.33, 0.29, 0.32, 0.28, 0.31])) is None  # noise < rise
    assert det.check(_curve([0.5, 0.4, 0.3, 0.2, 0.1, 0.0])) is None  # falls, never rose


def _train_config(export="best", stop=True):
    c = ml_collections.ConfigDict()
    c.train = dict(export=export)
    c.train.collapse = dict(stop=stop, metric="m", rise=0.05, drop=0.05, patience=2)
    return sections.peak_options(c)


def test_after_eval_exports_each_new_best_and_records_the_collapse():
    history, exported, said = {"eval": []}, [], []
    c = _train_config()
    for step, v in zip(STEPS, [0.1, 0.3, 0.5, 0.3, 0.2]):
        history["eval"].append(dict(step=step, m=v))
        cl.after_eval(history, {"m": v}, step, c, lambda s=step: exported.append(s), said.append)
        assert cl.collapse_outcome(history, step) == ("target" if step == 40 else None)
    assert exported == [0, 10, 20] and history["best"] == dict(step=20, value=0.5)
    assert history["collapse"]["next_budget"] == 23 and cl.finished(history)
    assert len(said) == 1 and "next budget 23" in said[0]


def test_after_eval_names_a_missing_metric_only_when_it_is_needed():
    history = {"eval": [dict(step=0, other=1.0)]}
    cl.after_eval(history, {"other": 1.0}, 0, _train_config("last", False), None, None)
    assert "best" not in history  # nothing asked for the metric: nothing tracked
    with pytest.raises(KeyError, match="train.collapse.metric"):
        cl.after_eval(history, {"other": 1.0}, 0, _train_config(), None, None)
