"""Packed rows (`train.pack_tokens`, rl/learn/packing.py): the packed update's loss and
gradient are the padded update's, for every registered weight, aggregation, KL estimator and
distillation loss, on rows of widely spread lengths; the cross-segment mask is what makes it
so; a run compiles one program per bucket and no more."""

from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import SMALL_MODEL, random_model, small_rl_config
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.models import transformer
from jaxrl_frontier.models.layers import positions_from_mask
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.objectives import losses
from jaxrl_frontier.objectives.aggregation import AGGREGATIONS
from jaxrl_frontier.objectives.distillation import DISTILL_LOSSES, KL_ESTIMATORS
from jaxrl_frontier.objectives.losses import objective_loss
from jaxrl_frontier.objectives.stats import TokenStats
from jaxrl_frontier.objectives.weights import WEIGHTS
from jaxrl_frontier.rl.learn import packing
from jaxrl_frontier.rl.learn.forward import make_logp_fn
from jaxrl_frontier.rl.learn.loss import rl_loss
from jaxrl_frontier.rl.learn.train_step import init_train_state, make_update_fn
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run import trainer as tr
from jaxrl_frontier.run.build import objective_section

V, TP, TN, N = 41, 4, 12, 20  # vocab, prompt / completion positions, slots per packed row
LENGTHS = [12, 1, 7, 2, 11, 3, 9, 5]  # completion lengths: 1 to the full 12
B = len(LENGTHS)


def _batch(seed=0):
    """B rows: left-padded prompts (1 to 4 tokens), completions of LENGTHS right-padded, and
    every per-token input an objective may read (reference, teacher, self-conditioned)."""
    rng = np.random.default_rng(seed)
    pads = rng.integers(0, TP, B)
    prompt_mask = (np.arange(TP)[None] >= pads[:, None]).astype(np.int32)
    completion_mask = (np.arange(TN)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
    mask = np.concatenate([prompt_mask, completion_mask], 1)
    loss_mask = np.concatenate([np.zeros_like(prompt_mask), completion_mask], 1)
    loss_mask = loss_mask.astype(np.float32)
    logp = lambda: jnp.asarray(-rng.exponential(1.0, mask.shape) * loss_mask, jnp.float32)
    return dict(
        tokens=jnp.asarray(np.where(mask, rng.integers(1, V, mask.shape), 0), jnp.int32),
        attention_mask=jnp.asarray(mask),
        loss_mask=jnp.asarray(loss_mask),
        old_logp=logp(),
        ref_logp=logp(),
        teacher_logp=logp(),
        sc_logp=logp(),
        advantages=jnp.asarray(rng.normal(size=(B, 1)) * loss_mask, jnp.float32),
    )


def _models():
    cfg = ModelConfig(vocab_size=V, **SMALL_MODEL, qkv_bias=True)
    return nnx.split(random_model(cfg)), nnx.split(random_model(cfg, seed=1))


def _packed(batch, spec):
    """batch with its 'pack' maps ([K, ...]; one microbatch's without the K axis), stats."""
    maps, stats = packing.plan_packing(np.asarray(batch["attention_mask"]), spec)
    if not spec.micro_rows and spec.microbatches == 1:
        maps = {k: v[0] for k, v in maps.items()}
    return {**batch, "pack": jax.tree.map(jnp.asarray, maps)}, stats


def test_plan_packs_every_token_once_first_fit_decreasing():
    batch = _batch()
    mask = np.asarray(batch["attention_mask"], bool)
    lengths = mask.sum(1)
    # by hand, capacity 20: 16 | 13 | 9 (neither has room), 7 -> 13's, 4 -> 16's, 2 -> 9's
    bins = packing.first_fit_decreasing(np.array([9, 16, 7, 4, 13, 2]), 20)
    assert bins == [[1, 3], [4, 2], [0, 5]]  # 16+4, 13+7, 9+2
    maps, stats = packing.plan_packing(mask, packing.PackSpec(N, microbatches=2))
    src, seg, pos, start = (maps[k] for k in ("src", "seg", "pos", "start"))
    k, r, n = src.shape
    assert (k, n) == (2, N) and r == packing.bucket(-(-int(stats["pack_rows"]) // 2))
    assert stats["pack_fill"] == lengths.sum() / (k * r * N)
    real = src < B * (TP + TN)
    assert real.sum() == mask.sum() and len(np.unique(src[real])) == mask.sum()
    # each token's slot points back at it, and its position is the padded row's
    flat_pos = np.asarray(positions_from_mask(jnp.asarray(mask))).reshape(-1)
    np.testing.assert_array_equal(pos[real], flat_pos[src[real]])
    for mk in range(k):
        dst = np.asarray(packing.destinations(jnp.asarray(start[mk]), jnp.asarray(mask), r * n))
        here = dst < r * n
        np.testing.assert_array_equal(src[mk].reshape(-1)[dst[here]], np.flatnonzero(here))
        # a row lies whole in one microbatch, as one segment
        assert set(np.flatnonzero(here.any(1))) == set(np.flatnonzero((here | ~mask).all(1)))
    buckets = [packing.bucket(n) for n in range(1, 41)]
    assert sorted(set(buckets)) == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40]
    assert all(n <= b <= 1.25 * n + 1 for n, b in zip(range(1, 41), buckets))
    assert packing.bucket(3, 2) == 4 and packing.bucket(9, 2) == 10 and packing.bucket(1, 2) == 2


def test_packed_hidden_states_equal_padded_and_need_the_segment_mask(monkeypatch):
    (graphdef, params), _ = _models()
    batch = _batch(1)
    tokens, mask = batch["tokens"], batch["attention_mask"]
    padded = jax.jit(lambda p: nnx.merge(graphdef, p).hidden_states(tokens, mask)[0])(params)
    pack = _packed(batch, packing.PackSpec(N))[0]["pack"]

    def unpacked():  # traced anew at each call
        model = lambda p: nnx.merge(graphdef, p)
        dst = packing.destinations(pack["start"], mask, pack["src"].size)
        fn = lambda p: packing.unpack(packing.packed_hidden(model(p), tokens, pack), dst)
        return np.asarray(jax.jit(fn)(params))

    real, padded = np.asarray(mask, bool), np.asarray(padded)
    assert pack["seg"].max() > 1  # several segments in a buffer row
    np.testing.assert_allclose(unpacked()[real], padded[real], atol=2e-5)
    # without the cross-segment mask, a segment sees the one packed before it
    monkeypatch.setattr(transformer, "same_segment", lambda seg: seg[:, None, :] > 0)
    broken = unpacked()[real]
    assert np.abs(broken - padded[real]).max() > 0.1


def _capture(stats, adv, cfg, **kw):
    """Stands in for `losses.objective_loss`: returns its inputs, to differentiate through."""
    out = dict(
        logp=stats.logp, old_logp=stats.old_logp, mask=stats.mask, ref_logp=stats.ref_logp,
        teacher_logp=stats.teacher_logp, sc_logp=stats.sc_logp, adv=adv,
        logits=kw["logits"], teacher_logits=kw["teacher_logits"],
    )  # fmt: skip
    return jnp.zeros(()), out


def _entries():
    """One objective per registered weight, aggregation, KL estimator and distillation
    loss (the rest at their defaults), and the entropy bonus."""
    base = objective_section(config_lib.base_config().objective)
    yield from (replace(base, weight=w) for w in WEIGHTS.names())
    yield from (replace(base, aggregation=a) for a in AGGREGATIONS.names())
    yield from (replace(base, kl_coef=0.1, kl_estimator=e) for e in KL_ESTIMATORS.names())
    yield from (replace(base, distill=d) for d in DISTILL_LOSSES.names())
    yield replace(base, entropy_coef=0.05)


@pytest.fixture(scope="module")
def captured():
    """(params, batch, inputs(b) -> (loss inputs, aux), vjp(b, cot) -> param cotangent):
    each layout's objective inputs (log-probs, the [B, T, V] student and teacher logits: the
    full-logits path, and the inputs masked as the loss sees them) and their VJP, jitted
    once per layout and shared by the tests below."""
    (graphdef, params), (t_graphdef, t_params) = _models()
    base = objective_section(config_lib.base_config().objective)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(losses, "objective_loss", _capture)
        loss_of = rl_loss(graphdef, replace(base, distill="jsd"), None, completion_len=TN,
                          teacher_graphdef=t_graphdef)  # fmt: skip
        frozen = {"teacher": t_params}

        def inputs(p, b):
            out = loss_of(p, b, denominator=jnp.ones(()), frozen=frozen)[1]
            return {k: out[k] for k in ("logp", "logits")}, out

        @jax.jit
        def run(b, cot):
            out, vjp, aux = jax.vjp(lambda p: inputs(p, b), params, has_aux=True)
            return out, aux, vjp(cot)[0]

        zeros = {"logp": jnp.zeros((B, TP + TN)), "logits": jnp.zeros((B, TP + TN, V))}
        cache = {}

        def side(b, key):  # traced inside the patch, the first time each layout is seen
            if key not in cache:
                cache[key] = run(b, zeros)[:2]
            return cache[key]

        batch = _batch(2)
        layouts = {
            "padded": batch,
            "packed": _packed(batch, packing.PackSpec(N))[0],
            "micro": _packed(batch, packing.PackSpec(N, micro_rows=1))[0],
        }
        for name, b in list(layouts.items()):
            if name == "micro":  # each token-budget microbatch, traced once
                k = b["pack"]["src"].shape[0]
                for i in range(k):
                    one = {**b, "pack": jax.tree.map(lambda x, i=i: x[i], b["pack"])}
                    side(one, (name, i))
                    layouts[(name, i)] = one
            else:
                side(b, name)
    return dict(batch=batch, layouts=layouts, side=side, run=run)  # the patch undone


def _objective(cfg):
    """Jitted (inputs, aux, denominator) -> (loss, its gradient in the inputs)."""

    def loss(d, aux, den):
        stats = TokenStats(
            logp=d["logp"], **{k: aux[k] for k in
            ("old_logp", "mask", "ref_logp", "teacher_logp", "sc_logp")},
        )  # fmt: skip
        return objective_loss(
            stats, aux["adv"], cfg, logits=d["logits"], teacher_logits=aux["teacher_logits"],
            tokens=aux["tokens"], denominator=den,
        )[0]  # fmt: skip

    return jax.jit(jax.value_and_grad(loss))


def _loss_and_grads(captured, objective, name, den):
    b = captured["layouts"][name]
    out, aux = captured["side"](b, name)
    value, cot = objective(out, {**aux, "tokens": b["tokens"]}, den)
    return value, captured["run"](b, cot)[2]


def _assert_same(a, b, what):
    (l0, g0), (l1, g1) = a, b
    np.testing.assert_allclose(l1, l0, rtol=1e-5, atol=1e-6, err_msg=what)
    for (path, x), y in zip(jax.tree.leaves_with_path(g0), jax.tree.leaves(g1)):
        scale = max(float(jnp.abs(x).max()), 1e-3)
        np.testing.assert_allclose(y, x, atol=2e-5 * scale, err_msg=f"{what} {path}")


def test_every_objective_gets_the_padded_loss_and_gradient(captured):
    """Every registered objective is the loss of the captured inputs, and its parameter
    gradient the VJP of its input gradient: packed rows give the padded rows' both."""
    checked = 0
    for cfg in _entries():
        objective = _objective(cfg)
        den = losses.aggregation_denominator(cfg, captured["batch"]["loss_mask"])
        padded = _loss_and_grads(captured, objective, "padded", den)
        _assert_same(padded, _loss_and_grads(captured, objective, "packed", den), str(cfg))
        checked += 1
    assert checked == len(WEIGHTS.names()) + len(AGGREGATIONS.names()) + 3 + 4 + 1


def test_token_budget_microbatches_sum_to_the_minibatch(captured):
    """`train.microbatch_tokens`: microbatches of one buffer row each (rows of about equal
    token counts); for every aggregation (token mean, sequence mean, token sums, Dr. GRPO's
    constant) their losses and gradients with the minibatch's denominator sum to the
    minibatch's."""
    pack = captured["layouts"]["micro"]["pack"]
    k = pack["src"].shape[0]
    used = int((pack["seg"].reshape(k, -1).max(1) > 0).sum())
    assert k == packing.bucket(used) and used >= 4  # several microbatches, some empty
    tokens = (pack["seg"] > 0).reshape(k, -1).sum(1)
    assert int(tokens[:used].max()) - int(tokens[:used].min()) <= N  # about equal
    base = objective_section(config_lib.base_config().objective)
    aggregations = [replace(base, aggregation=a) for a in AGGREGATIONS.names()]
    dr_grpo = dict(
        aggregation="seq_mean_token_sum_norm", aggregation_kwargs={"max_completion_len": 9}
    )
    aggregations.append(replace(base, **dr_grpo))
    for cfg in aggregations:
        objective = _objective(cfg)
        den = losses.aggregation_denominator(cfg, captured["batch"]["loss_mask"])
        full = _loss_and_grads(captured, objective, "padded", den)
        parts = [_loss_and_grads(captured, objective, ("micro", i), den) for i in range(k)]
        summed = (sum(p[0] for p in parts), jax.tree.map(lambda *g: sum(g), *(p[1] for p in parts)))
        _assert_same(full, summed, cfg.aggregation)


def test_packed_update_equals_padded_and_compiles_once_per_bucket(count_compiles):
    """The jitted update (`make_update_fn`) on the chunked path with the entropy bonus and a
    teacher's JSD: padded rows against 2 packed microbatches (each holding some rows), the
    same loss, additive metrics and SGD step; then a batch of short rows in another bucket
    (4 microbatches, 2 of them empty): the same again, and a second call of each bucket
    compiles nothing."""
    (graphdef, params), (t_graphdef, t_params) = _models()
    cfg = objective_section(config_lib.base_config().objective)
    cfg = replace(cfg, entropy_coef=0.05, distill="jsd", kl_coef=0.1)
    loss_of = rl_loss(graphdef, cfg, 7, completion_len=TN, teacher_graphdef=t_graphdef)
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    frozen = {"teacher": jax.device_put(t_params, sharding.replicated(mesh))}
    tx = optax.sgd(1.0)

    fresh = lambda: init_train_state(tx, jax.tree.map(jnp.copy, params), mesh, jax.random.key(0))

    def update_fn(keys, pack):
        sh = {k: sharding.batch_sharding(mesh, 2) for k in keys}
        if pack:
            sh["pack"] = {k: sharding.replicated(mesh) for k in ("src", "seg", "pos", "start")}
        den = lambda b: losses.aggregation_denominator(cfg, b["loss_mask"])
        update = make_update_fn(
            graphdef, tx, loss_of, 1, jax.tree.map(lambda x: x.sharding, fresh()), sh,
            denominator_fn=den, frozen_sharding=jax.tree.map(lambda x: x.sharding, frozen),
        )  # fmt: skip
        return lambda b, state=None: update(state or fresh(), b, frozen)

    batch = _batch(3)
    padded = update_fn(batch, False)
    packed = update_fn(batch, True)
    spec = packing.PackSpec(N, microbatches=2)
    wide, stats = _packed(batch, spec)
    (s0, m0), (s1, m1) = padded(batch), packed(wide)
    assert stats["pack_bucket"] == 4 and stats["pack_rows"] == 4
    for k in ("loss", "pg_loss", "kl_loss", "distill_loss", "grad_norm"):
        np.testing.assert_allclose(m1[k], m0[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert float(m0["distill_loss"]) > 0 and float(m0["grad_norm"]) > 0
    for x, y in zip(jax.tree.leaves(s0.params), jax.tree.leaves(s1.params)):
        np.testing.assert_allclose(y, x, atol=1e-5)
    short = dict(batch, attention_mask=batch["attention_mask"].at[:, TP + 2 :].set(0))
    short["loss_mask"] = batch["loss_mask"].at[:, TP + 2 :].set(0)
    # 2 buffer rows in 4 microbatches of 1: two are empty, skipped by the update
    narrow, small = _packed(short, packing.PackSpec(N, microbatches=4))
    assert small["pack_bucket"] == 4 and small["pack_rows"] == 2
    (s0, m0), (s1, m1) = padded(short), packed(narrow)
    # (diagnostics such as `entropy` are means over the microbatches that held rows, as
    # with grad_accum: not the minibatch's token mean, so not compared)
    for k in ("loss", "pg_loss", "kl_loss", "distill_loss", "grad_norm"):
        np.testing.assert_allclose(m1[k], m0[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for x, y in zip(jax.tree.leaves(s0.params), jax.tree.leaves(s1.params)):
        np.testing.assert_allclose(y, x, atol=1e-5)
    states = fresh(), fresh()
    with count_compiles() as seen:
        packed(wide, states[0])
        packed(narrow, states[1])
    assert seen == []


# Qwen3.5's hybrid layers (a Gated DeltaNet layer, then gated full attention): a packed row's
# linear layers restart their conv window and delta state at each sequence
HYBRID = ModelConfig(
    vocab_size=V, **SMALL_MODEL, layer_types=("linear_attention", "full_attention"),
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
    linear_value_head_dim=8, linear_conv_kernel_dim=4, attn_output_gate=True,
    partial_rotary_factor=0.5, qk_norm=True, norm_plus_one=True, head_dim=8,
)  # fmt: skip


@pytest.mark.parametrize("hybrid", [False, True], ids=["qwen2", "qwen3_5"])
def test_packed_logprob_pass_equals_padded(hybrid):
    (graphdef, params), _ = _models()
    if hybrid:
        graphdef, params = nnx.split(random_model(HYBRID))
    batch = _batch(4)
    args = (params, batch["tokens"], batch["attention_mask"])
    spec = packing.pack_spec(N)
    padded = np.asarray(make_logp_fn(graphdef, 5, completion_len=TN)(*args))
    packed = np.asarray(make_logp_fn(graphdef, 5, completion_len=TN, pack=spec)(*args))
    m = np.asarray(batch["loss_mask"])
    np.testing.assert_allclose(packed * m, padded * m, atol=1e-5)
    assert np.abs(packed[:, :TP]).max() == 0.0 and np.abs(packed * m).min() >= 0
    assert np.abs(packed * m).max() > 0


def test_packing_refuses_buffer_rows_shorter_than_a_row():
    # what packed rows do not run with is declared by the parts: tests/run/config/test_parts.py
    packing.check_packing(16, row_len=16)
    packing.check_packing(0, row_len=17)  # off: nothing checked
    with pytest.raises(ConfigError, match="shorter than a row"):
        packing.check_packing(16, row_len=17)
    with pytest.raises(ConfigError, match="train.microbatch_tokens' = 64 needs packed rows"):
        packing.pack_spec(0, microbatch_tokens=64)
    with pytest.raises(ConfigError, match="optimizer.grad_accum = 1"):
        packing.pack_spec(16, grad_accum=2, microbatch_tokens=64)
    assert packing.pack_spec(16, microbatch_tokens=70, multiple=2).micro_rows == 4  # 70 // 16
    assert packing.pack_spec(16, microbatch_tokens=40, multiple=4).micro_rows == 4  # 2 -> 4


def test_trainer_packs_its_update_and_passes(tmp_path):
    """The config keys wired through a run: a step's update and reference pass on packed
    rows log their bucket; the shared prompt with packing is refused, naming the key."""
    c = small_rl_config()
    c.train.update(pack_tokens=16, share_prompt_forward=False, minibatches=2)
    c.objective.kl_coef = 0.05  # the reference pass, packed too
    trainer = tr.Trainer(c, str(tmp_path / "packed"))
    exp, _ = trainer.step.rollout(
        [trainer.task.example("train", i) for i in range(4)], jax.random.key(3)
    )
    metrics = jax.device_get(trainer.step.learner.update(exp, trainer.step.next_key))
    rows = np.asarray(exp.attention_mask).sum(1)  # 8 rows of 8 positions per minibatch
    assert rows.max() <= 8 and len(metrics) == 2
    for m in metrics:  # 2 rows a buffer row of 16: 4 of them, a bucket of 4
        assert m["pack_bucket"] >= m["pack_rows"] >= 4 and 0 < m["pack_fill"] <= 1
    assert np.abs(np.asarray(exp.ref_logp)).sum() > 0
    c.train.share_prompt_forward = True
    with pytest.raises(ConfigError, match="set train.share_prompt_forward = False"):
        tr.Trainer(c, str(tmp_path / "shared"))
