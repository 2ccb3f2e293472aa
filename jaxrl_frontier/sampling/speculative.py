"""Speculative rollouts: a draft proposes k tokens, the policy verifies them in one forward,
and rejection sampling keeps every emitted token an exact sample of the policy (Leviathan,
Kalman & Matias 2023, "Fast Inference from Transformers via Speculative Decoding"; Chen et
al. 2023, "Accelerating LLM Decoding with Speculative Sampling"). One round, per row (x_n
emitted, not yet in the policy's cache):

    draft     d_i ~ q_i = q(. | x_<=n, d_<i)                 i = 1..k   (k small forwards)
    verify    p_1..p_{k+1} = policy([x_n, d_1, .., d_k])                (ONE forward)
    accept    d_i while u_i < p_i(d_i) / q_i(d_i); a = leading accepts
    correct   t ~ norm(max(0, p_{a+1} - q_{a+1})) if a < k, else t ~ p_{k+1} (the bonus)
    emit      d_1..d_a, t                                       (1 .. k+1 tokens)

p, q: both models' sampling distributions, so the tokens follow the `Sampler`'s (greedy:
the point-mass case). Linear-attention layers (Qwen3.5's Gated DeltaNet) hold a recurrent
state that a rejected draft cannot be taken out of: the verify forward keeps each such
layer's state after every one of its k + 1 tokens (`KVCache.keep_steps`, by the
token-by-token rule; the weights are still read once) and the round keeps the state after
its last accepted token; the draft keeps its proposals' states the same way.

A `Sampler` subclass on its pieces; the model runs under `jax.vmap`
over rows with per-row cache slots (`forward_rows`; stale slots of rejected drafts are
rewritten before they are read), so one device only, and no Dropout-GRPO masks. It pays
where a (k+1)-token forward costs about a one-token one (an accelerator), not on a CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxrl_frontier.core.capabilities import Capabilities
from jaxrl_frontier.core.xla_options import rollout_compiler_options
from jaxrl_frontier.models import model_forms
from jaxrl_frontier.models.hybrid import model_class
from jaxrl_frontier.models.multi_token import MultiTokenPredictor
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.sampling import mtp_draft, ops
from jaxrl_frontier.sampling.params import Knobs, Plan, SamplingParams
from jaxrl_frontier.sampling.records import DEFAULT_PROMPT_BUCKETS, Rollout, make_rollout
from jaxrl_frontier.sampling.sampler import DecodeState, Sampler, as_key, forward_rows


def shallow_draft(model: Transformer, num_layers: int) -> Transformer:
    """The policy cut after `num_layers` blocks (early exit), on the policy's own variables
    (its config runs only the first layers): the policy's state paths, no extra memory."""
    cfg = model.cfg
    low = cfg.first_k_dense_replace + 1  # DeepSeek-V3: its dense layers and an MoE one
    if not low <= num_layers <= cfg.num_layers:
        raise ValueError(f"num_layers={num_layers}; must be in [{low}, {cfg.num_layers}]")
    shallow = cfg.replace(num_layers=num_layers)
    draft = nnx.eval_shape(lambda: model_class(shallow)(shallow, rngs=nnx.Rngs(0)))
    draft.embed, draft.layers, draft.final_norm = model.embed, model.layers, model.final_norm
    if cfg.first_k_dense_replace:  # DeepSeek-V3's dense first layers: a stack of their own
        draft.dense_layers = model.dense_layers
    if not cfg.tie_word_embeddings:
        draft.lm_head = model.lm_head
    return draft


def _picker(greedy: bool):
    """pick(q_logits [B, V], u [B]) -> one token per row of sampling logits: the argmax, or
    the draw of uniform u."""

    def pick(q_logits, u):
        argmax = jnp.argmax(q_logits, axis=-1).astype(jnp.int32)
        return argmax if greedy else ops.inverse_cdf(q_logits, u)[0]

    return pick


def _check_draft(draft, cfg) -> None:
    """A draft proposes in the policy's vocabulary; an MTP module reads its hidden states."""
    if draft.cfg.vocab_size != cfg.vocab_size:
        raise ValueError(f"draft vocab {draft.cfg.vocab_size} != {cfg.vocab_size}")
    if isinstance(draft, MultiTokenPredictor) and draft.cfg.hidden_size != cfg.hidden_size:
        raise ValueError(
            f"multi-token-prediction module of width {draft.cfg.hidden_size}: the policy's "
            f"hidden states are {cfg.hidden_size} wide (another checkpoint's module?)"
        )


def _write_rows(buf, values, start):
    """buf [B, W] <- values [B, m] at per-row columns [start_b, start_b + m)."""
    return jax.vmap(lambda b, x, s: jax.lax.dynamic_update_slice(b, x, (s,)))(buf, values, start)


@flax.struct.dataclass
class SpeculativeState(DecodeState):
    """`DecodeState` over rounds (cache: the policy's and the draft's; token: x_n), with prev
    int32 [B] (x_{n-1}), live_rounds (rows running, summed over rounds), accepted int32 [],
    carried: a multi-token-prediction draft's input (`mtp_draft.Carried`; None otherwise)."""

    prev: jax.Array = None
    live_rounds: jax.Array = None
    accepted: jax.Array = None
    carried: tuple | None = None


class SpeculativeSampler(Sampler):
    """A `Sampler` whose decode lets a `draft` (a `Transformer` of the same vocabulary; N:
    `shallow_draft(policy, N)`, following `update_weights`; or the checkpoint's
    `MultiTokenPredictor`, on the policy's embedding and head: sampling/mtp_draft.py)
    propose `k` tokens per policy forward; mesh: None or one device. `stats`: the last
    rollout's acceptance_rate, tokens_per_policy_forward, rounds, policy_forwards,
    draft_tokens_proposed / _accepted."""

    capabilities = Capabilities.all_but(
        partial_rows="the rows start in its idle slots",
        environment="an environment's turns are sampled by the plain sampler",
        routing_record="the experts are recorded by the plain sampler only",
    )

    def __init__(
        self,
        policy: Transformer,
        draft: Transformer | MultiTokenPredictor | int,
        *,
        pad_id: int,
        k: int = 4,
        mesh: Mesh | None = None,
        prompt_buckets: Sequence[int] = DEFAULT_PROMPT_BUCKETS,
        batch_buckets: Sequence[int] | None = None,
        cache_dtype: str | None = None,
        dtype: str | None = None,
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
        _check_draft(draft, policy.cfg)
        kw = dict(pad_id=pad_id, prompt_buckets=prompt_buckets, batch_buckets=batch_buckets,
                  cache_dtype=cache_dtype, dtype=dtype)  # fmt: skip
        super().__init__(policy, mesh=mesh, **kw)
        self.mtp = isinstance(draft, MultiTokenPredictor)
        # a multi-token-prediction module runs inside the policy's programs (its input is
        # the policy's hidden states); another draft has a sampler's prefill of its own
        self.proposer = draft if self.mtp else Sampler(draft, mesh=mesh, **kw)
        if self.mtp and dtype is not None:  # the module computes in the sampler's dtype too
            draft = model_forms.with_compute_dtype(draft, dtype)
        self.draft_graphdef = nnx.graphdef(draft) if self.mtp else None
        self.k, self.stats = int(k), {}
        self.stats_prefix = "rollout/speculative_"  # the stats' metric names
        kw = dict(compiler_options=dict(rollout_compiler_options(self.platform, 1)))
        self.speculate = jax.jit(
            self._speculate, static_argnames="plan", donate_argnames="caches", **kw
        )

    def update_weights(self, model_or_state, version: int | None = None) -> None:
        """As `Sampler.update_weights`, for the policy (and a draft that follows it)."""
        super().update_weights(model_or_state, version)
        if self.draft_follows_policy:
            self.proposer.update_weights(model_or_state, version)

    def draft_weights(self):
        """The `nnx.State` the next `generate` drafts from."""
        return nnx.state(self.proposer) if self.mtp else self.proposer.weights()

    def draft_model(self, state):
        """The draft a decode loop runs (as `Sampler.decode_model`)."""
        if not self.mtp:
            return self.proposer.decode_model(state)
        mtp = nnx.merge(self.draft_graphdef, state)
        return model_forms.unstack_layers(model_forms.with_compute_weights(mtp))

    def _drafted(self, draft, policy, s: SpeculativeState, at, u, pick, sampling):
        """One round's proposals (d_1..d_k [B, k], their sampling logits [B, k, V], the
        draft's cache): the MTP module's on the carried states, or the draft model's fed
        [x_{n-1}, x_n]. at: x_n's (position, slot) [B] each; u, pick, sampling: as
        `_propose` takes them."""
        d_cache, k = s.cache[1], self.k
        if self.mtp:
            return mtp_draft.propose(draft, policy, d_cache, s.carried, at, u, k, pick, sampling)
        fed = (jnp.stack([s.prev, s.token], 1), *at)
        return _propose(draft, d_cache, fed, u, k, pick, sampling)

    def _speculate(
        self, states, caches, logits0, prompt_len, prompts, key, knobs, version, hidden, *, plan
    ):
        """Prefilled caches -> (`Rollout`, stats, final caches); see the module docstring.
        caches: (the policy's, the draft's: None for a multi-token-prediction draft, whose
        prefill runs here on `hidden`, the policy's states over the prompts [P, Tp, D])."""
        policy, draft = self.decode_model(states[0]), self.draft_model(states[1])
        k, tn, pad = self.k, plan.max_new_tokens, self.pad_id
        num_rows, tp = logits0.shape[0], prompts[0].shape[1]
        first_keys, streams = ops.row_keys(key, num_rows, knobs.first_row)

        u0 = jax.vmap(lambda kk: jax.random.uniform(kk, ()))(first_keys)
        # a round writes up to k + 1 columns from column n <= Tn - 1
        state = SpeculativeState.start(caches, num_rows, tn + k + 1, pad)
        state = state.emit(*ops.draw(logits0, u0, plan, knobs), knobs.stop_ids, pad)
        if self.mtp:  # the module's prefill: the prompts' pairs, from the policy's states
            d_cache, carried = mtp_draft.prefill(
                draft, policy, hidden, prompts, state.token, self.cache_dtype, n=plan.n,
                slots=tn + k, k=k,
            )  # fmt: skip
            state = state.replace(cache=(caches[0], d_cache), carried=carried)
        prev = jnp.repeat(prompts[0][:, -1], plan.n)  # the first round's x_{n-1}
        state = state.replace(prev=prev, live_rounds=state.step * 0, accepted=state.step * 0)

        def speculation_round(s: SpeculativeState) -> SpeculativeState:
            n, live = s.lengths, ~s.done & (s.lengths < tn)
            p_cache, d_cache = s.cache
            # k draft uniforms, k acceptance uniforms, the correction's
            uniform = lambda kk: jax.random.uniform(jax.random.fold_in(kk, s.step), (2 * k + 1,))
            u = jax.vmap(uniform)(streams)
            pos, slot = prompt_len + n - 1, tp + n - 1  # position and slot of x_n
            # -- draft: k proposals
            sampling = lambda z: ops.sampling_logits(z, plan, knobs)  # noqa: E731
            pick, at = _picker(plan.greedy), (pos, slot)
            drafts, q_logits, d_cache = self._drafted(draft, policy, s, at, u, pick, sampling)

            # -- verify: one policy forward over [x_n, d_1, .., d_k]
            verify = jnp.concatenate([s.token[:, None], drafts], 1)  # [B, k+1]
            positions = pos[:, None] + jnp.arange(k + 1)
            (p_raw, p_hidden), p_cache = forward_rows(
                policy, verify, positions, p_cache.replace(keep_steps=True), slot, hidden=True
            )
            p_logits = ops.sampling_logits(p_raw, plan, knobs)  # [B, k+1, V]

            # -- accept the longest prefix, then one corrected (or bonus) token
            a, t = _accept(p_logits, q_logits, drafts, u, k, plan.greedy)
            # linear layers keep the state after x_n, d_1..d_a (the policy's, which the
            # next round continues from t) and after x_{n-1}, x_n, d_1..d_{a-1} (the
            # draft's, which the next round re-feeds its last two tokens)
            p_cache, d_cache = p_cache.at_step(a), d_cache if self.mtp else d_cache.at_step(a)

            # -- emit d_1..d_a, t; cut at the first stop token and at max_new_tokens
            emitted, keep, stops, count = _emitted(drafts, a, t, live, tn - n, knobs.stop_ids, pad)
            policy_logp = jnp.where(keep, ops.log_prob(p_raw, emitted), 0.0)
            sample_logp = jnp.where(keep & (not plan.greedy), ops.log_prob(p_logits, emitted), 0.0)
            columns = (emitted, policy_logp, sample_logp)
            back = lambda i: jnp.take_along_axis(emitted, jnp.maximum(count - i, 0)[:, None], 1)
            last_two = (back(1)[:, 0], back(2)[:, 0])
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
                carried=_carried(p_hidden, emitted, a, count) if self.mtp else None,
            )

        running = lambda s: ~jnp.all(s.done | (s.lengths >= tn))
        s = jax.lax.while_loop(running, speculation_round, state)
        out = tuple(x[:, :tn] for x in s.out)
        record = dict(n=plan.n, version=version, dropout_keys=None)
        rollout = make_rollout(*prompts, out, s.lengths, s.done, **record)
        return rollout, _round_stats(s, k, num_rows), s.cache

    def generate(
        self,
        prompt_tokens,
        prompt_mask,
        params: SamplingParams,
        key: jax.Array,
        *,
        policy_version: int | None = None,
        first_row: int = 0,
    ) -> Rollout:
        """As `Sampler.generate` (B = P * n rows, prompt-major); the stats go to `stats`."""
        if params.dropout_rate > 0.0:
            raise ValueError("SpeculativeSampler does not support dropout_rate > 0")
        owner = "SpeculativeSampler"
        prompts, num_prompts = self.pad_prompts(prompt_tokens, prompt_mask, owner)
        plan, knobs, key = Plan.of(params), Knobs.of(params, first_row), as_key(key)
        states = (self.weights(), self.draft_weights())
        prefill = dict(n=plan.n, use_dropout=False, slots=plan.max_new_tokens + self.k)
        if self.mtp:  # the module's prefill runs in the decode, on the prompts' states
            p_cache, logits0, lengths, hidden = self.prefill(
                states[0], *prompts, key, knobs, hidden=True, **prefill
            )
            d_cache = None
        else:
            p_cache, logits0, lengths = self.prefill(states[0], *prompts, key, knobs, **prefill)
            hidden = None
            # the draft's cache stops before the prompt's last token: each round feeds the
            # draft its last two tokens (a linear layer's state must not count one twice)
            before_last = (prompts[0], prompts[1].at[:, -1].set(0))
            d_cache, _, _ = self.proposer.prefill(states[1], *before_last, key, knobs, **prefill)
        version = np.int32(self.policy_version if policy_version is None else policy_version)
        rollout, self.stats, _ = self.speculate(
            states, (p_cache, d_cache), logits0, lengths, prompts, key, knobs, version, hidden,
            plan=plan,
        )  # fmt: skip
        return rollout.take_rows(num_prompts * plan.n)


def _propose(draft, cache, fed, u, k: int, pick, sampling):
    """One round's draft: fed = (tokens [B, 2]: x_{n-1}, x_n; pos [B]: x_n's position;
    slot [B]: its cache slot), u [B, 2k+1] the round's uniforms, pick(q, u) -> a token per
    row, sampling(logits) -> sampling logits. -> (d_1..d_k [B, k], their sampling logits
    [B, k, V], the cache), the cache holding each linear layer's states after x_{n-1}, x_n,
    d_1..d_{k-1} ([B, k + 1, ...], `KVCache.keep_steps`) for the round to keep its
    accepted one (`KVCache.at_step`)."""
    tokens, pos, slot = fed
    positions = jnp.stack([pos - 1, pos], 1)
    logits, cache = forward_rows(draft, tokens, positions, cache.replace(keep_steps=True), slot - 1)
    fed_states = (cache.conv, cache.delta)  # after x_{n-1}, after x_n
    q1 = sampling(logits[:, 1])
    d1 = pick(q1, u[:, 0])

    def draft_step(carry, i):  # d_i at slot + i, position pos + i -> d_{i+1}
        (cache, tok), at = carry, (pos + i)[:, None]
        logits, cache = forward_rows(draft, tok[:, None], at, cache, slot + i)
        q = sampling(logits[:, 0])
        nxt = pick(q, jax.lax.dynamic_index_in_dim(u, i, 1, False))
        return (cache, nxt), (nxt, q, (cache.conv, cache.delta))

    carry = (cache.at_step(jnp.ones_like(pos)), d1)
    (cache, _), (ds, qs, step_states) = jax.lax.scan(draft_step, carry, jnp.arange(1, k))
    drafts = jnp.concatenate([d1[:, None], jnp.moveaxis(ds, 0, 1)], 1)  # [B, k]
    q_logits = jnp.concatenate([q1[:, None], jnp.moveaxis(qs, 0, 1)], 1)  # [B, k, V]
    steps = lambda f, d: jnp.concatenate([f, jnp.moveaxis(d, 0, 1)], 1)  # noqa: E731
    conv, delta = jax.tree.map(steps, fed_states, step_states)
    return drafts, q_logits, cache.replace(conv=conv, delta=delta, keep_steps=True)


def _carried(p_hidden, emitted, a, count) -> mtp_draft.Carried:
    """A multi-token-prediction draft's next catch-up input from the verify's hidden states
    [B, k+1, D], the round's emitted tokens [B, k+1] and accepts [B] (a row that stopped
    short of a + 1 tokens keeps its columns in range, unread)."""
    return p_hidden, emitted, jnp.clip(a, 0, jnp.maximum(count - 1, 0))


def _round_stats(s: SpeculativeState, k: int, num_rows: int) -> dict:
    """The decode's acceptance rate, rounds, tokens per policy forward (the prefill one of
    them) and draft tokens proposed and accepted."""
    proposed, per_row = k * s.live_rounds, jnp.sum(s.lengths) / (num_rows + s.live_rounds)
    stats = dict(acceptance_rate=s.accepted / jnp.maximum(proposed, 1), rounds=s.step - 1)
    stats.update(tokens_per_policy_forward=per_row, policy_forwards=s.step)  # prefill: 1
    stats.update(draft_tokens_proposed=proposed, draft_tokens_accepted=s.accepted)
    return stats


def _accept(p_logits, q_logits, drafts, u, k: int, greedy: bool):
    """(a [B]: the drafts accepted, t [B]: the corrected or bonus token) of one round:
    p_logits [B, k+1, V] the policy's sampling logits over [x_n, d_1..d_k], q_logits
    [B, k, V] the draft's, drafts [B, k], u [B, 2k+1] the round's uniforms. Greedy: the
    longest prefix equal to the policy's argmax, then its next argmax; sampled: d_i kept
    with probability min(1, p/q), then a draw from the residual max(p - q, 0)."""
    target = jnp.argmax(p_logits, axis=-1).astype(jnp.int32)  # [B, k+1], greedy
    log_ratio = ops.log_prob(p_logits[:, :k], drafts) - ops.log_prob(q_logits, drafts)
    accept = drafts == target[:, :k] if greedy else u[:, k : 2 * k] < jnp.exp(log_ratio)
    a = jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=1), axis=1)  # [B] in [0, k]
    if greedy:
        return a, jnp.take_along_axis(target, a[:, None], 1)[:, 0]
    p = jax.nn.softmax(p_logits, axis=-1)  # [B, k+1, V]
    # q_{k+1} = 0: the residual after k accepts is p_{k+1}
    q = jnp.concatenate([jax.nn.softmax(q_logits, -1), jnp.zeros_like(p[:, :1])], 1)
    p_a = jnp.take_along_axis(p, a[:, None, None], 1)[:, 0]  # [B, V]
    residual = jnp.maximum(p_a - jnp.take_along_axis(q, a[:, None, None], 1)[:, 0], 0.0)
    # a rejection with an all-zero residual means p == q up to rounding: use p
    residual = jnp.where(jnp.sum(residual, -1, keepdims=True) > 0, residual, p_a)
    return a, ops.inverse_cdf(jnp.log(residual), u[:, 2 * k])[0]


def _emitted(drafts, a, t, live, room, stop_ids, pad: int):
    """(emitted [B, k+1] (pad past the count), keep [B, k+1], stops [B, k+1], count [B]):
    d_1..d_a then t, cut after the first stop token and at `room` tokens [B]."""
    k = drafts.shape[1]
    col = jnp.arange(k + 1)
    emitted = jnp.where(col < a[:, None], jnp.pad(drafts, ((0, 0), (0, 1))), t[:, None])
    stops = ops.is_stop(emitted, stop_ids) & (col <= a[:, None])
    stop_at = jnp.where(jnp.any(stops, 1), jnp.argmax(stops, 1), k + 1)
    count = jnp.where(live, jnp.minimum(jnp.minimum(a + 1, stop_at + 1), room), 0)
    keep = col < count[:, None]
    return jnp.where(keep, emitted, pad), keep, stops, count
