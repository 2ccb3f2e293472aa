"""Speculative rollouts: a draft model proposes k tokens, the policy verifies them in one
forward, and rejection sampling keeps every emitted token an exact sample of the policy.

Leviathan, Kalman & Matias (2023), "Fast Inference from Transformers via Speculative
Decoding"; Chen et al. (2023), "Accelerating LLM Decoding with Speculative Sampling".
Probabilistic rejection (not greedy draft matching) keeps acceptance up as the policy's
entropy moves (Bebop: "Breaking Entropy Bounds: Accelerating RL Training via MTP with
Rejection Sampling").

One round, per row (x_1..x_n emitted so far, `last` = x_n not yet in the policy's cache):

    draft     q_i = q(. | x_<=n, d_<i),  d_i ~ q_i           i = 1..k   (k small forwards)
    verify    p_1..p_{k+1} = policy([x_n, d_1, .., d_k])                (ONE forward, k+1 tokens)
    accept    d_i while u_i < p_i(d_i) / q_i(d_i)  (u_i ~ U[0, 1)); a = leading accepts
    correct   t ~ norm(max(0, p_{a+1} - q_{a+1}))   if a < k
              t ~ p_{k+1}                           if a = k   (the bonus token)
    emit      d_1..d_a, t                                       (1 .. k+1 tokens)

p and q are the sampling distributions of the two models (`ops.sampling_logits`: the same
temperature and truncation), so the emitted tokens are distributed exactly as the
`Sampler`'s; greedy is the point-mass case (accept d_i iff it is the policy's argmax). Every
draw is `ops.inverse_cdf` on the row's uniforms; `sample_logp` and `policy_logp` are read off
the verify forward.

Built on the `Sampler`'s pieces: its prompt padding and batch buckets, its prefill program
(for both models, with k extra cache slots), its decode model (weights cast once, layers
unstacked), the named loop state (`SpeculativeState`, a `DecodeState` whose `step` counts
rounds and whose `lengths` are per row) and `make_rollout`.

Per-row cache slots. Rows accept different numbers of tokens, so after a round they sit at
different lengths, while the model's `KVCache` writes every row at one shared slot: here
the model runs under `jax.vmap` over rows with a per-row slot index (`forward_rows`). Row
slots: the prompt in [0, Tp), completion token j in slot Tp + j. Rejected draft tokens
leave stale keys/values past the row's frontier; a query in slot s attends only to slots
<= s and every slot between the frontier and s is rewritten in the same call before it is
read. The draft's cache trails the policy's by up to two tokens, so each round's first
draft call feeds [x_{n-1}, x_n] (rewriting a cached x_{n-1} gives the same keys/values).

Single device: the per-row vmap does not split over a mesh (a mesh of more than one device
is refused with an error), and Dropout-GRPO masks are not supported. It pays off where a
(k+1)-token policy forward costs about a one-token forward (memory-bound decoding on an
accelerator) and the draft is much cheaper than the policy; on a CPU it does not.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrl_frontier.models.transformer import KVCache, Transformer
from jaxrl_frontier.sampling import ops
from jaxrl_frontier.sampling.params import Knobs, Plan, SamplingParams
from jaxrl_frontier.sampling.rollout import DEFAULT_PROMPT_BUCKETS, Rollout, make_rollout
from jaxrl_frontier.sampling.sampler import DecodeState, Sampler, as_key


def shallow_draft(model: Transformer, num_layers: int) -> Transformer:
    """The policy cut after `num_layers` blocks (early exit): its embedding, first blocks,
    final norm and head. The variables are the policy's own (its stacked layers too; the
    draft's config makes its forwards run only the first ones), so the draft's state has the
    policy's paths and follows its weights through training with no extra memory."""
    cfg = model.cfg
    if not 1 <= num_layers <= cfg.num_layers:
        raise ValueError(f"num_layers={num_layers}; must be in [1, {cfg.num_layers}]")
    draft = nnx.eval_shape(
        lambda: Transformer(cfg.replace(num_layers=num_layers), rngs=nnx.Rngs(0))
    )
    draft.embed, draft.layers, draft.final_norm = model.embed, model.layers, model.final_norm
    if not cfg.tie_word_embeddings:
        draft.lm_head = model.lm_head
    return draft


def forward_rows(model: Transformer, tokens, positions, cache: KVCache, index):
    """T new tokens per row written at per-row slots [index_b, index_b + T).

    tokens, positions: int32 [B, T]; index: int32 [B]. Returns (logits f32 [B, T, V], the
    cache with the new keys/values and `valid` set there; `cache.index` kept)."""

    def one_row(tok, pos, k, v, valid, idx):
        add_row = functools.partial(jax.tree.map, lambda x: x[None])  # per layer [1, K, S, Dh]
        row = KVCache(k=add_row(k), v=add_row(v), valid=valid[None], index=idx)
        logits, row = model(tok[None], None, positions=pos[None], cache=row)
        drop_row = functools.partial(jax.tree.map, lambda x: x[0])
        return logits[0], drop_row(row.k), drop_row(row.v), row.valid[0]

    logits, k, v, valid = jax.vmap(one_row)(tokens, positions, cache.k, cache.v, cache.valid, index)
    return logits, KVCache(k=k, v=v, valid=valid, index=cache.index)


def _write_rows(buf, values, start):
    """buf [B, W] <- values [B, m] at per-row columns [start_b, start_b + m)."""
    return jax.vmap(lambda b, x, s: jax.lax.dynamic_update_slice(b, x, (s,)))(buf, values, start)


@flax.struct.dataclass
class SpeculativeState(DecodeState):
    """`DecodeState` over rounds: `step` counts rounds, `cache` is (policy's, draft's),
    `token` is x_n (emitted, in neither cache yet), `lengths` the tokens each row emitted.

    prev:        int32 [B]  x_{n-1}, fed again with x_n in the round's first draft call
    live_rounds: int32 []   sum over rounds of the rows still running
    accepted:    int32 []   draft tokens accepted by running rows
    """

    prev: jax.Array = None
    live_rounds: jax.Array = None
    accepted: jax.Array = None


class SpeculativeSampler:
    """Rollouts from `policy`, sped up by a `draft` proposing `k` tokens per policy forward.

    The emitted tokens are distributed exactly as the plain `Sampler`'s (same
    `SamplingParams`), and `generate` returns the same `Rollout`; `stats` holds the last
    rollout's figures (device scalars): acceptance_rate (accepted / proposed draft tokens),
    tokens_per_policy_forward (per row; 1 without speculation), rounds, policy_forwards
    (batched: prefill + verifies), draft_tokens_proposed, draft_tokens_accepted.

    Args:
      policy: the target `Transformer`; its parameters are read at every `generate`.
      draft: a `Transformer` with the same vocabulary (e.g. an SFT student), or an int N:
        `shallow_draft(policy, N)`, which follows the weights `update_weights` gives.
      pad_id, prompt_buckets, batch_buckets, cache_dtype: as in `Sampler`.
      k: draft tokens proposed per round.
      mesh: None or a one-device mesh (speculative rollouts are single-device).
    """

    def __init__(
        self,
        policy: Transformer,
        draft: Transformer | int,
        *,
        pad_id: int,
        k: int = 4,
        mesh: Mesh | None = None,
        prompt_buckets: Sequence[int] = DEFAULT_PROMPT_BUCKETS,
        batch_buckets: Sequence[int] | None = None,
        cache_dtype: str | None = None,
    ):
        if mesh is not None and mesh.size > 1:
            raise ValueError(
                f"SpeculativeSampler (config key 'rollout.speculative') runs on one device, not "
                f"on mesh {dict(mesh.shape)}: set rollout.speculative.draft = None, or give the "
                "rollouts one device (rollout.devices = 1, or mesh.num_devices = 1)"
            )
        if k < 1:
            raise ValueError(f"k={k}; must be >= 1")
        self.draft_follows_policy = isinstance(draft, int)
        draft = shallow_draft(policy, draft) if self.draft_follows_policy else draft
        if draft.cfg.vocab_size != policy.cfg.vocab_size:
            raise ValueError(
                f"draft vocab_size={draft.cfg.vocab_size} != policy vocab_size="
                f"{policy.cfg.vocab_size}"
            )
        kw = dict(pad_id=pad_id, prompt_buckets=prompt_buckets, batch_buckets=batch_buckets)
        self.target = Sampler(policy, mesh=mesh, cache_dtype=cache_dtype, **kw)
        self.proposer = Sampler(draft, mesh=mesh, cache_dtype=cache_dtype, **kw)
        self.pad_id, self.k = int(pad_id), int(k)
        self.stats: dict = {}
        self.speculate = jax.jit(
            self._speculate, static_argnames=("plan",), donate_argnames=("caches",)
        )

    @property
    def policy_version(self) -> int:
        return self.target.policy_version

    def update_weights(self, model_or_state, version: int | None = None) -> None:
        """As `Sampler.update_weights`, for the policy (and a draft that follows it)."""
        self.target.update_weights(model_or_state, version)
        if self.draft_follows_policy:
            self.proposer.update_weights(model_or_state, version)

    def _speculate(
        self, states, caches, logits0, prompt_len, prompts, key, knobs, version, *, plan
    ):
        """Prefilled caches -> (`Rollout`, stats, final caches); see the module docstring."""
        policy, draft = self.target.decode_model(states[0]), self.proposer.decode_model(states[1])
        k, tn, pad = self.k, plan.max_new_tokens, self.pad_id
        num_rows, tp = logits0.shape[0], prompts[0].shape[1]
        first_keys, streams = ops.row_keys(key, num_rows)

        def pick(q_logits, u):  # one token per row of sampling logits [B, V]
            if plan.greedy:
                return jnp.argmax(q_logits, axis=-1).astype(jnp.int32)
            return ops.inverse_cdf(q_logits, u)[0]

        u0 = jax.vmap(lambda kk: jax.random.uniform(kk, ()))(first_keys)
        y0, sample_logp0, policy_logp0 = ops.draw(logits0, u0, plan, knobs)
        width = tn + k + 1  # a round writes up to k + 1 columns from column n <= Tn - 1
        out = (jnp.full((num_rows, width), pad, jnp.int32), *[jnp.zeros((num_rows, width))] * 2)
        out = tuple(buf.at[:, 0].set(x) for buf, x in zip(out, (y0, policy_logp0, sample_logp0)))
        zero = jnp.zeros((), jnp.int32)
        state = SpeculativeState(
            step=zero,
            cache=caches,
            token=y0,
            done=ops.is_stop(y0, knobs.stop_ids),
            lengths=jnp.ones((num_rows,), jnp.int32),
            out=out,
            prev=jnp.repeat(prompts[0][:, -1], plan.n),  # x_{n-1}: the last prompt token
            live_rounds=zero,
            accepted=zero,
        )

        def speculation_round(s: SpeculativeState) -> SpeculativeState:
            n, live = s.lengths, ~s.done & (s.lengths < tn)
            p_cache, d_cache = s.cache
            # k draft uniforms, k acceptance uniforms, the correction's
            u = jax.vmap(
                lambda kk: jax.random.uniform(jax.random.fold_in(kk, s.step), (2 * k + 1,))
            )(streams)
            pos, slot = prompt_len + n - 1, tp + n - 1  # position and slot of x_n
            # -- draft: k proposals; the first call feeds [x_{n-1}, x_n]
            pair = (jnp.stack([s.prev, s.token], 1), jnp.stack([pos - 1, pos], 1))
            logits, d_cache = forward_rows(draft, *pair, d_cache, slot - 1)
            q1 = ops.sampling_logits(logits[:, 1], plan, knobs)
            d1 = pick(q1, u[:, 0])

            def draft_step(carry, i):  # d_i at slot + i, position pos + i -> d_{i+1}
                d_cache, tok = carry
                logits, d_cache = forward_rows(
                    draft, tok[:, None], (pos + i)[:, None], d_cache, slot + i
                )
                q = ops.sampling_logits(logits[:, 0], plan, knobs)
                nxt = pick(q, jax.lax.dynamic_index_in_dim(u, i, 1, False))
                return (d_cache, nxt), (nxt, q)

            (d_cache, _), (d_rest, q_rest) = jax.lax.scan(
                draft_step, (d_cache, d1), jnp.arange(1, k)
            )
            drafts = jnp.concatenate([d1[:, None], jnp.moveaxis(d_rest, 0, 1)], 1)  # [B, k]
            q_logits = jnp.concatenate([q1[:, None], jnp.moveaxis(q_rest, 0, 1)], 1)  # [B, k, V]

            # -- verify: one policy forward over [x_n, d_1, .., d_k]
            verify = jnp.concatenate([s.token[:, None], drafts], 1)  # [B, k+1]
            p_raw, p_cache = forward_rows(
                policy, verify, pos[:, None] + jnp.arange(k + 1), p_cache, slot
            )
            p_logits = ops.sampling_logits(p_raw, plan, knobs)  # [B, k+1, V]

            # -- accept the longest prefix, then one corrected (or bonus) token
            if plan.greedy:
                target = jnp.argmax(p_logits, axis=-1).astype(jnp.int32)  # [B, k+1]
                accept = drafts == target[:, :k]
            else:
                ratio = jnp.exp(
                    ops.log_prob(p_logits[:, :k], drafts) - ops.log_prob(q_logits, drafts)
                )
                accept = u[:, k : 2 * k] < ratio
            a = jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=1), axis=1)  # [B] in [0, k]
            if plan.greedy:
                t = jnp.take_along_axis(target, a[:, None], 1)[:, 0]
            else:
                p = jax.nn.softmax(p_logits, axis=-1)  # [B, k+1, V]
                q = jnp.concatenate(  # q_{k+1} = 0: the residual after k accepts is p_{k+1}
                    [jax.nn.softmax(q_logits, axis=-1), jnp.zeros_like(p[:, :1])], 1
                )
                p_a = jnp.take_along_axis(p, a[:, None, None], 1)[:, 0]  # [B, V]
                residual = jnp.maximum(p_a - jnp.take_along_axis(q, a[:, None, None], 1)[:, 0], 0.0)
                # a rejection with an all-zero residual means p == q up to rounding: use p
                residual = jnp.where(jnp.sum(residual, -1, keepdims=True) > 0, residual, p_a)
                t = ops.inverse_cdf(jnp.log(residual), u[:, 2 * k])[0]

            # -- emit d_1..d_a, t; cut at the first stop token and at max_new_tokens
            col = jnp.arange(k + 1)
            emitted = jnp.where(col < a[:, None], jnp.pad(drafts, ((0, 0), (0, 1))), t[:, None])
            stops = ops.is_stop(emitted, knobs.stop_ids) & (col <= a[:, None])
            stop_at = jnp.where(jnp.any(stops, 1), jnp.argmax(stops, 1), k + 1)
            count = jnp.where(live, jnp.minimum(jnp.minimum(a + 1, stop_at + 1), tn - n), 0)
            keep = col < count[:, None]
            emitted = jnp.where(keep, emitted, pad)
            policy_logp = jnp.where(keep, ops.log_prob(p_raw, emitted), 0.0)
            sample_logp = jnp.where(keep & (not plan.greedy), ops.log_prob(p_logits, emitted), 0.0)
            columns = (emitted, policy_logp, sample_logp)
            last_two = [
                jnp.take_along_axis(emitted, jnp.maximum(count - i, 0)[:, None], 1)[:, 0]
                for i in (1, 2)
            ]
            return s.replace(
                step=s.step + 1,
                cache=(p_cache, d_cache),
                token=jnp.where(live, last_two[0], s.token),
                prev=jnp.where(count >= 2, last_two[1], jnp.where(live, s.token, s.prev)),
                done=s.done | jnp.any(stops & keep, 1),
                lengths=n + count,
                out=tuple(_write_rows(buf, x, n) for buf, x in zip(s.out, columns)),
                live_rounds=s.live_rounds + jnp.sum(live, dtype=jnp.int32),
                accepted=s.accepted + jnp.sum(jnp.where(live, a, 0)),
            )

        s = jax.lax.while_loop(
            lambda s: ~jnp.all(s.done | (s.lengths >= tn)), speculation_round, state
        )
        rollout = make_rollout(
            *prompts, tuple(x[:, :tn] for x in s.out), s.lengths, s.done, n=plan.n, version=version
        )
        stats = dict(
            acceptance_rate=s.accepted / (k * jnp.maximum(s.live_rounds, 1)),
            # emitted tokens per (row, policy forward); the prefill forward emits one token
            tokens_per_policy_forward=jnp.sum(s.lengths) / (num_rows + s.live_rounds),
            rounds=s.step,
            policy_forwards=s.step + 1,
            draft_tokens_proposed=k * s.live_rounds,
            draft_tokens_accepted=s.accepted,
        )
        return rollout, stats, s.cache

    def generate(
        self,
        prompt_tokens,
        prompt_mask,
        params: SamplingParams,
        key: jax.Array,
        *,
        policy_version: int | None = None,
    ) -> Rollout:
        """As `Sampler.generate` (B = P * n rows, prompt-major); the stats go to `stats`."""
        if params.dropout_rate > 0.0:
            raise ValueError("SpeculativeSampler does not support dropout_rate > 0")
        prompts, num_prompts = self.target.pad_prompts(
            prompt_tokens, prompt_mask, "SpeculativeSampler"
        )
        plan, knobs, key = Plan.of(params), Knobs.of(params), as_key(key)
        states = (self.target.weights(), self.proposer.weights())
        prefill = dict(n=plan.n, use_dropout=False, slots=plan.max_new_tokens + self.k)
        p_cache, logits0, prompt_len = self.target.prefill(
            states[0], *prompts, key, knobs, **prefill
        )
        d_cache, _, _ = self.proposer.prefill(states[1], *prompts, key, knobs, **prefill)
        version = np.int32(self.policy_version if policy_version is None else policy_version)
        rollout, self.stats, _ = self.speculate(
            states, (p_cache, d_cache), logits0, prompt_len, prompts, key, knobs, version, plan=plan
        )
        num_rows = num_prompts * plan.n
        if num_rows != rollout.completion_tokens.shape[0]:  # drop the batch-bucket padding rows
            rollout = jax.tree.map(lambda x: x[:num_rows], rollout)
        return rollout


def make_sampler(model: Transformer, rollout, *, pad_id: int, mesh: Mesh | None = None):
    """The sampler a `rollout` config section asks for: a `SpeculativeSampler` when
    `rollout.speculative.draft` is set (the policy's first `draft` layers propose
    `rollout.speculative.k` tokens a round), else a `Sampler`; KV cache in
    `rollout.cache_dtype`."""
    spec = rollout.get("speculative") or {}
    kw = dict(pad_id=pad_id, mesh=mesh, cache_dtype=rollout.get("cache_dtype") or None)
    if spec.get("draft") is None:
        return Sampler(model, **kw)
    return SpeculativeSampler(model, int(spec["draft"]), k=int(spec.get("k", 4)), **kw)
