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

from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.random_init import random_model
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


# ----------------------------------------------------------------------------- producer


def char_model():
    from jaxrl_frontier.models.tokenizer import CharTokenizer

    tok = CharTokenizer()
    cfg = ModelConfig(
        vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_layers=2,
        num_heads=4, num_kv_heads=2,
    )  # fmt: skip
    return tok, random_model(cfg, seed=1, std=0.05, head_std=0.3, legacy_rng=True)


@pytest.fixture(scope="module")
def char_setup():
    tok, m = char_model()
    return tok, m, Sampler(m, pad_id=tok.pad_id, prompt_buckets=(16,))


def scripted_producer(char_setup, rewards, **env):
    """An AgentRolloutProducer over the scripted environment (turn rewards `rewards`)."""
    from jaxrl_frontier.core import sharding
    from jaxrl_frontier.data.envs.task import EnvTask
    from jaxrl_frontier.rl.produce.agent import AgentRolloutProducer
    from jaxrl_frontier.run.config import base_config
    from jaxrl_frontier.run.config.sections import env_options

    tok, m, sampler = char_setup
    c = base_config()
    c.data.max_prompt_len = 16
    c.env.update(name="scripted", max_turns=4, turn_tokens=3, obs_tokens=6, **env)
    c.env.kwargs = {"rewards": list(rewards)}
    section = env_options(c)
    producer = AgentRolloutProducer(
        sampler, tok, EnvTask(section), env=section, objective={"advantage": "grpo"},
        mesh=sharding.make_mesh((1, 1, 1), jax.devices()[:1]),
        sampling=SamplingParams(max_new_tokens=3, n=2, temperature=1.0),
    )  # fmt: skip
    examples = [{"index": 0, "seed": 3}, {"index": 1, "seed": 4}]
    exp, info = producer.produce(examples, {"policy": nnx.state(m)}, jax.random.key(0))
    return tok, exp, {k: float(v) for k, v in info["metrics"].items()}


def test_scripted_environment_rewards_per_turn_through_the_producer(char_setup):
    """Rewards (0.5, 0, 2): every episode lasts 3 turns whatever the policy writes; the
    return is 2.5, each turn's reward sits on that turn's last action token, the
    observations are the environment's, and only action tokens carry the loss mask."""
    tok, exp, metrics = scripted_producer(char_setup, (0.5, 0.0, 2.0))
    np.testing.assert_allclose(np.asarray(exp.rewards), [[2.5, 1.0]] * 4)
    tokens, mask = np.asarray(exp.tokens), np.asarray(exp.loss_mask)
    turn, attn = np.asarray(exp.turn_index), np.asarray(exp.attention_mask)
    per_token = np.asarray(exp.extras["turn_rewards"])
    tp = 16
    for b in range(4):
        for k, r in enumerate((0.5, 0.0, 2.0)):
            cols = np.flatnonzero((mask[b] == 1) & (turn[b] == k))
            assert len(cols) >= 1 and np.all(np.diff(cols) == 1)
            want = np.zeros(len(cols))
            want[-1] = r
            np.testing.assert_allclose(per_token[b, cols], want)
        # between the actions: exactly the environment's observations, never in the loss
        obs = tokens[b, tp:][(mask[b, tp:] == 0) & (attn[b, tp:] == 1)]
        assert tok.decode(obs.tolist()) == "obs 1obs 2"
        assert tokens[b, tp - 1] != tok.pad_id and np.all(mask[b, :tp] == 0)
        np.testing.assert_array_equal(np.asarray(exp.old_logp)[b][mask[b] == 0], 0.0)
        assert np.all(np.asarray(exp.old_logp)[b][mask[b] == 1] < 0)
    assert metrics["env/success_rate"] == 1.0 and metrics["env/turns"] == 3.0
    assert metrics["env/cut"] == 0.0 and metrics["reward/return"] == 2.5
    np.testing.assert_array_equal(np.asarray(exp.advantages), 0.0)  # equal returns: no signal


def test_observation_tokens_get_no_gradient_through_the_loss(char_setup):
    """On the producer's trajectories, with an advantage of 1 on EVERY column: the loss's
    gradient w.r.t. the logits that predict prompt, observation or padding tokens is exactly
    0, and nonzero for every logit row predicting an action token."""
    from jaxrl_frontier.objectives import losses

    tok, exp, _ = scripted_producer(char_setup, (0.5, 0.0, 2.0))
    mask = np.asarray(exp.loss_mask)
    batch = dict(exp.update_batch())
    batch["advantages"] = jnp.ones_like(exp.loss_mask)
    b, t = mask.shape
    logits = jax.random.normal(jax.random.key(1), (b, t, tok.vocab_size), jnp.float32)
    cfg = losses.default_config()
    cfg.weight = "pg"  # no ratio clipping: every action token's gradient is live

    def loss(lg):
        return losses.loss_fn(lg, batch, cfg, apply_fn=lambda p, tk, m: p)[0]

    g = np.abs(np.asarray(jax.grad(loss)(logits))).sum(-1)  # [B, T]
    predicts = np.zeros_like(mask)
    predicts[:, :-1] = mask[:, 1:]  # logits at t score token t + 1
    assert np.all(g[predicts == 0] == 0.0)
    assert np.all(g[predicts == 1] > 0.0)


def test_episodes_over_budget_are_cut_and_flagged(char_setup):
    """Ten scripted turns of reward 1 with a 4-turn budget: every episode is cut by turns
    with return 4; with a token budget of 12 (the 7-token first observation, an action of 1
    to 3 tokens, then the 5-token observation reaches it) every episode is cut by tokens
    after its first turn, its observation not appended."""
    _, exp, metrics = scripted_producer(char_setup, (1.0,) * 10)
    np.testing.assert_allclose(np.asarray(exp.rewards), [[4.0, 0.0]] * 4)
    assert metrics["env/cut_turns"] == 1.0 and metrics["env/cut"] == 1.0
    assert metrics["env/turns"] == 4.0 and metrics["env/success_rate"] == 0.0
    _, exp, metrics = scripted_producer(char_setup, (1.0,) * 10, max_tokens=12)
    assert metrics["env/cut_tokens"] == 1.0 and metrics["env/cut_turns"] == 0.0
    np.testing.assert_allclose(np.asarray(exp.rewards), [[1.0, 0.0]] * 4)
    assert metrics["env/turns"] == 1.0
    completion = np.asarray(exp.attention_mask)[:, 16:]
    np.testing.assert_array_equal(completion, np.asarray(exp.loss_mask)[:, 16:])  # no obs
