"""data/envs/batch.py: batched episodes step independently; turn and token budgets cut
and flag; argument errors."""

import pytest

from jaxrl_frontier.data.envs import EpisodeBatch, make_env


def test_batched_episodes_step_independently():
    scripts = [[1.0], [0.0, 0.5, 0.5], [0.0, 3.0]]
    envs = [make_env("scripted", rewards=r) for r in scripts]
    b = EpisodeBatch(envs, max_turns=5)
    assert b.reset([10, 11, 12]) == ["start 10", "start 11", "start 12"]
    out = b.step(["x0", "y0", "z0"])
    assert [o[2] for o in out] == [True, False, False]
    assert b.live.tolist() == [False, True, True]
    with pytest.raises(ValueError, match="episode 0 has ended"):
        b.step(["again", "y1", "z1"])
    with pytest.raises(ValueError, match="episode 1 is live"):
        b.step([None, None, "z1"])
    out = b.step([None, "y1", "z1"])
    assert out[0] is None and out[2][1] == 3.0 and out[2][2]
    b.step([None, "y2", None])
    assert b.all_done
    assert envs[0].actions == ["x0"]
    assert envs[1].actions == ["y0", "y1", "y2"]
    assert envs[2].actions == ["z0", "z1"]
    assert b.returns().tolist() == [1.0, 1.0, 3.0]
    assert b.turn_rewards().tolist() == [
        [1, 0, 0, 0, 0],
        [0, 0.5, 0.5, 0, 0],
        [0, 3, 0, 0, 0],
    ]
    assert not b.cut().any() and b.successes().all()
    assert [ep.group for ep in b.episodes] == [0, 1, 2]


def test_turn_budget_cuts_and_flags():
    b = EpisodeBatch([make_env("scripted", rewards=[0.1] * 5) for _ in range(2)], max_turns=3)
    b.reset([0, 0])
    for _ in range(2):
        out = b.step(["a", "b"])
        assert not any(o[2] for o in out)
    out = b.step(["a", "b"])
    assert all(o[2] and o[3]["cut"] == "turns" for o in out)
    ep = b.episodes[0]
    assert ep.truncated and ep.cut == "turns" and ep.turns == 3 and not ep.success
    assert ep.episode_return == pytest.approx(0.3)
    assert b.cut().tolist() == [True, True]
    assert [ep.group for ep in b.episodes] == [0, 0]  # same seed: one group


def test_token_budget_cuts_and_flags():
    # start "start 1" = 7 chars; each turn: action + "obs k" (5 chars)
    envs = [make_env("scripted", rewards=[0.0] * 4) for _ in range(3)]
    b = EpisodeBatch(envs, max_turns=10, max_tokens=20)
    b.reset([1, 2, 3])
    assert [b.remaining_tokens(i) for i in range(3)] == [13, 13, 13]
    out = b.step(["", "aaaaaaaa", "a"], action_tokens=[None, None, 1])  # 7+0+5, 7+8+5, 7+1+5
    assert [o[2] for o in out] == [False, True, False]
    assert out[1][3]["cut"] == "tokens" and b.episodes[1].tokens == 20
    out = b.step(["", None, "bbbbbbb"], action_tokens=[None, None, 2])  # 12+0+5; 13+2+5
    assert [o[2] for o in out[::2]] == [False, True]
    assert b.episodes[2].cut == "tokens" and b.episodes[0].tokens == 17
    assert b.remaining_tokens(0) == 3
    # an over-long first observation cuts at reset
    b2 = EpisodeBatch([make_env("scripted")], max_turns=2, max_tokens=5)
    b2.reset([123])
    assert b2.all_done and b2.episodes[0].cut == "tokens" and b2.episodes[0].turns == 0


def test_batch_argument_errors():
    env = make_env("scripted")
    with pytest.raises(ValueError, match="twice"):
        EpisodeBatch([env, env], max_turns=2)
    with pytest.raises(ValueError, match="max_turns"):
        EpisodeBatch([env], max_turns=0)
    b = EpisodeBatch.make("scripted", 2, {"rewards": [1.0]}, max_turns=1)
    with pytest.raises(ValueError, match="1 seeds for 2"):
        b.reset([0])
