"""objectives/losses.py: the assembled objective is the sum of its parts (the KL in the
reward or in the loss), `loss_fn` runs the forward, microbatches with the full denominator sum
to the full batch, the chunked teacher path equals the full logits one, config errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_frontier.core.errors import ObjectiveConfigError
from jaxrl_frontier.objectives import (
    AGGREGATIONS,
    DISTILL_LOSSES,
    WEIGHTS,
    TokenStats,
    default_config,
    loss_fn,
    losses,
    objective_loss,
    token_entropy,
    token_logprobs,
    validate_objective_config,
)

B, T, V = 3, 6, 7
MASK = np.array([[0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 1, 1]], np.float32)


def data(seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 1.5, (B, T, V)).astype(np.float32)
    teacher = rng.normal(0, 1.5, (B, T, V)).astype(np.float32)
    tokens = rng.integers(0, V, (B, T)).astype(np.int32)
    return logits, teacher, tokens


# ----------------------------------------------------------------------------- the objective


def stats_for(logits, tokens, seed=5):
    rng = np.random.default_rng(seed)
    logp = token_logprobs(jnp.asarray(logits), jnp.asarray(tokens))
    noise = rng.normal(0, 0.3, (B, T)).astype(np.float32)
    return TokenStats(
        logp=logp,
        old_logp=logp + noise * MASK,
        mask=jnp.asarray(MASK),
        ref_logp=logp - 0.2 * jnp.asarray(noise),
        teacher_logp=logp + 0.5,
    )


ADV = jnp.asarray(np.broadcast_to(np.array([[1.0], [-0.5], [2.0]], np.float32), (B, T)))


def test_objective_is_the_sum_of_its_parts():
    logits, teacher, tokens = data(6)
    stats = stats_for(logits, tokens)
    cfg = {
        "weight": "ppo_clip",
        "aggregation": "seq_mean_token_mean",
        "pg_coef": 0.7,
        "kl_coef": 0.1,
        "kl_estimator": "k2",
        "entropy_coef": 0.01,
        "distill": "jsd",
        "distill_coef": 0.5,
        "distill_kwargs": {"beta": 0.3},
    }
    loss, metrics = objective_loss(
        stats, ADV, cfg, logits=jnp.asarray(logits), teacher_logits=jnp.asarray(teacher)
    )
    agg = lambda x: AGGREGATIONS.get("seq_mean_token_mean")(x, stats.mask)
    w = WEIGHTS.get("ppo_clip")(stats, ADV)
    pg = agg(-w * ADV)
    d = stats.logp - stats.ref_logp
    kl = agg(0.5 * d**2)
    ent = agg(token_entropy(jnp.asarray(logits)))
    dist = agg(DISTILL_LOSSES.get("jsd")(jnp.asarray(logits), jnp.asarray(teacher), None, beta=0.3))
    np.testing.assert_allclose(metrics["pg_loss"], pg, rtol=1e-5)
    np.testing.assert_allclose(metrics["kl_loss"], kl, rtol=1e-5)
    np.testing.assert_allclose(metrics["distill_loss"], dist, rtol=1e-5)
    np.testing.assert_allclose(loss, 0.7 * pg + 0.1 * kl - 0.01 * ent + 0.5 * dist, rtol=1e-5)
    m = MASK > 0
    r = np.exp(np.asarray(stats.logp - stats.old_logp))[m]
    np.testing.assert_allclose(metrics["clip_frac"], np.mean(np.asarray(w)[m] == 0), rtol=1e-6)
    np.testing.assert_allclose(metrics["approx_kl"], np.mean(r - 1 - np.log(r)), rtol=1e-4)
    np.testing.assert_allclose(
        metrics["ratio_clip_frac"], np.mean((r > 1.2) | (r < 0.8)), rtol=1e-6
    )
    for key in ("loss", "kl_ref", "entropy", "weight_mean", "ratio_mean", "adv_mean"):
        assert np.isfinite(float(metrics[key])), key


def test_kl_in_reward_keeps_the_kl_out_of_the_loss():
    """With kl_in_reward the KL to the reference is paid once, through the rewards: the loss
    then has no KL term (the same loss as kl_coef = 0), while the KL is still reported."""
    logits, _, tokens = data(7)
    stats = stats_for(logits, tokens)
    base = {"weight": "ppo_clip", "aggregation": "token_mean"}
    in_reward, _ = objective_loss(stats, ADV, {**base, "kl_coef": 0.1, "kl_in_reward": True})
    no_kl, _ = objective_loss(stats, ADV, {**base, "kl_coef": 0.0})
    in_loss, metrics = objective_loss(stats, ADV, {**base, "kl_coef": 0.1})
    np.testing.assert_allclose(in_reward, no_kl, rtol=1e-6)
    assert abs(float(in_loss) - float(no_kl)) > 1e-4 and float(metrics["kl_ref"]) > 0


def test_kl_loss_gradient_is_k3_derivative():
    logits, _, tokens = data(7)
    stats = stats_for(logits, tokens)
    cfg = {"pg_coef": 0.0, "kl_coef": 1.0, "kl_estimator": "k3"}
    g = jax.grad(lambda l: objective_loss(stats.replace(logp=l), ADV, cfg)[0])(stats.logp)
    d = np.asarray(stats.logp - stats.ref_logp)
    np.testing.assert_allclose(g, MASK * (1 - np.exp(-d)) / MASK.sum(), rtol=1e-4, atol=1e-7)


class ToyModel:
    """A bigram model: logits[b, t] = E[tokens[b, t]] (no model code in objectives)."""

    @staticmethod
    def apply(params, tokens, attention_mask):
        del attention_mask
        return params["E"][tokens]


def test_loss_fn_runs_the_forward_and_matches_objective_loss():
    logits_unused, teacher, tokens = data(8)
    del logits_unused
    E = jax.random.normal(jax.random.key(0), (V, V))
    params = {"E": E}
    logits = ToyModel.apply(params, jnp.asarray(tokens), None)
    logp = token_logprobs(logits, jnp.asarray(tokens))
    batch = {
        "tokens": jnp.asarray(tokens),
        "attention_mask": jnp.ones((B, T), jnp.int32),
        "loss_mask": jnp.asarray(MASK),
        "old_logp": logp + 0.1 * jnp.asarray(MASK),
        "advantages": ADV,
        "teacher_logp": logp - 0.3,
        "teacher_logits": jnp.asarray(teacher),
    }
    cfg = default_config()
    cfg.weight = "iw_opd"
    cfg.distill = "cr_opd"
    cfg.distill_kwargs = {"eta": 0.5}
    validate_objective_config(cfg, available=batch.keys())

    @jax.jit
    def step(params, batch):
        return jax.value_and_grad(
            lambda p: loss_fn(p, batch, cfg, apply_fn=ToyModel.apply), has_aux=True
        )(params)

    (loss, metrics), grads = step(params, batch)
    stats = TokenStats(
        logp=logp,
        old_logp=batch["old_logp"],
        mask=batch["loss_mask"],
        teacher_logp=batch["teacher_logp"],
    )
    ref_loss, _ = objective_loss(
        stats,
        ADV,
        cfg,
        logits=logits,
        teacher_logits=batch["teacher_logits"],
        tokens=batch["tokens"],
    )
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    assert "distill_loss" in metrics and np.all(np.isfinite(np.asarray(grads["E"])))
    assert np.any(np.asarray(grads["E"]) != 0)


class HiddenModel:
    """hidden[b, t] = tanh(E[tokens[b, t]]) [D]; logits = hidden @ W [V] (an output layer to
    chunk over), so both the full-logits and the chunked hidden-state paths apply."""

    D = 5

    @staticmethod
    def hidden(params, tokens, attention_mask):
        del attention_mask
        return jnp.tanh(params["E"][tokens]), params["W"]

    @staticmethod
    def apply(params, tokens, attention_mask):
        h, w = HiddenModel.hidden(params, tokens, attention_mask)
        return h @ w


def hidden_batch(seed, rows=B, width=T, mask=None):
    rng = np.random.default_rng(seed)
    keys = jax.random.split(jax.random.key(seed), 4)
    params = {
        "E": jax.random.normal(keys[0], (V, HiddenModel.D)),
        "W": jax.random.normal(keys[1], (HiddenModel.D, V)),
    }
    tokens = jnp.asarray(rng.integers(0, V, (rows, width)).astype(np.int32))
    mask = jnp.asarray(MASK if mask is None else mask)
    logp = token_logprobs(HiddenModel.apply(params, tokens, None), tokens)
    batch = {
        "tokens": tokens,
        "attention_mask": jnp.ones((rows, width), jnp.int32),
        "loss_mask": mask,
        "old_logp": (logp + 0.2 * jnp.asarray(rng.normal(size=(rows, width)))) * mask,
        "advantages": jnp.asarray(rng.normal(size=(rows, width)).astype(np.float32)) * mask,
        "ref_logp": (logp - 0.1) * mask,
    }
    teacher = (
        jax.random.normal(keys[2], (rows, width, 4)),  # teacher hidden, D_t = 4
        jax.random.normal(keys[3], (4, V)),
    )
    return params, batch, teacher


@pytest.mark.parametrize("aggregation", sorted(AGGREGATIONS.names()))
def test_microbatch_losses_with_the_full_denominator_sum_to_the_full_batch(aggregation):
    # 4 rows in 2 microbatches holding 7 and 2 valid tokens (and an empty row): averaging
    # per-microbatch token means would weigh a token of the second microbatch 3.5x more.
    mask = np.array(
        [[0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]],
        np.float32,
    )
    params, batch, _ = hidden_batch(3, rows=4, mask=mask)
    cfg = {
        "weight": "ppo_clip",
        "aggregation": aggregation,
        "kl_coef": 0.1,
        "entropy_coef": 0.01,
    }
    if aggregation == "seq_mean_token_sum_norm":
        cfg["aggregation_kwargs"] = {"max_completion_len": 5}

    def loss(p, b, denominator=None):
        kw = dict(apply_fn=HiddenModel.apply, logprob_chunk=4)
        return loss_fn(p, b, cfg, denominator=denominator, **kw)[0]

    full, g_full = jax.value_and_grad(loss)(params, batch)
    Z = losses.aggregation_denominator(cfg, batch["loss_mask"])
    halves = [{k: v[i : i + 2] for k, v in batch.items()} for i in (0, 2)]
    parts = [jax.value_and_grad(loss)(params, h, Z) for h in halves]
    np.testing.assert_allclose(sum(v for v, _ in parts), full, rtol=1e-6, atol=1e-7)
    for k in params:
        np.testing.assert_allclose(
            sum(g[k] for _, g in parts), g_full[k], rtol=1e-6, atol=1e-6, err_msg=k
        )
    expected_Z = {
        "token_mean": 9.0,
        "seq_mean_token_mean": 3.0,
        "seq_mean_token_sum": 3.0,
        "seq_mean_token_sum_norm": 15.0,
    }[aggregation]
    assert float(Z) == expected_Z
    if aggregation == "token_mean":  # the per-microbatch mean is not the full batch's
        means = [loss(params, h) for h in halves]
        assert abs(float(sum(means)) / 2 - float(full)) > 1e-3


@pytest.mark.parametrize(
    "name,kw",
    [("forward_kl", {}), ("reverse_kl", {"top_k": 3}), ("jsd", {"beta": 0.3}), ("cr_opd", {})],
)
def test_chunked_teacher_distillation_equals_the_full_logits_path(name, kw):
    params, batch, teacher = hidden_batch(4)
    cfg = {"weight": "pg", "distill": name, "distill_kwargs": kw, "distill_coef": 0.7}
    h_t, w_t = teacher
    full_batch = {**batch, "teacher_logits": h_t @ w_t}

    def full(p):
        return loss_fn(p, full_batch, cfg, apply_fn=HiddenModel.apply)

    def chunked(p):
        return loss_fn(
            p,
            batch,
            cfg,
            apply_fn=HiddenModel.apply,
            apply_hidden_fn=HiddenModel.hidden,
            logprob_chunk=4,  # 15 positions: chunks of 4, the last one padded
            first_scored=2,  # MASK is 0 on columns 0 and 1
            teacher_hidden=teacher,
        )

    (l_full, m_full), g_full = jax.value_and_grad(full, has_aux=True)(params)
    (l_chunk, m_chunk), g_chunk = jax.jit(jax.value_and_grad(chunked, has_aux=True))(params)
    assert float(m_full["distill_loss"]) > 0.0
    np.testing.assert_allclose(m_chunk["distill_loss"], m_full["distill_loss"], rtol=1e-5)
    np.testing.assert_allclose(l_chunk, l_full, rtol=1e-5, atol=1e-6)
    for k in params:
        np.testing.assert_allclose(g_chunk[k], g_full[k], rtol=1e-5, atol=1e-6, err_msg=k)
    # the teacher_hidden path without the chunked student forms the teacher logits in full
    (l_plain, _) = loss_fn(params, batch, cfg, apply_fn=HiddenModel.apply, teacher_hidden=teacher)
    np.testing.assert_allclose(l_plain, l_full, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- config errors


def test_missing_statistics_are_named():
    logits, _, tokens = data(9)
    stats = stats_for(logits, tokens).replace(teacher_logp=None)
    with pytest.raises(ObjectiveConfigError, match=r"'iw_opd'.*'teacher_logp'"):
        objective_loss(stats, ADV, {"weight": "iw_opd"})
    with pytest.raises(ObjectiveConfigError, match=r"'sc_grpo'.*'sc_logp'"):
        validate_objective_config({"weight": "sc_grpo"}, available=["tokens", "old_logp"])
    with pytest.raises(ObjectiveConfigError, match=r"kl_coef.*'ref_logp'"):
        objective_loss(stats.replace(ref_logp=None), ADV, {"kl_coef": 0.1})
    with pytest.raises(ObjectiveConfigError, match=r"'reverse_kl'.*'teacher_logits'"):
        objective_loss(stats, ADV, {"distill": "reverse_kl"}, logits=jnp.asarray(logits))
    # distill '' is off, like None
    validate_objective_config({"distill": ""}, available=["tokens"])
    # the KL folded into the reward does not need ref_logp in the loss
    objective_loss(stats.replace(ref_logp=None), ADV, {"kl_coef": 0.1, "kl_in_reward": True})
