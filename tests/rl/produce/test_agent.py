"""The environment producer's host-side parts (rl/produce/agent.py), by hand: the episode
width of every row, a turn's stop tokens, observations the tokenizer cannot spell, an
episode's transcript and a batch's metrics, and what the producer declares it lacks.
(Episodes played through a model: tests/sampling/test_turns.py, test_evaluation.py.)"""

import types

import pytest

from jaxrl_frontier.models.tokenizer import CharTokenizer
from jaxrl_frontier.rl.produce.agent import (
    AgentRolloutProducer,
    completion_width,
    encode_observation,
    episode_metrics,
    stop_ids,
    transcript,
)
from jaxrl_frontier.run.config import base_config


def test_the_completion_width_is_the_turns_and_observations_or_the_budget():
    env = base_config().env
    env.update(max_turns=6, turn_tokens=8, obs_tokens=64, max_tokens=0)
    assert completion_width(env) == 6 * 8 + 5 * 64  # 368: the observations between turns
    env.max_tokens = 100
    assert completion_width(env) == 100  # the episode's token budget is smaller
    env.max_tokens = 1000
    assert completion_width(env) == 368
    plain = dict(max_turns=1, turn_tokens=8, obs_tokens=64, max_tokens=0)  # a dict works too
    assert completion_width(plain) == 8


def test_a_turn_ends_at_eos_each_stop_string_and_the_chat_turns_end():
    tok = CharTokenizer("ab\n;")  # ids: <pad> 0, <bos> 1, <eos> 2, <unk> 3, a 4, b 5, \n 6, ; 7
    assert stop_ids(tok, ()) == (2,)
    assert stop_ids(tok, ("\n", ";")) == (2, 6, 7)
    chat = types.SimpleNamespace(chat=types.SimpleNamespace(stop_token_ids=lambda t: [7, 2]))
    assert stop_ids(tok, ("\n", ";"), chat) == (2, 7, 6)  # each once, in first-seen order
    assert stop_ids(tok, ("\n",), types.SimpleNamespace(chat=None)) == (2, 6)
    with pytest.raises(ValueError, match=r"config key 'env.stop': 'ab' is 2 tokens, not one"):
        stop_ids(tok, ("ab",))


def test_an_observation_the_tokenizer_cannot_spell_gets_unknown_tokens():
    tok = CharTokenizer("ab")
    assert encode_observation(tok, "ab") == [4, 5]
    assert encode_observation(tok, "a?b!") == [4, 3, 5, 3]  # <unk> 3, not an error
    with pytest.raises(ValueError):
        tok.encode("a?")


def test_a_transcript_is_each_action_and_the_observation_after_it():
    ep = types.SimpleNamespace(actions=["up", "left", "down"], observations=["S", "o1", "o2", "o3"])
    assert transcript(ep) == "upo1lefto2down"  # the first and the last observation left out
    assert transcript(types.SimpleNamespace(actions=[], observations=["S"])) == ""


def test_a_batches_metrics_by_hand():
    """4 episodes: 2 succeed; cut by turns, by tokens, or not; 1 of 5 steps invalid."""
    ep = lambda turns, tokens, cut, invalid: types.SimpleNamespace(  # noqa: E731
        turns=turns, tokens=tokens, cut=cut, infos=[{"invalid": i} for i in invalid]
    )
    episodes = [
        ep(1, 10, None, [False]),
        ep(2, 20, "turns", [False, True]),
        ep(1, 30, "tokens", [False]),
        ep(1, 40, None, [{}.get("x")]),
    ]
    batch = types.SimpleNamespace(
        episodes=episodes,
        successes=lambda: [1, 0, 0, 1],
        returns=lambda: [1.0, -0.5, 0.0, 1.5],
        cut=lambda: [e.cut is not None for e in episodes],
    )
    assert episode_metrics(batch) == {
        "env/success_rate": 0.5,
        "env/return": 0.5,
        "env/turns": 1.25,
        "env/cut": 0.5,
        "env/cut_turns": 0.25,
        "env/cut_tokens": 0.25,
        "env/invalid_actions": 0.2,
        "env/episode_tokens": 25.0,
    }


def test_the_producer_declares_what_episodes_do_not_do():
    caps = AgentRolloutProducer.capabilities
    for feature in ("partial_rows", "process_local", "free_running", "keeps_rows_in_flight"):
        assert caps.why_not(feature) == "episodes: the agent producer"
    assert caps.why_not("multi_process") == "environment rollouts run in one process"
    assert AgentRolloutProducer.local is False
