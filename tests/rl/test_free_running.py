"""A free-running rollout producer (`rollout.free_running_queue`): timed by itself, so a
learner slower than the rollouts leaves batches older than the bound k, which are dropped
or resampled (`rollout.stale_batches`).

- by hand (no model): the loop fills its queue with the published weights, never past what
  the run still needs; stale batches are dropped and the next taken, or resampled with the
  loop held; a pause holds it;
- a real run whose update is slowed: batches drop, every batch trained on lags at most k,
  and the prompts drawn are the steps plus the drops; with 'resample' the same stale
  batches are sampled again, so the prompts drawn are exactly the steps';
- a run checkpointed with batches queued resumes them: nothing drawn is lost;
- the config refuses what does not go with it, naming the keys.
"""

import json
import time

import pytest
from conftest import Killed, killed_after, override, small_rl_config

from jaxrl_frontier.rl.ahead import FreeRunningRollouts
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run import trainer as tr


class _Source:
    def __init__(self):
        self.n = 0

    def state(self):
        return {"n": self.n}

    def next_batch(self):
        self.n += 1
        return self.n


def _wait_for(condition, timeout=20.0):
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_free_running_queue_by_hand():
    version = {"now": 0}

    def maker():  # what the learner publishes: batch i by the weights of version v
        v = version["now"]
        return lambda i: (lambda batch: (batch, {"policy_version": v}), lambda out: out)

    ahead, source = FreeRunningRollouts(max_staleness=1, capacity=3), _Source()
    try:
        ahead.begin(source, remaining=6, maker=maker)
        _wait_for(lambda: ahead.in_flight == 3 and not ahead.producing)  # by version 0
        time.sleep(0.05)
        assert source.n == 3  # never past the capacity
        assert ahead.take(learner_version=1) == (1, {"policy_version": 0})  # lag 1: kept
        _wait_for(lambda: source.n == 4 and not ahead.producing)  # refilled, by version 0
        version["now"] = 3
        ahead.publish(maker)
        # lag 3 - 0 > 1: batches 2, 3, 4 (version 0) dropped; 5, begun after the publish
        # (the queue was full before it), taken
        assert ahead.take(learner_version=3) == (5, {"policy_version": 3})
        assert ahead.dropped == 3 and ahead.resampled == 0
        # resample: the stale batch's own prompts, sampled by the caller with the loop held
        _wait_for(lambda: ahead.in_flight == 3 and not ahead.producing)  # 6, 7, 8: version 3
        held = []
        resample = lambda batch: held.append(ahead.producing) or (batch, {"policy_version": 9})
        got = ahead.take(learner_version=9, resample=resample)
        assert got == (6, {"policy_version": 9}) and held == [False]
        assert ahead.dropped == 4 and ahead.resampled == 1
        with ahead.paused():  # nothing starts while held
            drawn = source.n
            time.sleep(0.05)
            assert source.n == drawn and not ahead.producing
        assert [ahead.take(learner_version=3)[0] for _ in range(2)] == [7, 8]  # lag 0
        _wait_for(lambda: source.n == 9)  # the run's last batch queued
        time.sleep(0.05)
        # its 6 batches (1, 5, 6 resampled, 7, 8, 9) and the 3 dropped: nothing more drawn
        assert source.n == 9 and ahead.in_flight == 1
    finally:
        ahead.close()


def _config(**overrides):
    c = small_rl_config()
    c.train.update(steps=6, log_every=1, eval_every=10**6, checkpoint_every=10**6)
    c.rollout.update(max_staleness=1, free_running_queue=3)
    return override(c, overrides)


def _slow_run(config, workdir, delay=0.6, kill_at=None):
    """Train with every update slowed by `delay` s (a rollout of this model takes
    milliseconds) -> (trainer, summary, the rows that hold a train/loss); kill_at: stop
    dead once that step's checkpoint is on disk (summary None)."""
    trainer = tr.Trainer(config, str(workdir))
    trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
    update = trainer.step.learner.update

    def slow_update(*args, **kwargs):
        time.sleep(delay)
        return update(*args, **kwargs)

    trainer.step.learner.update = slow_update
    if kill_at is not None:
        killed_after(trainer, kill_at)
    summary = None
    try:
        summary = trainer.run()
    except Killed:
        pass
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    return trainer, summary, [r for r in rows if "train/loss" in r]


def _drawn(trainer):
    return trainer.source.state()["iterator"]["next_index"]


@pytest.mark.parametrize("stale", ["drop", "resample"])
def test_a_slow_learner_makes_batches_stale(tmp_path, stale):
    trainer, summary, rows = _slow_run(_config(**{"rollout.stale_batches": stale}), tmp_path)
    assert summary["step"] == 6
    lags = [r["rollout/policy_lag"] for r in rows]
    dropped = rows[-1]["rollout/dropped_stale_total"]
    assert max(lags) <= 1 and dropped >= 1, (lags, dropped)
    if stale == "drop":  # the dropped batches' prompts are skipped
        assert "rollout/resampled_stale_total" not in rows[-1]
        assert _drawn(trainer) == 6 + dropped
    else:  # every prompt drawn was trained on, the stale ones by the current weights
        assert rows[-1]["rollout/resampled_stale_total"] == dropped and _drawn(trainer) == 6
        assert lags.count(0.0) >= 1 + dropped  # the first batch and each one resampled


def test_free_running_checkpoint_keeps_the_queued_batches(tmp_path):
    """A run killed after a checkpoint: the checkpoint held the queued batches (not
    drained) and the source past them, the resumed run trains on them first; every prompt
    drawn is trained on or counted as dropped, across the kill."""
    config = lambda: _config(**{"train.checkpoint_every": 2})  # noqa: E731
    _, summary, rows = _slow_run(config(), tmp_path, delay=0.3, kill_at=2)
    assert summary is None and len(rows) == 2
    meta = json.load(open(tmp_path / "checkpoints" / "2" / "meta" / "metadata"))
    queued, dropped = len(meta["ahead"]), meta["stale"]["dropped"]
    assert queued >= 1 and dropped == rows[-1]["rollout/dropped_stale_total"]
    assert meta["data"]["iterator"]["next_index"] == 2 + queued + dropped
    trainer, summary, rows = _slow_run(config(), tmp_path, delay=0.3)
    assert summary["step"] == 6 and [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert max(r["rollout/policy_lag"] for r in rows) <= 1
    assert _drawn(trainer) == 6 + rows[-1]["rollout/dropped_stale_total"]


def test_free_running_config_errors_name_the_keys():
    for overrides, match in (
        ({"rollout.max_staleness": 0}, "rollout.max_staleness = 0"),
        ({"data.source": "dynamic"}, "data.source = 'dynamic'"),
        ({"rollout.stale_batches": "keep"}, "'rollout.stale_batches' = 'keep'"),
        ({"rollout.free_running_queue": -1}, "rollout.free_running_queue"),
    ):
        with pytest.raises(config_lib.ConfigError, match=match):
            config_lib.validate(config_lib.resolve(_config(**overrides)), num_devices=1)
