"""The forward passes' rules that need no model (rl/learn/forward.py): the first scored
position, and the layouts refused before anything is traced. (The log-prob passes over a
model: test_shared_prompt.py, test_perf_paths.py, test_packing.py.)"""

import jax.numpy as jnp
import pytest

from jaxrl_frontier.rl.learn import packing
from jaxrl_frontier.rl.learn.forward import apply_hidden, first_scored, make_logp_fn


def test_the_first_scored_position_is_the_completions_or_1():
    tokens = jnp.zeros((3, 10), jnp.int32)
    assert first_scored(tokens, 4) == 6  # 6 prompt positions, then 4 scored
    assert first_scored(tokens, 10) == 0
    assert first_scored(tokens, 0) == 1  # no completion length: every predicted position


def test_router_statistics_need_the_per_row_forward():
    with pytest.raises(ValueError, match="router statistics need the per-row forward"):
        apply_hidden(None, group_size=4, completion_len=3, router=True)
    apply_hidden(None, group_size=1, completion_len=3, router=True)  # per row: built
    apply_hidden(None, group_size=4, completion_len=0, router=True)  # no shared prompt


@pytest.mark.parametrize(
    "extra", [dict(mlp_mask=jnp.ones((1, 2, 4))), dict(routing=jnp.zeros((2, 5, 1, 1)))]
)
def test_packed_rows_refuse_masks_and_replayed_routing(extra):
    """Before any packing or tracing: the graphdef is never read."""
    logp_fn = make_logp_fn(None, 4, completion_len=3, pack=packing.PackSpec(8, microbatches=2))
    tokens = jnp.ones((2, 5), jnp.int32)
    with pytest.raises(ValueError, match="packed rows take neither per-row MLP masks nor"):
        logp_fn(None, tokens, jnp.ones_like(tokens), **extra)
