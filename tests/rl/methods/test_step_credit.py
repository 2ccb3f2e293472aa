"""Step credit: GiGPO turn-level group baselines on a hand-made batch, 3SPO state scores,
allocation and step rewards on a hand-made history, progress step scores, steps on tokens."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.data.envs import EpisodeBatch, make_env
from jaxrl_frontier.data.envs.batch import Episode
from jaxrl_frontier.rl.methods import step_credit as sc


def episode(group, states, rewards, success=False):
    infos = [{"success": success and k == len(rewards) - 1} for k in range(len(rewards))]
    return Episode(seed=group, group=group, states=list(states), rewards=list(rewards), infos=infos)


def hand_batch():
    # group 0: ep0 A -> B -> end (rewards 0, 1); ep1 A -> C -> B -> end (0, 0, 0)
    # group 1: ep2 A -> end (1): same state name, another group: not an anchor of group 0
    return sc.Steps.from_episodes(
        [
            episode(0, ["A", "B", "Z"], [0.0, 1.0], success=True),
            episode(0, ["A", "C", "B", "Y"], [0.0, 0.0, 0.0]),
            episode(1, ["A", "W"], [1.0], success=True),
        ]
    )


def test_steps_flat_layout_and_discounted_returns():
    s = hand_batch()
    np.testing.assert_array_equal(s.episode, [0, 0, 1, 1, 1, 2])
    np.testing.assert_array_equal(s.turn, [0, 1, 0, 1, 2, 0])
    assert s.state == ("A", "B", "A", "C", "B", "A")
    assert s.next_state == ("B", "Z", "C", "B", "Y", "W")
    np.testing.assert_array_equal(s.success, [False, True, False, False, False, True])
    np.testing.assert_allclose(sc.discounted_returns(s, 0.5), [0.5, 1, 0, 0, 0, 1])
    ids = sc.anchor_groups(s)
    assert ids[0] == ids[2] and ids[1] == ids[4]  # A and B in group 0
    assert len({ids[0], ids[1], ids[3], ids[5]}) == 4  # C alone; group 1's A is another anchor


def test_gigpo_hand_computed():
    out = sc.gigpo_advantages(hand_batch(), gamma=0.5, step_weight=1.0, scale="mean")
    # episode returns 1, 0 (group 0, mean 0.5) and 1 (group 1 alone)
    np.testing.assert_allclose(out["episode"], [0.5, 0.5, -0.5, -0.5, -0.5, 0.0])
    # anchor A (group 0): returns 0.5, 0 -> +-0.25; anchor B: 1, 0 -> +-0.5; C, group 1: alone
    np.testing.assert_allclose(out["step"], [0.25, 0.5, -0.25, 0.0, -0.5, 0.0])
    np.testing.assert_allclose(out["advantage"], [0.75, 1.0, -0.75, -0.5, -1.0, 0.0])
    out = sc.gigpo_advantages(hand_batch(), gamma=0.5, step_weight=0.5, scale="mean_std")
    std_a = np.std([0.5, 0.0], ddof=1)
    std_e = np.std([1.0, 0.0], ddof=1)
    np.testing.assert_allclose(out["step"][0], 0.25 / (std_a + 1e-6), rtol=1e-5)
    np.testing.assert_allclose(out["episode"][0], 0.5 / (std_e + 1e-6), rtol=1e-5)
    np.testing.assert_allclose(out["step"][3], 0.0)  # a group of one
    with pytest.raises(ValueError, match="mean, mean_std"):
        sc.group_normalise(np.zeros(2), np.zeros(2), "std")


def test_3spo_state_scores_on_hand_made_history():
    s = sc.StateScores(alpha=1.0, xi=2, zeta=0.1, g_max=4, omega_k=0.5, eps=0.0)
    s.update(["A", "B", "C"], True)
    s.update(["A", "B", "D"], False)
    s.update(["A", "E", "A"], False)  # A revisited: counted once
    assert s.t == 4
    assert s.counts == {"A": [3, 1], "B": [2, 1], "C": [1, 1], "D": [1, 0], "E": [1, 0]}
    np.testing.assert_allclose(s.score("A"), 4 ** (-1 / 3), rtol=1e-9)
    np.testing.assert_allclose(s.score("B"), 0.5, rtol=1e-9)
    np.testing.assert_allclose(s.score("C"), 0.25, rtol=1e-9)
    assert s.score("D") == 1.0 and s.score("never seen") == 1.0
    assert [s.rollouts(x) for x in "ABCD"] == [3, 2, 1, 4]
    # step rewards: w = 0.5 exp(-0.5 N(s_t)); R = w novel + (0.5 - w)(S_t - S_t+1) + 0.5 success
    w_a, w_b = 0.5 * math.exp(-1.5), 0.5 * math.exp(-1.0)
    np.testing.assert_allclose(
        s.step_reward("A", "B", False), w_a + (0.5 - w_a) * (4 ** (-1 / 3) - 0.5), rtol=1e-9
    )
    np.testing.assert_allclose(
        s.step_reward("B", "C", True), w_b + (0.5 - w_b) * 0.25 + 0.5, rtol=1e-9
    )
    assert s.step_reward("A", "A", False) == 0.0  # no move, no score change
    # D fails again: 2 failures >= xi at rate 0 <= zeta -> a dead end, no rollouts
    s.update(["D"], False)
    assert s.score("D") == 0.0 and s.rollouts("D") == 0
    np.testing.assert_allclose(s.score("A"), math.exp(-math.log(5) / 3), rtol=1e-9)  # t = 5
    copy = sc.StateScores(alpha=1.0, xi=2, zeta=0.1, g_max=4, omega_k=0.5, eps=0.0)
    copy.load_state_dict(s.state_dict())
    assert copy.score("A") == s.score("A") and copy.counts == s.counts


def test_3spo_step_advantages_normalised_within_anchor_groups():
    s = sc.StateScores(alpha=1.0, xi=10, zeta=0.1, g_max=4, omega_k=0.5, eps=0.0)
    s.update(["A", "B"], True)
    steps = hand_batch()
    r = s.step_rewards(steps)
    expect = [
        s.step_reward(a, b, ok) for a, b, ok in zip(steps.state, steps.next_state, steps.success)
    ]
    np.testing.assert_allclose(r, expect, rtol=1e-6)
    adv = s.advantages(steps)
    np.testing.assert_allclose(adv[[0, 2]], [(r[0] - r[2]) / 2, (r[2] - r[0]) / 2], rtol=1e-5)
    np.testing.assert_allclose(adv[[3, 5]], 0.0)


def test_progress_step_scores_and_steps_to_tokens():
    old = jnp.asarray([[0.0, -1.0, -2.0, -0.5, -0.1, -3.0]])
    ref = jnp.asarray([[0.0, -1.5, -1.0, -9.0, -9.0, -2.0]])
    mask = jnp.asarray([[0.0, 1.0, 1.0, 0.0, 0.0, 1.0]])  # columns 3, 4: an observation
    turn = jnp.asarray([[0, 0, 0, 0, 1, 1]])
    scores = sc.progress_step_scores(old, ref, mask, turn, num_turns=2, beta=2.0)
    # turn 0: 2 * ((-1 + 1.5) + (-2 + 1)) = -1; turn 1: 2 * (-3 + 2) = -2 (observation ignored)
    np.testing.assert_allclose(np.asarray(scores), [[-1.0, -2.0]], rtol=1e-6)
    tok = sc.steps_to_tokens(jnp.asarray([[0.5, -1.0]]), turn, mask)
    np.testing.assert_allclose(np.asarray(tok), [[0, 0.5, 0.5, 0, 0, -1.0]])


def test_steps_from_a_gridworld_batch():
    b = EpisodeBatch(
        [make_env("gridworld", size=3, hole_density=0.0) for _ in range(2)], max_turns=2
    )
    b.reset([5, 5])
    b.step(["stay", "stay"])
    b.step(["stay", "up"])
    steps = sc.Steps.from_episodes(b.episodes)
    ids = sc.anchor_groups(steps)
    # both episodes start at the same cell; both stay in turn 0, so turn 1 starts from one state
    assert ids[0] == ids[2] and ids[1] == ids[3] and ids[0] == ids[1]
