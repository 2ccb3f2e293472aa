"""PACT (rl/methods/pact.py): the annealing schedule, the two losses against hand-computed values,
the host layout of the trace-conditioned and SFT rows, the gradient of the combined loss,
and the calculator's expert trace played in its environment."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_model
from flax import nnx

from jaxrl_frontier.data.envs.calculator import CalculatorEnv
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.tokenizer import CharTokenizer
from jaxrl_frontier.objectives import logprobs
from jaxrl_frontier.rl.learn.forward import make_logp_fn
from jaxrl_frontier.rl.methods import pact

SYNTAX = dict(
    call_open="c{", call_close="}", result_open="r{", result_close="}", answer_open="a{",
    answer_close="}",
)  # fmt: skip
WEIGHTS = dict(reasoning=0.5, tool_call=1.0, answer=2.0)


def test_anneal_schedules():
    assert pact.anneal(0, 0.4, 100) == pytest.approx(0.4)
    assert pact.anneal(50, 0.4, 100) == pytest.approx(0.2)
    assert pact.anneal(100, 0.4, 100) == 0.0 and pact.anneal(500, 0.4, 100) == 0.0
    assert pact.anneal(25, 1.0, 100, "cosine") == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    assert pact.anneal(50, 1.0, 100, "cosine") == pytest.approx(0.5)
    assert pact.anneal(70, 0.3, 100, "constant") == pytest.approx(0.3)
    assert pact.anneal(70, 0.3, 0) == pytest.approx(0.3)  # K = 0: no annealing
    with pytest.raises(ValueError, match="pact.schedule = 'step'.*constant"):
        pact.anneal(1, 1.0, 10, "step")


def test_trace_surrogate_is_reinforce_under_the_context():
    logp = jnp.array([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.1]])
    adv = jnp.array([[0.0, 2.0, 2.0], [-1.0, -1.0, 0.0]])
    mask = jnp.array([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    value, grad = jax.value_and_grad(pact.trace_surrogate)(logp, adv, mask)
    assert float(value) == pytest.approx(-(2 + 2 - 1 - 1) / 4)  # exp(0) = 1 at every token
    np.testing.assert_allclose(grad, -(adv * mask) / 4.0, atol=1e-7)


def test_component_sft_is_the_weighted_nll():
    logp = jnp.array([[-1.0, -2.0, -0.5, -3.0]])
    w = jnp.array([[0.0, 0.5, 2.0, 0.0]])
    assert float(pact.component_sft(logp, w)) == pytest.approx((0.5 * 2.0 + 2.0 * 0.5) / 2)


def _expert(seed=7):
    env = CalculatorEnv(syntax=SYNTAX)
    return env, pact.calculator_trace({"seed": seed}, env)


def test_calculator_expert_trace_solves_its_episode():
    env, trace = _expert()
    env.reset(7)
    observations, rewards = [], []
    for turn in trace:
        obs, reward, done, info = env.step(turn.text)
        observations.append(obs)
        rewards.append(reward)
    assert observations[0] == trace[0].observation and rewards == [0.0, 1.0]
    assert done and info["success"]
    assert [c for c, _ in trace[0].segments] == ["reasoning", "tool_call"]


def test_host_layout_of_the_context_and_sft_rows():
    tok = CharTokenizer()
    _, trace = _expert()
    # two rows: prompt (left-padded, width 4) | completion (right-padded, width 3)
    tokens = np.array([[0, 1, 5, 6, 7, 8, 2], [1, 5, 6, 7, 9, 2, 0]], np.int32)
    attn = (np.arange(7) < 7).astype(np.int32)[None].repeat(2, 0)
    attn[0, 0], attn[1, 6] = 0, 0
    loss_mask = np.zeros((2, 7), np.float32)
    loss_mask[0, 4:7], loss_mask[1, 4:6] = 1, 1
    adv = loss_mask * np.array([[1.5], [-0.5]], np.float32)
    f = pact.pact_fields(
        tok, dict(tokens=tokens, attention_mask=attn, loss_mask=loss_mask, advantages=adv),
        traces=[trace, trace], context="hint: {trace};", weights=WEIGHTS, stop_id=tok.eos_id,
        beta=0.25, context_len=64, trace_len=48,
    )  # fmt: skip
    ctx = tok.encode("hint: " + trace[0].text + trace[0].observation + trace[1].text + ";")
    row = f["pact_tokens"][0]
    np.testing.assert_array_equal(row[:4], tokens[0, :4])
    np.testing.assert_array_equal(row[4 + 64 - len(ctx) : 68], ctx)
    assert not f["pact_mask"][0, 4 : 68 - len(ctx)].any()  # the context's left padding
    np.testing.assert_array_equal(row[68:], tokens[0, 4:])
    np.testing.assert_array_equal(f["pact_loss_mask"][:, 68:], loss_mask[:, 4:])
    assert not f["pact_loss_mask"][:, :68].any()
    np.testing.assert_array_equal(f["pact_adv"][:, 68:], adv[:, 4:])
    # SFT: prompt | segments, stop token, observation (weight 0), answer, stop token
    calc, obs = tok.encode(trace[0].text), tok.encode(trace[0].observation)
    answer = tok.encode(trace[1].text)
    want = calc + [tok.eos_id] + obs + answer + [tok.eos_id]
    n = len(want)
    np.testing.assert_array_equal(f["sft_tokens"][1, 4 : 4 + n], want)
    assert f["sft_mask"][1, 4 : 4 + n].all() and not f["sft_mask"][1, 4 + n :].any()
    w = f["sft_weight"][1, 4 : 4 + n]
    reasoning = len(tok.encode("compute "))
    np.testing.assert_array_equal(w[:reasoning], 0.5)
    np.testing.assert_array_equal(w[reasoning : len(calc) + 1], 1.0)  # the call and its stop
    np.testing.assert_array_equal(w[len(calc) + 1 : len(calc) + 1 + len(obs)], 0.0)
    np.testing.assert_array_equal(w[len(calc) + 1 + len(obs) :], 2.0)
    assert not f["sft_weight"][:, :4].any() and (f["pact_beta"] == 0.25).all()
    with pytest.raises(ValueError, match="'pact.trace_len' = 8"):
        pact.pact_fields(
            tok, dict(tokens=tokens, attention_mask=attn, loss_mask=loss_mask, advantages=adv),
            traces=[trace, trace], context="{trace}", weights=WEIGHTS, stop_id=2, beta=0.0,
            context_len=64, trace_len=8,
        )  # fmt: skip


def test_combined_loss_gradient_is_anchor_plus_trace_plus_sft():
    tok = CharTokenizer()
    cfg = ModelConfig(
        vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_layers=2,
        num_heads=4, num_kv_heads=2,
    )  # fmt: skip
    graphdef, params = nnx.split(random_model(cfg, seed=3))
    _, trace = _expert()
    rng = np.random.default_rng(0)
    tokens = rng.integers(4, tok.vocab_size, (2, 10)).astype(np.int32)
    attn = np.ones((2, 10), np.int32)
    loss_mask = np.zeros((2, 10), np.float32)
    loss_mask[:, 5:] = 1
    adv = loss_mask * np.array([[1.0], [-2.0]], np.float32)
    f = pact.pact_fields(
        tok, dict(tokens=tokens, attention_mask=attn, loss_mask=loss_mask, advantages=adv),
        traces=[trace, trace], context="{trace}", weights=WEIGHTS, stop_id=tok.eos_id,
        beta=0.3, context_len=40, trace_len=40,
    )  # fmt: skip
    logp_fn = make_logp_fn(graphdef, None)
    old = np.asarray(logp_fn(params, tokens, attn)) * loss_mask

    def anchor(p, batch, denominator=None, frozen=None):
        lp = logp_fn(p, batch["tokens"], batch["attention_mask"])
        return -jnp.sum(lp * batch["loss_mask"]), {"anchor": 0.0}

    batch = dict(tokens=tokens, attention_mask=attn, loss_mask=loss_mask, old_logp=old, **f)
    total = pact.with_pact(anchor, logp_fn, trace_coef=0.7)
    (value, metrics), grads = jax.jit(jax.value_and_grad(total, has_aux=True))(params, batch)

    def reference(p):  # the three terms from full-vocabulary log-softmaxes
        def lp(t, m):
            logits = nnx.merge(graphdef, p)(t, m)
            return logprobs.token_logprobs(logits, t)

        a = -jnp.sum(lp(tokens, attn) * loss_mask)
        l_tc = lp(f["pact_tokens"], f["pact_mask"])
        m = f["pact_loss_mask"]
        tc = -jnp.sum(m * f["pact_adv"] * jnp.exp(l_tc - jax.lax.stop_gradient(l_tc))) / m.sum()
        w = f["sft_weight"]
        sft = -jnp.sum(w * lp(f["sft_tokens"], f["sft_mask"])) / (w > 0).sum()
        return a + 0.7 * tc + 0.3 * sft, sft

    (ref_value, ref_sft), ref_grads = jax.jit(jax.value_and_grad(reference, has_aux=True))(params)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    np.testing.assert_allclose(metrics["pact/sft_nll"], ref_sft, rtol=1e-5)
    assert float(metrics["pact/beta"]) == pytest.approx(0.3)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(g, r, atol=1e-5)
    # the trace term moves the weights: its gradient alone is not zero
    tc_only = pact.with_pact(lambda p, b, **_: (0.0, {}), logp_fn, trace_coef=1.0)
    f0 = dict(batch, pact_beta=np.zeros((2, 1), np.float32))
    g_tc = jax.jit(jax.grad(lambda p: tc_only(p, f0)[0]))(params)
    assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(g_tc)) > 1e-4
    # without the PACT fields the loss is the anchor's alone
    plain = {k: v for k, v in batch.items() if k not in pact.FIELDS}
    np.testing.assert_allclose(total(params, plain)[0], anchor(params, plain)[0], rtol=1e-6)


def test_pact_run_trains_on_the_expert_trace(tmp_path):
    """configs/pact_calculator_tool.py:runlocal for 6 steps: every update logs the PACT
    terms, beta follows the linear schedule of the policy version, and the expert trace's
    NLL falls (the SFT term trains the policy, though the rollouts never see the trace)."""
    from conftest import get_config, read_metrics

    from jaxrl_frontier.run.trainer import Trainer

    c = get_config(
        "pact_calculator_tool",
        {"train.steps": 6, "train.log_every": 1, "optimizer.lr": 3e-3, "optimizer.warmup_steps": 0,
         "pact.sft_coef": 1.0, "pact.anneal_steps": 10, "eval.at_start": False,
         "train.eval_every": 10**6},
    )  # fmt: skip
    Trainer(c, str(tmp_path)).run()
    rows = [r for r in read_metrics(tmp_path) if "train/pact/sft_nll" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose(
        [r["train/pact/beta"] for r in rows], [1.0 - k / 10 for k in range(6)], rtol=1e-6
    )
    nll = [r["train/pact/sft_nll"] for r in rows]
    assert nll[-1] < nll[0] - 0.3, nll
