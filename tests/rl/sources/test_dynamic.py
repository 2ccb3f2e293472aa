"""DAPO dynamic sampling (rl/sources/dynamic.py), hand-checked: groups with signal, refills
from more draws up to the budget, signal on the weighted reward, the builder's weights, and
an exact resume from its JSON state. (Through the trainer: test_sources_resume.py.)"""

import dataclasses
import json

import numpy as np

from jaxrl_frontier.data.tasks import make_task
from jaxrl_frontier.rl.experience import RolloutRows, ScoredRows
from jaxrl_frontier.rl.sources.base import UniformSource
from jaxrl_frontier.rl.sources.dynamic import DynamicSource, signal_groups

TASK = make_task("arithmetic", max_digits=1, ops="+", prompt_template="{a}{op}{b}=", train_size=64)


def _draw(indices, rewards, g=2) -> ScoredRows:
    """A scored draw of prompts `indices` with per-row rewards [P * G] (one component)."""
    b = len(indices) * g
    rows = RolloutRows(
        examples=tuple({"index": i} for i in indices),
        completion_tokens=np.arange(b)[:, None].repeat(3, 1),
        completion_mask=np.ones((b, 3), np.int32),
        policy_mask=np.ones((b, 3), np.int32),
        policy_logp=np.zeros((b, 3), np.float32),
        texts=tuple(f"t{i}" for i in range(b)),
    )
    z = np.zeros((b, 2), np.int32)
    return ScoredRows(rows, z, z, np.asarray(rewards, np.float32)[:, None], None, 1)


def _json(state):
    return json.loads(json.dumps(state))  # the checkpoint's metadata is JSON


def test_signal_groups_are_groups_with_unequal_rewards():
    r = np.asarray([[1, 0], [1, 0], [0, 0], [1, 0], [1, 1], [0, 1]], np.float32)  # G = 2
    np.testing.assert_array_equal(signal_groups(r, 2), [False, True, True])


def test_dynamic_sampling_refills_dropped_groups_from_more_draws():
    src = DynamicSource(None, max_draws=4)
    first = _draw([10, 11, 12, 13], [1, 1, 0, 1, 0, 0, 1, 0])  # signal: 11, 13
    second = _draw([20, 21, 22, 23], [0, 0, 1, 0, 1, 1, 0, 1])  # signal: 21, 23
    asked = []
    out, m = src.select(first, lambda i: asked.append(i) or second)
    assert asked == [1]  # one more draw filled the batch
    assert [e["index"] for e in out.rows.examples] == [11, 13, 21, 23]
    assert signal_groups(out.rewards, 2).all()  # no zero-variance group while prompts remain
    np.testing.assert_array_equal(out.rewards[:, 0], [0, 1, 1, 0, 1, 0, 0, 1])
    assert out.rows.texts == ("t2", "t3", "t6", "t7", "t2", "t3", "t6", "t7")
    assert out.n_failed == 2
    assert m["dynamic/draws"] == 2 and m["dynamic/signal_groups"] == 4
    assert m["dynamic/filled_zero_signal"] == 0


def test_dynamic_sampling_stops_at_the_draw_budget_and_reports_the_shortfall():
    src = DynamicSource(None, max_draws=2)
    first = _draw([10, 11, 12, 13], [1, 1, 0, 1, 0, 0, 1, 0])
    flat = _draw([20, 21, 22, 23], [0] * 8)
    calls = []
    out, m = src.select(first, lambda i: calls.append(i) or flat)
    assert calls == [1]  # the budget: 2 draws
    # the 2 signal groups, then zero-signal groups in draw order (10, 12), kept in draw order
    assert [e["index"] for e in out.rows.examples] == [10, 11, 12, 13]
    assert m["dynamic/filled_zero_signal"] == 2 and m["dynamic/signal_groups"] == 2


def test_dynamic_sampling_judges_signal_on_the_weighted_reward():
    # components (correctness, format): group 0 differs only in the unweighted format
    r = np.asarray([[1, 0], [1, 1], [0, 1], [1, 1]], np.float32)
    draw = dataclasses.replace(_draw([10, 11], r[:, 0]), rewards=r)
    src = DynamicSource(None, max_draws=1, weights=[1.0, 0.0])
    out, m = src.select(draw, None)
    assert m["dynamic/signal_groups"] == 1 and m["dynamic/filled_zero_signal"] == 1
    assert [e["index"] for e in out.rows.examples] == [10, 11]  # 11 has signal, 10 fills
    assert DynamicSource(None, max_draws=1).signal(draw).tolist() == [True, True]


def test_dynamic_builder_weighs_correctness_and_the_shaped_components():
    from jaxrl_frontier.rl.sources import make_source
    from jaxrl_frontier.run import config as config_lib
    from jaxrl_frontier.run.config import sections

    c = config_lib.base_config()
    c.data.source = "dynamic"
    c.rollout.overlong_cache = 2
    src = make_source(TASK, sections.source_options(c), batch_size=4)
    # the task's (correctness, format, length), then the shaper's overlong
    np.testing.assert_array_equal(src.weights, [1.0, 0.0, 0.0, 1.0])
    c.objective.reward_weights = dict(correctness=1.0, length=0.5)
    np.testing.assert_array_equal(
        make_source(TASK, sections.source_options(c), batch_size=4).weights, [1, 0, 0.5, 0]
    )


def test_dynamic_source_resumes_exactly():
    def make():
        return DynamicSource(UniformSource(TASK, batch_size=4, seed=3), max_draws=3)

    one = make()
    one.next_batch()
    saved = _json(one.state())
    want = [[e["index"] for e in one.next_batch()] for _ in range(2)]
    two = make()
    two.restore(saved)
    assert [[e["index"] for e in two.next_batch()] for _ in range(2)] == want
    assert two.draws_total == one.draws_total == 3
