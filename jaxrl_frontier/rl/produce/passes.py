"""Log-prob passes (`PASSES`): forwards run over a whole Experience after it is assembled,
each filling one field (or several from the same forwards): the behaviour log-probs when the
trainer recomputes them, the reference's, the teacher's, SC-GRPO's self-conditioned ones, or
any a method registers. The run builds the passes its objective needs (`run/rl_build.py`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.rl.diagnostics import logp_mismatch
from jaxrl_frontier.rl.experience import TEACHER_INDEX, Experience
from jaxrl_frontier.rl.methods.self_conditioning import chunked_kl_and_logp, conditioned_rows

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class LogprobPass:
    """One extra forward over the assembled rollout.

    field: the Experience field it fills (`old_logp`, `ref_logp`, `teacher_logp`, or any
      other name, which lands in `Experience.extras` for a loss to read).
    role: whose weights it takes: 'policy', 'reference' or 'teacher'.
    fn: (params, experience) -> [B, T] (jitted by its builder), or {field name: [B, T]} for a
      pass that fills several fields from the same forwards; the producer masks each with
      the loss mask.
    """

    field: str
    role: str
    fn: Callable[[Any, Experience], Array | dict[str, Array]]


# name -> builder(**context) -> LogprobPass; the trainer passes graphdefs and layouts.
PASSES = Registry("log-prob pass")


def logprob_pass(
    field: str, role: str, logp_fn, mlp_masks=None, replay_routing: bool = False
) -> LogprobPass:
    """A pass from a `forward.make_logp_fn`; mlp_masks(dropout_keys) -> [L, B, F] or None
    runs it under the rollout's Dropout-GRPO masks (the policy's own sub-networks);
    replay_routing: an MoE policy's forward routes each token to the experts the rollout
    recorded (`Experience.routing`, when present: `model.moe.routing_replay = 'rollout'`)."""

    def fn(params, exp: Experience):
        masks = None if mlp_masks is None else mlp_masks(exp.dropout_keys)
        routing = exp.routing if replay_routing else None
        return logp_fn(params, exp.tokens, exp.attention_mask, masks, routing)

    return LogprobPass(field, role, fn)


# extras a pass leaves for the mismatch metrics (`run_passes` takes them out again)
SAMPLER_LOGP, LEARNER_LOGP = "sampler_logp", "learner_logp"


def run_passes(
    passes: Sequence[LogprobPass], weights: dict, exp: Experience
) -> tuple[Experience, dict[str, Array]]:
    """(`exp` with each pass's arrays, masked to the policy's tokens, filled in: old_logp /
    ref_logp / teacher_logp in place, any other field in `extras`; the train/rollout
    mismatch metrics, `diagnostics.logp_mismatch`, when a pass measured them, else {})."""
    for p in passes:
        out = p.fn(weights[p.role], exp)
        for name, value in (out if isinstance(out, dict) else {p.field: out}).items():
            value = value * exp.loss_mask
            if name in ("old_logp", "ref_logp", "teacher_logp"):
                exp = exp.replace(**{name: value})
            else:
                exp = exp.replace(extras={**exp.extras, name: value})
    extras = dict(exp.extras)
    if SAMPLER_LOGP in extras:  # old_logp recomputed; the sampler's kept beside it
        pair = (extras.pop(SAMPLER_LOGP), exp.old_logp)
    elif LEARNER_LOGP in extras:  # the sampler's old_logp kept; a probe beside it
        pair = (exp.old_logp, extras.pop(LEARNER_LOGP))
    else:
        return exp, {}
    return exp.replace(extras=extras), logp_mismatch(*pair, exp.loss_mask)


@PASSES.register("behaviour")
def behaviour_pass(
    *, policy_logp_fn, mlp_masks=None, measure_mismatch=False, replay_routing=False, **_
):
    """old_logp recomputed by the trainer's forward (`train.recompute_old_logp`), not the
    sampler's: removes the sampler/trainer numerics mismatch from the ratio. measure_mismatch:
    the sampler's values are kept for the mismatch metrics (not when an editor changed the
    tokens they were sampled for). replay_routing (R3): an MoE policy's forward takes the
    rollout's recorded experts, as the update's does, so old_logp and the update's log-probs
    share the routing the tokens were sampled with."""
    recompute = logprob_pass("old_logp", "policy", policy_logp_fn, mlp_masks, replay_routing)
    if not measure_mismatch:
        return recompute

    def fn(params, exp: Experience):
        return {"old_logp": recompute.fn(params, exp), SAMPLER_LOGP: exp.old_logp}

    return LogprobPass("old_logp", "policy", fn)


@PASSES.register("mismatch_probe")
def mismatch_probe_pass(*, policy_logp_fn, mlp_masks=None, replay_routing=False, **_):
    """The trainer's log-probs of the sampled tokens beside the sampler's (which the loss
    keeps): one more policy forward a step, for the mismatch metrics only
    (`train.measure_mismatch` without `train.recompute_old_logp`); replay_routing as the
    behaviour pass (the mismatch measured is then the one the replaying update sees)."""
    return logprob_pass(LEARNER_LOGP, "policy", policy_logp_fn, mlp_masks, replay_routing)


@PASSES.register("reference")
def reference_pass(*, policy_logp_fn, mlp_masks=None, **_):
    """ref_logp: the frozen starting policy (KL penalties, the progress advantage). An MoE
    reference routes with its own router, never the rollout's recorded experts: those are
    the current policy's choices, and forcing them would score the tokens under a hybrid
    (the reference's experts picked by the policy's router), not the reference the KL
    penalty measures against."""
    return logprob_pass("ref_logp", "reference", policy_logp_fn, mlp_masks)


@PASSES.register("teacher")
def teacher_pass(*, teacher_logp_fn, **_):
    """teacher_logp: the teacher on the student's own samples (OPD); an MoE teacher routes
    with its own router (the recorded experts are the student's choices). Several teachers
    (`teacher_logp_fn` a tuple, the role's weights a tuple in the same order): each runs over
    the batch and each row keeps its own teacher's log-probs,
        teacher_logp[b, t] = sum_k [teacher_index[b, t] = k] logp_k[b, t]."""
    if not isinstance(teacher_logp_fn, tuple):
        return logprob_pass("teacher_logp", "teacher", teacher_logp_fn)

    def fn(weights, exp: Experience):
        index = exp.extras[TEACHER_INDEX]
        logps = [f(w, exp.tokens, exp.attention_mask) for f, w in zip(teacher_logp_fn, weights)]
        return sum(jnp.where(index == k, logp, 0.0) for k, logp in enumerate(logps))

    return LogprobPass("teacher_logp", "teacher", fn)


@PASSES.register("self_conditioned")
def self_conditioned_pass(
    *,
    scored_logp_fn,
    group_size: int,
    completion_len: int,
    correct_column: int,
    hidden_fn=None,
    vocab_chunk: int = 2048,
    **_,
):
    """SC-GRPO's pass ("Learning from Own Solutions: Self-Conditioned Credit Assignment for
    RLVR"): each completion teacher-forced after its group's first verified solution
    (`self_conditioning.conditioned_rows`: [prompt | solution | completion]),

        sc_logp[b, t] = log pi(y_bt | prompt_g, solution_g, y_b<t),
        sc_kl[b, t]   = KL( pi(. | prompt_g, y_b<t) || pi(. | prompt_g, solution_g, y_b<t) ),

    the KL a sum over the vocabulary in chunks of `vocab_chunk` (`rollout.sc_vocab_chunk`),
    from the hidden states of the plain and the conditioned forward. A group with no correct
    completion takes sc_logp = old_logp and sc_kl = 0, so SC-GRPO's weight is 1 there.
    Computed once per rollout with the sampling weights, as the behaviour log-probs are (the
    weight holds it constant). Runs when the objective needs `sc_kl` or `sc_logp`.

    hidden_fn: `forward.apply_hidden(graphdef)`; given, fn returns {'sc_logp', 'sc_kl'} (both
    from the same two forwards); without it only sc_logp, through `scored_logp_fn`.
    """
    tn = completion_len

    # jitted over arrays, not the Experience: its host fields (results, texts) are static
    # pytree metadata, and a change there would recompile
    def rows(tokens, mask, rewards):
        correct = rewards[:, correct_column] > 0
        return conditioned_rows(tokens, mask, correct, group_size=group_size, completion_len=tn)

    @jax.jit
    def logp_only(params, tokens, mask, rewards, old_logp):
        b, t = tokens.shape
        sc_tokens, sc_mask, solved = rows(tokens, mask, rewards)
        logp = scored_logp_fn(params, sc_tokens, sc_mask)[:, t:]  # the completion's Tn
        logp = jnp.where(solved[:, None], logp, old_logp[:, t - tn :])
        return jnp.concatenate([jnp.zeros((b, t - tn), logp.dtype), logp], axis=1)

    @jax.jit
    def with_kl(params, tokens, mask, rewards, old_logp):
        b, t = tokens.shape
        tp = t - tn
        sc_tokens, sc_mask, solved = rows(tokens, mask, rewards)
        h_u, w_out = hidden_fn(params, tokens, mask)
        h_c, _ = hidden_fn(params, sc_tokens, sc_mask)
        # positions t - 1 predict token t: the completion's Tn tokens on each side
        h_u = h_u[:, tp - 1 : t - 1].reshape(b * tn, -1)
        h_c = h_c[:, tp + tn - 1 : t + tn - 1].reshape(b * tn, -1)
        y = tokens[:, tp:].reshape(-1)
        kl, logq = chunked_kl_and_logp(h_u, h_c, w_out, y, vocab_chunk=vocab_chunk)
        kl, logq = kl.reshape(b, tn), logq.reshape(b, tn)
        zeros = jnp.zeros((b, tp), jnp.float32)
        sc_logp = jnp.where(solved[:, None], logq, old_logp[:, tp:])
        sc_kl = jnp.where(solved[:, None], kl, 0.0)
        return dict(
            sc_logp=jnp.concatenate([zeros, sc_logp], 1), sc_kl=jnp.concatenate([zeros, sc_kl], 1)
        )

    inner = logp_only if hidden_fn is None else with_kl

    def fn(params, exp: Experience):
        return inner(params, exp.tokens, exp.attention_mask, exp.rewards, exp.old_logp)

    return LogprobPass("sc_logp", "policy", fn)
