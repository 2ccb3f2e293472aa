"""Multi-turn rollouts: the session's incremental observation prefill equals re-running the
whole history, greedy session turns equal turn-by-turn re-prefills, observation tokens get
no gradient, and the environment producer's per-turn rewards and budgets.

One tiny random model for all; every comparison is against an uncached full forward or a
hand-computed value.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_frontier.models.random_init import random_model
from jaxrl_frontier.models.transformer import ModelConfig
from jaxrl_frontier.sampling import Sampler, SamplingParams
from jaxrl_frontier.sampling.turns import TurnSession, observe

CFG = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2
)
PAD, TA, TO, TURNS = 0, 4, 5, 3


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, seed=0, std=0.05, head_std=0.3, legacy_rng=True)


@pytest.fixture(scope="module")
def sampler(model):
    return Sampler(model, pad_id=PAD, prompt_buckets=(8,))


@pytest.fixture(scope="module")
def forward(model):
    graphdef, state = nnx.split(model)
    fwd = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))
    return lambda tokens: np.asarray(fwd(state, jnp.asarray(tokens)[None]))[0]


def prompt_batch(lengths, width=8, seed=0):
    rng = np.random.RandomState(seed)
    tokens, mask = (
        np.zeros((len(lengths), width), np.int32),
        np.zeros((len(lengths), width), np.int32),
    )
    for i, n in enumerate(lengths):
        tokens[i, width - n :] = rng.randint(1, CFG.vocab_size, size=n)
        mask[i, width - n :] = 1
    return tokens, mask


def test_observation_prefill_equals_full_history_forward(sampler, forward):
    """Rows with different turn lengths and observation lengths (and one row not live): the
    logits of every appended observation token equal an uncached forward on the row's
    concatenated history (prompt, action, observation) to 1e-5 in f32."""
    params = SamplingParams(max_new_tokens=TA, n=2, temperature=1.0, stop_ids=(7,))
    session = TurnSession(sampler, params, obs_tokens=TO, max_turns=TURNS)
    ptok, pmask = prompt_batch([5, 3])
    assert session.start(ptok, pmask, jax.random.key(3)) == 4
    actions, _, lengths = session.turn([4, 2, 3, 0])
    assert np.all(lengths <= [4, 2, 3, 0]) and lengths[3] == 0 and np.all(lengths[:3] >= 1)
    rng = np.random.RandomState(1)
    obs = [rng.randint(1, CFG.vocab_size, size=n).tolist() for n in (3, 5, 1)] + [None]
    tokens = np.zeros((4, TO), np.int32)
    mask = np.zeros((4, TO), np.int32)
    for i, ids in enumerate(obs):
        if ids:
            tokens[i, TO - len(ids) :], mask[i, TO - len(ids) :] = ids, 1
    model = sampler.decode_model(session.state)
    logits, _, pos = observe(
        model, session.cache, session.pos, jnp.asarray(tokens), jnp.asarray(mask), all_logits=True
    )
    logits = np.asarray(logits)
    for row in range(3):
        p = row // 2
        history = list(ptok[p][pmask[p] == 1]) + list(actions[row, : lengths[row]]) + obs[row]
        ref = forward(np.asarray(history, np.int32))
        n = len(obs[row])
        np.testing.assert_allclose(logits[row, TO - n :], ref[-n:], atol=1e-5, rtol=0)
        assert int(pos[row]) == len(history)


def test_greedy_session_equals_turn_by_turn_reprefill(sampler, model):
    """Greedy turns over the session's one cache give exactly the tokens of sampling each
    turn afresh from the whole history re-prefilled as a prompt."""
    stop = 9
    params = SamplingParams(max_new_tokens=TA, n=1, greedy=True, stop_ids=(stop,))
    session = TurnSession(sampler, params, obs_tokens=TO, max_turns=TURNS)
    ptok, pmask = prompt_batch([6, 2, 4], seed=2)
    session.start(ptok, pmask, jax.random.key(0))
    reference = Sampler(model, pad_id=PAD, prompt_buckets=(40,))
    ref_params = SamplingParams(max_new_tokens=TA, n=1, greedy=True, stop_ids=(stop,))
    histories = [list(ptok[i][pmask[i] == 1]) for i in range(3)]
    caps = [[4, 3, 4], [2, 4, 4], [4, 4, 1]]
    rng = np.random.RandomState(5)
    for turn in range(TURNS):
        got, _, lengths = session.turn(caps[turn])
        width = 40
        tok = np.zeros((3, width), np.int32)
        msk = np.zeros((3, width), np.int32)
        for i, h in enumerate(histories):
            tok[i, width - len(h) :], msk[i, width - len(h) :] = h, 1
        ro = reference.generate(tok, msk, ref_params, jax.random.key(0))
        want = np.asarray(ro.completion_tokens)
        for i in range(3):
            n = min(caps[turn][i], int(ro.lengths[i]))
            assert lengths[i] == n
            np.testing.assert_array_equal(got[i, :n], want[i, :n])
            histories[i] += got[i, :n].tolist()
        if turn < TURNS - 1:
            obs = [rng.randint(1, CFG.vocab_size, size=k).tolist() for k in (2, 5, 3)]
            session.append(obs)
            for i in range(3):
                histories[i] += obs[i]
