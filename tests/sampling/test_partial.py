"""Partial rollouts (`rollout.partial_budget`, sampling/partial.py): the next batch's rows
start in the idle slots of the current batch's decode and continue in the next call.

- with unchanged weights a row continued across calls gives the tokens of an uncut row;
- each token keeps the version that sampled it; a row of the next batch holds at most the
  budget's tokens from the call before its own;
- the rows in flight survive `state()` / `restore()` exactly;
- in the trainer: tokens lag by at most one version, the run learns, and a run checkpointed
  with rows in flight (no draining) resumes to the uncut run's metrics and weights;
- the config refuses what does not go with it, naming the keys.
"""

import json
import os
import sys

import jax
import numpy as np
import pytest
from conftest import override, run_killed_after, run_trainer, small_rl_config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sampler tests beside it
from tiny_sampler import PAD, TN, N, make_hybrid_model, make_model, prompts  # noqa: E402

from jaxrl_frontier.run import config as config_lib  # noqa: E402
from jaxrl_frontier.sampling import ContinuousSampler, SamplingParams  # noqa: E402
from jaxrl_frontier.sampling.partial import PartialSampler, RowsInFlight  # noqa: E402

# no top-p: a nucleus whose edge moves by a rounding renormalises sample_logp by a step
STOPS = SamplingParams(max_new_tokens=TN, n=N, temperature=0.9, stop_ids=(5, 9, 17, 33, 65))
BATCHES = ([4, 14, 1], [6, 9, 3], [12, 2, 7], [5, 5, 11])


@pytest.fixture(scope="module")
def model():
    return make_model()


def _calls(sampler, batches, keys, versions=None):
    out = []
    for i, batch in enumerate(batches):
        if i + 1 < len(batches):
            sampler.begin_next(*batches[i + 1], keys[i + 1])
        version = i if versions is None else versions[i]
        out.append(sampler.generate(*batch, STOPS, keys[i], policy_version=version))
    return out


def test_continued_rows_give_the_tokens_of_uncut_rows(model):
    """Three calls with the same weights: every batch equals the uncut continuous decode of
    its rows. The log-probs of a continued token come from a prefill instead of decode
    steps: the same sums in another order, |logp| < 10 over <= 30 slots."""
    batches = [prompts(lengths, seed=s) for s, lengths in enumerate(BATCHES[:3])]
    keys = [jax.random.key(10 + i) for i in range(3)]
    uncut = ContinuousSampler(model, slots=3, pad_id=PAD)
    partial = PartialSampler(model, slots=3, budget=4, pad_id=PAD)
    for i, (got, batch, key) in enumerate(zip(_calls(partial, batches, keys), batches, keys)):
        want = uncut.generate(*batch, STOPS, key)
        for field in ("completion_tokens", "completion_mask", "lengths", "finish_reason"):
            np.testing.assert_array_equal(
                np.asarray(getattr(got, field)), np.asarray(getattr(want, field)), err_msg=field
            )
        tol = 30 * np.finfo(np.float32).eps * 10
        for field in ("policy_logp", "sample_logp"):
            np.testing.assert_allclose(getattr(got, field), getattr(want, field), atol=tol)
        versions = np.asarray(got.token_version)
        mask = np.asarray(got.completion_mask) > 0
        assert set(np.unique(versions[mask])) <= {i - 1, i} and (versions[~mask] == -1).all()
        if i > 0:  # begun by the call before: its first tokens are version i - 1
            begun = (versions == i - 1).sum(1)
            assert begun.max() > 0 and begun.max() <= partial.budget
            # a row's tokens are a prefix of version i - 1 then version i, never back
            assert (np.diff(np.where(mask, versions, i), axis=1) >= 0).all()
            np.testing.assert_array_equal(
                np.asarray(got.policy_version), np.where(begun > 0, i - 1, i)
            )
    assert partial.in_flight is None  # the last call began nothing


def test_a_hybrid_models_continued_rows_give_the_tokens_of_uncut_rows():
    """Qwen3.5's hybrid layers: a continued row's linear state comes from the re-prefill of
    its prompt and held tokens (padded to a quarter of Tn: masked tokens leave the conv
    window and the delta-rule matrix as they were), and the next batch's rows take their
    prompts' states into the slots. Three calls equal the uncut continuous decode: tokens
    exactly, log-probs as above (the chunk-parallel prefill against the token-by-token
    recurrence: other sums of the same terms; 1.2e-6 measured)."""
    model = make_hybrid_model()
    batches = [prompts(lengths, seed=s) for s, lengths in enumerate(BATCHES[:3])]
    keys = [jax.random.key(10 + i) for i in range(3)]
    uncut = ContinuousSampler(model, slots=3, pad_id=PAD)
    partial = PartialSampler(model, slots=3, budget=4, pad_id=PAD)
    continued = 0
    for got, batch, key in zip(_calls(partial, batches, keys), batches, keys):
        want = uncut.generate(*batch, STOPS, key)
        for field in ("completion_tokens", "lengths", "finish_reason"):
            np.testing.assert_array_equal(
                np.asarray(getattr(got, field)), np.asarray(getattr(want, field)), err_msg=field
            )
        for field in ("policy_logp", "sample_logp"):
            np.testing.assert_allclose(
                getattr(got, field), getattr(want, field), atol=30 * np.finfo(np.float32).eps * 10
            )
        continued += partial.stats["continued_rows"]
    assert continued > 0  # rows were cut and continued


def test_rows_in_flight_survive_state_and_restore(model):
    """A sampler restored from `state()` (JSON) continues the rows as the one that began
    them: bitwise the same tokens and log-probs."""
    batches = [prompts(lengths, seed=s) for s, lengths in enumerate(BATCHES[1:])]
    keys = [jax.random.key(20 + i) for i in range(3)]
    first = PartialSampler(model, slots=4, budget=3, pad_id=PAD)
    whole = _calls(first, batches, keys)
    again = PartialSampler(model, slots=4, budget=3, pad_id=PAD)
    for i in range(2):  # calls 0 and 1; call 1 begins batch 2
        again.begin_next(*batches[i + 1], keys[i + 1])
        again.generate(*batches[i], STOPS, keys[i], policy_version=i)
    saved = json.loads(json.dumps(again.state()))
    assert again.in_flight is not None and again.in_flight.lengths.max() > 0
    fresh = PartialSampler(model, slots=4, budget=3, pad_id=PAD)
    fresh.restore(saved)
    resumed = fresh.generate(*batches[2], STOPS, keys[2], policy_version=2)
    for field in ("completion_tokens", "policy_logp", "sample_logp", "token_version"):
        np.testing.assert_array_equal(getattr(resumed, field), getattr(whole[2], field))
    with pytest.raises(ValueError, match="not the one the last call began"):
        fresh.restore(saved)
        fresh.generate(*batches[0], STOPS, keys[2])
    fresh.restore(None)
    fresh.begin_next(*prompts([3, 4], seed=9), keys[0])  # 2 prompts after a batch of 3
    with pytest.raises(ValueError, match="begun ahead has 2 prompts, this one 3"):
        fresh.generate(*batches[0], STOPS, keys[0])


@pytest.mark.parametrize("shape,slots", [((2, 1, 1), 2), ((2, 2, 1), 4)])
def test_on_a_mesh_each_device_continues_its_rows(model, shape, slots):
    """Rows split over data x fsdp: each device begins and continues its own share of the
    rows. Three calls give the one-device calls' tokens, lengths and finish reasons (how many
    tokens a row got one version back depends on its device's loop, the tokens do not)."""
    from tiny_sampler import first_devices_mesh as _mesh
    from tiny_sampler import placed as _placed

    lengths = ([4, 14, 1, 9], [6, 9, 3, 2], [12, 2, 7, 5])
    batches = [prompts(batch, seed=s) for s, batch in enumerate(lengths)]
    keys = [jax.random.key(30 + i) for i in range(3)]
    mesh = _mesh(shape)
    one = PartialSampler(model, slots=2, budget=3, pad_id=PAD)
    split = PartialSampler(_placed(model, mesh), slots=slots, budget=3, pad_id=PAD, mesh=mesh)
    calls = zip(_calls(one, batches, keys), _calls(split, batches, keys), strict=True)
    for i, (a, b) in enumerate(calls):
        for field in ("completion_tokens", "lengths", "finish_reason"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
        tol = 30 * np.finfo(np.float32).eps * 10
        np.testing.assert_allclose(a.policy_logp, b.policy_logp, atol=tol)
        versions, mask = np.asarray(b.token_version), np.asarray(b.completion_mask) > 0
        assert set(np.unique(versions[mask])) <= {i - 1, i}
        begun = ((versions == i - 1) & mask).sum(1)  # tokens sampled by the call before
        assert begun.max() <= split.budget and (i == 0) == (begun.max() == 0)
    with pytest.raises(ValueError, match="3 prompts do not split over [24] devices"):
        split.generate(*prompts([4, 5, 6], seed=1), STOPS, keys[0])


def _config(**overrides):
    c = small_rl_config()
    c.rollout.update(max_new_tokens=8, continuous_slots=4, partial_budget=3)
    c.objective.reward_weights = dict(correctness=1.0, format=0.5, length=0.1)
    c.objective.weight = "tis"  # corrects the tokens sampled one version back
    c.optimizer.update(lr=5e-3, warmup_steps=0)
    c.train.update(steps=4, log_every=1, eval_every=10**6, checkpoint_every=10**6)
    return override(c, overrides)


def _run(tmp_path, name, **overrides):
    return run_trainer(_config(**overrides), tmp_path / name)


def _leaves(trainer):
    return [np.asarray(x) for x in jax.tree.leaves(trainer.state.params)]


def test_trainer_lags_by_at_most_one_and_resumes_with_rows_in_flight(tmp_path):
    whole, _, rows = _run(tmp_path, "whole", **{"train.checkpoint_every": 2})
    assert rows[0]["rollout/token_lag_max"] == 0.0  # step 1: nothing was begun before it
    assert all(r["rollout/token_lag_max"] == 1.0 for r in rows[1:])
    assert all(0 < r["rollout/lagged_token_share"] < 1 for r in rows[1:])
    assert [r["rollout/policy_lag"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert rows[-1]["train/grad_norm"] > 0
    # killed right after step 2's checkpoint, which holds step 3's rows begun during step 2
    run_killed_after(_config(**{"train.checkpoint_every": 2}), tmp_path / "cut", 2)
    held = json.load(open(tmp_path / "cut" / "checkpoints" / "2" / "meta" / "metadata"))
    assert len(held["partial"]["examples"]) == 4
    rows_held = RowsInFlight.from_state(held["partial"]["rows"])
    assert rows_held.lengths.max() > 0 and not rows_held.finished.all()
    resumed, summary, rows_resumed = _run(tmp_path, "cut", **{"train.checkpoint_every": 2})
    assert summary["step"] == 4
    for key in ("train/loss", "reward/total", "rollout/token_lag_mean"):
        assert [r[key] for r in rows_resumed][-2:] == [r[key] for r in rows][-2:], key
    for a, b in zip(_leaves(whole), _leaves(resumed), strict=True):
        np.testing.assert_array_equal(a, b)


def test_trainer_on_two_devices_continues_each_devices_rows(tmp_path):
    """mesh.num_devices = 2: the rollout mesh splits the rows, each device runs 2 of the 4
    slots. Step 1 (the same weights, the same rows' keys) gives the one-device run's
    rewards; the later steps lag by one version and train."""
    _, _, one = _run(tmp_path, "one")
    _, _, two = _run(tmp_path, "two", **{"mesh.num_devices": 2})
    assert two[0]["reward/total"] == one[0]["reward/total"]
    assert [r["rollout/token_lag_max"] for r in two] == [0.0, 1.0, 1.0, 1.0]
    assert two[-1]["train/grad_norm"] > 0


def test_config_refuses_what_partial_rollouts_do_not_go_with():
    for overrides, named in (
        (dict(continuous_slots=0), "rollout.continuous_slots = 0"),
        (dict(max_staleness=1), "rollout.max_staleness"),
        (dict(editors=("dre",)), "rollout.editors"),
    ):
        c = _config()
        c.rollout.update(**overrides)
        c.objective.weight = config_lib.base_config().objective.weight  # ('tis' refuses DRE)
        with pytest.raises(config_lib.ConfigError, match="rollout.partial_budget") as e:
            config_lib.validate(c, num_devices=1)
        assert named in str(e.value)
    c = _config()
    c.data.source = "dynamic"
    with pytest.raises(config_lib.ConfigError, match="data.source = 'dynamic'"):
        config_lib.validate(c, num_devices=1)
