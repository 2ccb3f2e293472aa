"""Forward passes over a split model (graphdef + params): hidden states, logits, log-probs.

Shared by the SFT step, the RL update and the rollout's extra log-prob passes. Each returns a
plain function of (params, tokens, attention_mask[, mlp_mask]) so it can be jitted once and
take the weights as an argument (never as constants baked into the program).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.objectives import logprobs
from jaxrl_frontier.rl.learn import packing
from jaxrl_frontier.sampling.sampler import recorded_experts


def apply_hidden(graphdef, group_size: int = 1, completion_len: int = 0, router: bool = False):
    """(params, tokens, mask, mlp_mask=None) -> (final hidden [B, T, D], the output layer: a
    `logprobs.OutputLayer`, the weights as stored and the model's final logit soft-cap).

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
    if router and group_size > 1 and completion_len > 0:
        raise ValueError("apply_hidden: router statistics need the per-row forward (group_size 1)")
    hidden_fn = _hidden_states(graphdef, group_size, completion_len)

    def apply_hidden_fn(params, tokens, attention_mask, mlp_mask=None, routing=None):
        if router:
            model = nnx.merge(graphdef, params)
            hidden, _, stats = model.hidden_states(
                tokens, attention_mask, mlp_mask=mlp_mask, routing=routing, router_stats=True
            )
            return hidden, _output_layer(model), stats
        model, hidden = hidden_fn(params, tokens, attention_mask, mlp_mask)
        return hidden, _output_layer(model)

    return apply_hidden_fn


def _output_layer(model) -> logprobs.OutputLayer:
    """The model's output layer as it stores it (a tied embedding [V, D], not transposed)
    and its final logit soft-cap (Gemma 2; None for a model without one)."""
    w, vocab_major = model.output_table()
    return logprobs.OutputLayer(w, model.cfg.final_logit_softcap, vocab_major=vocab_major)


def _hidden_states(graphdef, group_size: int, completion_len: int):
    """(params, tokens, mask, mlp_mask, routing=None) -> (the merged model, final hidden
    [B, T, D]). routing int [B, T, L, k] (an MoE's replayed experts) runs the per-row
    forward whatever the layout (the shared prompt's forward takes no routing)."""
    shared = group_size > 1 and completion_len > 0

    def hidden_fn(params, tokens, attention_mask, mlp_mask, routing=None):
        model = nnx.merge(graphdef, params)
        if routing is not None:
            hidden = model.hidden_states(
                tokens, attention_mask, mlp_mask=mlp_mask, routing=routing
            )[0]
        elif shared:
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
        return model, hidden

    return hidden_fn


def apply_logits(graphdef, group_size: int = 1, completion_len: int = 0):
    """(params, tokens, mask, mlp_mask=None) -> logits [B, T, V] (f32); as `apply_hidden`
    (through `Transformer.logits`, so a final logit soft-cap applies)."""
    hidden_fn = _hidden_states(graphdef, group_size, completion_len)

    def apply_fn(params, tokens, attention_mask, mlp_mask=None):
        model, hidden = hidden_fn(params, tokens, attention_mask, mlp_mask)
        return model.logits(hidden)

    return apply_fn


def first_scored(tokens, completion_len: int) -> int:
    """First position whose log-prob is computed: the completion's (the loss mask is 0
    on the prompt), or 1 (every position) when the completion length is not given."""
    return tokens.shape[1] - completion_len if completion_len else 1


def apply_packed_hidden(graphdef):
    """(params, tokens [B, T], pack) -> (final hidden [R, N, D] over one microbatch's packed
    slots, the `logprobs.OutputLayer`); pack: one microbatch's maps (`packing.plan_packing`)."""

    def apply_fn(params, tokens, pack):
        model = nnx.merge(graphdef, params)
        return packing.packed_hidden(model, tokens, pack), _output_layer(model)

    return apply_fn


def make_packed_logp_fn(
    graphdef,
    spec: packing.PackSpec,
    logprob_chunk: int | None = logprobs.DEFAULT_LOGPROB_CHUNK,
    *,
    completion_len: int = 0,
):
    """`make_logp_fn` on packed rows: (params, tokens, mask, mlp_mask=None, routing=None)
    -> [B, T] log-probs (0 before the scored columns and on padding). The rows are packed
    on the host (`packing.plan_packing`, one microbatch) and the packed forward is jitted
    once per bucket of buffer rows; mlp_mask and routing must be None (refused with
    packing)."""
    spec = dataclasses.replace(spec, microbatches=1, micro_rows=0)
    hidden_fn = apply_packed_hidden(graphdef)
    chunk = logprob_chunk or logprobs.DEFAULT_LOGPROB_CHUNK

    @jax.jit
    def packed_logp(params, tokens, attention_mask, pack):
        hidden, w_out = hidden_fn(params, tokens, pack)
        packed_tokens = packing.gather_packed(tokens, pack["src"])
        logp = logprobs.token_logprobs_from_hidden(hidden, w_out, packed_tokens, chunk)
        scored = jnp.arange(tokens.shape[1]) >= first_scored(tokens, completion_len)
        dst = packing.destinations(pack["start"], attention_mask, pack["src"].size)
        return jnp.where(scored, packing.unpack(logp, dst), 0.0)

    def logp_fn(params, tokens, attention_mask, mlp_mask=None, routing=None):
        if mlp_mask is not None or routing is not None:
            raise ValueError("packed rows take neither per-row MLP masks nor replayed routing")
        maps, _ = packing.plan_packing(packing.host_mask(attention_mask), spec)
        return packed_logp(params, tokens, attention_mask, {k: v[0] for k, v in maps.items()})

    return logp_fn


def make_logp_fn(
    graphdef,
    logprob_chunk: int | None = logprobs.DEFAULT_LOGPROB_CHUNK,
    *,
    group_size: int = 1,
    completion_len: int = 0,
    pack: packing.PackSpec | None = None,
):
    """Jitted (params, tokens, mask, mlp_mask=None, routing=None) -> per-token log-probs
    [B, T], aligned with tokens. routing int [B, T, L, k]: an MoE policy's forward routes
    each token to those experts (routing replay; -1: the router's own choice), per row.

    logprob_chunk: positions per chunk of the fused output layer + log-softmax (no
    [B, T, V] logits); None: the plain path through the full logits.
    completion_len > 0: only the last `completion_len` positions are scored (the rest are
    0), and with group_size > 1 each group's prompt runs once (see `apply_hidden`).
    pack: packed rows (`train.pack_tokens`; `make_packed_logp_fn`), group_size ignored.
    """
    if pack is not None:
        return make_packed_logp_fn(graphdef, pack, logprob_chunk, completion_len=completion_len)
    hidden_fn = _hidden_states(graphdef, group_size, completion_len)

    @jax.jit
    def logp_fn(params, tokens, attention_mask, mlp_mask=None, routing=None):
        start = first_scored(tokens, completion_len)
        model, hidden = hidden_fn(params, tokens, attention_mask, mlp_mask, routing)
        if logprob_chunk is None:
            logp = logprobs.token_logprobs(model.logits(hidden), tokens)
            return jnp.where(jnp.arange(tokens.shape[1]) >= start, logp, 0.0)
        w_out = _output_layer(model)
        return logprobs.token_logprobs_from_hidden(hidden, w_out, tokens, logprob_chunk, start)

    return logp_fn


def make_routing_fn(graphdef, *, chunks: int, mesh):
    """Jitted (params, batch) -> int16 [B, T, L, k]: the experts an MoE policy's router
    picks for each token of the batch's rows (`tokens`, `attention_mask` [B, T]), -1 on
    padding: the record that `model.moe.routing_replay = 'first_update'` (R2) replays.

    The rows run in `chunks` slices of B / chunks rows (`lax.map`: an update microbatch's
    activations, not the whole batch's), each slice strided over the rows so that it
    spreads over the batch devices as the rows do. (An MoE takes no Dropout-GRPO masks.)"""
    hidden_fn = apply_hidden(graphdef, router=True)

    def one(params, rows):
        tokens, mask = rows
        return recorded_experts(hidden_fn(params, tokens, mask)[2].experts, mask)

    def route(params, batch):
        split = lambda x: x.reshape(-1, chunks, *x.shape[1:]).swapaxes(0, 1)
        rows = (split(batch["tokens"]), split(batch["attention_mask"]))
        out = jax.lax.map(lambda r: one(params, r), rows)
        return out.swapaxes(0, 1).reshape(-1, *out.shape[2:])

    return jax.jit(route, out_shardings=sharding.batch_sharding(mesh, 4))
