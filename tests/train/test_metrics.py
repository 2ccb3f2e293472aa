"""Metrics: TensorBoard event files read back, JSONL lines, process-0-only writes, ProgressBar."""

import io
import json
import math

import numpy as np
import pytest

from jaxrl_frontier.train.metrics import (
    METRICS_FILE,
    ROLLOUTS_FILE,
    MetricsWriter,
    ProgressBar,
    RolloutLogger,
    format_duration,
)


def _accumulator(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_scalars_and_text_read_back(tmp_path):
    with MetricsWriter(tmp_path, process_index=0) as w:
        w.write_scalars(1, {"loss": 0.5, "reward/correctness": np.float32(0.25)})
        w.write_scalars(2, {"loss": np.asarray(0.125), "reward/correctness": 1})
        w.write_scalars(3, {"loss": float("nan")})
        w.write_text(0, "config", "lr: 1e-5")
    acc = _accumulator(tmp_path)
    assert set(acc.Tags()["scalars"]) == {"loss", "reward/correctness"}
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == [1, 2, 3]
    assert [e.value for e in loss[:2]] == [0.5, 0.125] and math.isnan(loss[2].value)
    assert [e.value for e in acc.Scalars("reward/correctness")] == [0.25, 1.0]
    assert "config" in acc.Tags()["tensors"]
    text = acc.Tensors("config")[0]
    assert text.step == 0 and text.tensor_proto.string_val[0].decode() == "lr: 1e-5"

    rows = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["loss"] == 0.5 and rows[0]["reward/correctness"] == 0.25
    assert rows[2]["loss"] is None  # NaN -> null: strict JSON
    assert all(isinstance(r["time"], float) for r in rows)


def test_scalar_errors(tmp_path):
    with MetricsWriter(tmp_path, process_index=0) as w:
        with pytest.raises(ValueError, match="'loss' must be a scalar"):
            w.write_scalars(0, {"loss": np.zeros(3)})
        with pytest.raises(ValueError, match="'step' collides"):
            w.write_scalars(0, {"step": 1.0})
    with pytest.raises(RuntimeError, match="is closed"):
        w.write_scalars(1, {"loss": 1.0})
    w.close()  # twice is fine


def test_only_process_zero_writes(tmp_path):
    w = MetricsWriter(tmp_path / "p1", process_index=1)
    w.write_scalars(0, {"loss": 1.0})
    w.write_text(0, "t", "x")
    w.flush()
    w.close()
    r = RolloutLogger(tmp_path / "p1", process_index=1)
    r.write_batch(0, ["p"], ["c"], [[1.0]], ["correctness"], [0.0])
    r.write(step=0, prompt="p", completion="c", rewards={"correctness": 1.0}, advantage=0.0)
    r.close()
    assert not (tmp_path / "p1").exists()


def test_default_process_index_is_jax(tmp_path):
    with MetricsWriter(tmp_path) as w:  # single process: jax.process_index() == 0
        w.write_scalars(0, {"x": 1.0})
    assert (tmp_path / METRICS_FILE).exists()


def test_rollout_logger(tmp_path):
    log = RolloutLogger(tmp_path, process_index=0)
    names = ("correctness", "format", "length")
    rewards = np.array([[1.0, 1.0, 0.5], [0.0, 1.0, 0.75]], np.float32)
    log.write_batch(
        7,
        ["1+1=", "1+1="],
        ["2", "3"],
        rewards,
        names,
        np.array([0.5, -0.5]),
        extra={"policy_version": np.array([3, 3])},
    )
    log.write_batch(8, ["a", "b"], ["x", "é"], rewards, names, [0, 0], max_rows=1)
    log.write(
        step=9,
        prompt="p",
        completion="c",
        rewards={"correctness": np.float32(1.0), "format": 1, "length": float("nan")},
        advantage=0.25,
    )
    with pytest.raises(ValueError, match=r"rewards shape \(2, 3\), expected \(2, 2\)"):
        log.write_batch(9, ["a", "b"], ["x", "y"], rewards, ("a", "b"), [0, 0])
    with pytest.raises(ValueError, match="'prompts': 1"):
        log.write_batch(9, ["a"], ["x", "y"], rewards, names, [0, 0])
    log.close()
    rows = [json.loads(line) for line in (tmp_path / ROLLOUTS_FILE).read_text().splitlines()]
    assert len(rows) == 4
    assert rows[0] == {
        "step": 7,
        "prompt": "1+1=",
        "completion": "2",
        "rewards": {"correctness": 1.0, "format": 1.0, "length": 0.5},
        "advantage": 0.5,
        "policy_version": 3,
    }
    assert rows[1]["advantage"] == -0.5 and rows[2]["step"] == 8 and rows[2]["completion"] == "x"
    assert rows[3]["rewards"] == {"correctness": 1.0, "format": 1.0, "length": None}


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0s"),
        (7.4, "7s"),
        (59.6, "1m00s"),
        (245, "4m05s"),
        (3600 + 120 + 5, "1h02m"),
        (2 * 86400 + 3 * 3600 + 59, "2d03h"),
        (None, "?"),
        (float("inf"), "?"),
        (float("nan"), "?"),
        (-1, "?"),
    ],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_plain_lines():
    clock, out = FakeClock(), io.StringIO()
    bar = ProgressBar(100, metrics=("loss", "missing"), stream=out, log_interval_s=10, clock=clock)
    bar.update(0, {"loss": 1.0})  # first update: prints, no rate yet
    clock.t += 5
    bar.update(10, {"loss": 0.5})  # the first rate: printed within the interval
    clock.t += 5
    bar.update(20, {"loss": np.float32(0.25), "other": 3})  # within the interval: silent
    clock.t += 10
    bar.update(40, {"loss": np.float32(0.25)})
    clock.t += 1
    bar.update(100)  # the last step always prints
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 4
    assert lines[0] == "step 0/100 (0.0%) | ? it/s | eta ? | loss 1"
    # 10 steps in 5 s = 2 it/s; 90 steps left -> 45 s.
    assert lines[1] == "step 10/100 (10.0%) | 2.00 it/s | eta 45s | loss 0.5"
    # 40 steps in 20 s = 2 it/s; 60 steps left -> 30 s.
    assert lines[2] == "step 40/100 (40.0%) | 2.00 it/s | eta 30s | loss 0.25"
    assert lines[3].startswith("step 100/100 (100.0%)") and "eta 0s" in lines[3]
    assert "\r" not in out.getvalue()


def test_progress_bar_tty_redraws_in_place():
    clock, out = FakeClock(), FakeTTY()
    bar = ProgressBar(1000, stream=out, clock=clock)
    bar.update(0)
    clock.t += 60
    bar.update(60)  # 1 it/s, 940 left
    bar.close()
    text = out.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n")
    assert "eta 15m40s" in text.split("\r")[-1]


def test_progress_bar_resumed_desc_and_all_metrics():
    clock, out = FakeClock(), io.StringIO()
    bar = ProgressBar(100, initial=40, desc="rl", stream=out, log_interval_s=10, clock=clock)
    bar.update(41, {"reward": 0.5, "loss": 2})  # metrics=None: show all, in the given order
    clock.t += 10
    bar.update(51, {"reward": 0.75})
    lines = out.getvalue().splitlines()
    assert lines[0] == "rl step 40/100 (40.0%) | ? it/s | eta ?"
    assert lines[1] == "rl step 41/100 (41.0%) | ? it/s | eta ? | reward 0.5 loss 2"
    assert lines[2] == "rl step 51/100 (51.0%) | 1.00 it/s | eta 49s | reward 0.75 loss 2"


def test_progress_bar_total_validated():
    with pytest.raises(ValueError, match="total must be >= 1"):
        ProgressBar(0)
    with pytest.raises(ValueError, match="initial <= total"):
        ProgressBar(10, initial=11)


# ---------------------------------------------------------------- nothing lost, nothing twice


def test_truncate_after_keeps_rows_up_to_the_step_and_drops_torn_lines(tmp_path):
    from jaxrl_frontier.train.metrics import truncate_jsonl

    w = MetricsWriter(tmp_path, process_index=0)
    for step in (1, 2, 3, 4):
        w.write_scalars(step, {"loss": float(step)})
    w.flush(sync=True)
    with open(tmp_path / METRICS_FILE, "a") as f:
        f.write('{"step": 5, "loss": 5.0')  # a kill in the middle of a write
    assert w.truncate_after(2) == 3  # steps 3, 4 and the torn row
    w.write_scalars(3, {"loss": 30.0})  # the same open handle appends after the cut
    w.close()
    rows = [json.loads(line) for line in open(tmp_path / METRICS_FILE)]
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert truncate_jsonl(tmp_path / "missing.jsonl", 3) == 0


def test_rollout_logger_truncate_after(tmp_path):
    log = RolloutLogger(tmp_path, process_index=0)
    for step in (1, 1, 2, 3):
        log.write(step=step, prompt="p", completion="c", rewards={"r": 1.0}, advantage=0.0)
    assert log.truncate_after(1) == 2
    log.write(step=2, prompt="p", completion="again", rewards={"r": 1.0}, advantage=0.0)
    log.close()
    rows = [json.loads(line) for line in open(tmp_path / "rollouts.jsonl")]
    assert [(r["step"], r["completion"]) for r in rows] == [(1, "c"), (1, "c"), (2, "again")]
