"""data/envs/gridworld.py: the grid world's generator, moves, collisions, slips, layout
statistics, random-policy success and the classic corners board."""

import dataclasses

import pytest

from jaxrl_frontier.data.envs import gridworld as gw
from jaxrl_frontier.data.envs import make_env


def test_generator_is_seeded_and_honours_its_knobs():
    cfg = gw.GridConfig(size=6, num_agents=3, hole_density=0.3, min_goal_distance=3)
    a, b = gw.generate(cfg, 11), gw.generate(cfg, 11)
    assert a == b
    assert gw.generate(cfg, 12) != a
    for seed in range(30):
        lay = gw.generate(cfg, seed)
        cells = set(lay.starts) | set(lay.goals)
        assert len(cells) == 6 and not cells & lay.holes
        for s, g in zip(lay.starts, lay.goals):
            d = gw.shortest_path(6, lay.holes, s, g)
            assert d is not None and d >= 3
    assert not gw.generate(dataclasses.replace(cfg, hole_density=0.0), 3).holes
    with pytest.raises(ValueError, match="hole_density"):
        gw.GridConfig(hole_density=1.0)
    with pytest.raises(ValueError, match="no layout"):
        gw.generate(gw.GridConfig(size=2, min_goal_distance=5), 0)


def board(env, holes, starts, goals, size=4):
    env.layout = gw.Layout(size, frozenset(holes), tuple(starts), tuple(goals))
    env.positions = tuple(starts)


def test_grid_moves_holes_goals_and_rewards():
    env = make_env("gridworld", size=4, hole_density=0.0, goal_reward=0.25, step_penalty=-0.01)
    env.reset(0)
    board(env, holes=[(1, 1)], starts=[(0, 0)], goals=[(0, 2)])
    assert env.render() == "a.1.\n.o..\n....\n....\na at (0, 0) goal (0, 2)\n"
    obs, r, done, info = env.step("i think: up")  # off the grid: stays
    assert env.positions == ((0, 0),) and r == pytest.approx(-0.01) and not done
    obs, r, done, info = env.step("right")
    assert env.positions == ((0, 1),) and not done
    obs, r, done, info = env.step("left then right.")  # the last move word counts
    assert done and info["success"] and r == pytest.approx(1.0 + 0.25 - 0.01)
    env.reset(0)
    board(env, holes=[(1, 1)], starts=[(0, 1)], goals=[(3, 3)])
    _, r, done, info = env.step("down")
    assert done and info["fell"] and not info["success"] and r == pytest.approx(-0.01)
    env.reset(0)
    _, r, done, info = env.step("no move here")
    assert info["invalid"] and not done and r == 0.0


def test_grid_collisions_and_agents_on_goals():
    env = make_env("gridworld", size=4, num_agents=2, hole_density=0.0)
    env.reset(0)
    board(env, holes=[], starts=[(0, 0), (0, 2)], goals=[(3, 3), (3, 0)])
    env.step("right left")  # both aim at (0, 1): blocked
    assert env.positions == ((0, 0), (0, 2))
    board(env, holes=[], starts=[(0, 0), (0, 1)], goals=[(3, 3), (3, 0)])
    env.step("right left")  # a swap: blocked
    assert env.positions == ((0, 0), (0, 1))
    env.step("right down")  # b moves away, a follows into its old cell: allowed
    assert env.positions == ((0, 1), (1, 1))
    board(env, holes=[], starts=[(0, 0), (0, 1)], goals=[(3, 3), (3, 0)])
    env.step("right up")  # b stays (the edge), so a, moving into it, is blocked too
    assert env.positions == ((0, 0), (0, 1))
    board(env, holes=[], starts=[(3, 2), (2, 0)], goals=[(3, 3), (3, 0)])
    _, r, done, info = env.step("a: right, b: down")
    assert done and info["success"] and r == 1.0
    env.reset(0)  # the episode above ended: a new one on the next board
    board(env, holes=[], starts=[(3, 3), (2, 0)], goals=[(3, 3), (3, 0)])
    env.step("up up")  # a on its goal stays there
    assert env.positions == ((3, 3), (1, 0))
    assert gw.parse_moves("up", 2) is None


def test_grid_slips_are_seeded_and_perpendicular():
    env = make_env("gridworld", size=5, hole_density=0.0, slip_prob=1.0, min_goal_distance=1)
    env.reset(4)
    board(env, holes=[], starts=[(2, 2)], goals=[(0, 0)], size=5)
    _, _, _, info = env.step("up")
    assert info["moves"][0] in ("left", "right")
    runs = []
    for _ in range(2):
        e = make_env("gridworld", size=5, hole_density=0.1, slip_prob=0.5)
        obs = [e.reset(9)]
        for a in ["up", "left", "down", "right", "up", "up"]:
            o, _, done, _ = e.step(a)
            obs.append(o)
            if done:
                break
        runs.append(obs)
    assert runs[0] == runs[1]  # same seed, same actions: the same episode


def test_layout_statistics():
    stats = gw.layout_statistics(
        {"size": 5, "hole_density": 0.0, "min_goal_distance": 3}, range(20)
    )
    assert stats["holes_mean"] == 0.0 and stats["distance_mean"] >= 3
    assert stats["distance_max"] <= 8  # corner to corner of a 5x5 board without holes
    lay = gw.generate(gw.GridConfig(size=5, hole_density=0.3), 0)
    one = gw.layout_statistics({"size": 5, "hole_density": 0.3}, [0])
    assert one["holes_mean"] == len(lay.holes)
    assert one["distance_mean"] == gw.shortest_path(5, lay.holes, lay.starts[0], lay.goals[0])


def test_random_policy_success_rate():
    cfg = {"size": 4, "hole_density": 0.2, "min_goal_distance": 2}
    p = gw.random_policy_success(cfg, episodes=100, max_turns=6, seed=0)
    assert p == gw.random_policy_success(cfg, episodes=100, max_turns=6, seed=0)
    assert 0.0 < p < 0.5
    two = gw.random_policy_success({**cfg, "num_agents": 2}, episodes=100, max_turns=6)
    assert two < p  # two agents must both arrive


def test_grid_observation_encodes_with_the_char_tokenizer():
    from jaxrl_frontier.models.tokenizer import CharTokenizer

    env = make_env("gridworld", size=5, num_agents=3)
    tok = CharTokenizer()
    observation = env.reset(1)
    ids = tok.encode(observation)  # raises on a character outside the alphabet
    assert tok.decode(ids) == observation and tok.unk_id not in ids


def test_gridworld_corners_is_the_classic_board():
    from jaxrl_frontier.data.envs import gridworld

    cfg = gridworld.GridConfig(size=4, hole_density=0.3, corners=True)
    layouts = [gridworld.generate(cfg, seed) for seed in range(20)]
    assert all(lay.starts == ((0, 0),) and lay.goals == ((3, 3),) for lay in layouts)
    assert len({lay.holes for lay in layouts}) > 5  # only the holes vary by seed
    assert all(gridworld.shortest_path(4, lay.holes, (0, 0), (3, 3)) for lay in layouts)
    with pytest.raises(ValueError, match="corners needs num_agents = 1, got 2"):
        gridworld.GridConfig(num_agents=2, corners=True)
    env = gridworld.GridWorld(size=2, hole_density=0.0, corners=True, min_goal_distance=2)
    assert env.reset(0) == "a.\n.1\na at (0, 0) goal (1, 1)\n"
    assert env.step("right")[2] is False
    _, reward, done, info = env.step("down")
    assert done and info["success"] and reward == 1.0
