"""A full-vocabulary distillation loss with several teachers (`teacher.by_tag`, one
vocabulary: rl/learn/loss.py): with two teachers that differ, each row's forward-KL term is
the one computed by hand (jax.nn.log_softmax) from its own teacher's logits alone, on the
chunked path and the full-logits path; with every row's index naming the main teacher the
loss is the single-teacher loss exactly; on packed rows (each slot's index gathered) the
same KL, by hand."""

from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SMALL_MODEL, random_model
from flax import nnx

from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.rl.learn import packing
from jaxrl_frontier.rl.learn.forward import apply_logits
from jaxrl_frontier.rl.learn.loss import rl_loss
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run.build import objective_section

V, TP, TN, B = 29, 3, 5, 4  # vocab, prompt / completion positions, rows
INDEX = np.array([0, 1, 1, 0], np.float32)  # each row's teacher
OBJECTIVE = replace(objective_section(config_lib.base_config().objective), distill="forward_kl")


@pytest.fixture(scope="module")
def models():
    """(student, teacher a, teacher b) as (graphdef, params), three random weights."""
    cfg = ModelConfig(vocab_size=V, **SMALL_MODEL)
    return [nnx.split(random_model(cfg, seed=s)) for s in (0, 1, 2)]


def _batch(index=INDEX, token=None):
    """B rows [prompt | completion], every completion token scored (or only `token`, a
    (row, column) pair)."""
    rng = np.random.default_rng(0)
    t = TP + TN
    loss_mask = np.zeros((B, t), np.float32)
    loss_mask[:, TP:] = 1.0
    if token is not None:
        loss_mask[:] = 0.0
        loss_mask[token] = 1.0
    return dict(
        tokens=jnp.asarray(rng.integers(1, V, (B, t)), jnp.int32),
        attention_mask=jnp.ones((B, t), jnp.int32),
        loss_mask=jnp.asarray(loss_mask),
        old_logp=jnp.zeros((B, t)),
        advantages=jnp.zeros((B, t)),
        teacher_index=jnp.asarray(np.repeat(index[:, None], t, 1)),
    )


@pytest.fixture(scope="module")
def losses_of(models):
    """{(teachers, logprob_chunk): jitted (batch) -> metrics}: two teachers or the main one
    alone, on the chunked (3) and the full-logits (None) paths; each compiled once."""
    (graphdef, params), a, b = models
    out = {}
    for chunk in (3, None):
        for name, teachers in (("two", (a, b)), ("one", a)):
            several = isinstance(teachers[0], tuple)
            g = tuple(t[0] for t in teachers) if several else teachers[0]
            w = tuple(t[1] for t in teachers) if several else teachers[1]
            loss_of = rl_loss(graphdef, OBJECTIVE, chunk, completion_len=TN, teacher_graphdef=g)
            fn = jax.jit(lambda batch, loss_of=loss_of, w=w: loss_of(params, batch,
                                                                     frozen={"teacher": w}))  # fmt: skip
            out[name, chunk] = fn
    return out


def _kl_by_hand(models, batch):
    """forward KL(p_T || p_S) [B, T] of each row against each teacher: [teacher][B, T]."""
    (graphdef, params), *teachers = models
    tok, mask = batch["tokens"], batch["attention_mask"]
    ls = jax.nn.log_softmax(apply_logits(graphdef)(params, tok, mask), -1)
    out = []
    for g, w in teachers:
        lt = jax.nn.log_softmax(apply_logits(g)(w, tok, mask), -1)
        kl = jnp.sum(jnp.exp(lt) * (lt - ls), -1)[:, :-1]  # position t - 1 scores token t
        out.append(np.asarray(jnp.pad(kl, ((0, 0), (1, 0)))))
    return out


@pytest.mark.parametrize("chunk", [3, None])
def test_each_rows_kl_term_is_its_own_teachers(models, losses_of, chunk):
    kl = _kl_by_hand(models, _batch())
    got = np.zeros((B, TN))
    for row in range(B):
        for t in range(TN):  # the token mean over one token: that token's term
            metrics = losses_of["two", chunk](_batch(token=(row, TP + t)))[1]
            got[row, t] = float(metrics["distill_loss"])
    own = np.stack([kl[int(k)][row, TP:] for row, k in enumerate(INDEX)])
    other = np.stack([kl[1 - int(k)][row, TP:] for row, k in enumerate(INDEX)])
    np.testing.assert_allclose(got, own, rtol=2e-5, atol=1e-7)
    assert np.abs(own - other).max(1).min() > 1e-3  # the teachers differ on every row


@pytest.mark.parametrize("chunk", [3, None])
def test_every_row_on_the_main_teacher_is_the_single_teacher_loss(losses_of, chunk):
    batch = _batch(index=np.zeros(B, np.float32))
    got = losses_of["two", chunk](batch)
    want = losses_of["one", chunk](batch)
    for key in ("loss", "distill_loss"):
        np.testing.assert_array_equal(got[1][key], want[1][key], err_msg=key)


def test_packed_rows_get_the_padded_several_teacher_loss(models):
    (graphdef, params), a, b = models
    g, w = (a[0], b[0]), (a[1], b[1])
    batch = _batch()
    want = _kl_by_hand(models, batch)
    want = np.where(INDEX[:, None] == 0, want[0], want[1])[:, TP:].mean()
    maps, _ = packing.plan_packing(np.asarray(batch["attention_mask"]), packing.PackSpec(16))
    pack = jax.tree.map(lambda x: jnp.asarray(x[0]), maps)
    den = jnp.asarray(float(batch["loss_mask"].sum()))
    for chunk in (3, None):
        loss_of = rl_loss(graphdef, OBJECTIVE, chunk, completion_len=TN, teacher_graphdef=g)
        run = jax.jit(lambda b, loss_of=loss_of: loss_of(params, b, den, {"teacher": w}))
        got = run({**batch, "pack": pack})[1]["distill_loss"]
        np.testing.assert_allclose(got, want, rtol=2e-5, err_msg=str(chunk))
