"""DeepSeek-V3's auxiliary-loss-free balancing inside the learner's update
(`train_step.balanced`, `model.moe.bias_update_rate`): after each optimizer step every MoE
layer's selection bias moves by b_e <- b_e + u sign(mean load - load_e), the load of that
minibatch's forward, and the optimizer (AdamW with weight decay) holds no state for the bias
and never moves it. One tiny random DeepSeek-V3 (3 layers, the first dense, 4 experts, top
2), one compiled update reused for every step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_experience, random_model
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.models import moe, routing
from jaxrl_frontier.models.model_config import ModelConfig
from jaxrl_frontier.rl.learn.learner import Learner, LearnerOptions
from jaxrl_frontier.rl.learn.optimizer import OptimizerSection, build_optimizer
from jaxrl_frontier.rl.learn.train_step import init_train_state

TINY_DSV3 = ModelConfig(
    vocab_size=20, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=2,
    num_kv_heads=2, head_dim=12, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
    v_head_dim=8, first_k_dense_replace=1, num_experts=4, num_experts_per_tok=2,
    moe_intermediate_size=16, shared_expert_intermediate_size=16, shared_expert_gated=False,
    router_scoring="sigmoid", norm_topk_prob=True, routed_scaling_factor=2.5,
)  # fmt: skip
RATE = 0.1
START = np.asarray([0.3, 0.0, 0.0, 0.0], np.float32)  # expert 0 first in every token's pick


def _learner(rate: float, cfg=TINY_DSV3):
    model = random_model(cfg)
    graphdef, params = nnx.split(model)
    if cfg.router_scoring == "sigmoid":
        bias = params["layers"]["mlp"]["router_score_bias"]
        bias.set_value(jnp.broadcast_to(jnp.asarray(START), bias.get_value().shape))
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    fixed = moe.is_balance_bias if moe.has_balance_bias(params) else None
    opt = OptimizerSection(lr=1e-2, weight_decay=0.1)
    tx = build_optimizer(opt, 100, fixed=fixed)
    state = init_train_state(tx, params, mesh, jax.random.key(0))
    options = LearnerOptions(
        objective=dict(weight="ppo_clip", aggregation="token_mean", advantage="grpo"),
        rows=16, group_size=4, completion_len=3, minibatches=2, bias_update_rate=rate,
    )  # fmt: skip
    return Learner(graphdef, tx, state, options, mesh=mesh, model_cfg=cfg, log=lambda m: None)


def test_the_bias_moves_toward_balance_and_no_optimizer_touches_it():
    """2 steps x 2 minibatches (4 updates, one program): after each update the bias moved by
    exactly u sign(mean - load) of the minibatch it trained on (its load recomputed here at
    the weights before the update), so expert 0 (started 0.3 ahead: in every token's top 2,
    load twice the mean) falls by u at the first update while the idle experts rise; the optimizer
    state holds nothing for the bias and AdamW's decay (0.1 x lr 0.01 x b, 3e-4 at the
    start) did not shrink it: the step is exactly the rule's, while the other weights move, and the busiest expert's load over the mean falls below 2."""
    learner = _learner(RATE)
    names = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(
        learner.state.opt_state)[0]]  # fmt: skip
    assert names and not any(routing.BIAS_NAME in n for n in names)
    graphdef = learner._graphdef

    @jax.jit
    def load(params, tokens, mask):  # [L, E] at these weights
        return nnx.merge(graphdef, params).hidden_states(tokens, mask, router_stats=True)[2].load

    bias_of = lambda s: np.asarray(s.params["layers"]["mlp"]["router_score_bias"].get_value())
    program, busiest, expert0 = learner.programs, [], []

    def checked(keys):  # every update checked against the rule at its own minibatch
        select, update = program(keys)

        def step(state, mb, *frozen):
            before = bias_of(state)
            want = load(state.params, mb["tokens"], mb["attention_mask"])[1:]  # the MoE layer
            state, metrics = update(state, mb, *frozen)
            step = np.sign(want.mean(-1, keepdims=True) - want) * np.float32(RATE)
            np.testing.assert_array_equal(bias_of(state), before + step)
            busiest.append(float(metrics["moe/load_max"]))
            expert0.append(float(bias_of(state)[0, 0]))
            assert float(metrics["moe/bias_abs_max"]) == np.abs(bias_of(state)).max()
            assert moe.LOAD_METRIC not in metrics
            return state, metrics

        return select, step

    learner.programs = checked
    params0 = jax.tree.map(np.asarray, nnx.to_pure_dict(learner.state.params))
    for seed in range(2):
        keys = iter(jax.random.split(jax.random.key(seed), 1))
        learner.update(random_experience(seed=seed), lambda: next(keys))
    assert len(learner.built_programs()) == 1 and len(busiest) == 4
    assert expert0[0] == pytest.approx(0.3 - RATE, abs=1e-6)
    # measured: expert 0's bias 0.2, 0.1, 0, 0.1 and the busiest load 2, 2, 1.80, 2 (this
    # coarse u on 16-row minibatches overshoots; the sign rule brings it back)
    assert busiest[0] == 2.0 and min(busiest) < 2.0
    moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - b).max()),
                         nnx.to_pure_dict(learner.state.params), params0)  # fmt: skip
    assert moved["layers"]["mlp"]["expert_up"] > 1e-4


def test_a_rate_on_a_router_without_a_bias_is_refused():
    """`model.moe.bias_update_rate` > 0 on a softmax router (no balancing bias): a
    ConfigError naming the key, before any update is compiled."""
    softmax = TINY_DSV3.replace(router_scoring="softmax")
    with pytest.raises(ConfigError, match=r"'model.moe.bias_update_rate' = 0.1 .*'softmax'"):
        _learner(RATE, softmax)
