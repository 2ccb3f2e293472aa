"""The RL step's stages, each alone with fake neighbours, and the trainer's wiring of them.

- PromptSource: one global stream sliced per process, exact state; a custom source.
- RolloutProducer: a scripted sampler and a fixed scorer -> the Experience, by hand.
- RolloutEditor: a custom editor changes what is scored and trained.
- Learner: epochs x minibatches x microbatches against plain full-batch optax steps.
- The trainer: every weight, advantage, aggregation and distillation name runs two steps,
  and its gradient equals `objective_loss` on the same batch.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import SMALL_MODEL, random_model, small_rl_config
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.data.tasks import make_task
from jaxrl_frontier.models.layers import ModelConfig
from jaxrl_frontier.models.tokenizer import CharTokenizer
from jaxrl_frontier.objectives import (
    TokenStats,
    advantages,
    aggregation,
    distillation,
    logprobs,
    losses,
    weights,
)
from jaxrl_frontier.rl.experience import Experience, RolloutRows
from jaxrl_frontier.rl.learn.learner import Learner, LearnerOptions, minibatch_order
from jaxrl_frontier.rl.learn.train_step import init_train_state
from jaxrl_frontier.rl.produce.editors import RolloutEditor
from jaxrl_frontier.rl.produce.rollout import RolloutProducer
from jaxrl_frontier.rl.sources.base import PromptSource, UniformSource
from jaxrl_frontier.run import trainer as tr
from jaxrl_frontier.sampling import Rollout, SamplingParams

TASK = make_task("arithmetic", max_digits=1, ops="+", prompt_template="{a}{op}{b}=")


# ============================================================================ PromptSource


def test_uniform_source_is_one_global_stream_sliced_per_process_and_resumes_exactly():
    one = UniformSource(TASK, batch_size=4, seed=3)
    halves = [
        UniformSource(TASK, batch_size=4, seed=3, process_index=i, process_count=2)
        for i in range(2)
    ]
    for _ in range(3):
        whole = [e["index"] for e in one.next_batch()]
        assert [e["index"] for h in halves for e in h.next_batch()] == whole
    saved = json.loads(json.dumps(one.state()))  # the checkpoint's metadata is JSON
    expected = [[e["index"] for e in one.next_batch()] for _ in range(2)]
    again = UniformSource(TASK, batch_size=4, seed=3)
    again.restore(saved)
    assert [[e["index"] for e in again.next_batch()] for _ in range(2)] == expected
    with pytest.raises(ValueError, match="multiple of the 2 processes"):
        UniformSource(TASK, batch_size=3, seed=0, process_count=2)


class ReplayUnsolved(PromptSource):
    """A PromptSource written in a test: half of each batch replays prompts that none of a
    group's completions solved, the rest comes from a uniform source."""

    def __init__(self, fresh):
        self.fresh, self.queue, self.seen = fresh, [], []

    def next_batch(self):
        batch = self.fresh.next_batch()
        replay = self.queue[: len(batch) // 2]
        self.queue = self.queue[len(replay) :]
        return replay + batch[: len(batch) - len(replay)]

    def observe(self, results):
        self.seen.append([r.index for r in results])
        self.queue += [r.example for r in results if r.correct == 0.0]

    def state(self):
        return {"fresh": self.fresh.state(), "queue": self.queue}

    def restore(self, state):
        self.fresh.restore(state["fresh"])
        self.queue = state["queue"]


class FirstTokenOnly(RolloutEditor):
    """A RolloutEditor written in a test: keep each completion's first token only."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0

    def edit(self, rows: RolloutRows) -> RolloutRows:
        self.calls += 1
        mask = rows.completion_mask.copy()
        mask[:, 1:] = 0
        tokens = np.where(mask == 1, rows.completion_tokens, self.tokenizer.pad_id)
        texts = tuple(self.tokenizer.decode(t[:1].tolist(), skip_special=True) for t in tokens)
        return rows.replace(completion_tokens=tokens, completion_mask=mask, texts=texts)


def test_a_custom_source_and_editor_plug_into_the_loop(tmp_path):
    c = small_rl_config()
    c.train.update(steps=3, log_every=1, eval_every=10**6, checkpoint_every=10**6)
    c.eval.update(num_prompts=4, batch=4, pass_k=1)
    trainer = tr.Trainer(c, str(tmp_path))
    trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
    source = trainer.step.source = ReplayUnsolved(trainer.source)
    editor = FirstTokenOnly(trainer.tokenizer)
    trainer.step.producer.editors = (editor,)
    trainer.run()
    assert editor.calls == 3 and len(source.seen) == 3
    # an untrained policy solves nothing: step 2 replays two of step 1's prompts
    assert source.seen[1][:2] == source.seen[0][:2]
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["rollout/response_length"] for r in rows if "train/loss" in r] == [1.0] * 3
    exp, _ = trainer.step.rollout(trainer.source.next_batch(), jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(exp.loss_mask).sum(1), np.ones(16))


# ============================================================================ RolloutProducer


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


# ============================================================================ Learner


def _plain_loss(graphdef, objective):
    """The objective on full logits: no chunking, no shared prompt, no microbatches."""

    def loss(params, batch):
        logits = nnx.merge(graphdef, params)(batch["tokens"], batch["attention_mask"])
        stats = TokenStats(
            logp=logprobs.token_logprobs(logits, batch["tokens"]),
            old_logp=batch["old_logp"],
            mask=batch["loss_mask"],
            ref_logp=batch.get("ref_logp"),
            teacher_logp=batch.get("teacher_logp"),
            sc_logp=batch.get("sc_logp"),
            sc_kl=batch.get("sc_kl"),
        )
        extra = {}
        if batch.get("teacher_logits") is not None:
            extra = dict(teacher_logits=batch["teacher_logits"], tokens=batch["tokens"])
        return losses.objective_loss(stats, batch["advantages"], objective, logits=logits, **extra)[
            0
        ]

    return loss


def _experience(rows=16, t=8, tp=5, seed=0, vocab=20) -> Experience:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, t - tp + 1, rows)  # unequal token counts per row
    mask = (np.arange(t)[None] >= tp) & (np.arange(t)[None] < tp + lengths[:, None])
    mask = mask.astype(np.float32)
    z = lambda dtype=np.float32: np.zeros((rows, t), dtype)
    tokens = rng.integers(4, vocab, (rows, t))
    tokens[:, :tp] = np.repeat(tokens[::4, :tp], 4, 0)  # groups of 4 share their prompt
    return Experience(
        tokens=jnp.asarray(tokens, jnp.int32),
        attention_mask=jnp.asarray(np.arange(t)[None] < tp + lengths[:, None], jnp.int32),
        loss_mask=jnp.asarray(mask),
        old_logp=jnp.asarray(-rng.exponential(2.0, (rows, t)) * mask),
        advantages=jnp.asarray(rng.normal(size=(rows, 1)) * mask),
        rewards=jnp.zeros((rows, 1)),
        prompt_index=jnp.zeros(rows, jnp.int32),
        group_id=jnp.arange(rows) // 4,
        policy_version=jnp.zeros(rows, jnp.int32),
        turn_index=jnp.asarray(z(np.int32)),
    )


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_learner_epochs_minibatches_microbatches_equal_plain_full_batch_steps(aggregation):
    """2 epochs x 2 minibatches x 2 microbatches of unequal token counts: the same params
    as plain optax steps on each whole minibatch with the full-logits objective."""
    model = random_model(ModelConfig(vocab_size=20, **SMALL_MODEL))
    graphdef, params = nnx.split(model)
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    objective = dict(weight="ppo_clip", aggregation=aggregation, advantage="grpo")
    tx = optax.adam(1e-2)
    state = init_train_state(tx, jax.tree.map(jnp.copy, params), mesh, jax.random.key(0))
    options = LearnerOptions(
        objective=objective,
        rows=16,
        group_size=4,
        completion_len=3,
        epochs=2,
        minibatches=2,
        grad_accum=2,
    )
    learner = Learner(graphdef, tx, state, options, mesh=mesh, log=lambda m: None)
    exp = _experience()
    keys = iter(jax.random.split(jax.random.key(1), 2))
    learner.update(exp, lambda: next(keys))

    plain = _plain_loss(graphdef, objective)
    batch = {k: np.asarray(v) for k, v in exp.update_batch().items()}
    p, opt = params, tx.init(params)
    for key in jax.random.split(jax.random.key(1), 2):
        order = minibatch_order(key, 16, learner.update_groups)
        for j in range(2):
            mb = {k: v[order[j * 8 : (j + 1) * 8]] for k, v in batch.items()}
            g = jax.grad(plain)(p, mb)
            u, opt = tx.update(g, opt, p)
            p = optax.apply_updates(p, u)
    moved = max(
        float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(params))
    )
    assert moved > 1e-3
    for a, b in zip(jax.tree.leaves(learner.state.params), jax.tree.leaves(p)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)
    assert int(learner.state.step) == 1 and learner.update_groups == 4  # shared prompts


# ============================================================================ the trainer's wiring

NAMES = (
    [("weight", n) for n in weights.WEIGHTS.names()]
    # progress cannot train (run/config.py); gae needs a critic (tests/rl/methods/test_ppo.py)
    + [("advantage", n) for n in advantages.ADVANTAGES.names() if n not in ("progress", "gae")]
    + [("aggregation", n) for n in aggregation.AGGREGATIONS.names()]
    + [("distill", n) for n in distillation.DISTILL_LOSSES.names()]
)


def _wired(tmp_path, kind: str, name: str) -> tr.Trainer:
    c = small_rl_config()
    c.teacher.init = "scratch"  # OPD, IW-OPD and the distillation losses read a teacher
    c.objective.reward_weights = dict(correctness=1.0, format=0.5, length=0.1)
    c.objective[kind] = name
    c.optimizer.update(lr=1e-2, warmup_steps=0)
    c.train.update(steps=2, eval_every=10**6, checkpoint_every=10**6, log_every=1)
    trainer = tr.Trainer(c, str(tmp_path))
    trainer.evaluate = lambda num_prompts=None: {"eval/pass@1_greedy": 0.0}
    return trainer


@pytest.mark.parametrize("kind,name", NAMES, ids=[f"{k}={n}" for k, n in NAMES])
def test_every_objective_name_runs_two_steps_and_its_gradient_is_objective_loss(
    tmp_path, kind, name
):
    trainer = _wired(tmp_path, kind, name)
    assert trainer.run()["step"] == 2
    exp, _ = trainer.step.rollout(trainer.source.next_batch(), jax.random.key(5))
    _, got, _ = trainer.step.learner.gradient(exp)
    batch = dict(exp.update_batch())
    assert ("sc_logp" in batch) == (name == "sc_grpo")  # the pass runs when the weight needs it
    if kind == "distill":
        teacher = nnx.merge(nnx.graphdef(trainer.roles.teacher), trainer.roles.teacher_params)
        batch["teacher_logits"] = teacher(exp.tokens, exp.attention_mask)
    objective = trainer.step.learner.objective
    want = jax.grad(_plain_loss(trainer.roles.graphdef, objective))(trainer.state.params, batch)
    scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(want))
    assert scale > 1e-5, "a zero gradient would make the comparison vacuous"
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5 * scale)


def test_self_conditioned_pass_equals_a_direct_forward_after_the_groups_solution():
    """sc_logp of each row = log-probs of its completion after [prompt, the group's first
    verified solution], computed here on a compact (gap-free) sequence; a group with no
    solution keeps the behaviour log-probs."""
    from jaxrl_frontier.rl.learn.forward import make_logp_fn
    from jaxrl_frontier.rl.produce.passes import PASSES

    model = random_model(ModelConfig(vocab_size=20, **SMALL_MODEL))
    graphdef, params = nnx.split(model)
    tp, tn = 4, 3
    prompt = [[0, 9, 8, 7], [0, 0, 6, 5]]  # left-padded (0 = pad)
    comps = [[11, 12, 2], [13, 2, 0], [14, 15, 16], [17, 2, 0]]
    cmask = [[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]]
    tokens = np.asarray([prompt[i // 2] + comps[i] for i in range(4)], np.int32)
    pmask = [[0, 1, 1, 1], [0, 0, 1, 1]]
    mask = np.asarray([pmask[i // 2] + cmask[i] for i in range(4)], np.int32)
    exp = _experience(rows=4, t=tp + tn, tp=tp).replace(
        tokens=jnp.asarray(tokens),
        attention_mask=jnp.asarray(mask),
        loss_mask=jnp.asarray(np.pad(np.asarray(cmask, np.float32), ((0, 0), (tp, 0)))),
        rewards=jnp.asarray([[0.0], [1.0], [0.0], [0.0]]),  # group 0: row 1 solved it
    )
    sc_pass = PASSES.get("self_conditioned")(
        scored_logp_fn=make_logp_fn(graphdef, None, completion_len=tn),
        group_size=2,
        completion_len=tn,
        correct_column=0,
    )
    got = np.asarray(sc_pass.fn(params, exp))

    def direct(context, completion):
        seq = jnp.asarray([context + completion], jnp.int32)
        logp = logprobs.token_logprobs(model(seq, jnp.ones_like(seq)), seq)
        return np.asarray(logp)[0, -tn:]

    solution = [13, 2]  # row 1's completion up to and with its stop token
    for i in range(2):
        context = [t for t, m in zip(prompt[0], pmask[0]) if m] + solution
        valid = np.asarray(cmask[i], bool)
        np.testing.assert_allclose(got[i, tp:][valid], direct(context, comps[i])[valid], atol=1e-5)
        plain = direct([t for t, m in zip(prompt[0], pmask[0]) if m], comps[i])
        assert np.abs(got[i, tp:][valid] - plain[valid]).max() > 1e-3  # the context matters
    np.testing.assert_array_equal(got[2:, tp:], np.asarray(exp.old_logp)[2:, tp:])
    assert np.abs(got[:, :tp]).max() == 0.0
