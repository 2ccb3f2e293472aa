"""Environments: scripted per-turn rewards, budgets (cut and flagged), independent batched
episodes, the registry and user modules, the grid world's rules and generator, the
calculator's safe evaluator and episodes."""

import dataclasses
from fractions import Fraction

import numpy as np
import pytest

from jaxrl_frontier.data.envs import (
    ENVS,
    EpisodeBatch,
    env_from_config,
    load_env_module,
    make_env,
    split_seeds,
)
from jaxrl_frontier.data.envs import calculator as calc
from jaxrl_frontier.data.envs import gridworld as gw
from jaxrl_frontier.data.envs.trajectory import episode_row, pack

# ----------------------------------------------------------------- scripted, batch, budgets


def test_scripted_env_gives_exactly_the_scripted_rewards():
    env = make_env("scripted", rewards=[0.0, 0.25, -1.0, 2.0])
    assert env.reset(7) == "start 7"
    got = [env.step(f"act {k}") for k in range(4)]
    assert [g[1] for g in got] == [0.0, 0.25, -1.0, 2.0]
    assert [g[2] for g in got] == [False, False, False, True]
    assert [g[0] for g in got] == ["obs 1", "obs 2", "obs 3", "obs 4"]
    assert got[-1][3]["success"] and not got[0][3]["success"]
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("one more")


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


# ----------------------------------------------------------------- registry, user modules


def test_registry_lists_environments_and_names_unknown_ones():
    assert {"calculator", "gridworld", "scripted"} <= set(ENVS.names())
    with pytest.raises(KeyError, match="gridworld"):
        make_env("gridwrld")


def test_user_environment_from_a_module_file(tmp_path):
    f = tmp_path / "my_env.py"
    f.write_text(
        "from jaxrl_frontier.data.envs import ENVS, TextEnv\n"
        "@ENVS.register('echo_test_env')\n"
        "class Echo(TextEnv):\n"
        "    name = 'echo_test_env'\n"
        "    def _reset(self, seed):\n"
        "        return 'say ' + str(seed)\n"
        "    def _step(self, action):\n"
        "        return action, float(action == 'hi'), True, {'success': action == 'hi'}\n"
        "    def state_key(self):\n"
        "        return 0\n"
    )
    try:
        load_env_module(str(f))
        load_env_module(str(f))  # twice: a no-op, not a duplicate registration
        env = make_env("echo_test_env")
        assert env.reset(3) == "say 3" and env.step("hi")[1] == 1.0
        env = env_from_config({"module": str(f), "name": "echo_test_env", "kwargs": {}})
        assert env.reset(4) == "say 4"
    finally:
        ENVS.unregister("echo_test_env")
    with pytest.raises(KeyError, match="'env.name'.*gridworld"):
        env_from_config({"name": "no_such_env"})
    import ml_collections

    cfg = ml_collections.ConfigDict({"name": "gridworld", "module": "", "kwargs": {"size": 3}})
    assert env_from_config(cfg).config.size == 3
    with pytest.raises(FileNotFoundError, match="env.module"):
        load_env_module(str(tmp_path / "missing.py"))
    with pytest.raises(ModuleNotFoundError, match="env.module"):
        load_env_module("no_such_module_for_envs")


# ----------------------------------------------------------------- grid world


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


def test_layout_statistics_and_split_seeds():
    stats = gw.layout_statistics(
        {"size": 5, "hole_density": 0.0, "min_goal_distance": 3}, range(20)
    )
    assert stats["holes_mean"] == 0.0 and stats["distance_mean"] >= 3
    assert stats["distance_max"] <= 8  # corner to corner of a 5x5 board without holes
    lay = gw.generate(gw.GridConfig(size=5, hole_density=0.3), 0)
    one = gw.layout_statistics({"size": 5, "hole_density": 0.3}, [0])
    assert one["holes_mean"] == len(lay.holes)
    assert one["distance_mean"] == gw.shortest_path(5, lay.holes, lay.starts[0], lay.goals[0])
    train = split_seeds("gridworld", "train", 200, eval_fraction=0.2)
    evals = split_seeds("gridworld", "eval", 50, eval_fraction=0.2)
    assert len(set(train)) == 200 and len(set(evals)) == 50 and not set(train) & set(evals)
    assert split_seeds("gridworld", "train", 200, 0.2) == train  # stable
    assert 0.1 < 50 / max(evals) < 0.3  # about eval_fraction of the seeds
    assert not set(evals) & set(split_seeds("gridworld", "train", 50, 0.2, start=max(evals)))
    with pytest.raises(ValueError, match="unknown split"):
        split_seeds("gridworld", "test", 1)


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


# ----------------------------------------------------------------- calculator


@pytest.mark.parametrize(
    "expr, value",
    [
        ("3*(4+5)", 27),
        ("7/2", Fraction(7, 2)),
        ("-2**3 + 10 // 3 % 2", -7),
        ("2**-2", Fraction(1, 4)),
        ("1.5 * 4", 6),
        ("+(1)", 1),
    ],
)
def test_evaluator_values(expr, value):
    assert calc.evaluate(expr) == value


@pytest.mark.parametrize(
    "expr, reason",
    [
        ("__import__('os').system('true')", "Call"),
        ("().__class__", "Attribute"),
        ("x + 1", "Name"),
        ("'a' * 3", "not a number"),
        ("True + 1", "not a number"),
        ("[1, 2]", "List"),
        ("lambda: 1", "Lambda"),
        ("9**9**9", "exponent"),
        ("10**15 * 10", "too large"),
        ("1/0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("1 +", "syntax"),
        ("1" * 300, "longer than"),
        ("1 << 3", "operator not allowed"),
        ("1j", "not a number"),
    ],
)
def test_evaluator_refuses(expr, reason):
    with pytest.raises(calc.CalcError, match=reason):
        calc.evaluate(expr)


def test_calculator_episode():
    env = make_env("calculator")
    obs = env.reset(3)
    p = env.problem
    assert p["question"] in obs and "<calc>" in obs
    assert calc.evaluate(p["expression"]) == p["answer"]
    o, r, done, info = env.step(f"let me compute <calc>{p['expression']}</calc>")
    assert o == f"<result>{p['answer']}</result>\n" and r == 0.0 and not done
    o, r, done, info = env.step("<calc>1/0</calc>")
    assert o == "<result>error: division by zero</result>\n" and not done
    o, r, done, info = env.step("hmm")
    assert info["invalid"] and not done and "<answer>" in o
    o, r, done, info = env.step(f"<calc>1+1</calc> so <answer>{p['answer']}</answer>")
    assert done and r == 1.0 and info["success"]
    env.reset(3)
    _, r, done, info = env.step(f"<answer>{p['answer'] + 1}</answer>")
    assert done and r == 0.0 and not info["success"]
    env.reset(3)
    _, r, _, _ = env.step(f"<answer>{p['answer']}.0</answer>")
    assert r == 1.0
    assert calc.parse_answer("1,000") == 1000 and calc.parse_answer("3/4") == Fraction(3, 4)
    assert calc.parse_answer("abc") is None and calc.format_number(Fraction(1, 3)) == "0.333333"


def test_calculator_problems_are_seeded_and_whole():
    assert calc.make_problem(5) == calc.make_problem(5)
    questions = {calc.make_problem(s)["question"] for s in range(50)}
    assert len(questions) == 50
    for s in range(200):
        p = calc.make_problem(s, max_number=20)
        assert isinstance(p["answer"], int) and p["answer"] >= 0


def test_calculator_custom_syntax():
    env = make_env(
        "calculator",
        syntax={"call_open": "[", "call_close": "]", "result_open": "=", "result_close": ";"},
    )
    env.reset(0)
    assert env.step("[2*21]")[0] == "=42;\n"


# ----------------------------------------------------------------- token layout, end to end


def test_pack_layout_hand_built():
    out = pack(
        prompts=[[5, 6], [7]],
        episodes=[([[1, 2], [3]], [[8, 8, 8]]), ([[4]], [])],
        pad_id=0,
    )
    assert out["tokens"].tolist() == [[5, 6, 1, 2, 8, 8, 8, 3], [0, 7, 4, 0, 0, 0, 0, 0]]
    assert out["attention_mask"].tolist() == [[1] * 8, [0, 1, 1, 0, 0, 0, 0, 0]]
    assert out["loss_mask"].tolist() == [[0, 0, 1, 1, 0, 0, 0, 1], [0, 0, 1, 0, 0, 0, 0, 0]]
    assert out["turn_index"].tolist() == [[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 0]]
    assert out["turns"].tolist() == [2, 1]
    with pytest.raises(ValueError, match="2 observations for 1 actions"):
        episode_row([[1]], [[2], [3]])
    with pytest.raises(ValueError, match="row 0"):
        pack([[5, 6]], [([[1, 2]], [])], pad_id=0, completion_width=1)


def test_gridworld_episodes_to_token_advantages():
    """Environments, chat markup, token layout and step credit plugged together by hand (the
    sampler replaced by fixed actions): advantages land on the policy's tokens only."""
    import jax.numpy as jnp

    from jaxrl_frontier.data.tasks.chat import ChatTemplate
    from jaxrl_frontier.models.tokenizer import CharTokenizer
    from jaxrl_frontier.rl.methods import critic, step_credit

    tok = CharTokenizer()
    chat = ChatTemplate(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    cfg = {"size": 3, "hole_density": 0.0, "min_goal_distance": 1}
    batch = EpisodeBatch([make_env("gridworld", **cfg) for _ in range(2)], max_turns=3)
    first = batch.reset([2, 2])
    goal = batch.envs[0].layout.goals[0]
    start = batch.envs[0].layout.starts[0]
    dr, dc = goal[0] - start[0], goal[1] - start[1]
    path = ["down"] * dr + ["up"] * -dr + ["right"] * dc + ["left"] * -dc
    scripts = [path, ["stay"] * 3]  # the first walks to its goal, the second stays put
    histories = [[{"role": "user", "content": o}] for o in first]
    prompts = [chat.encode(tok, h, add_generation_prompt=True) for h in histories]
    rows = [([], []), ([], [])]
    for k in range(3):
        actions = [
            scripts[i][k] if batch.live[i] and k < len(scripts[i]) else None for i in range(2)
        ]
        if all(a is None for a in actions):
            break
        out = batch.step(actions)
        for i, (a, o) in enumerate(zip(actions, out)):
            if a is None:
                continue
            rows[i][0].append(tok.encode(a) + [tok.eos_id])
            histories[i].append({"role": "assistant", "content": a})
            if not o[2]:
                new = [{"role": "user", "content": o[0]}]
                rows[i][1].append(tok.encode(chat.turn_text(tok, histories[i], new)))
                histories[i] += new
    assert batch.successes().tolist() == [True, False]
    assert batch.cut().tolist() == [len(path) > 3, True]
    # each row, decoded, is the whole conversation rendered by the template
    packed = pack(prompts, rows, pad_id=tok.pad_id)
    for b in range(2):
        real = packed["tokens"][b][packed["attention_mask"][b] == 1]
        text = tok.decode(real, skip_special=True)
        assert chat.render(histories[b]) == text + "\n"
    # GiGPO advantages per turn, then on tokens: only action tokens carry them
    steps = step_credit.Steps.from_episodes(batch.episodes)
    adv = step_credit.gigpo_advantages(steps, gamma=1.0)["advantage"]
    per_turn = np.zeros((2, 3), np.float32)
    per_turn[steps.episode, steps.turn] = adv
    tok_adv = np.asarray(
        step_credit.steps_to_tokens(
            jnp.asarray(per_turn),
            jnp.asarray(packed["turn_index"]),
            jnp.asarray(packed["loss_mask"]),
        )
    )
    mask = packed["loss_mask"]
    assert np.all(tok_adv[mask == 0] == 0)
    assert tok_adv[0][mask[0] == 1].min() > 0 > tok_adv[1][mask[1] == 1].max()
    # the turn rewards on tokens sum to each episode's return
    r_tok = critic.turn_rewards_to_tokens(
        jnp.asarray(batch.turn_rewards()), jnp.asarray(packed["turn_index"]), jnp.asarray(mask)
    )
    np.testing.assert_allclose(np.asarray(r_tok).sum(1), batch.returns())


def test_observation_tokens_get_no_gradient_through_the_loss():
    """A hand-built two-turn trajectory: the loss mask is 0 on the prompt and the
    observation, and the objective's gradient w.r.t. the per-token log-probs is 0 there even
    with an advantage of 1 on every column (only the mask protects them)."""
    import jax
    import jax.numpy as jnp

    from jaxrl_frontier.objectives import losses
    from jaxrl_frontier.objectives.stats import TokenStats

    packed = pack(
        prompts=[[9, 9, 9], [9]],
        episodes=[([[1, 2], [3, 4, 5]], [[7, 7]]), ([[1], [2]], [[7, 7, 7]])],
        pad_id=0,
    )
    mask = jnp.asarray(packed["loss_mask"])
    policy = np.zeros(mask.shape)
    policy[0, 3:5] = policy[0, 7:10] = 1  # actions of row 0: after the 3-token prompt
    policy[1, 3] = policy[1, 7] = 1  # row 1: prompt left-padded to width 3
    np.testing.assert_array_equal(np.asarray(mask), policy)
    logp0 = jnp.asarray(np.random.default_rng(0).normal(size=mask.shape), jnp.float32) - 2.0
    adv = jnp.ones(mask.shape)
    cfg = losses.default_config()

    def loss(logp):
        stats = TokenStats(logp=logp, old_logp=jax.lax.stop_gradient(logp0), mask=mask)
        return losses.objective_loss(stats, adv, cfg)[0]

    g = np.asarray(jax.grad(loss)(logp0))
    assert np.all(g[policy == 0] == 0)
    assert np.all(g[policy == 1] < 0)  # a positive advantage raises every sampled token


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
