"""Roles on their own devices and asynchronous rollouts, on 8 fake CPU devices.

- rollouts on 4 devices, training on the other 4: bitwise the run that trains and samples on
  one 4-device mesh (the same programs on other devices);
- max_staleness = 0 is the synchronous run; 1 samples each batch with the weights of one
  version back (lags recorded, never above 1), still learns, and resumes exactly;
- LoRA on those roles: only the adapters move to the rollout mesh after each update.
"""

import json

import jax
import numpy as np
import pytest
from conftest import override, run_killed_after, run_trainer, small_rl_config

from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run import trainer as tr


def _untimed(row: dict) -> dict:
    """A metrics row without its wall-clock figures."""
    return {k: v for k, v in row.items() if k != "time" and "seconds" not in k and "perf/" not in k}


def _config(**overrides):
    c = small_rl_config(num_devices=0)  # all 8 devices
    c.data.prompt_batch = 8  # 32 rows: 4 per device on 8, 8 per device on 4
    c.objective.reward_weights = dict(correctness=1.0, format=0.5, length=0.1)
    c.optimizer.update(lr=5e-3, warmup_steps=0)
    c.train.update(steps=4, log_every=1, eval_every=10**6, checkpoint_every=10**6)
    c.eval.update(num_prompts=4, batch=4, pass_k=1)
    return override(c, overrides)


def _run(tmp_path, name, **overrides):
    return run_trainer(_config(**overrides), tmp_path / name)


def _leaves(trainer):
    return [np.asarray(x) for x in jax.tree.leaves(trainer.state.params)]


def test_rollout_mesh_of_its_own_is_the_same_run(tmp_path):
    one, _, rows1 = _run(tmp_path, "one", **{"mesh.num_devices": 4})
    two, _, rows2 = _run(tmp_path, "two", **{"rollout.devices": 4})
    assert one.roles.mesh.devices.size == 4 and one.roles.rollout_mesh is one.roles.mesh
    assert two.roles.mesh.devices.size == 4 and two.roles.rollout_mesh.devices.size == 4
    assert not set(two.roles.mesh.devices.flat) & set(two.roles.rollout_mesh.devices.flat)
    sampler_devices = {d for x in jax.tree.leaves(two.roles.sampler.weights()) for d in x.devices()}
    assert sampler_devices == set(two.roles.rollout_mesh.devices.flat)
    for a, b in zip(rows1, rows2, strict=True):
        for key in ("train/loss", "train/grad_norm", "reward/total"):
            assert b[key] == a[key], key
    assert rows1[-1]["train/grad_norm"] > 1e-3
    for a, b in zip(_leaves(one), _leaves(two), strict=True):
        np.testing.assert_array_equal(b, a)
    assert all(r["perf/reshard_seconds"] > 0 for r in rows2)


def test_staleness_zero_is_the_synchronous_run_and_one_lags_by_one(tmp_path):
    sync, _, rows_sync = _run(tmp_path, "sync", **{"rollout.devices": 4})
    zero, _, rows_zero = _run(
        tmp_path, "zero", **{"rollout.devices": 4, "rollout.max_staleness": 0}
    )
    for a, b in zip(_leaves(sync), _leaves(zero), strict=True):
        np.testing.assert_array_equal(a, b)
    one, summary, rows_one = _run(
        tmp_path, "one", **{"rollout.devices": 4, "rollout.max_staleness": 1}
    )
    assert summary["step"] == 4
    # step 1 samples synchronously; each later batch was sampled during the previous update
    assert [r["rollout/policy_lag"] for r in rows_one] == [0.0, 1.0, 1.0, 1.0]
    assert [r["rollout/policy_lag"] for r in rows_zero] == [0.0] * 4
    assert rows_one[-1]["rollout/dropped_stale_total"] == 0.0
    moved = max(float(np.abs(a - b).max()) for a, b in zip(_leaves(one), _leaves(sync)))
    assert moved > 1e-5  # other batches and weights: a different (not a broken) run


def test_asynchronous_run_learns_and_resumes_exactly(tmp_path):
    async1 = {"rollout.devices": 4, "rollout.max_staleness": 1}
    _, _, rows = _run(tmp_path, "learn", **async1, **{"train.steps": 30})
    reward = [r["reward/total"] for r in rows]
    assert np.mean(reward[-5:]) > np.mean(reward[:5]) + 0.05, reward
    assert max(r["rollout/policy_lag"] for r in rows) == 1.0

    # killed after step 2's checkpoint, which holds step 3's batch produced during step 2
    whole, _, rows_whole = _run(tmp_path, "whole", **async1, **{"train.checkpoint_every": 2})
    run_killed_after(_config(**async1, **{"train.checkpoint_every": 2}), tmp_path / "cut", 2)
    held = json.load(open(tmp_path / "cut" / "checkpoints" / "2" / "meta" / "metadata"))
    assert len(held["ahead"]) == 1  # no drain before the checkpoint: one batch in flight
    resumed, summary, rows = _run(tmp_path, "cut", **async1, **{"train.checkpoint_every": 2})
    assert summary["step"] == 4
    assert [r["rollout/policy_lag"] for r in rows_whole] == [0.0, 1.0, 1.0, 1.0]
    for key in ("train/loss", "reward/total", "rollout/policy_lag", "train/grad_norm"):
        assert [r[key] for r in rows][-2:] == [r[key] for r in rows_whole][-2:], key
    for a, b in zip(_leaves(whole), _leaves(resumed), strict=True):
        np.testing.assert_array_equal(a, b)


def test_staleness_k_keeps_k_batches_in_flight_and_resumes_exactly(tmp_path):
    """k = 2: the lag climbs to 2 and stays there (the batch a step starts is taken two steps
    later), across checkpoints too: a checkpoint saves the batches in flight instead of
    draining the queue, so a run killed after one resumes to the uncut run's weights and
    metrics with the lag still 2."""
    async2 = {"rollout.devices": 4, "rollout.max_staleness": 2, "train.checkpoint_every": 3}
    whole, _, rows = _run(tmp_path, "whole", **async2, **{"train.steps": 6})
    assert [r["rollout/policy_lag"] for r in rows] == [0.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    assert rows[-1]["rollout/dropped_stale_total"] == 0.0
    run_killed_after(_config(**async2, **{"train.steps": 6}), tmp_path / "cut", 3)
    held = json.load(open(tmp_path / "cut" / "checkpoints" / "3" / "meta" / "metadata"))
    assert [b["policy_version"] for b in held["ahead"]] == [1, 2]  # steps 4, 5's batches
    resumed, summary, rows_resumed = _run(tmp_path, "cut", **async2, **{"train.steps": 6})
    assert summary["step"] == 6
    for key in ("train/loss", "reward/total", "rollout/policy_lag", "train/grad_norm"):
        assert [r[key] for r in rows_resumed][-3:] == [r[key] for r in rows][-3:], key
    for a, b in zip(_leaves(whole), _leaves(resumed), strict=True):
        np.testing.assert_array_equal(a, b)
    # a real evaluation every 2 steps waits for the batches being produced and leaves them
    # queued: the lag still reaches 2 and every train step equals the run without evals
    evaluated = tr.Trainer(
        _config(**async2, **{"train.steps": 6, "train.eval_every": 2}), str(tmp_path / "evals")
    )
    evaluated.run()
    logged = [json.loads(line) for line in open(tmp_path / "evals" / "metrics.jsonl")]
    assert [r["step"] for r in logged if "eval/pass@1_greedy" in r] == [2, 4, 6]
    rows_evals = [r for r in logged if "train/loss" in r]
    assert [r["rollout/policy_lag"] for r in rows_evals] == [0.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    for a, b in zip(rows, rows_evals, strict=True):
        assert _untimed(b) == _untimed(a)
    for a, b in zip(_leaves(whole), _leaves(evaluated), strict=True):
        np.testing.assert_array_equal(a, b)


def test_rollouts_ahead_schedule_and_drop_by_hand():
    """room(): at most k in flight, none taken after the last step or across a sync step;
    take(): oldest first, a batch lagging past k dropped and counted."""
    from jaxrl_frontier.rl.ahead import RolloutsAhead

    class Source:
        n = 0

        def state(self):
            return {"n": self.n}

        def next_batch(self):
            self.n += 1
            return self.n

    ahead, source = RolloutsAhead(2), Source()
    never = lambda s: False
    try:
        assert ahead.room(1, 10, never)
        for version in (0, 0):
            ahead.start(
                source, lambda batch, v=version: (batch, {"policy_version": v}), lambda out: out
            )
        assert not ahead.room(1, 10, never) and ahead.in_flight == 2
        assert ahead.source_state(source) == {"n": 0}  # before the oldest batch's prompts
        assert ahead.take(1)[0] == 1 and ahead.source_state(source) == {"n": 1}
        assert ahead.take(3) is None and ahead.dropped == 1  # lag 3 > 2
        assert ahead.room(9, 10, never) and not ahead.room(10, 10, never)  # taken at 10 / 11
        assert not ahead.room(8, 10, lambda s: s == 8)  # step 8 ends with a checkpoint
    finally:
        ahead.close()


def test_async_roles_config_errors_name_the_key():
    for overrides, match in (
        ({"rollout.devices": 8}, "rollout.devices"),
        ({"rollout.devices": 4, "rollout.mesh": dict(data=3, fsdp=1, tensor=1)}, "rollout.mesh"),
        ({"rollout.max_staleness": -1}, "rollout.max_staleness"),
    ):
        c = config_lib.resolve(_config(**overrides))
        try:
            config_lib.validate(c, num_devices=8)
        except config_lib.ConfigError as e:
            assert match in str(e), e
        else:
            raise AssertionError(f"{overrides} passed validation")


def test_lora_on_disaggregated_roles_moves_only_the_adapters(tmp_path):
    """LoRA with rollouts on 4 devices and training on the other 4, one version ahead: the
    same run as one 8-device mesh at staleness 0; the rollout mesh keeps its own copy of the
    frozen base (placed once) and samples base + the latest adapters."""
    from jaxrl_frontier.models import lora

    def run(name, **overrides):
        c = _config(**overrides)
        c.model.lora.update(rank=4, alpha=8.0)
        trainer = tr.Trainer(c, str(tmp_path / name))
        trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
        trainer.run()
        rows = [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]
        return trainer, [r for r in rows if "train/loss" in r]

    one, rows1 = run("one")
    two, rows2 = run("two", **{"rollout.devices": 4})
    paths = [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(two.state.params)
    ]
    assert paths and all("_lora_" in p for p in paths)  # the learner trains adapters only
    for a, b in zip(rows1, rows2, strict=True):
        np.testing.assert_allclose(b["train/loss"], a["train/loss"], rtol=1e-5, atol=1e-6)
    for a, b in zip(_leaves(one), _leaves(two), strict=True):
        np.testing.assert_allclose(b, a, atol=1e-5)
    # the rollout mesh holds base + adapters; the base there is one copy, reused each step
    rollout_devices = set(two.roles.rollout_mesh.devices.flat)
    weights = two.roles.sampler.weights()
    assert {d for x in jax.tree.leaves(weights) for d in x.devices()} == rollout_devices
    base_there = two.step.learner.rollout_base
    assert all(
        a is b
        for a, b in zip(jax.tree.leaves(base_there), jax.tree.leaves(two.step.learner.rollout_base))
    )
    want = lora.combine(two.roles.base_params, two.state.params)
    got = two.step.learner.rollout_params()
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    async1, rows_async = run("async", **{"rollout.devices": 4, "rollout.max_staleness": 1})
    assert [r["rollout/policy_lag"] for r in rows_async] == [0.0, 1.0, 1.0, 1.0]
    for a, b in zip(
        jax.tree.leaves(two.roles.base_params), jax.tree.leaves(async1.roles.base_params)
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # the same frozen base
    moved = max(float(np.abs(a - b).max()) for a, b in zip(_leaves(async1), _leaves(two)))
    assert moved > 1e-6  # the adapters trained on other (stale) batches


def test_rollouts_ahead_on_several_processes_refuse_what_talks_to_other_hosts():
    """rollout.max_staleness > 0 on several processes (config.check_local_rollouts): the parts
    whose rollouts run collectives in the background thread are refused, each named; a plain
    task run passes (tests/run/test_multihost.py trains one)."""
    from jaxrl_frontier.run.config import check_local_rollouts

    check_local_rollouts(config_lib.resolve(_config(**{"rollout.max_staleness": 2})))
    for overrides, words in (
        ({"data.source": "dynamic"}, "data.source = 'dynamic'"),
        ({"rollout.editors": ("dre",)}, "rollout.editors with 'dre'"),
        ({"env.name": "gridworld"}, "env.name = 'gridworld'"),
    ):
        c = config_lib.resolve(_config(**{"rollout.max_staleness": 2, **overrides}))
        with pytest.raises(config_lib.ConfigError, match="several processes") as e:
            check_local_rollouts(c)
        assert words in str(e.value), e.value
