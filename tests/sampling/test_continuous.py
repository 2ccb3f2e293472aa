"""Continuous batching: the same tokens as the static decode for the same keys, whatever the
slot count (greedy, sampled with stop tokens, a prompt bucket with padding rows), slots kept
busy, no recompilation, and the config's choice and errors."""

import jax
import ml_collections
import numpy as np
import pytest
from tiny_sampler import GREEDY, PAD, TN, N, make_hybrid_model, make_model, prompts
from tiny_sampler import first_devices_mesh as _mesh
from tiny_sampler import placed as _placed

from jaxrl_frontier.sampling import ContinuousSampler, Sampler, SamplingParams, make_sampler

STOPS = SamplingParams(
    max_new_tokens=TN, n=N, temperature=0.9, top_p=0.95, stop_ids=(5, 9, 17, 33, 65)
)


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def static(model):
    return Sampler(model, pad_id=PAD, batch_buckets=(4,), decode_phases=1)


@pytest.mark.parametrize("slots", [1, 3, 8])
def test_same_tokens_as_static_batching(model, static, slots):
    """Row r's tokens come from its own uniforms and its prompt's cache in any slot. The
    log-probs agree to f32 rounding of a softmax over <= 28 slots with |logp| < 10."""
    tokens, mask = prompts([4, 14, 1], seed=4)  # 3 prompts in a bucket of 4: a padding row
    cont = ContinuousSampler(model, slots=slots, pad_id=PAD, batch_buckets=(4,))
    for params in (GREEDY, STOPS):
        a, b = (s.generate(tokens, mask, params, jax.random.key(7)) for s in (static, cont))
        assert b.completion_tokens.shape == (3 * N, TN)
        for field in ("completion_tokens", "completion_mask", "lengths", "finish_reason"):
            np.testing.assert_array_equal(np.asarray(getattr(a, field)), getattr(b, field))
        tol = 28 * np.finfo(np.float32).eps * 10
        for field in ("policy_logp", "sample_logp"):
            np.testing.assert_allclose(np.asarray(getattr(a, field)), getattr(b, field), atol=tol)
        np.testing.assert_array_equal(np.asarray(a.prompt_tokens), b.prompt_tokens)
    lengths = np.asarray(b.lengths)
    assert lengths.min() < TN and (np.asarray(b.finish_reason) == 0).any()  # rows stopped early
    if slots == 1:  # one slot is never idle: steps = every row's tokens (padding rows too)
        assert cont.stats["slot_busy_share"] == 1.0


def test_a_hybrid_models_rows_carry_their_linear_state_through_the_slots():
    """Qwen3.5's hybrid layers: a slot that takes a row takes its prompt's conv window and
    delta-rule matrix with its KV slots, and the tokens are the static decode's (3 slots
    for 6 rows: every slot runs rows one after another). Log-probs: as above, the
    recurrence's sums in the same order (one token a step on both sides)."""
    model = make_hybrid_model()
    tokens, mask = prompts([4, 14, 1], seed=4)
    static = Sampler(model, pad_id=PAD, batch_buckets=(4,), decode_phases=1)
    cont = ContinuousSampler(model, slots=3, pad_id=PAD, batch_buckets=(4,))
    for params in (GREEDY, STOPS):
        a, b = (s.generate(tokens, mask, params, jax.random.key(7)) for s in (static, cont))
        for field in ("completion_tokens", "lengths", "finish_reason"):
            np.testing.assert_array_equal(np.asarray(getattr(a, field)), getattr(b, field))
        tol = 28 * np.finfo(np.float32).eps * 10
        for field in ("policy_logp", "sample_logp"):
            np.testing.assert_allclose(np.asarray(getattr(a, field)), getattr(b, field), atol=tol)
    assert np.asarray(b.lengths).min() < TN  # rows stopped early: slots changed rows


def test_slots_stay_busy_where_static_rows_idle(model):
    """Rows of unequal lengths: the static decode keeps a stopped row's slot to the end of
    the batch's longest row; continuous batching hands it to a pending row."""
    tokens, mask = prompts([6, 9, 3, 12], seed=1)
    cont = ContinuousSampler(model, slots=2, pad_id=PAD, batch_buckets=(4,))
    ro = cont.generate(tokens, mask, STOPS, jax.random.key(3))
    lengths = np.asarray(ro.lengths)
    assert len(set(lengths.tolist())) > 1  # the lengths spread
    static_busy = lengths.sum() / (lengths.size * lengths.max())  # every row runs to the max
    # each decode step advances both slots until no row is pending; the first tokens come
    # from the prefill logits, so a row of length L takes L - 1 decode steps
    assert cont.stats["slot_busy_share"] > static_busy
    assert cont.stats["steps"] <= (lengths - 1).sum() / 2 + TN


def test_no_recompilation(model, count_compiles):
    cont = ContinuousSampler(model, slots=3, pad_id=PAD, batch_buckets=(4,))
    jax.block_until_ready(cont.generate(*prompts([3, 5], seed=5), STOPS, jax.random.key(0)))
    with count_compiles() as seen:
        for i, lengths in enumerate(([9, 2, 7], [12, 1])):
            cont.generate(*prompts(lengths, seed=6 + i), STOPS, jax.random.key(i + 1))
    assert seen == [], f"compiled again on a same-shaped call: {seen}"


def test_config_picks_it_and_errors_name_the_key(model):
    rollout = ml_collections.ConfigDict(dict(continuous_slots=4, speculative=dict(draft=None)))
    assert isinstance(make_sampler(model, rollout, pad_id=PAD), ContinuousSampler)
    rollout.continuous_slots = 0
    assert type(make_sampler(model, rollout, pad_id=PAD)) is Sampler
    rollout.update(continuous_slots=4, dropout_rate=0.1)
    with pytest.raises(ValueError, match="rollout.dropout_rate"):
        make_sampler(model, rollout, pad_id=PAD)
    rollout.update(dropout_rate=0.0, speculative=dict(draft=1))
    with pytest.raises(ValueError, match="rollout.speculative.draft"):
        make_sampler(model, rollout, pad_id=PAD)
    rows_mesh, heads_mesh = _mesh((2, 1, 1)), _mesh((1, 1, 2))
    with pytest.raises(ValueError, match="continuous_slots=3.*multiple of the 2 devices"):
        ContinuousSampler(_placed(model, rows_mesh), slots=3, pad_id=PAD, mesh=rows_mesh)
    with pytest.raises(ValueError, match="tensor axis must be 1"):
        ContinuousSampler(_placed(model, heads_mesh), slots=4, pad_id=PAD, mesh=heads_mesh)


@pytest.mark.parametrize("shape,slots", [((2, 1, 1), 2), ((2, 2, 1), 8)])
def test_on_a_mesh_each_device_runs_its_rows(model, static, shape, slots):
    """Rows split over data x fsdp, each device's slot loop over its own prompts: the tokens
    of the one-device static decode (the rows' keys are global), log-probs to f32 rounding;
    busy slot-steps counted over every device."""
    mesh = _mesh(shape)
    cont = ContinuousSampler(
        _placed(model, mesh), slots=slots, pad_id=PAD, batch_buckets=(4,), mesh=mesh
    )
    tokens, mask = prompts([4, 14, 1], seed=4)
    for params in (GREEDY, STOPS):
        a, b = (s.generate(tokens, mask, params, jax.random.key(7)) for s in (static, cont))
        for field in ("completion_tokens", "completion_mask", "lengths", "finish_reason"):
            np.testing.assert_array_equal(np.asarray(getattr(a, field)), getattr(b, field))
        tol = 28 * np.finfo(np.float32).eps * 10
        np.testing.assert_allclose(np.asarray(a.policy_logp), b.policy_logp, atol=tol)
    lengths = np.asarray(b.lengths)  # 3 prompts x N rows and the padding prompt's N rows
    assert 0 < cont.stats["slot_busy_share"] <= 1 and cont.stats["steps"] < lengths.sum()


def test_rl_run_with_continuous_batching_is_the_static_run(tmp_path):
    """Two RL steps with rollout.continuous_slots = 4 (16 rows of 8-token completions): the
    same rewards as the static decode, losses equal up to the log-probs' f32 rounding, and
    the slots' busy share logged."""
    from conftest import read_metrics, small_rl_config

    from jaxrl_frontier.run import trainer as tr

    rows = {}
    for slots in (0, 4):
        c = small_rl_config()
        c.rollout.update(max_new_tokens=8, continuous_slots=slots)
        c.objective.reward_weights = dict(correctness=1.0, format=0.5, length=0.1)
        c.train.update(steps=2, log_every=1, eval_every=10**6, checkpoint_every=10**6)
        trainer = tr.Trainer(c, str(tmp_path / str(slots)))
        trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
        trainer.run()
        rows[slots] = [r for r in read_metrics(tmp_path / str(slots)) if "train/loss" in r]
    for a, b in zip(rows[0], rows[4], strict=True):
        assert a["reward/total"] == b["reward/total"]
        assert b["train/loss"] == pytest.approx(a["train/loss"], abs=1e-5)
        assert 0.0 < b["rollout/continuous_slot_busy_share"] <= 1.0
        assert "rollout/continuous_slot_busy_share" not in a


def test_merge_stats_over_processes_counts_every_slot_step():
    """Two processes' loops of 2 slots each: 10 steps at 0.9 busy (18 slot-steps) and 6
    steps at 0.5 (6): 24 busy of 2 x 2 slots x 10 steps = 0.6; continued rows summed."""
    merged = ContinuousSampler.merge_stats(
        [
            dict(slot_busy_share=0.9, steps=10.0, continued_rows=3.0),
            dict(slot_busy_share=0.5, steps=6.0, continued_rows=2.0),
        ]
    )
    assert merged == pytest.approx(dict(slot_busy_share=0.6, steps=10.0, continued_rows=5.0))
    assert Sampler.merge_stats([dict(acceptance_rate=0.5), dict(acceptance_rate=0.7)]) == (
        pytest.approx(dict(acceptance_rate=0.6))
    )
