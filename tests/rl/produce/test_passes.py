"""The train/rollout log-prob mismatch: the metric by hand, the passes that measure it, and
its size on the tiny model in f32 (the sampler's cached decode against the trainer's full
forward, the same weights); the self-conditioned pass against a direct forward after the
group's solution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SMALL_MODEL, random_model, small_rl_config
from flax import nnx

from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.objectives import logprobs
from jaxrl_frontier.rl.diagnostics import logp_mismatch
from jaxrl_frontier.rl.experience import Experience
from jaxrl_frontier.rl.learn.forward import make_logp_fn
from jaxrl_frontier.rl.produce.passes import PASSES, TEACHER_INDEX, run_passes
from jaxrl_frontier.run import trainer as tr

KEYS = ("rollout/logp_mismatch_max", "rollout/logp_mismatch_mean", "rollout/logp_mismatch_k3")


def test_logp_mismatch_by_hand():
    sampler = jnp.array([[-1.0, -2.0, -3.0], [-0.5, -4.0, 0.0]])
    learner = jnp.array([[-0.9, -2.2, -9.0], [-0.5, -3.7, 5.0]])
    mask = jnp.array([[1, 1, 0], [1, 1, 0]], jnp.float32)  # the 6.0 and 5.0 gaps masked
    d = np.array([0.1, -0.2, 0.0, 0.3])
    got = {k: float(v) for k, v in logp_mismatch(sampler, learner, mask).items()}
    assert got["rollout/logp_mismatch_max"] == pytest.approx(0.3, abs=1e-6)
    assert got["rollout/logp_mismatch_mean"] == pytest.approx(0.6 / 4, abs=1e-6)
    assert got["rollout/logp_mismatch_k3"] == pytest.approx(np.mean(np.expm1(d) - d), abs=1e-6)


def _experience(old_logp, loss_mask):
    b, t = old_logp.shape
    zeros = jnp.zeros((b, t), jnp.float32)
    return Experience(
        tokens=jnp.zeros((b, t), jnp.int32), attention_mask=jnp.ones((b, t), jnp.int32),
        loss_mask=loss_mask, old_logp=old_logp, advantages=zeros, rewards=jnp.zeros((b, 1)),
        prompt_index=jnp.zeros((b,), jnp.int32), group_id=jnp.zeros((b,), jnp.int32),
        policy_version=jnp.zeros((b,), jnp.int32), turn_index=jnp.zeros((b, t), jnp.int32),
    )  # fmt: skip


@pytest.mark.parametrize("measured_by", ["behaviour", "mismatch_probe"])
def test_passes_measure_the_mismatch_and_leave_no_extras(measured_by):
    """The recompute replaces old_logp and keeps the sampler's for the metric; the probe
    keeps old_logp (the sampler's) and measures beside it."""
    sampler = jnp.array([[0.0, -1.0, -2.0]])
    mask = jnp.array([[0.0, 1.0, 1.0]])
    learner = jnp.array([[0.0, -1.25, -2.0]])
    p = PASSES.get(measured_by)(policy_logp_fn=lambda *_: learner, measure_mismatch=True)
    exp, metrics = run_passes([p], {"policy": None}, _experience(sampler, mask))
    assert exp.extras == {}
    want_old = learner if measured_by == "behaviour" else sampler
    np.testing.assert_array_equal(np.asarray(exp.old_logp), want_old)
    assert float(metrics["rollout/logp_mismatch_max"]) == 0.25
    assert float(metrics["rollout/logp_mismatch_mean"]) == 0.125
    plain = PASSES.get("behaviour")(policy_logp_fn=lambda *_: learner)
    assert run_passes([plain], {"policy": None}, _experience(sampler, mask))[1] == {}


@pytest.mark.parametrize("recompute", [True, False])
def test_tiny_model_mismatch_in_f32(tmp_path, recompute):
    """The sampler's behaviour log-probs against the trainer's forward of the same tokens
    under the same weights: f32, 16-token completions. Both compute log-softmax of logits
    from the same weights; they differ in reduction order only (the decode's one-query
    attention over the cache against the training forward's einsum attention), so each is
    within a few f32 roundings of the largest |log-prob|: 16 eps of it bounds their gap."""
    c = small_rl_config()
    c.rollout.max_new_tokens = 16
    c.train.recompute_old_logp, c.train.measure_mismatch = recompute, not recompute
    trainer = tr.Trainer(c, str(tmp_path))
    examples = [trainer.task.example("train", i) for i in range(c.data.prompt_batch)]
    exp, info = trainer.step.rollout(examples, jax.random.key(0))
    got = {k: float(info["metrics"][k]) for k in KEYS}
    assert float(jnp.sum(exp.loss_mask)) > 16  # real completions were measured
    scale = max(1.0, float(jnp.max(jnp.abs(exp.old_logp))))
    bound = 16 * np.finfo(np.float32).eps * scale  # 4.8e-7 measured at scale ~5 (AVX-512)
    assert 0.0 < got["rollout/logp_mismatch_max"] <= bound, (got, bound)
    assert got["rollout/logp_mismatch_mean"] <= got["rollout/logp_mismatch_max"]
    assert abs(got["rollout/logp_mismatch_k3"]) < got["rollout/logp_mismatch_max"] ** 2


def test_self_conditioned_pass_equals_a_direct_forward_after_the_groups_solution():
    """sc_logp of each row = log-probs of its completion after [prompt, the group's first
    verified solution], computed here on a compact (gap-free) sequence; a group with no
    solution keeps the behaviour log-probs."""
    model = random_model(ModelConfig(vocab_size=20, **SMALL_MODEL))
    graphdef, params = nnx.split(model)
    tp, tn = 4, 3
    prompt = [[0, 9, 8, 7], [0, 0, 6, 5]]  # left-padded (0 = pad)
    comps = [[11, 12, 2], [13, 2, 0], [14, 15, 16], [17, 2, 0]]
    cmask = [[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]]
    tokens = np.asarray([prompt[i // 2] + comps[i] for i in range(4)], np.int32)
    pmask = [[0, 1, 1, 1], [0, 0, 1, 1]]
    mask = np.asarray([pmask[i // 2] + cmask[i] for i in range(4)], np.int32)
    loss_mask = jnp.asarray(np.pad(np.asarray(cmask, np.float32), ((0, 0), (tp, 0))))
    behaviour = -0.25 * (1 + jnp.arange(4 * (tp + tn), dtype=jnp.float32)).reshape(4, -1)
    exp = _experience(behaviour * loss_mask, loss_mask).replace(
        tokens=jnp.asarray(tokens),
        attention_mask=jnp.asarray(mask),
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


def test_several_teachers_each_row_scored_by_its_own():
    """`teacher.by_tag`: with two teachers that differ, each row's teacher_logp is its own
    teacher's log-probs (the rows' index in the TEACHER_INDEX extra), masked as one
    teacher's are; with every row on teacher 0, the first teacher's exactly."""
    cfg = ModelConfig(vocab_size=11, **SMALL_MODEL)
    teachers = [random_model(cfg, seed=s) for s in (1, 2)]
    logp_fn = make_logp_fn(nnx.graphdef(teachers[0]), None)
    weights = tuple(nnx.state(t) for t in teachers)
    tokens = jnp.asarray(np.random.RandomState(0).randint(1, 11, (4, 6)), jnp.int32)
    mask = jnp.ones((4, 6), jnp.float32).at[:, :2].set(0.0)
    exp = _experience(jnp.zeros((4, 6)), mask).replace(tokens=tokens)
    own = [np.asarray(logp_fn(w, tokens, exp.attention_mask)) * np.asarray(mask) for w in weights]
    assert np.abs(own[0] - own[1]).max() > 1e-2  # the teachers differ
    p = PASSES.get("teacher")(teacher_logp_fn=(logp_fn, logp_fn))
    for rows in ([0, 1, 1, 0], [0, 0, 0, 0]):
        index = jnp.repeat(jnp.asarray(rows, jnp.float32)[:, None], 6, axis=1)
        got, _ = run_passes([p], {"teacher": weights}, exp.replace(extras={TEACHER_INDEX: index}))
        want = np.stack([own[k][b] for b, k in enumerate(rows)])
        np.testing.assert_array_equal(np.asarray(got.teacher_logp), want)
