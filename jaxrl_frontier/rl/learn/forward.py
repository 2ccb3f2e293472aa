"""Forward passes over a split model (graphdef + params): hidden states, logits, log-probs.

Shared by the SFT step, the RL update and the rollout's extra log-prob passes. Each returns a
plain function of (params, tokens, attention_mask[, mlp_mask]) so it can be jitted once and
take the weights as an argument (never as constants baked into the program).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_frontier.objectives import logprobs


def apply_hidden(graphdef, group_size: int = 1, completion_len: int = 0, router: bool = False):
    """(params, tokens, mask, mlp_mask=None) -> (final hidden [B, T, D], output layer [D, V]).

    router=True (a mixture-of-experts policy; no shared prompt): (params, tokens, mask,
    mlp_mask=None, routing=None) -> (hidden, output layer, the layers' `moe.RouterStats`),
    routing int [B, T, L, k] replaying recorded experts (`Transformer.hidden_states`).

    group_size > 1 and completion_len > 0: the rows are prompt-major groups of `group_size`
    that share their first T - completion_len tokens (an RL batch), and each group's prompt
    runs through the model once (`Transformer.hidden_states_shared_prompt`; same values).
    mlp_mask [L, B, F]: Dropout-GRPO's per-row masks on the MLP hidden units (the rollout's),
    so the update runs the sub-network that sampled each row; not with a shared prompt (each
    row's prompt then runs through its own sub-network).
    """
    shared = group_size > 1 and completion_len > 0
    if router and shared:
        raise ValueError("apply_hidden: router statistics need the per-row forward (group_size 1)")

    def apply_hidden_fn(params, tokens, attention_mask, mlp_mask=None, routing=None):
        model = nnx.merge(graphdef, params)
        if router:
            hidden, _, stats = model.hidden_states(
                tokens, attention_mask, mlp_mask=mlp_mask, routing=routing, router_stats=True
            )
            return hidden, model.output_embedding(), stats
        if shared:
            if mlp_mask is not None:
                raise ValueError("a shared-prompt forward cannot take per-row MLP masks")
            hidden = model.hidden_states_shared_prompt(
                tokens,
                attention_mask,
                prompt_len=tokens.shape[1] - completion_len,
                group_size=group_size,
            )
        else:
            hidden = model.hidden_states(tokens, attention_mask, mlp_mask=mlp_mask)[0]
        return hidden, model.output_embedding()

    return apply_hidden_fn


def apply_logits(graphdef, group_size: int = 1, completion_len: int = 0):
    """(params, tokens, mask, mlp_mask=None) -> logits [B, T, V] (f32); as `apply_hidden`."""
    hidden_fn = apply_hidden(graphdef, group_size, completion_len)

    def apply_fn(params, tokens, attention_mask, mlp_mask=None):
        hidden, _ = hidden_fn(params, tokens, attention_mask, mlp_mask)
        return nnx.merge(graphdef, params).logits(hidden)

    return apply_fn


def first_scored(tokens, completion_len: int) -> int:
    """First position whose log-prob is computed: the completion's (the loss mask is 0
    on the prompt), or 1 (every position) when the completion length is not given."""
    return tokens.shape[1] - completion_len if completion_len else 1


def make_logp_fn(
    graphdef,
    logprob_chunk: int | None = logprobs.DEFAULT_LOGPROB_CHUNK,
    *,
    group_size: int = 1,
    completion_len: int = 0,
):
    """Jitted (params, tokens, mask, mlp_mask=None) -> per-token log-probs [B, T], aligned
    with tokens.

    logprob_chunk: positions per chunk of the fused output layer + log-softmax (no
    [B, T, V] logits); None: the plain path through the full logits.
    completion_len > 0: only the last `completion_len` positions are scored (the rest are
    0), and with group_size > 1 each group's prompt runs once (see `apply_hidden`).
    """
    logits_fn = apply_logits(graphdef, group_size, completion_len)
    hidden_fn = apply_hidden(graphdef, group_size, completion_len)

    @jax.jit
    def logp_fn(params, tokens, attention_mask, mlp_mask=None):
        start = first_scored(tokens, completion_len)
        if logprob_chunk is None:
            logits = logits_fn(params, tokens, attention_mask, mlp_mask)
            logp = logprobs.token_logprobs(logits, tokens)
            return jnp.where(jnp.arange(tokens.shape[1]) >= start, logp, 0.0)
        hidden, w_out = hidden_fn(params, tokens, attention_mask, mlp_mask)
        return logprobs.token_logprobs_from_hidden(hidden, w_out, tokens, logprob_chunk, start)

    return logp_fn
