"""The members' rollouts in one vmapped program (run/population/batched_sampling.py): each member's rows
equal the plain sampler's from its weights, prompts, key and temperature, with leaves the
members share (a LoRA base) passed once; a rollout asked for other prompts is refused, one
asked for another key is the plain sampler's."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx
from tiny_sampler import PAD, TN, make_hybrid_model, make_model, prompts

from jaxrl_frontier.run.population.batched_sampling import MemberRequest, MemberSampler
from jaxrl_frontier.sampling import Sampler, SamplingParams


def test_each_member_gets_the_plain_samplers_rows():
    a, b = nnx.state(make_model(0)), nnx.state(make_model(1))
    # member 1 holds member 0's 1-D leaves (the norms) as the same arrays: in_axes None
    b = jax.tree.map(lambda x, y: x if x.ndim == 1 else y, a, b)
    sampler = Sampler(make_model(0), pad_id=PAD, decode_phases=1)
    base = SamplingParams(max_new_tokens=TN, n=2)
    reqs = [
        MemberRequest(
            *prompts([5, 9, 3], seed=i),
            dataclasses.replace(base, temperature=t),
            jax.random.key(10 + i),
            w,
            i,
        )  # fmt: skip
        for i, (w, t) in enumerate([(a, 0.7), (b, 1.3)])
    ]
    members = MemberSampler(sampler)
    members.prepare(reqs)
    got = [members.generate(r.prompt_tokens, r.prompt_mask, r.params, r.key) for r in reqs]
    assert members.compiles == 1
    n_1d = sum(x.ndim == 1 for x in jax.tree.leaves(a))
    assert members.shared_leaves == n_1d > 0
    for r, g in zip(reqs, got):
        sampler.update_weights(r.weights, r.version)
        want = sampler.generate(r.prompt_tokens, r.prompt_mask, r.params, r.key)
        np.testing.assert_array_equal(g.completion_tokens, want.completion_tokens)
        np.testing.assert_array_equal(g.completion_mask, want.completion_mask)
        np.testing.assert_allclose(g.policy_logp, want.policy_logp, rtol=0, atol=1e-5)
    assert not np.array_equal(got[0].completion_tokens, got[1].completion_tokens)
    members.prepare(reqs)  # the same program again, in any order; other prompts: refused
    r0, r1 = reqs
    got1 = members.generate(r1.prompt_tokens, r1.prompt_mask, r1.params, r1.key)
    np.testing.assert_array_equal(got1.completion_tokens, got[1].completion_tokens)
    with pytest.raises(RuntimeError, match="other prompts"):
        members.generate(r1.prompt_tokens, r1.prompt_mask, r0.params, r0.key)
    assert members.compiles == 1
    # a key none was prepared for (an extra draw): the plain sampler's rows
    extra = members.generate(r1.prompt_tokens, r1.prompt_mask, r1.params, jax.random.key(99))
    assert extra.completion_tokens.shape == got[1].completion_tokens.shape


def test_hybrid_members_carry_their_linear_state():
    """Qwen3.5's hybrid layers: the vmapped prefill and decode carry each member's conv
    window and delta-rule matrix: each member's rows are the plain sampler's (tokens
    exactly; log-probs to the bound above)."""
    models = [make_hybrid_model(seed) for seed in (0, 1)]
    sampler = Sampler(models[0], pad_id=PAD, decode_phases=1)
    params = SamplingParams(max_new_tokens=TN, n=2, temperature=1.0)
    reqs = [
        MemberRequest(*prompts([5, 9, 3], seed=i), params, jax.random.key(20 + i), nnx.state(m), i)
        for i, m in enumerate(models)
    ]
    members = MemberSampler(sampler)
    members.prepare(reqs)
    for r in reqs:
        got = members.generate(r.prompt_tokens, r.prompt_mask, r.params, r.key)
        sampler.update_weights(r.weights, r.version)
        want = sampler.generate(r.prompt_tokens, r.prompt_mask, r.params, r.key)
        np.testing.assert_array_equal(got.completion_tokens, want.completion_tokens)
        np.testing.assert_allclose(got.policy_logp, want.policy_logp, rtol=0, atol=1e-5)
    assert members.compiles == 1
