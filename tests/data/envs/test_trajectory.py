"""data/envs/trajectory.py: the token layout of multi-turn episodes, by hand and end to end
(environments, chat markup, layout and step credit plugged together; the loss mask keeps
observation tokens out of the gradient)."""

import numpy as np
import pytest

from jaxrl_frontier.data.envs import EpisodeBatch, make_env
from jaxrl_frontier.data.envs.trajectory import episode_row, pack


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
