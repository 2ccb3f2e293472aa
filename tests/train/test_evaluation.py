"""train/evaluation.py: the one evaluation's figures, chunks and keys by hand on a registered
toy part (no model), and an environment's evaluation on the scripted environment: its
figures by hand, its episodes those of the producer's own `play` on a fresh session, its
sessions kept by the sampler and reused."""

import jax
import numpy as np
import pytest

from jaxrl_frontier.core.errors import UnknownNameError
from jaxrl_frontier.data.envs.task import EnvTask
from jaxrl_frontier.data.tasks.base import Task
from jaxrl_frontier.sampling import SamplingParams
from jaxrl_frontier.train import evaluation as ev

SEEN = []  # (greedy, chunk, key data) of every roll of the toy part


@ev.EVAL_BATCHES.register("test_toy_kind")
class ToyBatches:
    """Example e's greedy row is right when e is even, its sampled row j when (e + j) % 4 ==
    0; every chunk reports one failure a prompt and the greedy figure 'index' = e."""

    def __init__(self, sampler, tokenizer, task, options, scorer=None):
        pass

    def examples(self, n):
        return list(range(n))

    def params(self, greedy, k):
        return SamplingParams(greedy=greedy, n=k, max_new_tokens=1)

    def roll(self, examples, params, key):
        SEEN.append((params.greedy, list(examples), jax.random.key_data(key).tolist()))
        if params.greedy:
            correct = [float(e % 2 == 0) for e in examples]
        else:
            correct = [float((e + j) % 4 == 0) for e in examples for j in range(params.n)]
        figures = {"index": np.asarray(examples, np.float32)}
        return ev.EvalRows(np.asarray(correct), len(examples), figures, batch=list(examples))


class ToyTask(Task):
    evaluation = "test_toy_kind"

    def num_examples(self, split):
        return 5


def test_the_figures_chunks_and_keys_of_a_registered_part_by_hand():
    """5 held-out examples (9 asked: the split holds 5), k = 3, greedy chunks of 2, sampled
    chunks of 3: greedy 3/5 right; sampled rows right at (0,0), (2,2), (3,1), (4,0), so
    pass@3 = 4/5 and the mean 4/15; 10 failures; the index's greedy mean 2. Each chunk's key
    is the next split of key(key_seed) (greedy) or key(key_seed + 1) (sampled)."""
    SEEN.clear()
    sampled_chunks = []
    options = ev.EvalOptions(pass_k=3, batch=2, sampled_batch=3, key_seed=7)
    out = ev.evaluate(
        None, None, ToyTask(), options, 9, on_sampled=lambda e, r: sampled_chunks.append(e)
    )
    assert out == pytest.approx(
        {"eval/pass@1_greedy": 0.6, "eval/index_greedy": 2.0, "eval/pass@3": 0.8,
         "eval/mean_correct_sampled": 4 / 15, "eval/reward_failed": 10.0}
    )  # fmt: skip
    assert list(out) == ["eval/pass@1_greedy", "eval/index_greedy", "eval/pass@3",
                         "eval/mean_correct_sampled", "eval/reward_failed"]  # fmt: skip
    assert [(g, e) for g, e, _ in SEEN] == [
        (True, [0, 1]), (True, [2, 3]), (True, [4]), (False, [0, 1, 2]), (False, [3, 4])
    ]  # fmt: skip
    assert sampled_chunks == [[0, 1, 2], [3, 4]]

    def keys(seed, n):
        key, out = jax.random.key(seed), []
        for _ in range(n):
            key, sub = jax.random.split(key)
            out.append(jax.random.key_data(sub).tolist())
        return out

    assert [k for _, _, k in SEEN] == keys(7, 3) + keys(8, 2)
    # pass_k = 1: the greedy pass only, unless the sampled pass is asked for
    SEEN.clear()
    one = ev.evaluate(None, None, ToyTask(), ev.EvalOptions(pass_k=1, batch=8), 4)
    assert one == {"eval/pass@1_greedy": 0.5, "eval/index_greedy": 1.5,
                   "eval/reward_failed": 4.0}  # fmt: skip
    asked = ev.EvalOptions(pass_k=1, batch=8, sampled=True)
    assert ev.evaluate(None, None, ToyTask(), asked, 4)["eval/pass@1"] == 0.25  # row (0, 0)


def test_each_task_declares_its_kind_and_an_unknown_kind_is_named():
    assert Task.evaluation == "completions" and EnvTask.evaluation == "episodes"
    assert ev.EVAL_BATCHES.get("completions") is ev.CompletionBatches
    assert ev.EVAL_BATCHES.get("episodes") is ev.EpisodeBatches

    class Typo(ToyTask):
        evaluation = "episode"

    with pytest.raises(UnknownNameError, match="'episode'.*completions, episodes.*'episodes'"):
        ev.evaluate(None, None, Typo(), ev.EvalOptions())


def test_episode_evaluation_plays_the_seeds_with_the_samplers_shared_sessions():
    """The scripted environment's rewards (0.5, 0, 2) whatever the policy writes: every
    episode succeeds in 3 turns with return 2.5. The sampled pass's episodes are those of
    `play` on a fresh session with the chunk's key; a second evaluation reuses the two
    sessions (greedy, sampled) the sampler keeps and gives the same figures."""
    from jaxrl_frontier.models.model_config import ModelConfig
    from jaxrl_frontier.models.random_init import random_model
    from jaxrl_frontier.models.tokenizer import CharTokenizer
    from jaxrl_frontier.rl.produce.agent import play
    from jaxrl_frontier.run.config import base_config
    from jaxrl_frontier.run.config.sections import env_options
    from jaxrl_frontier.sampling import Sampler
    from jaxrl_frontier.sampling.turns import TurnSession

    tok = CharTokenizer()
    cfg = ModelConfig(
        vocab_size=tok.vocab_size, hidden_size=16, intermediate_size=32, num_layers=1,
        num_heads=2, num_kv_heads=1,
    )  # fmt: skip
    sampler = Sampler(random_model(cfg, seed=1), pad_id=tok.pad_id, prompt_buckets=(24,))
    c = base_config()
    c.data.max_prompt_len = 24  # "start <a 10-digit seed>" and BOS
    c.env.update(name="scripted", max_turns=4, turn_tokens=3, obs_tokens=6)
    c.env.kwargs = {"rewards": [0.5, 0.0, 2.0]}
    env = env_options(c)
    task = EnvTask(env)
    options = ev.EvalOptions(num_prompts=3, pass_k=2, batch=3, environment=env)  # one chunk
    played = []
    out = ev.evaluate(sampler, tok, task, options, on_sampled=lambda e, r: played.append(r))
    assert out == {"eval/pass@1_greedy": 1.0, "eval/return_greedy": 2.5,
                   "eval/turns_greedy": 3.0, "eval/pass@2": 1.0,
                   "eval/mean_correct_sampled": 1.0, "eval/reward_failed": 0.0}  # fmt: skip
    sessions = dict(sampler.turn_sessions)
    assert sorted(p.n for p, _, _ in sessions) == [1, 2]  # greedy and sampled

    params = ev.EpisodeBatches(sampler, tok, task, options).params(False, 2)
    fresh = TurnSession(sampler, params, obs_tokens=6, max_turns=4)
    seeds = [task.example("eval", i)["seed"] for i in range(3)]
    (rows,) = played
    want = play(fresh, task, tok, seeds, jax.random.split(jax.random.key(1))[1], env=env).batch
    assert [ep.actions for ep in rows.batch.episodes] == [ep.actions for ep in want.episodes]

    assert ev.evaluate(sampler, tok, task, options) == out
    assert sampler.turn_sessions == sessions  # the same session objects, no new compiles
