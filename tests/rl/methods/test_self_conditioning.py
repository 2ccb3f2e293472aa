"""SC-GRPO's self-conditioned pass: the full-vocabulary KL against a direct two-forward
computation on a tiny model, the chunked KL against dense softmaxes, and the sc_grpo weight
reading it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SMALL_MODEL, random_model
from flax import nnx

from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.objectives import TokenStats, losses, weights
from jaxrl_frontier.rl.experience import Experience
from jaxrl_frontier.rl.learn.forward import apply_hidden, make_logp_fn
from jaxrl_frontier.rl.methods.self_conditioning import chunked_kl_and_logp
from jaxrl_frontier.rl.produce.passes import PASSES

V = 20


def _dense_kl(zp, zq):
    lp, lq = jax.nn.log_softmax(zp, -1), jax.nn.log_softmax(zq, -1)
    return np.asarray(jnp.sum(jnp.exp(lp) * (lp - lq), -1)), np.asarray(lq)


@pytest.mark.parametrize("vocab_chunk,position_chunk", [(7, 5), (20, 64), (1, 3)])
def test_chunked_kl_and_logp_equal_dense_softmaxes(vocab_chunk, position_chunk):
    """Chunks that do not divide V = 20 nor N = 13 (padding on both axes)."""
    rng = np.random.default_rng(0)
    h_p, h_q = (jnp.asarray(rng.normal(size=(13, 6)) * 2, jnp.float32) for _ in range(2))
    w = jnp.asarray(rng.normal(size=(6, V)), jnp.float32)
    y = jnp.asarray(rng.integers(0, V, 13))
    kl, logq = chunked_kl_and_logp(
        h_p, h_q, w, y, vocab_chunk=vocab_chunk, position_chunk=position_chunk
    )
    want_kl, lq = _dense_kl(h_p @ w, h_q @ w)
    np.testing.assert_allclose(np.asarray(kl), want_kl, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(logq), lq[np.arange(13), np.asarray(y)], atol=1e-5)
    assert want_kl.min() > 1e-3  # distinct distributions: the comparison is not 0 == 0


def test_chunked_kl_of_equal_distributions_is_zero():
    h = jnp.asarray(np.random.default_rng(1).normal(size=(4, 6)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(2).normal(size=(6, V)), jnp.float32)
    kl, _ = chunked_kl_and_logp(h, h, w, jnp.zeros(4, jnp.int32), vocab_chunk=3)
    np.testing.assert_allclose(np.asarray(kl), 0.0, atol=1e-6)


def _batch(tp=4, tn=3):
    prompt = [[0, 9, 8, 7], [0, 0, 6, 5]]  # left-padded (0 = pad)
    comps = [[11, 12, 2], [13, 2, 0], [14, 15, 16], [17, 2, 0]]
    cmask = [[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]]
    pmask = [[0, 1, 1, 1], [0, 0, 1, 1]]
    tokens = np.asarray([prompt[i // 2] + comps[i] for i in range(4)], np.int32)
    mask = np.asarray([pmask[i // 2] + cmask[i] for i in range(4)], np.int32)
    loss_mask = np.pad(np.asarray(cmask, np.float32), ((0, 0), (tp, 0)))
    old = -np.linspace(0.5, 2.0, 4 * (tp + tn)).reshape(4, tp + tn) * loss_mask
    z = np.zeros((4, tp + tn))
    exp = Experience(
        tokens=jnp.asarray(tokens),
        attention_mask=jnp.asarray(mask),
        loss_mask=jnp.asarray(loss_mask),
        old_logp=jnp.asarray(old, jnp.float32),
        advantages=jnp.asarray(z, jnp.float32),
        rewards=jnp.asarray([[0.0], [1.0], [0.0], [0.0]]),  # group 0: row 1 solved it
        prompt_index=jnp.zeros(4, jnp.int32),
        group_id=jnp.arange(4) // 2,
        policy_version=jnp.zeros(4, jnp.int32),
        turn_index=jnp.asarray(z, jnp.int32),
    )
    return exp, prompt, pmask, comps, cmask


def test_self_conditioned_kl_equals_a_direct_two_forward_computation():
    """sc_kl[b, t] = sum_v p(v | prompt, y<t) log(p / p(v | prompt, solution, y<t)) from two
    plain forwards on compact (gap-free) sequences and full softmaxes; a group with no
    verified completion gets KL 0 and sc_logp = old_logp; the prompt columns are 0."""
    model = random_model(ModelConfig(vocab_size=V, **SMALL_MODEL))
    graphdef, params = nnx.split(model)
    tp, tn = 4, 3
    exp, prompt, pmask, comps, cmask = _batch(tp, tn)
    sc_pass = PASSES.get("self_conditioned")(
        scored_logp_fn=make_logp_fn(graphdef, None, completion_len=tn),
        hidden_fn=apply_hidden(graphdef),
        vocab_chunk=6,  # 4 chunks, the last one padded
        group_size=2,
        completion_len=tn,
        correct_column=0,
    )
    got = {k: np.asarray(v) for k, v in sc_pass.fn(params, exp).items()}
    assert set(got) == {"sc_logp", "sc_kl"}

    def logits_of(context, completion):  # the distributions over each completion token
        seq = jnp.asarray([context + completion], jnp.int32)
        return model(seq, jnp.ones_like(seq))[0, len(context) - 1 : -1]

    real_prompt = [t for t, m in zip(prompt[0], pmask[0]) if m]
    solution = [13, 2]  # row 1's completion up to and with its stop token
    for i in range(2):
        plain = logits_of(real_prompt, comps[i])
        cond = logits_of(real_prompt + solution, comps[i])
        kl, lq = _dense_kl(plain, cond)
        valid = np.asarray(cmask[i], bool)
        np.testing.assert_allclose(got["sc_kl"][i, tp:][valid], kl[valid], rtol=1e-4, atol=1e-6)
        sampled = lq[np.arange(tn), comps[i]]
        np.testing.assert_allclose(got["sc_logp"][i, tp:][valid], sampled[valid], atol=1e-5)
        assert kl[valid].min() > 1e-4  # the solution in the context moves the distribution
    np.testing.assert_array_equal(got["sc_kl"][2:], 0.0)
    np.testing.assert_array_equal(got["sc_logp"][2:, tp:], np.asarray(exp.old_logp)[2:, tp:])
    assert np.abs(got["sc_kl"][:, :tp]).max() == 0.0
    # the sc_logp-only path (no hidden_fn) agrees with the KL path's sampled log-probs
    only = PASSES.get("self_conditioned")(
        scored_logp_fn=make_logp_fn(graphdef, None, completion_len=tn),
        group_size=2,
        completion_len=tn,
        correct_column=0,
    )
    m = np.asarray(exp.loss_mask) > 0
    np.testing.assert_allclose(np.asarray(only.fn(params, exp))[m], got["sc_logp"][m], atol=1e-5)


def test_sc_grpo_weight_reads_the_full_kl_when_present():
    """w = 1 + coef * min(sc_kl, max_kl) on the loss mask, by hand; without sc_kl the
    sampled-token k3 estimate of the same KL."""
    mask = jnp.asarray([[0.0, 1.0, 1.0, 1.0]])
    kl = jnp.asarray([[9.0, 0.5, 0.0, 30.0]])
    logp = jnp.asarray([[0.0, -1.0, -2.0, -0.5]])
    stats = TokenStats(
        logp=logp, old_logp=logp, mask=mask, sc_logp=logp + jnp.asarray([[0, 0.3, 0, 0]]), sc_kl=kl
    )
    fn = weights.WEIGHTS.get("sc_grpo")
    w = np.asarray(fn(stats, jnp.zeros_like(mask), coef=2.0, max_kl=10.0))
    np.testing.assert_allclose(w[0, 1:], [1 + 2 * 0.5, 1.0, 1 + 2 * 10.0])
    k3 = np.exp(0.3) - 1 - 0.3
    w_sampled = np.asarray(fn(stats.replace(sc_kl=None), jnp.zeros_like(mask), coef=2.0))
    np.testing.assert_allclose(w_sampled[0, 1:], [1 + 2 * k3, 1.0, 1.0], rtol=1e-6)


def test_sc_grpo_relative_weight_keeps_each_rows_mean_at_one():
    """relative=True: w = max(0, 1 + coef (k / mean_row k - 1)); a row with KL 0 keeps 1."""
    mask = jnp.asarray([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    kl = jnp.asarray([[1.0, 2.0, 3.0, 50.0], [0.0, 0.0, 0.0, 0.0]])
    stats = TokenStats(logp=mask, old_logp=mask, mask=mask, sc_logp=mask, sc_kl=kl)
    fn = weights.WEIGHTS.get("sc_grpo")
    w = np.asarray(fn(stats, jnp.zeros_like(mask), relative=True))
    np.testing.assert_allclose(w[0, :3], [0.5, 1.0, 1.5])  # mean 2 -> k / 2
    np.testing.assert_allclose(w[1], 1.0)
    w = np.asarray(fn(stats, jnp.zeros_like(mask), coef=3.0, relative=True))
    np.testing.assert_allclose(w[0, :3], [0.0, 1.0, 2.5])  # 1 + 3 (0.5 - 1) < 0 -> 0


def test_loss_fn_passes_sc_kl_from_the_batch_to_the_weight():
    """weight_mean of the loss's metrics is the token mean of 1 + coef * sc_kl."""
    model = random_model(ModelConfig(vocab_size=V, **SMALL_MODEL))
    graphdef, params = nnx.split(model)
    exp, *_ = _batch()
    batch = dict(exp.update_batch())
    m = np.asarray(exp.loss_mask)
    sc_kl = np.linspace(0.0, 1.0, m.size).reshape(m.shape) * m
    batch.update(sc_logp=exp.old_logp, sc_kl=jnp.asarray(sc_kl, jnp.float32))
    cfg = dict(weight="sc_grpo", weight_kwargs=dict(coef=0.5), aggregation="token_mean")
    apply_fn = lambda p, t, a: nnx.merge(graphdef, p)(t, a)
    _, metrics = losses.loss_fn(params, batch, cfg, apply_fn=apply_fn)
    want = np.sum((1 + 0.5 * sc_kl) * m) / m.sum()
    np.testing.assert_allclose(float(metrics["weight_mean"]), want, rtol=1e-6)
