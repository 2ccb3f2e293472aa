"""SpeculativeSampler: the emitted tokens are exact policy samples (chi-square against the
enumerated distribution), greedy equals the normal Sampler's greedy, a draft equal to the
policy is always accepted, and the behaviour log-probs equal a teacher-forced forward.

Compiles dominate the runtime: the policy and the "different" draft share an architecture
(so the draft == policy check reuses the sampled compile), and one jitted uncached forward
of a fixed shape serves both the enumeration and the teacher forcing.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny_sampler import HYBRID_LAYERS

from jaxrl_frontier.core import sharding as shd
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.random_init import random_model
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.sampling import (
    FinishReason,
    Sampler,
    SamplingParams,
    SpeculativeSampler,
    make_sampler,
    shallow_draft,
    truncate_logits,
)

CFG = ModelConfig(
    vocab_size=8, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2
)
PAD, TP = 0, 8  # prompt bucket
PROMPT = np.array([[3, 1, 4, 1, 5]], np.int32)  # left-padded to TP by the samplers
NUM_SAMPLES = 8000
TN_DIST, K_DIST, STOP = 3, 2, 2
SAMPLED = SamplingParams(
    max_new_tokens=TN_DIST, n=NUM_SAMPLES, temperature=0.8, top_p=0.95, stop_ids=(STOP,)
)
FWD_LEN = 20  # every uncached forward is [64, FWD_LEN]: one compile


def make_model(seed: int, cfg: ModelConfig = CFG) -> Transformer:
    """Numpy-drawn weights; a sharp output layer (logit std ~1.5), so the distributions are
    far from uniform and a wrong sampler shows in the chi-square."""
    return random_model(cfg, seed=seed, std=0.1, head_std=0.12, legacy_rng=True)


@pytest.fixture(scope="module")
def policy():
    return make_model(0)


@pytest.fixture(scope="module")
def forward(policy):
    """Uncached forward: numpy (tokens, mask) [<=64, <=FWD_LEN] -> numpy logits, padded to
    one shape (rows and trailing masked columns; causal, so they change nothing)."""
    graphdef, state = nnx.split(policy)
    fwd = jax.jit(lambda s, t, m: nnx.merge(graphdef, s)(t, m))

    def run(tokens, mask):
        b, t = tokens.shape
        pad = ((0, 64 - b), (0, FWD_LEN - t))
        logits = fwd(state, jnp.asarray(np.pad(tokens, pad)), jnp.asarray(np.pad(mask, pad)))
        return np.asarray(logits)[:b, :t]

    return run


def padded_prompt():
    tokens = np.zeros((1, TP), np.int32)
    tokens[0, TP - PROMPT.shape[1] :] = PROMPT[0]
    return tokens, (tokens != 0).astype(np.int32)


def log_softmax_np(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def chi2_upper(df: int, z: float = 4.265) -> float:
    """Wilson-Hilferty approximation of the chi-square upper quantile (z=4.265: p=1e-5)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def sampling_probs(logits):
    """The target distribution: softmax(truncate(logits / T)) with SAMPLED's settings."""
    q = truncate_logits(jnp.asarray(logits) / SAMPLED.temperature, top_p=SAMPLED.top_p)
    return np.exp(log_softmax_np(np.asarray(q, np.float64)))


def exact_distribution(forward):
    """{completion (ending at STOP or after TN_DIST tokens): probability}, by enumeration."""
    v = CFG.vocab_size
    prompt, mask = padded_prompt()
    pairs = list(itertools.product(range(v), repeat=2))  # every (y0, y1)
    tokens = np.concatenate([np.repeat(prompt, len(pairs), 0), np.array(pairs, np.int32)], 1)
    masks = np.concatenate([np.repeat(mask, len(pairs), 0), np.ones((len(pairs), 2), np.int32)], 1)
    probs = sampling_probs(forward(tokens, masks)[:, TP - 1 :])  # [V^2, 3, V]: y0, y1, y2
    p0 = probs[0, 0]
    p1 = {y0: probs[pairs.index((y0, 0)), 1] for y0 in range(v)}
    p2 = {pair: probs[i, 2] for i, pair in enumerate(pairs)}
    dist = {}
    for y0 in range(v):
        if y0 == STOP:
            dist[(y0,)] = p0[y0]
            continue
        for y1 in range(v):
            if y1 == STOP:
                dist[(y0, y1)] = p0[y0] * p1[y0][y1]
                continue
            for y2 in range(v):
                dist[(y0, y1, y2)] = p0[y0] * p1[y0][y1] * p2[(y0, y1)][y2]
    return dist


@pytest.fixture(scope="module")
def sampled_rollout(policy):
    """NUM_SAMPLES completions of PROMPT with a different draft (same architecture)."""
    draft = make_model(1)
    spec = SpeculativeSampler(policy, draft, pad_id=PAD, k=K_DIST, prompt_buckets=(TP,))
    ro = spec.generate(*padded_prompt(), SAMPLED, jax.random.key(0))
    return jax.device_get(ro), jax.device_get(spec.stats)


def test_distribution_matches_policy(sampled_rollout, forward):
    ro, stats = sampled_rollout
    dist = exact_distribution(forward)
    assert abs(sum(dist.values()) - 1.0) < 1e-6
    counts = {}
    for row, length in zip(ro.completion_tokens, ro.lengths):
        key = tuple(int(y) for y in row[:length])
        counts[key] = counts.get(key, 0) + 1
    impossible = {key for key in counts if dist.get(key, 0.0) == 0.0}
    assert not impossible, impossible  # e.g. a token top-p removes, or one after a stop
    # chi-square over the completions, pooling the rare ones (expected count < 5) into one cell
    expected = {key: NUM_SAMPLES * p for key, p in dist.items()}
    big = [key for key, e in expected.items() if e >= 5]
    rare_obs = NUM_SAMPLES - sum(counts.get(key, 0) for key in big)
    rare_exp = NUM_SAMPLES - sum(expected[key] for key in big)
    stat = sum((counts.get(key, 0) - expected[key]) ** 2 / expected[key] for key in big)
    stat += (rare_obs - rare_exp) ** 2 / rare_exp
    bound = chi2_upper(len(big))  # len(big) + 1 cells
    print(f"chi-square {stat:.1f} < {bound:.1f} (df {len(big)}), stats {stats}")
    assert stat < bound, (stat, bound)
    # the rejection path was exercised, and speculation did save policy forwards
    assert 0.2 < stats["acceptance_rate"] < 0.95, stats
    assert stats["tokens_per_policy_forward"] > 1.2, stats
    stopped = ro.finish_reason == FinishReason.STOP
    np.testing.assert_array_equal(
        stopped, ro.completion_tokens[np.arange(NUM_SAMPLES), ro.lengths - 1] == STOP
    )


def test_logps_match_teacher_forcing(sampled_rollout, forward):
    ro, _ = sampled_rollout
    # 64 rows, half of them stopped early (a stop token before TN_DIST)
    stopped = np.flatnonzero(ro.lengths < TN_DIST)[:32]
    rows = np.concatenate([stopped, np.flatnonzero(ro.lengths == TN_DIST)[: 64 - len(stopped)]])
    assert len(stopped) == 32 and len(rows) == 64
    ro = jax.tree.map(lambda x: x[rows], ro)
    seq = ro.sequences()
    logits = forward(seq.tokens, seq.attention_mask)
    next_logp = np.take_along_axis(log_softmax_np(logits[:, :-1]), seq.tokens[:, 1:, None], -1)
    expected = np.concatenate([np.zeros((64, 1)), next_logp[..., 0]], 1) * seq.loss_mask
    np.testing.assert_allclose(seq.old_logp, expected, atol=1e-4)
    # sample_logp: the same tokens under temperature + truncation
    with np.errstate(divide="ignore"):  # log 0 on truncated tokens, never sampled
        q = np.log(sampling_probs(logits[:, TP - 1 : -1]))
    q_logp = np.take_along_axis(q, ro.completion_tokens[..., None], -1)[..., 0]
    expected_q = np.where(ro.completion_mask == 1, q_logp, 0.0)
    np.testing.assert_allclose(ro.sample_logp, expected_q, atol=1e-4)
    for b in range(64):
        np.testing.assert_array_equal(ro.completion_tokens[b, ro.lengths[b] :], PAD)


def test_draft_equal_to_policy_is_always_accepted(policy):
    spec = SpeculativeSampler(policy, policy, pad_id=PAD, k=K_DIST, prompt_buckets=(TP,))
    spec.generate(*padded_prompt(), SAMPLED, jax.random.key(1))
    stats = jax.device_get(spec.stats)
    assert float(stats["acceptance_rate"]) == 1.0, stats
    assert int(stats["rounds"]) == 1  # TN_DIST = 1 (prefill) + K_DIST + 1 (bonus)


def test_greedy_equals_normal_sampler(policy):
    """Greedy speculative rollouts equal the plain sampler's, token for token."""
    prompts = np.array([[0, 0, 0, 2, 5, 1], [3, 6, 2, 2, 1, 4], [0, 0, 0, 0, 0, 6]], np.int32)
    mask = (prompts != 0).astype(np.int32)
    sampler = Sampler(policy, pad_id=PAD, prompt_buckets=(TP,))
    spec = SpeculativeSampler(
        policy,
        shallow_draft(policy, 1),
        pad_id=PAD,
        k=3,
        prompt_buckets=(TP,),
    )
    plain = SamplingParams(max_new_tokens=12, n=2, greedy=True)
    ref = jax.device_get(sampler.generate(prompts, mask, plain, jax.random.key(0)))
    # a stop token that some rows emit mid-way, so rows stop at different rounds
    eos = int(ref.completion_tokens[0, 4])
    params = SamplingParams(max_new_tokens=12, n=2, greedy=True, eos_ids=(eos,))
    ref = jax.device_get(sampler.generate(prompts, mask, params, jax.random.key(0)))
    ro = jax.device_get(spec.generate(prompts, mask, params, jax.random.key(1)))
    stats = jax.device_get(spec.stats)
    assert (ref.lengths < 12).any()
    for name in ("completion_tokens", "completion_mask", "lengths", "finish_reason"):
        np.testing.assert_array_equal(getattr(ro, name), getattr(ref, name), err_msg=name)
    np.testing.assert_allclose(ro.policy_logp, ref.policy_logp, atol=1e-4)
    np.testing.assert_array_equal(ro.sample_logp, 0.0)
    np.testing.assert_array_equal(ro.prompt_tokens, ref.prompt_tokens)
    assert 0.0 <= stats["acceptance_rate"] <= 1.0
    assert ro.group_size == 2


def test_shallow_draft_is_the_policy_cut_early(policy):
    draft = shallow_draft(policy, 1)
    assert draft.cfg.num_layers == 1 and draft.layers is policy.layers
    assert draft.embed is policy.embed  # shared, not copied: it follows the policy's training
    # the policy's own parameter arrays (the stacked layers too: no copy of block 0)
    expected = list(nnx.to_flat_state(nnx.state(policy)))
    got = list(nnx.to_flat_state(nnx.state(draft)))
    assert [p for p, _ in got] == [p for p, _ in expected]
    assert all(a.get_value() is b.get_value() for (_, a), (_, b) in zip(got, expected))
    # ... of which its forward uses the embedding, block 0, the final norm and the head: it
    # equals a one-layer model holding block 0's slice of the stacked layers
    one_layer = nnx.graphdef(
        nnx.eval_shape(lambda: Transformer(CFG.replace(num_layers=1), rngs=nnx.Rngs(0)))
    )
    block0 = jax.tree_util.tree_map_with_path(
        lambda p, a: a[:1] if jax.tree_util.keystr(p[:1]) == "['layers']" else a,
        nnx.state(policy),
    )
    cut = nnx.merge(one_layer, block0)
    tokens = jnp.asarray(PROMPT)
    np.testing.assert_array_equal(draft(tokens), cut(tokens))
    assert not np.allclose(draft(tokens), policy(tokens), atol=1e-3)  # block 1 is left out
    with pytest.raises(ValueError, match="num_layers"):
        shallow_draft(policy, 3)


def test_prompt_contract_errors_name_the_problem(policy):
    """The Sampler's prompt checks (`sampling.left_pad_prompts`), with this sampler's name;
    dropout and meshes of several devices are refused with errors that name them."""
    spec = SpeculativeSampler(policy, policy, pad_id=PAD, k=2, prompt_buckets=(TP,))
    too_long = np.ones((1, TP + 1), np.int32)
    with pytest.raises(ValueError, match=r"largest bucket .* SpeculativeSampler\(prompt_buckets"):
        spec.generate(too_long, np.ones_like(too_long), SAMPLED, jax.random.key(0))
    right_padded = np.array([[1, 1, 0]], np.int32)
    with pytest.raises(ValueError, match=r"left-padded; rows \[0\]"):
        spec.generate(right_padded, right_padded, SAMPLED, jax.random.key(0))
    with pytest.raises(ValueError, match=r"prompts \[0\] are empty"):
        spec.generate(
            np.zeros((1, 3), np.int32), np.zeros((1, 3), np.int32), SAMPLED, jax.random.key(0)
        )
    with pytest.raises(ValueError, match="dropout_rate"):
        params = SamplingParams(max_new_tokens=2, dropout_rate=0.1)
        spec.generate(*padded_prompt(), params, jax.random.key(0))
    if jax.device_count() >= 2:
        mesh = shd.make_mesh((2, 1, 1), devices=jax.devices()[:2])
        with pytest.raises(ValueError, match=r"rollout.speculative.*one device"):
            SpeculativeSampler(policy, 1, pad_id=PAD, mesh=mesh)


def test_config_turns_speculative_rollouts_on(tmp_path):
    """`rollout.speculative = {draft: N, k}` gives the trainer a SpeculativeSampler whose
    draft is the policy's first N layers, following the weights it is given; its rollouts
    feed the RL step and log the acceptance figures."""
    from conftest import small_rl_config

    from jaxrl_frontier.run import trainer as tr

    c = small_rl_config()
    c.rollout.speculative = dict(draft=1, k=2)
    trainer = tr.Trainer(c, str(tmp_path))
    assert isinstance(trainer.roles.sampler, SpeculativeSampler)
    assert trainer.roles.sampler.proposer.cfg.num_layers == 1 and trainer.roles.sampler.k == 2
    examples = [trainer.task.example("train", i) for i in range(4)]
    exp, info = trainer.step.rollout(examples, jax.random.key(0))
    assert exp.num_rows == 16
    rate = float(info["metrics"]["rollout/speculative_acceptance_rate"])
    assert 0.0 <= rate <= 1.0
    off = dict(speculative=dict(draft=None, k=4), cache_dtype=None)
    assert type(make_sampler(trainer.roles.policy, off, pad_id=0)) is Sampler


# -- a hybrid policy (Qwen3.5's layers): its linear layers' recurrent state per round


# a Gated DeltaNet layer before a gated full-attention one (the sampler tests' hybrid
# layers), with this file's sharp weights: the linear layers' state moves the logits well
# beyond rounding
HYBRID_CFG = CFG.replace(**HYBRID_LAYERS)


@pytest.fixture(scope="module")
def hybrid():
    return make_model(0, HYBRID_CFG)


def hybrid_prompts():
    tokens = np.array([[0, 0, 0, 0, 0, 3, 1, 4], [0, 0, 2, 7, 1, 5, 6, 2], [0] * 7 + [6]])
    return tokens.astype(np.int32), (tokens != 0).astype(np.int32)


def greedy_accepted(policy_tokens, draft, tokens, mask, n: int, k: int, tn: int) -> int:
    """What greedy speculative rounds accept in all, draft proposals made by full forwards
    of the draft on each row's whole prefix (no cache): a reference for the draft's cached
    state. policy_tokens [B, >= tn + k]: the policy's greedy tokens (B = P * n rows)."""
    fwd = jax.jit(lambda t, m: draft(t, m)[:, -1])  # right padding: one shape per length
    accepted = 0
    for row, target in enumerate(policy_tokens):
        prompt = tokens[row // n][mask[row // n] == 1]
        done = 1  # the prefill emitted target[0]
        while done < tn:
            seq = list(prompt) + list(target[:done])
            for i in range(k):
                d = int(np.argmax(fwd(jnp.asarray([seq]), jnp.ones((1, len(seq)), jnp.int32))))
                if d != target[done + i]:
                    break
                seq.append(d)
            else:
                i = k
            accepted, done = accepted + i, done + i + 1
    return accepted


def test_hybrid_greedy_equals_normal_sampler_and_the_draft_keeps_its_state(hybrid):
    """Greedy speculative rollouts of a hybrid policy (a shallow draft: its linear layer
    alone) equal the plain sampler's token for token: the policy's linear state is the one
    after the last accepted token. The drafts accepted equal a draft that re-reads each
    row's whole prefix every round: the draft's state is right too (a draft that counted a
    token twice would propose other tokens)."""
    tokens, mask = hybrid_prompts()
    k, tn = 3, 12
    plain = Sampler(hybrid, pad_id=PAD, prompt_buckets=(TP,))
    longer = SamplingParams(max_new_tokens=tn + k, n=2, greedy=True)
    ref = jax.device_get(plain.generate(tokens, mask, longer, jax.random.key(0)))
    draft = shallow_draft(hybrid, 1)
    spec = SpeculativeSampler(hybrid, draft, pad_id=PAD, k=k, prompt_buckets=(TP,))
    params = SamplingParams(max_new_tokens=tn, n=2, greedy=True)
    ro = jax.device_get(spec.generate(tokens, mask, params, jax.random.key(1)))
    np.testing.assert_array_equal(ro.completion_tokens, ref.completion_tokens[:, :tn])
    np.testing.assert_allclose(ro.policy_logp, ref.policy_logp[:, :tn], atol=1e-5)
    stats = jax.device_get(spec.stats)
    want = greedy_accepted(ref.completion_tokens, draft, tokens, mask, 2, k, tn)
    print(f"drafts accepted {int(stats['draft_tokens_accepted'])} (reference {want}), {stats}")
    assert 0 < want < int(stats["draft_tokens_proposed"])  # some rounds reject
    assert int(stats["draft_tokens_accepted"]) == want


@pytest.fixture(scope="module")
def hybrid_spec(hybrid):
    """A hybrid speculative sampler with its own hybrid draft, and its sampled params."""
    draft = make_model(1, HYBRID_CFG)
    spec = SpeculativeSampler(hybrid, draft, pad_id=PAD, k=3, prompt_buckets=(TP,))
    return spec, SamplingParams(max_new_tokens=12, n=4, temperature=1.0)


def test_hybrid_sampled_logps_match_teacher_forcing(hybrid, hybrid_spec):
    """Sampled rounds that reject: every emitted token's policy log-prob equals a full
    forward's over the finished sequence (a linear state left at a rejected draft would
    change the tokens after it)."""
    spec, params = hybrid_spec
    ro = jax.device_get(spec.generate(*hybrid_prompts(), params, jax.random.key(3)))
    stats = jax.device_get(spec.stats)
    assert 0.1 < float(stats["acceptance_rate"]) < 0.9, stats
    seq = ro.sequences()
    logits = np.asarray(hybrid(jnp.asarray(seq.tokens), jnp.asarray(seq.attention_mask)))
    next_logp = np.take_along_axis(log_softmax_np(logits[:, :-1]), seq.tokens[:, 1:, None], -1)
    expected = np.concatenate([np.zeros((len(logits), 1)), next_logp[..., 0]], 1)
    np.testing.assert_allclose(seq.old_logp, expected * seq.loss_mask, atol=1e-5)


def test_hybrid_draft_equal_to_policy_is_always_accepted(hybrid, hybrid_spec):
    """The policy as its own draft: p = q at every proposal only if the draft's linear
    state is the policy's at every round (its first round's prefill included)."""
    spec, params = hybrid_spec
    same = SpeculativeSampler(hybrid, hybrid, pad_id=PAD, k=3, prompt_buckets=(TP,))
    same.generate(*hybrid_prompts(), params, jax.random.key(4))
    stats = jax.device_get(same.stats)
    assert float(stats["acceptance_rate"]) == 1.0 and int(stats["rounds"]) == 3, stats
