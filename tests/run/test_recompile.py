"""Hot paths compile once: a second call of the jitted train step (`make_update_fn`, RL and
SFT losses) or of the sampler's prefill + decode loop with inputs of the same shapes (new
values, new keys, a new temperature) must not trace or compile again.

Counted by the `count_compiles` fixture (a `jax.monitoring` listener on XLA backend
compiles): any compile at all during the second call, eager helpers included, fails the
test; the train step's own jit cache size is checked too."""

import jax
import numpy as np
import pytest
from conftest import small_rl_config
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.rl.learn.train_step import make_update_fn
from jaxrl_frontier.run import trainer as tr
from jaxrl_frontier.sampling import Sampler, SamplingParams
from jaxrl_frontier.train.sft import sft_loss


def _model():
    cfg = ModelConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
    )
    return Transformer(cfg, rngs=nnx.Rngs(0))


def _batch(seed, rl=True):
    rng = np.random.default_rng(seed)
    mask = np.zeros((8, 12), np.float32)
    mask[:, 4:] = 1.0
    batch = dict(
        tokens=rng.integers(1, 64, (8, 12)).astype(np.int32),
        attention_mask=np.ones((8, 12), np.int32),
        loss_mask=mask,
    )
    if rl:
        batch["old_logp"] = (-rng.exponential(2.0, (8, 12)) * mask).astype(np.float32)
        batch["advantages"] = (rng.normal(size=(8, 1)) * mask).astype(np.float32)
    return batch


def _trainer(tmp_path, mode, num_devices):
    c = small_rl_config(mode, num_devices)
    c.train.steps = 3
    c.train.recompute_old_logp = True
    c.objective.kl_coef = 0.01  # a reference forward too
    return tr.Trainer(c, str(tmp_path))


def _state_step(trainer):
    trainer.state = trainer.state.replace(step=trainer.state.step + 1)  # as the loops do


@pytest.mark.parametrize("num_devices", [1, 8])
def test_rl_step_compiles_once(tmp_path, num_devices, count_compiles):
    """The Trainer's own pieces: rollout, old/ref log-probs, advantages, update."""
    trainer = _trainer(tmp_path, "rl", num_devices)
    keys = ["tokens", "attention_mask", "loss_mask", "old_logp", "advantages", "ref_logp"]
    select, update = trainer.step.learner.programs(keys)
    examples = [trainer.task.example("train", i) for i in range(4)]

    def step(i):
        exp, _ = trainer.step.rollout(examples, jax.random.key(i))
        batch = exp.update_batch()
        assert sorted(batch) == sorted(keys)
        mb = select(batch, np.arange(exp.num_rows))
        trainer.state, metrics = update(trainer.state, mb)
        _state_step(trainer)
        jax.block_until_ready((trainer.state, metrics))

    step(0)
    with count_compiles() as seen:
        step(1)
        step(2)
    assert update._cache_size() == 1, "the train step was traced again"
    assert select._cache_size() == 1, "the minibatch gather was traced again"
    assert trainer.step.logp_fn._cache_size() == 1, "the log-prob forward was traced again"
    assert seen == [], f"compiled again on a same-shaped call: {seen}"


def test_sft_step_compiles_once(tmp_path, count_compiles):
    trainer = _trainer(tmp_path, "sft", 1)
    batch_sh = sharding.batch_sharding(trainer.roles.mesh, 2)
    update = make_update_fn(
        trainer.roles.graphdef,
        trainer.tx,
        sft_loss(trainer.roles.graphdef),
        1,
        trainer.state_sharding,
        batch_sh,
    )
    batches = [sharding.shard_batch(_batch(s, rl=False), trainer.roles.mesh) for s in range(3)]
    trainer.state, _ = update(trainer.state, batches[0])
    _state_step(trainer)
    jax.block_until_ready(trainer.state)
    with count_compiles() as seen:
        for b in batches[1:]:
            trainer.state, metrics = update(trainer.state, b)
            _state_step(trainer)
        jax.block_until_ready((trainer.state, metrics))
    assert update._cache_size() == 1, "the train step was traced again"
    assert seen == [], f"compiled again on a same-shaped call: {seen}"


def test_decode_loop_compiles_once(count_compiles):
    """The first rollout compiles one prefill and one decode program; same-shaped rollouts
    with new prompts, keys and temperatures compile nothing."""
    sampler = Sampler(_model(), pad_id=0, prompt_buckets=(8,))

    def prompts(seed):
        r = np.random.default_rng(seed)
        tok = r.integers(1, 64, (3, 6)).astype(np.int32)
        mask = np.ones_like(tok)
        mask[0, :2] = 0  # a left-padded row
        return tok, mask

    params = SamplingParams(max_new_tokens=10, n=2, temperature=1.0, eos_ids=(5,))
    with count_compiles() as first:
        jax.block_until_ready(sampler.generate(*prompts(0), params, jax.random.key(0)))
    assert sum("prefill" in name for name in first) == 1, first
    assert sum("decode" in name for name in first) == 1, first
    with count_compiles() as seen:
        for i, temp in enumerate((0.7, 1.3), start=1):
            p = SamplingParams(max_new_tokens=10, n=2, temperature=temp, eos_ids=(5,))
            jax.block_until_ready(sampler.generate(*prompts(i), p, jax.random.key(i)))
    assert seen == [], f"compiled again on a same-shaped call: {seen}"
