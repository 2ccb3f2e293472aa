"""The rollout producer (rl/produce/producer.py) with a scripted sampler and a fixed scorer: the
Experience's tokens, masks, behaviour log-probs, advantages, groups and versions, the
per-prompt results and the rollout metrics, all by hand."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.core import sharding
from jaxrl_frontier.data.tasks import make_task
from jaxrl_frontier.models.tokenizer import CharTokenizer
from jaxrl_frontier.rl.produce.producer import RolloutProducer
from jaxrl_frontier.sampling import Rollout, SamplingParams

TASK = make_task("arithmetic", max_digits=1, ops="+", prompt_template="{a}{op}{b}=")


class ScriptedSampler:
    """Returns fixed completions (row b: tokens COMPLETIONS[b % 4]) with fixed log-probs."""

    COMPLETIONS = [[5, 6, 2], [7, 2, 0], [5, 2, 0], [8, 9, 9]]  # 2 = EOS, 0 = pad
    LENGTHS = [3, 2, 2, 3]
    mesh, stats = None, {}  # a Sampler's: no mesh of its own, no decode statistics

    def __init__(self):
        self.weights = None

    def update_weights(self, weights, version=None):
        self.weights, self.version = weights, version

    def generate(self, tokens, mask, params: SamplingParams, key):
        n, p = params.n, tokens.shape[0]
        b = p * n
        comp = np.asarray([self.COMPLETIONS[i % 4] for i in range(b)], np.int32)
        cmask = np.asarray(
            [[1] * k + [0] * (3 - k) for k in [self.LENGTHS[i % 4] for i in range(b)]], np.int32
        )
        logp = -0.5 * (1 + np.arange(b)[:, None] + np.arange(3)[None]) * cmask
        as_j = lambda x: jnp.asarray(x)
        return Rollout(
            prompt_tokens=as_j(np.repeat(tokens, n, 0)),
            prompt_mask=as_j(np.repeat(mask, n, 0)),
            completion_tokens=as_j(comp),
            completion_mask=as_j(cmask),
            policy_mask=as_j(cmask),
            lengths=as_j(cmask.sum(1)),
            finish_reason=as_j(np.zeros(b, np.int32)),
            sample_logp=as_j(logp.astype(np.float32)),
            policy_logp=as_j(logp.astype(np.float32)),
            policy_version=as_j(np.zeros(b, np.int32)),
            group_size=n,
        )


class FixedScorer:
    """Reward = row number within the batch, on one 'correctness' component."""

    reward_names = ("correctness",)

    def __call__(self, examples, completions):
        return np.arange(len(completions), dtype=np.float32)[:, None], 0


def test_rollout_producer_builds_the_experience_by_hand():
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    sampler = ScriptedSampler()
    producer = RolloutProducer(
        sampler,
        CharTokenizer(),
        FixedScorer(),
        mesh=mesh,
        sampling=SamplingParams(n=4, max_new_tokens=3),
        max_prompt_len=5,
        objective=dict(advantage="dr_grpo", advantage_kwargs={}, reward_weights={}),
        prompt_of=TASK.prompt,
    )
    examples = [TASK.example("train", i) for i in (11, 12)]
    exp, info = producer.produce(examples, {"policy": "W"}, jax.random.key(0), version=7)
    assert sampler.weights == "W" and sampler.version == 7
    tok = np.asarray(exp.tokens)
    assert tok.shape == (8, 5 + 3)
    np.testing.assert_array_equal(
        tok[:, 5:], [ScriptedSampler.COMPLETIONS[i % 4] for i in range(8)]
    )
    want_mask = np.asarray([[1] * k + [0] * (3 - k) for k in [3, 2, 2, 3] * 2], np.float32)
    np.testing.assert_array_equal(np.asarray(exp.loss_mask)[:, 5:], want_mask)
    assert np.asarray(exp.loss_mask)[:, :5].sum() == 0
    old = -0.5 * (1 + np.arange(8)[:, None] + np.arange(3)[None]) * want_mask
    np.testing.assert_allclose(np.asarray(exp.old_logp)[:, 5:], old)
    # dr_grpo: R - mean of the group; rewards 0..3 and 4..7 -> -1.5, -0.5, 0.5, 1.5
    adv = np.asarray(exp.advantages)
    np.testing.assert_allclose(adv[:, 5:], np.tile([-1.5, -0.5, 0.5, 1.5], 2)[:, None] * want_mask)
    assert adv[:, :5].sum() == 0
    np.testing.assert_array_equal(np.asarray(exp.group_id), [0] * 4 + [1] * 4)
    np.testing.assert_array_equal(np.asarray(exp.prompt_index), [11] * 4 + [12] * 4)
    np.testing.assert_array_equal(np.asarray(exp.policy_version), [7] * 8)
    assert [r.index for r in info["results"]] == [11, 12]
    np.testing.assert_allclose(info["results"][1].reward, [4, 5, 6, 7])
    assert info["results"][0].correct == 0.75  # rewards 1, 2, 3 > 0
    np.testing.assert_allclose(float(info["metrics"]["reward/total"]), 3.5)
    np.testing.assert_allclose(float(info["metrics"]["rollout/response_length"]), 2.5)
    assert float(info["metrics"]["rollout/response_length_max"]) == 3.0  # lengths 3, 2, 2, 3
