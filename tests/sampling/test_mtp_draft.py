"""Drafting with a multi-token-prediction module (sampling/mtp_draft.py) in the speculative
sampler, on the tiny random DeepSeek-V3 shape of tests/tiny_deepseek.py and a random
module: the proposals' logits equal full forwards over each row's whole sequence (the
prefill's prompt pairs, the catch-up on the policy's states, the chain on the module's
own), and the rollouts are the policy's (greedy: the plain sampler's tokens; sampled: the
log-probs of a full forward). Tolerance 1e-5 of the logits' scale: cached against uncached
forwards of the same f32 weights, which differ in reduction order only.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import rel_diff
from flax import nnx
from tiny_deepseek import CFG

from jaxrl_frontier.models.multi_token import MultiTokenPredictor
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.sampling import Sampler, SamplingParams, SpeculativeSampler, mtp_draft
from jaxrl_frontier.sampling.speculative import _carried

REL_TOL, K, TP = 1e-5, 3, 8
PROMPTS = np.zeros((2, TP), np.int32)  # left-padded rows of 6 and 3 tokens
PROMPTS[0, 2:], PROMPTS[1, 5:] = [17, 99, 5, 64, 3, 80], [41, 12, 77]
MASK = (PROMPTS != 0).astype(np.int32)
LENGTHS = MASK.sum(1)


def drawn(module, seed: int):
    """`module` with its parameters redrawn as tests/tiny_deepseek.py redraws transformers':
    norm scales 1 + 0.2 N(0, 1), every other weight 0.3 N(0, 1)."""
    rng = np.random.default_rng(seed)
    for path, v in nnx.to_flat_state(nnx.state(module)):
        w = rng.standard_normal(v.get_value().shape)
        norm = any("norm" in str(part) for part in path)
        v.set_value(jnp.asarray(1.0 + 0.2 * w if norm else 0.3 * w, jnp.float32))
    return module


@pytest.fixture(scope="module")
def models():
    """(policy, its MTP module), random."""
    policy = drawn(Transformer(CFG, rngs=nnx.Rngs(0)), seed=0)
    return policy, drawn(MultiTokenPredictor(CFG, rngs=nnx.Rngs(0)), seed=1)


@nnx.jit
def full_states(policy, tokens, mask):
    return policy.hidden_states(tokens, mask)[0]


@nnx.jit
def full_draft(policy, mtp, follow, prev, mask):
    g, _ = mtp(policy, follow, prev, mask)
    return g, policy.logits(g)


def padded(x, width: int):
    """x [n, ...] -> [1, width, ...], zeros after (right padding: one compile a width)."""
    x = np.asarray(x)
    return jnp.asarray(np.pad(x, [(0, width - len(x))] + [(0, 0)] * (x.ndim - 1)))[None]


def reference_chain(policy, mtp, seq, width: int) -> np.ndarray:
    """The module's K greedy proposals after the tokens `seq` (prompt, then emitted) from
    full forwards, no cache: pairs (h_j, t_{j+1}) of the policy's states over `seq`, then
    (g, d) of each proposal. -> their logits [K, V]."""
    ones = lambda m: padded(np.ones(m, np.int32), width)  # noqa: E731
    h = np.asarray(full_states(policy, padded(seq, width), ones(len(seq)))[0])
    follow, prev, out = list(seq[1:]), list(h[: len(seq) - 1]), []
    for _ in range(K):
        m = len(follow)
        g, logits = full_draft(policy, mtp, padded(follow, width), padded(prev, width), ones(m))
        out.append(np.asarray(logits[0, m - 1]))
        follow.append(int(np.argmax(out[-1])))
        prev.append(np.asarray(g[0, m - 1]))
    return np.stack(out)


def argmax(q, u):
    return jnp.argmax(q, -1).astype(jnp.int32)


@nnx.jit
def first_round(policy, mtp, x_n):
    """The prefill and the first round's proposals, greedy (x_n at position L_b, slot TP)."""
    hidden = policy.hidden_states(PROMPTS, MASK)[0]
    cache, carried = mtp_draft.prefill(
        mtp, policy, hidden, (PROMPTS, MASK), x_n, None, n=1, slots=2 * K + 2, k=K
    )
    at, u = (jnp.asarray(LENGTHS), jnp.full(2, TP)), jnp.zeros((2, 2 * K + 1))
    return mtp_draft.propose(mtp, policy, cache, carried, at, u, K, argmax, lambda z: z)


@nnx.jit
def next_round(policy, mtp, cache, carried, at):
    u = jnp.zeros((2, 2 * K + 1))
    return mtp_draft.propose(mtp, policy, cache, carried, at, u, K, argmax, lambda z: z)


def assert_proposals(drafts, q, want):
    np.testing.assert_array_equal(np.asarray(drafts), np.argmax(want, -1))
    assert rel_diff(np.asarray(q), want, np.ones(len(want), np.int32)) < REL_TOL


def test_proposals_equal_full_forwards_over_the_whole_sequence(models):
    """Two rounds of drafting (greedy): the first after the prefill's prompt pairs; the
    second after rows accepted 2 and 0 of its drafts, its catch-up rewriting the module's
    chained entries with the policy's states (`_carried` of the verify's), its chain from
    x_n's position on."""
    policy, mtp = models
    x_n, width = np.array([5, 9], np.int32), TP + 2 * K + 2
    drafts, q, cache = first_round(policy, mtp, jnp.asarray(x_n))
    seqs = [np.concatenate([PROMPTS[b][MASK[b] == 1], x_n[b : b + 1]]) for b in range(2)]
    for b in range(2):
        assert_proposals(drafts[b], q[b], reference_chain(policy, mtp, seqs[b], width))

    # the verify's states over [x_n, d_1..d_K]; a = 2 and 0 accepted, then t
    a, t, drafts = np.array([2, 0], np.int32), np.array([11, 13], np.int32), np.asarray(drafts)
    states = []
    for seq, d in zip(seqs, drafts):
        verified = np.concatenate([seq, d])
        ones = padded(np.ones(len(verified), np.int32), width)
        h = np.asarray(full_states(policy, padded(verified, width), ones)[0])
        states.append(h[len(seq) - 1 : len(verified)])
    emitted = np.where(np.arange(K + 1) < a[:, None], np.pad(drafts, ((0, 0), (0, 1))), t[:, None])
    carried = _carried(*map(jnp.asarray, (np.stack(states), emitted, a, a + 1)))
    at = (jnp.asarray(LENGTHS + a + 1), jnp.asarray(TP + a + 1))
    drafts, q, _ = next_round(policy, mtp, cache, carried, at)
    for b in range(2):
        seq = np.concatenate([seqs[b], emitted[b, : a[b] + 1]])
        assert_proposals(drafts[b], q[b], reference_chain(policy, mtp, seq, width))


@pytest.fixture(scope="module")
def near_bigram(models):
    """(policy, module) made to agree often enough that rounds both accept and reject: the
    policy's attention and MLP outputs zeroed (its next token a function of the last: a
    bigram model), the module's block outputs damped to DAMP, W_eh the identity on the
    token's half and BETA of itself on the policy state's half (so it reads both)."""
    policy, mtp = (nnx.clone(m) for m in models)
    for module, scale in ((policy, 0.0), (mtp, DAMP)):
        for p, v in nnx.to_flat_state(nnx.state(module)):
            if "o_proj" in p or any("down" in str(part) for part in p):
                v.set_value(v.get_value() * scale)
    w, d = np.asarray(mtp.eh_proj[...]), CFG.hidden_size
    mtp.eh_proj.set_value(jnp.asarray(np.concatenate([np.eye(d), BETA * w[d:]]), jnp.float32))
    return policy, mtp


DAMP, BETA = 0.05, 0.1


def reference_accepted(policy, mtp, targets, tn: int) -> int:
    """What greedy rounds accept in all when each round's proposals are `reference_chain`'s
    over the row's whole sequence. targets [B, >= tn + K]: the policy's greedy tokens."""
    accepted = 0
    for row, target in enumerate(targets):
        prompt, done = PROMPTS[row // 2][MASK[row // 2] == 1], 1  # the prefill emitted one
        while done < tn:
            seq = np.concatenate([prompt, target[:done]])
            proposed = np.argmax(reference_chain(policy, mtp, seq, TP + tn + K), -1)
            a = int(np.cumprod(proposed == target[done : done + K]).sum())
            accepted, done = accepted + a, done + a + 1
    return accepted


def test_rollouts_drafted_by_the_module_are_the_policys(near_bigram):
    """Rounds that both accept and reject: greedy tokens and log-probs equal the plain
    sampler's, the drafts accepted `reference_accepted`'s (the sampler feeds the module the
    policy's states); sampled ones, the log-probs of a full forward over the finished
    sequences."""
    policy, mtp = near_bigram
    tn = 12
    plain = Sampler(policy, pad_id=0, prompt_buckets=(TP,))
    longer = SamplingParams(max_new_tokens=tn + K, n=2, greedy=True)
    ref = jax.device_get(plain.generate(PROMPTS, MASK, longer, jax.random.key(0)))
    spec = SpeculativeSampler(policy, mtp, pad_id=0, k=K, prompt_buckets=(TP,))
    greedy = SamplingParams(max_new_tokens=tn, n=2, greedy=True)
    ro = jax.device_get(spec.generate(PROMPTS, MASK, greedy, jax.random.key(1)))
    np.testing.assert_array_equal(ro.completion_tokens, ref.completion_tokens[:, :tn])
    np.testing.assert_allclose(ro.policy_logp, ref.policy_logp[:, :tn], atol=1e-5)
    stats = jax.device_get(spec.stats)
    want = reference_accepted(policy, mtp, ref.completion_tokens, tn)
    print(f"drafts accepted {int(stats['draft_tokens_accepted'])} (reference {want}), {stats}")
    assert 0 < want < int(stats["draft_tokens_proposed"])  # rounds accept and reject
    assert int(stats["draft_tokens_accepted"]) == want

    sampled = SamplingParams(max_new_tokens=12, n=2, temperature=1.0)
    ro = jax.device_get(spec.generate(PROMPTS, MASK, sampled, jax.random.key(2)))
    stats = jax.device_get(spec.stats)
    print(stats)
    assert 0.0 < float(stats["acceptance_rate"]) < 1.0, stats
    seq = ro.sequences()
    logits = np.asarray(jax.jit(policy)(seq.tokens, seq.attention_mask))
    logp = np.asarray(jax.nn.log_softmax(logits[:, :-1], -1))
    next_logp = np.take_along_axis(logp, seq.tokens[:, 1:, None], -1)[..., 0]
    expected = np.concatenate([np.zeros((len(logits), 1)), next_logp], 1) * seq.loss_mask
    np.testing.assert_allclose(seq.old_logp, expected, atol=1e-5)


def test_config_key_draft_mtp_takes_the_module(models):
    """`rollout.speculative.draft = 'mtp'`: `make_sampler` drafts with the module it is
    given, and without one says where it comes from; the key takes None, N >= 1 or 'mtp'
    and names them otherwise."""
    from jaxrl_frontier.sampling import make_sampler
    from jaxrl_frontier.sampling.rollout_section import SpeculativeSection

    policy, mtp = models
    rollout = dict(speculative=dict(draft="mtp", k=2))
    sampler = make_sampler(policy, rollout, pad_id=0, mtp=mtp)
    assert type(sampler) is SpeculativeSampler and sampler.proposer is mtp and sampler.k == 2
    with pytest.raises(ValueError, match="no multi-token-prediction module was loaded"):
        make_sampler(policy, rollout, pad_id=0)
    for bad in ("eagle", 0, True, 1.5):
        with pytest.raises(ValueError, match=r"allowed: None \(off\), a number .* or 'mtp'"):
            SpeculativeSection(draft=bad)
