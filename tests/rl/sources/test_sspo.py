"""3SPO's allocation source (`data.source = 'sspo'`): start states drawn in proportion to
n(s0) = ceil(G_max S(s0)), dead ends left out, the history filled from observed episodes and
resumed exactly from its JSON state; the config errors that name the keys."""

import json

import numpy as np
import pytest

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.data.envs.task import EnvTask
from jaxrl_frontier.rl.experience import PromptResult
from jaxrl_frontier.rl.methods.step_credit import StateScores
from jaxrl_frontier.rl.sources import make_source
from jaxrl_frontier.rl.sources.base import UniformSource
from jaxrl_frontier.rl.sources.sspo import SSPOSource
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run.config import presets, sections


class Stream:
    """A fixed stream of candidate seeds, P at a time, with an exact state."""

    def __init__(self, seeds, batch):
        self.seeds, self.batch, self.pos = list(seeds), batch, 0

    def next_batch(self):
        out = [{"index": s, "seed": s} for s in self.seeds[self.pos : self.pos + self.batch]]
        self.pos = (self.pos + self.batch) % len(self.seeds)
        return out

    def state(self):
        return {"pos": self.pos}

    def restore(self, state):
        self.pos = state["pos"]


def start_state(seed):
    return (seed % 100, ((0, 0),))  # a tuple state, as the grid world's


def history():
    """t = 1 + 40 episodes. s0 of seed 1: 20 visits, 20 successes (rate 1: S = 1/t);
    seed 2: 12 failures (a dead end: >= xi = 10 failures, rate 0 <= zeta);
    seed 3: 8 visits, 4 successes (rate 0.5); seeds 4 and 5 never seen (S = 1)."""
    s = StateScores(alpha=1.0, xi=10.0, zeta=0.1, g_max=8)
    for _ in range(20):
        s.update([start_state(1)], True)
    for _ in range(12):
        s.update([start_state(2)], False)
    for k in range(8):
        s.update([start_state(3)], k % 2 == 0)
    return s


def n_of(scores, seed):
    return scores.rollouts(start_state(seed))


def test_allocation_by_hand():
    s = history()
    t = 41
    assert s.t == t
    assert n_of(s, 1) == int(np.ceil(8 * np.exp(-np.log(t) * 20 / (20 + 1e-6))))  # = 1
    assert n_of(s, 1) == 1 and n_of(s, 2) == 0
    assert n_of(s, 3) == int(np.ceil(8 * np.exp(-np.log(t) * 4 / (8 + 1e-6))))  # = 2
    assert n_of(s, 4) == n_of(s, 5) == 8


def test_draws_follow_n_of_the_start_state_and_skip_dead_ends():
    scores = history()
    src = SSPOSource(
        Stream([1, 2, 3, 4], 4), batch_size=1, start_state=start_state, scores=scores,
        seed=0, pool=1,
    )  # fmt: skip
    counts = {1: 0, 2: 0, 3: 0, 4: 0}
    draws = 4000
    for _ in range(draws):
        (e,) = src.next_batch()
        counts[e["seed"]] += 1
    n = {k: n_of(scores, k) for k in counts}  # 1, 0, 2, 8
    assert counts[2] == 0  # the dead end is never played
    for k in (1, 3, 4):
        p = n[k] / 11
        assert abs(counts[k] / draws - p) < 4 * np.sqrt(p * (1 - p) / draws), (k, counts)
    assert src.metrics()["sspo/dead_fraction"] == 0.25


def test_too_few_live_start_states_fill_the_batch_with_dead_ones():
    scores = history()
    for _ in range(12):
        scores.update([start_state(4)], False)  # seed 4 dies too
    src = SSPOSource(
        Stream([1, 2, 4, 102], 4), batch_size=3, start_state=start_state, scores=scores,
        seed=0, pool=1,
    )  # fmt: skip
    # seed 102's s0 is seed 2's: dead. Live: only seed 1, so two dead seeds fill the batch.
    batch = [e["seed"] for e in src.next_batch()]
    assert len(batch) == 3 and 1 in batch and len(set(batch)) == 3


def test_observe_records_every_episode_and_the_state_resumes_exactly():
    scores = StateScores(g_max=4)
    src = SSPOSource(
        Stream(range(40), 4), batch_size=4, start_state=start_state, scores=scores,
        seed=3, pool=3,
    )  # fmt: skip
    for _ in range(3):
        batch = src.next_batch()
        results = [
            PromptResult(
                index=e["index"],
                example=e,
                rewards=np.asarray([[1.0, float(e["seed"] % 3 == 0)], [0.0, 0.0]]),
                reward=np.zeros(2),
                correct=0.5,
                lengths=np.zeros(2),
                episode_states=(
                    (start_state(e["seed"]), (e["seed"], ((0, 1),))),
                    (start_state(e["seed"]), (e["seed"], ((1, 0),))),
                ),
            )  # fmt: skip
            for e in batch
        ]
        src.observe(results)
    assert scores.t == 1 + 3 * 4 * 2  # every episode recorded
    some = next(iter(scores.counts))
    assert scores.counts[some][0] >= 2  # both episodes of a group pass through its s0
    saved = json.loads(json.dumps(src.state()))
    want = [[e["seed"] for e in src.next_batch()] for _ in range(4)]
    again = SSPOSource(
        Stream(range(40), 4), batch_size=4, start_state=start_state,
        scores=StateScores(g_max=4), seed=99, pool=3,
    )  # fmt: skip
    again.restore(saved)
    # the restored history holds the same (tuple) states: scores equal, draws equal
    assert again.state_scores.t == 25
    for state, counts in list(scores.counts.items())[:10]:
        assert again.state_scores.counts[state] == counts
    assert [[e["seed"] for e in again.next_batch()] for _ in range(4)] == want


def test_allocate_false_keeps_the_history_with_uniform_seeds():
    src = SSPOSource(
        Stream(range(8), 4), batch_size=4, start_state=start_state, scores=history(),
        seed=0, pool=4, allocate=False,
    )  # fmt: skip
    assert [e["seed"] for e in src.next_batch()] == [0, 1, 2, 3]


def test_the_config_errors_name_their_keys():
    c = presets.frozenlake("rl")
    c.env.credit = "3spo"
    with pytest.raises(ConfigError, match="env.credit.*data.source='sspo'"):
        config_lib.check_env_run(c)
    c.data.source = "sspo"
    config_lib.check_env_run(c)
    src = make_source(EnvTask(c.env), sections.source_options(c), batch_size=8)
    assert isinstance(src, SSPOSource) and isinstance(src.fresh, UniformSource)
    batch = src.next_batch()
    assert len(batch) == 8 and len({e["seed"] for e in batch}) == 8
    c.data.sspo.pool = 0
    with pytest.raises(ConfigError, match="data.sspo.pool"):
        make_source(EnvTask(c.env), sections.source_options(c), batch_size=8)
    plain = presets.frozenlake("rl")
    plain.env.name = ""
    plain.data.source = "sspo"
    with pytest.raises(ConfigError, match="'data.source' = 'sspo' needs an environment"):
        make_source(EnvTask(c.env), sections.source_options(plain), batch_size=8)


def test_a_3spo_run_cut_after_two_steps_resumes_bitwise(tmp_path):
    """configs/3spo_frozenlake.py:runlocal on 6 training boards (so start states repeat and
    the history steers the draws): 3 uninterrupted steps == 2 steps, a new trainer on the
    same workdir, 1 more step: the same parameters and the same step-3 numbers, the 3SPO
    history and the allocation included."""
    from conftest import assert_resumed_run_equal, get_config

    from jaxrl_frontier.run.trainer import Trainer

    def trainer(workdir, steps):
        c = get_config(
            "3spo_frozenlake",
            {"train.steps": steps, "train.log_every": 1, "train.checkpoint_every": 1,
             "train.eval_every": 10**6, "eval.at_start": False, "mesh.num_devices": 1,
             "env.train_size": 6, "data.sspo.pool": 1},
        )  # fmt: skip
        t = Trainer(c, str(workdir))
        t.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
        return t

    full = trainer(tmp_path / "full", 3)
    full.run()
    trainer(tmp_path / "cut", 2).run()
    resumed = trainer(tmp_path / "cut", 3)
    resumed.run()
    # the history came back from the checkpoint: step 3 alone would give t = 1 + 16
    assert resumed.source.state_scores.t == full.source.state_scores.t == 1 + 3 * 16
    assert resumed.source.state_scores.counts == full.source.state_scores.counts
    row = assert_resumed_run_equal(full, resumed, tmp_path / "full", tmp_path / "cut", step=3)
    assert "sspo/allocation_mean" in row and "env/success_rate" in row
