"""SFT warm start: demonstrations in the rollout layout, token-mean cross-entropy.

`SFTStep` is the SFT counterpart of the RL stages: a prompt source's examples in, one
update of the train state out. The loop around it (eval, checkpoint, stop) is the trainer's,
shared with RL.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.core import sharding
from jaxrl_frontier.models.text import encode_prompts
from jaxrl_frontier.objectives import logprobs
from jaxrl_frontier.rl.learn.forward import apply_hidden, apply_logits
from jaxrl_frontier.rl.learn.train_step import make_update_fn


def encode_demonstrations(tokenizer, prompts, completions, max_prompt_len, max_new_tokens):
    """SFT batch in the rollout layout: [left-padded prompt | completion + EOS, right-padded].

    Returns dict(tokens, attention_mask, loss_mask) [N, Tp + Tn]; loss on completion + EOS.
    """
    p_tok, p_mask = encode_prompts(tokenizer, prompts, max_prompt_len)
    n, tn = len(completions), max_new_tokens
    c_tok = np.full((n, tn), tokenizer.pad_id, np.int32)
    c_mask = np.zeros((n, tn), np.int32)
    for i, text in enumerate(completions):
        ids = tokenizer.encode(text) + [tokenizer.eos_id]
        if len(ids) > tn:
            raise ValueError(
                f"demonstration {text!r} is {len(ids)} tokens with EOS; "
                f"rollout.max_new_tokens={tn} is too small"
            )
        c_tok[i, : len(ids)] = ids
        c_mask[i, : len(ids)] = 1
    return dict(
        tokens=np.concatenate([p_tok, c_tok], 1),
        attention_mask=np.concatenate([p_mask, c_mask], 1),
        loss_mask=np.concatenate([np.zeros_like(p_mask), c_mask], 1).astype(np.float32),
    )


def sft_loss(graphdef, logprob_chunk: int | None = logprobs.DEFAULT_LOGPROB_CHUNK):
    """Token-mean cross-entropy on completion tokens (the loss_mask):
    NLL = -sum_{b,t} m log p(y_bt) / Z, Z = sum m (or the given `denominator`: the whole
    minibatch's token count, so that microbatch shares add up to the minibatch's NLL).

    logprob_chunk: as in `forward.make_logp_fn` (None: through the full [B, T, V] logits).
    """
    logits_fn, hidden_fn = apply_logits(graphdef), apply_hidden(graphdef)

    def loss_of(params, batch, denominator=None):
        if logprob_chunk is None:
            logits = logits_fn(params, batch["tokens"], batch["attention_mask"])
            logp = logprobs.token_logprobs(logits, batch["tokens"])
        else:
            hidden, w_out = hidden_fn(params, batch["tokens"], batch["attention_mask"])
            logp = logprobs.token_logprobs_from_hidden(
                hidden, w_out, batch["tokens"], logprob_chunk
            )
        m = batch["loss_mask"]
        z = jnp.maximum(jnp.sum(m), 1.0) if denominator is None else denominator
        nll = -jnp.sum(logp * m) / z
        return nll, dict(nll=nll)

    return loss_of


def token_count(batch) -> jax.Array:
    """The SFT loss's normaliser over a whole minibatch: its completion tokens."""
    return jnp.maximum(jnp.sum(batch["loss_mask"]), 1.0)


@dataclasses.dataclass(frozen=True)
class SFTOptions:
    """What an SFT step reads: `optimizer.grad_accum` microbatches per update, the prompt and
    demonstration lengths (`data.max_prompt_len`, `rollout.max_new_tokens`)."""

    grad_accum: int = 1
    max_prompt_len: int = 16
    max_new_tokens: int = 8


class SFTStep:
    """examples -> one update of the state (demonstrations from the task)."""

    def __init__(
        self,
        graphdef,
        tx,
        state_sharding,
        mesh,
        task,
        tokenizer,
        *,
        grad_accum,
        max_prompt_len,
        max_new_tokens,
    ):
        self.mesh, self.task, self.tokenizer = mesh, task, tokenizer
        self.max_prompt_len, self.max_new_tokens = max_prompt_len, max_new_tokens
        self.update = make_update_fn(
            graphdef,
            tx,
            sft_loss(graphdef),
            grad_accum,
            state_sharding,
            sharding.batch_sharding(mesh, 2),
            denominator_fn=token_count,
        )

    @classmethod
    def from_options(cls, options: SFTOptions, graphdef, tx, state_sharding, mesh, task, tokenizer):
        return cls(
            graphdef,
            tx,
            state_sharding,
            mesh,
            task,
            tokenizer,
            grad_accum=options.grad_accum,
            max_prompt_len=options.max_prompt_len,
            max_new_tokens=options.max_new_tokens,
        )

    def __call__(self, state, examples):
        batch = encode_demonstrations(
            self.tokenizer,
            [self.task.prompt(e) for e in examples],
            [self.task.demonstration(e) for e in examples],
            self.max_prompt_len,
            self.max_new_tokens,
        )
        state, metrics = self.update(state, sharding.shard_local_batch(batch, self.mesh))
        return state.replace(step=state.step + 1), metrics
