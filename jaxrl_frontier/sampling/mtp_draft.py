"""The speculative sampler's draft from a checkpoint's multi-token-prediction module
(`rollout.speculative.draft = 'mtp'`; models/multi_token.py). Its entry i pairs the
policy's final hidden state h_i with the next token t_{i+1}, sits at h_i's position and
cache slot, and predicts t_{i+2}.

One round, x_n at position p (emitted, not yet in the policy's cache). Carried from the
last verify (`Carried`): H, the policy's hidden states over its k + 1 columns (positions
c..c+k), Y, the tokens that followed each (its accepted drafts, then x_n), and a, its
accepts (so c + a = p - 1):

    catch up   g = MTP(H, Y) at positions c..c+k     entries c..p-1 rewritten from the
               q_1 = softmax(g_a W_out)              policy's states      (ONE forward)
    chain      d_i ~ q_i;  g_{i+1} = MTP(g_i, d_i) at position p + i - 1    i = 1..k-1

The last round's chain wrote entries c+1..p-1 from the module's own states; the catch-up
writes the policy's over them. Its columns past a are stale pairs at slots from p on, which
the chain and the next catch-up rewrite before any query reads them (a query reads only the
slots up to its own). The prefill writes the prompt's pairs (h_j, t_{j+1}); the pair of
its last column, (the prompt's last state, x_n), is the first round's catch-up (H = that
state, Y = x_n, a = 0).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_frontier.models.kv_cache import KVCache
from jaxrl_frontier.models.layers import positions_from_mask
from jaxrl_frontier.models.multi_token import MultiTokenPredictor
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.sampling.sampler import fitted, per_row

# (H [B, k+1, D], Y int32 [B, k+1], a int32 [B]): the catch-up's input (module docstring)
Carried = tuple[jax.Array, jax.Array, jax.Array]


def prefill(
    mtp: MultiTokenPredictor,
    policy: Transformer,
    hidden,
    prompts,
    x_n,
    cache_dtype,
    *,
    n: int,
    slots: int,
    k: int,
) -> tuple[KVCache, Carried]:
    """hidden [P, Tp, D]: the policy's over the prompts (tokens, mask) [P, Tp], left-padded;
    x_n [B = P*n]: each row's first token -> (the module's cache [B, Tp + slots] holding the
    prompt's pairs, the first round's `Carried` for rounds of k proposals)."""
    tokens, mask = prompts
    # t_{j+1}; the last column's pair (the first token wrapped round) is rewritten by the
    # first round's catch-up before any query reads it
    follow = jnp.roll(tokens, -1, axis=1)
    cache = mtp.init_cache(*tokens.shape, cache_dtype)
    _, cache = mtp(policy, follow, hidden, mask, positions=positions_from_mask(mask), cache=cache)
    last = jnp.repeat(hidden[:, -1:], n, axis=0)  # [B, 1, D]
    h = jnp.pad(last, ((0, 0), (0, k), (0, 0)))
    y = jnp.pad(x_n[:, None], ((0, 0), (0, k)))
    return fitted(cache, n, slots), (h, y, jnp.zeros_like(x_n))


def propose(mtp, policy, cache: KVCache, carried: Carried, at, u, k: int, pick, sampling):
    """One round's draft (module docstring): at = (pos [B]: x_n's position, slot [B]: its
    cache slot), u [B, 2k+1] the round's uniforms, pick(q, u) -> a token per row,
    sampling(logits) -> sampling logits -> (d_1..d_k [B, k], their sampling logits
    [B, k, V], the cache)."""
    (h, y, a), (pos, slot) = carried, at

    def run(tokens, previous, positions, cache, index):  # [B, T] at per-row slots
        call = lambda tok, prev, p, row: mtp(policy, tok, prev, positions=p, cache=row)  # noqa: E731
        return per_row(call, cache, index, tokens, previous, positions)

    first = pos - 1 - a  # the catch-up's first position (its first slot: slot - 1 - a)
    g, cache = run(y, h, first[:, None] + jnp.arange(k + 1), cache, slot - 1 - a)
    g1 = jnp.take_along_axis(g, a[:, None, None], 1)[:, 0]  # [B, D]
    q1 = sampling(policy.logits(g1))
    d1 = pick(q1, u[:, 0])

    def chain(carry, i):  # (g_i, d_i) at position pos + i - 1 -> d_{i+1}
        cache, g, tok = carry
        g, cache = run(tok[:, None], g[:, None], (pos + i - 1)[:, None], cache, slot + i - 1)
        q = sampling(policy.logits(g[:, 0]))
        nxt = pick(q, jax.lax.dynamic_index_in_dim(u, i, 1, False))
        return (cache, g[:, 0], nxt), (nxt, q)

    (cache, _, _), (ds, qs) = jax.lax.scan(chain, (cache, g1, d1), jnp.arange(1, k))
    drafts = jnp.concatenate([d1[:, None], jnp.moveaxis(ds, 0, 1)], 1)  # [B, k]
    q_logits = jnp.concatenate([q1[:, None], jnp.moveaxis(qs, 0, 1)], 1)  # [B, k, V]
    return drafts, q_logits, cache
