"""The router's parts (models/routing.py) by hand: top-k gates with and without the
renormalisation and under routing replay, the balancing-bias update, and the share of
routings that differ. (The routers inside a model, against transformers: test_moe.py,
test_gpt_oss.py, test_deepseek_v3.py.)"""

import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.models import routing


def test_top_k_gates_by_hand_and_under_replay():
    logits = jnp.log(jnp.array([[0.1, 0.6, 0.3]]))  # softmax: the probabilities themselves
    experts, gates = routing.top_k_gates(logits, 2, norm=False)
    assert experts.tolist() == [[1, 2]]
    np.testing.assert_allclose(gates, [[0.6, 0.3]], rtol=1e-6)
    _, normed = routing.top_k_gates(logits, 2, norm=True)
    np.testing.assert_allclose(normed, [[2 / 3, 1 / 3]], rtol=1e-6)
    # replayed experts keep the current probabilities there; -1 (none recorded): its own
    forced = jnp.array([[0, 2]])
    experts, gates = routing.top_k_gates(logits, 2, norm=True, forced=forced)
    assert experts.tolist() == [[0, 2]]
    np.testing.assert_allclose(gates, [[0.25, 0.75]], rtol=1e-6)
    experts, _ = routing.top_k_gates(logits, 2, norm=True, forced=jnp.array([[-1, -1]]))
    assert experts.tolist() == [[1, 2]]


def test_balance_bias_moves_each_expert_toward_the_mean_load():
    bias = jnp.zeros((2, 4))
    load = jnp.array([[4.0, 2.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0]])  # means 2, 2
    got = routing.balance_bias_update(bias, load, 0.1)
    np.testing.assert_allclose(got, [[-0.1, 0.0, 0.1, 0.1], [0.0, 0.0, 0.0, 0.0]])


def test_routing_difference_share_by_hand():
    a = jnp.array([[[[0, 1]], [[2, 3]]]])  # [B=1, T=2, L=1, k=2]
    b = jnp.array([[[[1, 0]], [[2, 1]]]])  # token 0: the same set in another order
    assert float(routing.routing_difference_share(a, b)) == 0.5
    assert float(routing.routing_difference_share(a, b, jnp.array([[1, 0]]))) == 0.0
