"""Sampler: greedy = uncached argmax, behaviour log-probs = teacher forcing, the sampling
distribution (chi-square), stop tokens, padding invariance, sharding, no recompilation.

Compiles are the cost here, so the tests share one tiny model and a few samplers whose
static plans (greedy / sampled, max_new_tokens, n, batch bucket) are reused across tests;
every forward runs jitted.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_sampler import CFG, GREEDY, PAD, TN, N, make_model, prompts

from jaxrl_frontier.core import sharding as shd
from jaxrl_frontier.models import model_forms
from jaxrl_frontier.sampling import (
    FinishReason,
    Knobs,
    Sampler,
    SamplingParams,
    mlp_dropout_mask,
    sample_logits,
    truncate_logits,
)
from jaxrl_frontier.sampling.sampler import decode_windows


@pytest.fixture(scope="module")
def model():
    return make_model()


@pytest.fixture(scope="module")
def sampler(model):
    return Sampler(model, pad_id=PAD, batch_buckets=(4,))


@pytest.fixture(scope="module")
def forward(model):
    """Uncached full forward: (tokens, mask[, mlp_mask]) -> numpy logits [B, T, V]."""
    graphdef, state = nnx.split(model)
    fwd = jax.jit(lambda s, t, m, mm: nnx.merge(graphdef, s)(t, m, mlp_mask=mm))

    def run(tokens, mask, mlp_mask=None):
        return np.asarray(fwd(state, jnp.asarray(tokens), jnp.asarray(mask), mlp_mask))

    return run


def log_softmax_np(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def greedy_reference(forward, tokens, mask, tn):
    """Token-by-token argmax of the full, uncached forward over the growing sequence."""
    b, tp = tokens.shape
    buf = np.concatenate([tokens, np.zeros((b, tn), np.int32)], 1)
    buf_mask = np.concatenate([mask, np.zeros((b, tn), np.int32)], 1)
    logps = np.zeros((b, tn), np.float32)
    for i in range(tn):
        logits = forward(buf, buf_mask)[:, tp + i - 1]  # causal: later (zero) slots unseen
        buf[:, tp + i] = logits.argmax(-1)
        buf_mask[:, tp + i] = 1
        logps[:, i] = np.take_along_axis(log_softmax_np(logits), buf[:, tp + i, None], -1)[:, 0]
    return buf[:, tp:], logps


def test_greedy_equals_uncached_argmax(sampler, forward):
    tokens, mask = prompts([3, 9, 14, 6])
    ro = sampler.generate(tokens, mask, GREEDY, jax.random.key(0))
    ref_tokens, ref_logp = greedy_reference(forward, tokens, mask, TN)
    # n=2 greedy completions of a prompt are identical; rows are prompt-major
    np.testing.assert_array_equal(np.asarray(ro.completion_tokens), np.repeat(ref_tokens, N, 0))
    np.testing.assert_allclose(np.asarray(ro.policy_logp), np.repeat(ref_logp, N, 0), atol=1e-4)
    np.testing.assert_array_equal(np.asarray(ro.sample_logp), 0.0)  # log q = log 1
    np.testing.assert_array_equal(np.asarray(ro.lengths), TN)
    assert ro.finish_reason_names() == ["length"] * (4 * N)
    assert ro.prompt_tokens.shape == (4 * N, 16)  # left-padded to the prompt bucket


def test_mixed_length_batch_matches_alone(sampler):
    tokens, mask = prompts([2, 13, 7])
    batch = sampler.generate(tokens, mask, GREEDY, jax.random.key(0))
    for i in range(3):
        alone = sampler.generate(tokens[i : i + 1], mask[i : i + 1], GREEDY, jax.random.key(0))
        assert alone.completion_tokens.shape == (N, TN)  # batch padding rows dropped
        np.testing.assert_array_equal(
            np.asarray(alone.completion_tokens),
            np.asarray(batch.completion_tokens[i * N : i * N + N]),
        )


def test_a_part_of_the_batch_sampled_from_its_first_row_draws_the_batch_rows(model, sampler):
    """first_row: a process sampling prompts 2-3 of a batch of 4 (rows 4-7 at N = 2) gives
    the tokens and log-probs of those rows of the whole batch (keys by global row index);
    from row 0 it draws other tokens."""
    from jaxrl_frontier.sampling import ContinuousSampler

    tokens, mask = prompts([5, 9, 3, 11], seed=3)
    params = SamplingParams(max_new_tokens=TN, n=N, temperature=1.0)
    for engine in (sampler, ContinuousSampler(model, pad_id=PAD, slots=3, batch_buckets=(4,))):
        whole = engine.generate(tokens, mask, params, jax.random.key(7))
        part = engine.generate(tokens[2:], mask[2:], params, jax.random.key(7), first_row=2 * N)
        got, want = np.asarray(part.completion_tokens), np.asarray(whole.completion_tokens)
        np.testing.assert_array_equal(got, want[2 * N :])
        np.testing.assert_allclose(
            np.asarray(part.policy_logp), np.asarray(whole.policy_logp)[2 * N :], atol=1e-6
        )
        unshifted = engine.generate(tokens[2:], mask[2:], params, jax.random.key(7))
        assert not np.array_equal(np.asarray(unshifted.completion_tokens), got)


def test_eos_stops_row_and_masks_tail(sampler, forward):
    tokens, mask = prompts([4, 10])
    free = np.asarray(sampler.generate(tokens, mask, GREEDY, jax.random.key(0)).completion_tokens)
    # EOS := the first token of row 0 that it has not produced before, at position p >= 2
    row = free[0]
    p = next(i for i in range(2, TN) if row[i] not in row[:i])
    eos = int(row[p])
    ro = sampler.generate(
        tokens, mask, dataclasses.replace(GREEDY, eos_ids=(eos,)), jax.random.key(0)
    )
    out, cmask = np.asarray(ro.completion_tokens), np.asarray(ro.completion_mask)
    for b in range(ro.completion_tokens.shape[0]):
        hits = np.flatnonzero(free[b] == eos)
        length = hits[0] + 1 if len(hits) else TN
        assert int(ro.lengths[b]) == length
        np.testing.assert_array_equal(out[b, :length], free[b, :length])
        np.testing.assert_array_equal(out[b, length:], PAD)
        np.testing.assert_array_equal(cmask[b], np.arange(TN) < length)
        np.testing.assert_array_equal(np.asarray(ro.policy_logp)[b, length:], 0.0)
        reason = FinishReason.STOP if len(hits) else FinishReason.LENGTH
        assert int(ro.finish_reason[b]) == reason
    assert int(ro.lengths[0]) == p + 1 and ro.finish_reason_names()[0] == "stop"


def test_sampled_logps_match_teacher_forcing(sampler, forward):
    """policy_logp = log softmax of an uncached forward over the produced sequence, and
    sample_logp = the same under temperature + truncation; tails past a stop are masked."""
    params = SamplingParams(
        max_new_tokens=TN, n=N, temperature=0.7, top_k=20, top_p=0.9, min_p=0.02, stop_ids=(5, 9)
    )
    tokens, mask = prompts([3, 14, 8, 1], seed=1)
    ro = sampler.generate(tokens, mask, params, jax.random.key(3))
    seq = jax.device_get(ro.sequences())
    tp = ro.prompt_tokens.shape[1]
    assert seq.tokens.shape == (4 * N, tp + TN)
    logits = forward(seq.tokens, seq.attention_mask)  # [B, T, V]
    next_logp = np.take_along_axis(log_softmax_np(logits[:, :-1]), seq.tokens[:, 1:, None], -1)
    expected = np.concatenate([np.zeros((4 * N, 1)), next_logp[..., 0]], 1) * seq.loss_mask
    np.testing.assert_allclose(seq.old_logp, expected, atol=1e-4)
    np.testing.assert_array_equal(seq.loss_mask[:, :tp], 0.0)
    np.testing.assert_array_equal(seq.policy_mask, seq.loss_mask)

    q = truncate_logits(jnp.asarray(logits[:, tp - 1 : -1]) / 0.7, 20, 0.9, 0.02)
    q_logp = np.take_along_axis(log_softmax_np(np.asarray(q)), seq.tokens[:, tp:, None], -1)
    cmask = np.asarray(ro.completion_mask)
    expected_q = np.where(cmask == 1, q_logp[..., 0], 0.0)  # past the end: -inf * 0
    np.testing.assert_allclose(np.asarray(ro.sample_logp), expected_q, atol=1e-4)

    # stop tokens end rows; nothing is sampled after them
    out, lengths = np.asarray(ro.completion_tokens), np.asarray(ro.lengths)
    for b in range(4 * N):
        body = out[b, : lengths[b]]
        assert not np.isin(body[:-1], (5, 9)).any()
        assert (int(ro.finish_reason[b]) == FinishReason.STOP) == bool(np.isin(body[-1], (5, 9)))
        np.testing.assert_array_equal(out[b, lengths[b] :], PAD)
    # a group's completions are independent draws
    assert len({tuple(r) for r in out}) > 4


def test_no_recompilation(sampler, count_compiles):
    """Same shapes and static plan -> nothing compiles again: prompts, their lengths, keys,
    temperature, top_p, min_p and the stop ids are traced."""
    a = SamplingParams(max_new_tokens=TN, n=N, temperature=0.7, top_k=20, top_p=0.9, min_p=0.02)
    b = SamplingParams(
        max_new_tokens=TN, n=N, temperature=1.3, top_k=20, top_p=0.5, min_p=0.1, eos_ids=(7,)
    )
    jax.block_until_ready(sampler.generate(*prompts([3, 5], seed=5), a, jax.random.key(0)))
    with count_compiles() as seen:
        jax.block_until_ready(sampler.generate(*prompts([9, 2], seed=6), b, jax.random.key(1)))
        jax.block_until_ready(sampler.generate(*prompts([12, 1], seed=7), a, jax.random.key(2)))
    assert seen == [], f"compiled again on a same-shaped call: {seen}"


def test_sharded_greedy_equals_single_device(sampler):
    """8 devices (data 2, fsdp 2, tensor 2: rows over data x fsdp, heads over tensor, the
    decode scanning the fsdp-split layers) against one device (layers unstacked), the
    phased (filled-cache) decode against the full cache on the mesh too."""
    if jax.device_count() < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    mesh = shd.make_mesh((2, 2, 2))
    sharded_model = shd.shard_model(make_model(), mesh)
    assert "tensor" in str(sharded_model.layers.attn.q_proj[...].sharding.spec)
    sharded = Sampler(sharded_model, pad_id=PAD, mesh=mesh, batch_buckets=(4,))
    tokens, mask = prompts([6, 14, 2, 9], seed=2)
    a = sharded.generate(tokens, mask, GREEDY, jax.random.key(0))
    b = sampler.generate(tokens, mask, GREEDY, jax.random.key(0))
    full = Sampler(sharded_model, pad_id=PAD, mesh=mesh, batch_buckets=(4,), decode_phases=1)
    c = full.generate(tokens, mask, GREEDY, jax.random.key(0))
    assert len(a.completion_tokens.sharding.device_set) == 8
    assert sharded.decode_phases > 1 and len(decode_windows(16, TN, sharded.decode_phases)) > 1
    for other in (b, c):
        np.testing.assert_array_equal(np.asarray(a.completion_tokens), other.completion_tokens)
        np.testing.assert_allclose(np.asarray(a.policy_logp), other.policy_logp, atol=1e-4)


def test_dropout_masks_fixed_per_row(model, forward):
    """Each row samples under its own MLP mask; policy_logp is that sub-network's log-prob."""
    drop = Sampler(model, pad_id=PAD, batch_buckets=(4,))
    params = SamplingParams(max_new_tokens=TN, n=4, greedy=True, dropout_rate=0.5)
    tokens, mask = prompts([7], seed=3)
    ro = drop.generate(tokens, mask, params, jax.random.key(4))
    again = drop.generate(tokens, mask, params, jax.random.key(4))
    np.testing.assert_array_equal(
        np.asarray(ro.completion_tokens), np.asarray(again.completion_tokens)
    )
    assert len({tuple(r) for r in np.asarray(ro.completion_tokens)}) > 1  # greedy, yet diverse

    seq = ro.sequences()
    keys = jax.random.wrap_key_data(ro.dropout_keys)
    mlp_mask = mlp_dropout_mask(keys, 0.5, CFG.num_layers, CFG.intermediate_size)
    logits = forward(seq.tokens, seq.attention_mask, mlp_mask)
    tok = np.asarray(seq.tokens)
    next_logp = np.take_along_axis(log_softmax_np(logits[:, :-1]), tok[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(
        np.asarray(seq.old_logp)[:, 1:], next_logp * np.asarray(seq.loss_mask)[:, 1:], atol=1e-4
    )


# ----------------------------------------------------------------------------- sample_logits (its distribution: tests/sampling/test_ops.py)


LOGITS = np.array([2.0, 1.5, 1.2, 0.9, 0.4, 0.0, -0.3, -0.8, -1.5, -3.0], np.float32)


def test_greedy_sample_logits_and_errors(sampler):
    logits = jnp.asarray(np.stack([LOGITS, LOGITS[::-1]]))
    token, logp = sample_logits(
        logits, jax.random.key(0), SamplingParams(max_new_tokens=1, greedy=True)
    )
    np.testing.assert_array_equal(np.asarray(token), [0, LOGITS.size - 1])
    np.testing.assert_array_equal(np.asarray(logp), 0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(max_new_tokens=4, top_p=0.0)
    too_long = prompts([4], width=9000)
    with pytest.raises(ValueError, match=r"prompt length 9000 .* largest bucket 8192"):
        sampler.generate(
            np.ones_like(too_long[0]), np.ones_like(too_long[1]), GREEDY, jax.random.key(0)
        )
    with pytest.raises(ValueError, match="left-padded"):
        tokens, mask = prompts([4])
        sampler.generate(tokens, mask[:, ::-1], GREEDY, jax.random.key(0))


def test_bf16_cache_is_bf16_and_close(model, sampler, forward):
    """`cache_dtype='bfloat16'`: the cache is stored in bf16 (half the bytes), and sampled
    log-probs stay close to a teacher-forced f32 forward over the same tokens."""
    bf16 = Sampler(model, pad_id=PAD, batch_buckets=(4,), cache_dtype="bfloat16")
    tokens, mask = prompts([3, 9, 14, 6])
    knobs = Knobs.of(SamplingParams(max_new_tokens=TN))
    prompts_d, _ = bf16.pad_prompts(tokens, mask)
    cache, _, _ = bf16.prefill(
        nnx.state(model), *prompts_d, jax.random.key(0), knobs, n=1, use_dropout=False, slots=TN
    )
    assert {x.dtype for x in cache.k + cache.v} == {jnp.dtype(jnp.bfloat16)}
    assert cache.k[0].shape == (4, CFG.num_kv_heads, 16 + TN, CFG.resolved_head_dim)
    params = SamplingParams(max_new_tokens=TN, n=N, temperature=1.0)
    ro = bf16.generate(tokens, mask, params, jax.random.key(3))
    seq = ro.sequences()
    logits = forward(np.asarray(seq.tokens), np.asarray(seq.attention_mask))
    ref = np.take_along_axis(
        log_softmax_np(logits[:, :-1]), np.asarray(seq.tokens)[:, 1:, None], -1
    )
    loss_mask = np.asarray(seq.loss_mask)[:, 1:] == 1
    err = np.abs(np.asarray(seq.old_logp)[:, 1:] - ref[..., 0])[loss_mask]
    assert err.size > 0 and err.max() < 5e-2, err.max()  # bf16 keys/values: ~3 significant digits
    with pytest.raises(ValueError, match="cache_dtype"):
        Sampler(model, pad_id=PAD, cache_dtype="float16")


def test_sampler_dtype_samples_as_a_model_built_for_it(model, sampler):
    """`dtype='bfloat16'` (config `rollout.dtype`) over f32 weights: bit for bit the rollout
    of a sampler over a model built to compute in bf16 on those weights, in a bf16 cache,
    and not the f32 sampler's; the model itself stays f32. A bad dtype is named."""
    bf16 = Sampler(model, pad_id=PAD, batch_buckets=(4,), dtype="bfloat16")
    built = Sampler(
        model_forms.reconfigured(model, model.cfg.replace(dtype="bfloat16")), pad_id=PAD,
        batch_buckets=(4,),
    )  # fmt: skip
    tokens, mask = prompts([3, 9, 14, 6])
    params = SamplingParams(max_new_tokens=TN, n=N, temperature=1.0)
    a, b, f32 = (
        s.generate(tokens, mask, params, jax.random.key(5)) for s in (bf16, built, sampler)
    )
    for field in ("completion_tokens", "policy_logp", "sample_logp"):
        np.testing.assert_array_equal(np.asarray(getattr(a, field)), np.asarray(getattr(b, field)))
    assert not np.array_equal(np.asarray(a.policy_logp), np.asarray(f32.policy_logp))
    assert model.cfg.dtype == "float32" and bf16.cfg.dtype == "bfloat16"
    with pytest.raises(ValueError, match=r"dtype='float16'; allowed"):
        Sampler(model, pad_id=PAD, dtype="float16")


def test_decode_windows_by_hand():
    """Steps s = 1 .. Tn-1 split evenly over the phases, bounds Tp + ceil(j (Tn-1) / P)
    rounded up to 8 slots, the last the whole cache Tp + Tn."""
    assert decode_windows(16, 128, 4) == (48, 80, 112, 144)  # 16 + 32j, already multiples
    assert decode_windows(16, TN, 4) == (24, 28)  # 19, 22, 25 -> 24, 24, 32 (capped: 28)
    assert decode_windows(16, 128, 1) == (144,)
    assert decode_windows(3, 2, 8) == (5,)  # one step: every bound rounds past the cache
    with pytest.raises(ValueError, match="decode phases=0"):
        decode_windows(16, 8, 0)


@pytest.mark.parametrize("phases", [3, 8])
def test_filled_cache_decode_gives_the_full_cache_tokens(model, sampler, phases):
    """A decode in phases (each step attends to a cache just large enough for it) gives the
    tokens of one full-size cache for the same keys, greedy and sampled with stop ids.
    Log-probs differ by rounding only: a softmax over S <= 28 slots, |logp| < 10, f32."""
    full = Sampler(model, pad_id=PAD, batch_buckets=(4,), decode_phases=1)
    phased = Sampler(model, pad_id=PAD, batch_buckets=(4,), decode_phases=phases)
    assert len(decode_windows(16, TN, phases)) > 1
    sampled = SamplingParams(
        max_new_tokens=TN, n=N, temperature=0.9, top_p=0.95, stop_ids=(5, 9, 17, 33, 65)
    )
    tokens, mask = prompts([4, 14, 1, 10], seed=4)
    for params in (GREEDY, sampled):
        a, b = (s.generate(tokens, mask, params, jax.random.key(7)) for s in (full, phased))
        np.testing.assert_array_equal(np.asarray(a.completion_tokens), b.completion_tokens)
        np.testing.assert_array_equal(np.asarray(a.lengths), b.lengths)
        tol = 28 * np.finfo(np.float32).eps * 10
        np.testing.assert_allclose(np.asarray(a.policy_logp), b.policy_logp, atol=tol)
    assert int(np.asarray(b.finish_reason == FinishReason.STOP).sum()) > 0  # stops exercised
