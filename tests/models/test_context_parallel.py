"""Context parallelism (`mesh.sequence`): each device along the sequence axis holds a slice
of every row's positions in the update and the log-prob passes.

- 8 fake devices, sequence 4 x fsdp 2 (and x tensor 2): the RL loss (clipped policy gradient, KL to a
  reference, entropy bonus, a teacher's JSD) and its gradient equal one device's, on padded
  and on packed rows;
- the compiled update gathers the keys and values of a whole row, never its hidden states
  (the log-prob chunks take each device's own positions; a layout that flattens the rows
  instead gathers them, and the check fails);
- a 16k-token row: the compiled update's temporaries per device fall about 4x; with ring
  attention (`model.attention = 'ring'`) no buffer spans a device's queries x the row, and
  they fall 2.6x below the all-gather path's;
- the trainer runs a sequence-split mesh end to end and gives the run without one;
- rows the axis does not divide, and MoE policies, are config errors naming the key
  (tests/run/test_rl_build.py).
"""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SMALL_MODEL, override, random_model, run_trainer, small_rl_config
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.objectives import logprobs
from jaxrl_frontier.rl.learn import packing
from jaxrl_frontier.rl.learn.forward import apply_hidden
from jaxrl_frontier.rl.learn.loss import rl_loss
from jaxrl_frontier.run import config as config_lib
from jaxrl_frontier.run.build import objective_section

V, TP, TN = 64, 4, 12  # vocabulary; prompt and completion positions (T = 16: 4 per device)
LENGTHS = [12, 1, 7, 2, 11, 3, 9, 5]  # completion lengths
B = len(LENGTHS)
CP = (1, 2, 4, 1)  # data, fsdp, sequence, tensor


def _mesh(shape):
    return sharding.make_mesh(shape, jax.devices()[: int(np.prod(shape))])


def _batch(seed=0):
    """B rows: left-padded prompts, completions of LENGTHS right-padded, an RL batch's inputs."""
    rng = np.random.default_rng(seed)
    pads = rng.integers(0, TP, B)
    prompt_mask = (np.arange(TP)[None] >= pads[:, None]).astype(np.int32)
    completion_mask = (np.arange(TN)[None] < np.array(LENGTHS)[:, None]).astype(np.int32)
    mask = np.concatenate([prompt_mask, completion_mask], 1)
    loss_mask = np.concatenate([np.zeros_like(prompt_mask), completion_mask], 1).astype(np.float32)
    logp = lambda: (-rng.exponential(1.0, mask.shape) * loss_mask).astype(np.float32)
    return dict(
        tokens=np.where(mask, rng.integers(1, V, mask.shape), 0).astype(np.int32),
        attention_mask=mask,
        loss_mask=loss_mask,
        old_logp=logp(),
        ref_logp=logp(),
        advantages=(rng.normal(size=(B, 1)) * loss_mask).astype(np.float32),
    )


@pytest.fixture(scope="module")
def models():
    cfg = ModelConfig(vocab_size=V, **SMALL_MODEL, qkv_bias=True)
    return nnx.split(random_model(cfg)), nnx.split(random_model(cfg, seed=1))


def _objective():
    cfg = objective_section(config_lib.base_config().objective)
    return dataclasses.replace(cfg, entropy_coef=0.05, distill="jsd", kl_coef=0.1)


def _loss_and_grads(models, mesh, batch, chunk=16):
    """((loss, metrics), grads) of `rl_loss` on `mesh` (weights and rows placed on it)."""
    (graphdef, params), (t_graphdef, t_params) = models
    place = lambda p: jax.device_put(p, sharding.state_shardings(p, mesh))  # noqa: E731
    params, frozen = place(params), {"teacher": place(t_params)}
    pack = batch.pop("pack", None)
    batch = sharding.shard_batch(batch, mesh)
    if pack is not None:
        batch["pack"] = jax.device_put(pack, sharding.replicated(mesh))
    loss_of = rl_loss(graphdef, _objective(), chunk, completion_len=TN, teacher_graphdef=t_graphdef)
    fn = jax.jit(jax.value_and_grad(lambda p, b, f: loss_of(p, b, frozen=f), has_aux=True))
    return fn(params, batch, frozen)


def _assert_same(a, b):
    ((l0, m0), g0), ((l1, m1), g1) = a, b
    # f32 sums of at most B * T = 128 terms of O(1) in another order: ~1e-6 apart
    np.testing.assert_allclose(float(l1), float(l0), rtol=1e-5, atol=1e-6)
    for k in ("pg_loss", "kl_loss", "distill_loss", "entropy"):
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    assert float(m0["distill_loss"]) > 0
    for x, y in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), strict=True):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-4, atol=1e-6)


@pytest.fixture(scope="module")
def one_device(models):
    return _loss_and_grads(models, _mesh((1, 1, 1, 1)), _batch())


@pytest.mark.parametrize("shape", [CP, (1, 1, 4, 2)], ids=["fsdp2_seq4", "seq4_tensor2"])
def test_sequence_axis_loss_and_gradient_equal_one_device(models, one_device, shape):
    _assert_same(one_device, _loss_and_grads(models, _mesh(shape), _batch()))
    # the weights are split over fsdp x sequence (ZeRO-3 over both): [L, D, F] by D
    gate = models[0][1]["layers"]["mlp"]["gate_proj"]
    spec = sharding.state_shardings(gate, _mesh(CP)).get_value().spec
    assert tuple(spec) == (None, ("fsdp", "sequence"), None)


def test_sequence_axis_composes_with_packed_rows(models):
    """Packed rows of 16 slots (`train.pack_tokens`), 4 per device along the axis: the loss
    and gradient of the padded rows on one device."""
    batch = _batch(1)
    maps, _ = packing.plan_packing(batch["attention_mask"], packing.PackSpec(16, multiple=2))
    packed = {**batch, "pack": {k: v[0] for k, v in maps.items()}}
    _assert_same(
        _loss_and_grads(models, _mesh((1, 1, 1, 1)), batch),
        _loss_and_grads(models, _mesh(CP), packed),
    )


def _update_program(cfg, mesh, rows, t):
    """The compiled value-and-gradient of a token-log-prob loss over rows of t positions."""
    from jaxrl_frontier.models.transformer import Transformer

    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    shardings = sharding.state_shardings(state, mesh)
    params = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
    )
    data = jax.ShapeDtypeStruct((rows, t), jnp.int32, sharding=sharding.batch_sharding(mesh, 2))
    hidden_fn = apply_hidden(graphdef)

    def loss(p, tokens, mask):
        h, w = hidden_fn(p, tokens, mask)
        return -jnp.sum(logprobs.token_logprobs_from_hidden(h, w, tokens, 256) * mask)

    return jax.jit(jax.value_and_grad(loss)).lower(params, data, data).compile()


GATHERS = re.compile(r"= f32\[([0-9,]+)\]\{[^}]*\} all-gather(?:-start)?\(")


def test_update_gathers_keys_and_values_not_hidden_states(monkeypatch):
    """The attention is the all-gather of K/V over the sequence axis (`core/sharding.py`):
    the compiled update all-gathers the [1, T, K, Dh] keys and values of a row, and no
    hidden states [.., n, D] of a whole row (n >= T; with one chunk per row XLA may gather
    that chunk in the output layer's backward, a chunk at most). Cutting the chunks from the flattened rows instead of
    each device's own positions makes XLA gather whole rows' states, and the check sees it."""
    cfg = ModelConfig(vocab_size=V, **SMALL_MODEL, remat="full")
    t, d = 320, cfg.hidden_size  # 80 positions a device: 3 chunks of 2 x 4 x 32 = 256 rows

    def gathered(program):
        return {tuple(map(int, dims.split(","))) for dims in GATHERS.findall(program.as_text())}

    def whole_rows(shapes):  # hidden states [.., n, D] of n >= T positions
        return {s for s in shapes if len(s) >= 2 and s[-1] == d and s[-2] >= t}

    shapes = gathered(_update_program(cfg, _mesh(CP), 2, t))
    assert (1, t, cfg.num_kv_heads, cfg.resolved_head_dim) in shapes, shapes
    assert not whole_rows(shapes), shapes
    flat = lambda cls, h, w, chunk, start: cls((h.shape[0], h.shape[1]), chunk, start, 1)  # noqa: E731
    monkeypatch.setattr(logprobs.PositionChunks, "of", classmethod(flat))
    assert whole_rows(gathered(_update_program(cfg, _mesh(CP), 2, t)))


@functools.cache
def _long_row_update(attention: str, shape, t: int = 16384):
    """(temporary bytes per device, HLO text) of the compiled update over two rows of t
    tokens with `model.attention = attention` on the mesh `shape` (shared by the tests)."""
    cfg = ModelConfig(vocab_size=V, **SMALL_MODEL, remat="full", attention=attention)
    program = _update_program(cfg, _mesh(shape), 2, t)
    return program.memory_analysis().temp_size_in_bytes, program.as_text()


def test_sixteen_thousand_token_row_needs_a_quarter_of_the_temporaries():
    """Two rows of 16,384 tokens on fsdp 2 against fsdp 2 x sequence 4 (compiled, not run):
    the attention scores [T / s, T], the activations and the logits chunks all fall by the
    sequence axis (measured 13.4 GB -> 3.3 GB a device)."""
    plain, _ = _long_row_update("xla", (1, 2, 1, 1))
    split, _ = _long_row_update("xla", CP)
    assert 3.5 < plain / split <= 4.2, (plain, split)


F32_SHAPES = re.compile(r"f32\[([0-9,]+)\]")


def test_ring_attention_holds_a_block_of_scores_not_a_row():
    """The same 16k update with `model.attention = 'ring'` (fsdp 2 x sequence 4): no f32
    buffer spans [T / s, T] (the all-gather path's scores and bias do), and the temporaries
    per device fall below the all-gather path's (measured 3.3 GB -> 1.3 GB: the [T / s,
    T / s] block's scores, probabilities and their gradients remain)."""
    t, n = 16384, 16384 // 4
    gather_bytes, gather_text = _long_row_update("xla", CP)
    ring_bytes, ring_text = _long_row_update("ring", CP)

    def row_wide(text):  # f32 buffers with a T / s and a T dim: a device's queries x the row
        return {s for s in F32_SHAPES.findall(text) if {n, t} <= set(map(int, s.split(",")))}

    assert row_wide(gather_text)
    assert not row_wide(ring_text), row_wide(ring_text)
    assert "collective-permute" in ring_text
    assert gather_bytes / ring_bytes > 2.2, (gather_bytes, ring_bytes)


def _config(**overrides):
    c = small_rl_config(num_devices=0)  # rows of 16 (a prompt bucket) + 4 tokens
    c.rollout.max_new_tokens = 4
    c.objective.reward_weights = dict(correctness=1.0, format=0.5, length=0.1)
    c.optimizer.update(lr=5e-3, warmup_steps=0)
    c.train.update(steps=2, log_every=1, eval_every=10**6, checkpoint_every=10**6)
    return override(c, {"mesh.data": 1, **overrides})


def test_trainer_on_a_sequence_axis_is_the_run_without_one(tmp_path):
    """fsdp 2 x sequence 4 (8 devices) against fsdp 2: the same rollouts, rewards and
    losses, step by step (sampling reads the same weights, split another way). The rollouts
    run on the same devices with the sequence axis folded into fsdp (rows over all 8)."""
    _, _, plain = run_trainer(_config(**{"mesh.fsdp": 2, "mesh.num_devices": 2}), tmp_path / "a")
    trainer, summary, split = run_trainer(
        _config(**{"mesh.fsdp": 2, "mesh.sequence": 4}), tmp_path / "b"
    )
    assert dict(trainer.roles.mesh.shape) == dict(data=1, fsdp=2, sequence=4, tensor=1)
    assert dict(trainer.roles.rollout_mesh.shape) == dict(data=1, fsdp=8, sequence=1, tensor=1)
    assert trainer.roles.rollout_mesh.devices.ravel().tolist() == (
        trainer.roles.mesh.devices.ravel().tolist()
    )
    assert summary["step"] == 2 and len(split) == len(plain) == 2
    for a, b in zip(plain, split, strict=True):
        assert b["reward/total"] == a["reward/total"]
        for key in ("train/loss", "train/grad_norm"):
            np.testing.assert_allclose(b[key], a[key], rtol=1e-4, atol=1e-6, err_msg=key)
