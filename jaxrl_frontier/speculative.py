"""Speculative rollouts: a draft model proposes k tokens, the policy verifies them in one
forward, and rejection sampling keeps every emitted token an exact sample of the policy.

Leviathan, Kalman & Matias (2023), "Fast Inference from Transformers via Speculative
Decoding"; Chen et al. (2023), "Accelerating LLM Decoding with Speculative Sampling".
In RL post-training the rollout is the bottleneck; the Bebop paper (seeds: "Breaking
Entropy Bounds: Accelerating RL Training via MTP with Rejection Sampling") finds that
probabilistic rejection (rather than greedy draft matching) is what keeps acceptance up
as the policy's entropy moves.

One round, per row (x_1..x_n emitted so far, `last` = x_n not yet in the policy's cache):

    draft     q_i = q(. | x_<=n, d_<i),  d_i ~ q_i           i = 1..k   (k small forwards)
    verify    p_1..p_{k+1} = policy([x_n, d_1, .., d_k])                (ONE forward, k+1 tokens)
    accept    d_i while u_i < p_i(d_i) / q_i(d_i)  (u_i ~ U[0, 1)); a = leading accepts
    correct   t ~ norm(max(0, p_{a+1} - q_{a+1}))   if a < k
              t ~ p_{k+1}                           if a = k   (the bonus token)
    emit      d_1..d_a, t                                       (1 .. k+1 tokens)

p and q are the *sampling* distributions: softmax(truncate(logits / T)) of each model with
the same temperature and truncation (`SamplingParams`), so the emitted tokens are exactly
distributed as the normal `Sampler`'s. Greedy is the point-mass case: accept d_i iff it is
the policy's argmax, t = the policy's argmax. Each emitted token carries
log p_T(y) (`sample_logp`) and the plain policy log p(y) at temperature 1 (`policy_logp`,
the behaviour log-prob for RL), both read off the verify forward.

Per-row cache slots. Rows accept different numbers of tokens, so after one round they sit
at different lengths; the model's `KVCache` writes every row at one shared slot. Here the
model is called under `jax.vmap` over rows with a per-row slot index (a batch of one per
call; the shared-slot write becomes a per-row scatter). Slot layout per row: the prompt in
slots [0, Tp) (left-padded; `valid` masks the padding), completion token j in slot Tp + j.
Rejected draft tokens leave stale keys/values in slots past the row's frontier; they need
no invalidation: a query in slot s attends only to slots <= s (causal in slot space, and
slot order is time order within a row), and every slot between the frontier and s is
rewritten in the same call before it is read.

The draft's cache trails the policy's: after a round the draft has not seen t (and, when all
k were accepted, not d_k either). Each round's first draft call therefore feeds two tokens,
[x_{n-1}, x_n], at their slots; rewriting x_{n-1} when it was already cached is harmless
(the same token at the same position gives the same keys/values).

Everything is one jitted call: prefill of both models, then a `lax.while_loop` over rounds
(a `lax.scan` over the k-1 single-token draft steps inside), until every row has stopped or
holds max_new_tokens tokens. Shapes are static: the caches have Tp + Tn + k slots.

Speed. A round costs k draft forwards plus one (k+1)-token policy forward and emits
1 + (accepted) tokens per row; it pays off where a policy forward costs about the same for
k+1 tokens as for one (memory-bound decoding on an accelerator) and the draft is much cheaper
than the policy. On a CPU the (k+1)-token forward costs ~1.6x a one-token forward and the
speed-up is not there (scripts/bench_speculative.py). Rows wait for the slowest row of the
batch (the loop runs until every row is done). Not done yet: the plain Sampler's
cache-growing decode chunks (attention here always reads all Tp + Tn + k slots), meshes,
Dropout-GRPO masks, and batch buckets (each batch size compiles once).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_frontier.models.transformer import (
    KVCache,
    Transformer,
    unstack_layers,
    with_compute_weights,
)
from jaxrl_frontier.sampling import (
    DEFAULT_PROMPT_BUCKETS,
    FinishReason,
    Rollout,
    SamplingParams,
    left_pad_prompts,
    truncate_logits,
)
from jaxrl_frontier.xla_options import rollout_compiler_options

# ----------------------------------------------------------------------------- draft


def shallow_draft(model: Transformer, num_layers: int) -> Transformer:
    """A draft that is the policy cut after `num_layers` blocks: the policy's embedding, its
    first `num_layers` blocks, its final norm and its output head (early exit).

    The parameters are shared, not copied: the draft holds the policy's own variables (its
    stacked layers too; its config's `num_layers` makes its forwards run only the first
    ones), so it follows the policy's weights through training with no extra memory.
    """
    cfg = model.cfg
    if not 1 <= num_layers <= cfg.num_layers:
        raise ValueError(f"num_layers={num_layers}; must be in [1, {cfg.num_layers}]")
    draft = nnx.eval_shape(
        lambda: Transformer(cfg.replace(num_layers=num_layers), rngs=nnx.Rngs(0))
    )
    draft.embed = model.embed
    draft.layers = model.layers
    draft.final_norm = model.final_norm
    if not cfg.tie_word_embeddings:
        draft.lm_head = model.lm_head
    return draft


# ----------------------------------------------------------------------------- helpers


def forward_rows(model: Transformer, tokens, positions, cache: KVCache, index):
    """Run T new tokens per row, written at per-row cache slots [index_b, index_b + T).

    tokens, positions: int32 [B, T]; index: int32 [B]. `cache.index` is ignored (and kept).
    Returns (logits f32 [B, T, V], cache with the new keys/values and `valid` set there).
    """

    def one_row(tok, pos, k, v, valid, idx):
        add_row = functools.partial(jax.tree.map, lambda x: x[None])  # per-layer [1, K, S, Dh]
        row = KVCache(k=add_row(k), v=add_row(v), valid=valid[None], index=idx)
        logits, row = model(tok[None], None, positions=pos[None], cache=row)
        drop_row = functools.partial(jax.tree.map, lambda x: x[0])
        return logits[0], drop_row(row.k), drop_row(row.v), row.valid[0]

    logits, k, v, valid = jax.vmap(one_row)(  # every array has the row axis first
        tokens, positions, cache.k, cache.v, cache.valid, index
    )
    return logits, KVCache(k=k, v=v, valid=valid, index=cache.index)


def _log_prob(logits, token):
    """log softmax(logits)[token] over the last axis; token has logits' leading shape."""
    picked = jnp.take_along_axis(logits, token[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def _write_rows(buf, values, start):
    """buf [B, W] <- values [B, m] at per-row columns [start_b, start_b + m)."""
    return jax.vmap(lambda b, x, s: jax.lax.dynamic_update_slice(b, x, (s,)))(buf, values, start)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything static about one compiled speculative rollout (besides shapes)."""

    k: int
    max_new_tokens: int
    greedy: bool
    top_k: int
    use_top_p: bool
    use_min_p: bool
    num_stop_ids: int
    pad_id: int
    cast_weights_once: bool = True


# ----------------------------------------------------------------------------- the rollout


def _generate(
    graphdefs, policy_state, draft_state, tokens, mask, key, stop_ids, temperature, top_p, min_p,
    *, plan: _Plan,
):  # fmt: skip
    """Prompts [B, Tp] -> (rollout fields, stats); jitted by `_jitted_generate`, one compile
    per (architectures, plan, shapes, compiler options), shared by every sampler (a draft
    equal in shape to the policy reuses it)."""
    policy = nnx.merge(graphdefs[0], policy_state)
    draft = nnx.merge(graphdefs[1], draft_state)
    if plan.cast_weights_once:  # as in `Sampler`: out of the decode loop
        policy, draft = with_compute_weights(policy), with_compute_weights(draft)
    # per-layer weights and caches, read and written in place by every round (`Sampler`)
    policy, draft = unstack_layers(policy), unstack_layers(draft)
    k, tn, pad = plan.k, plan.max_new_tokens, plan.pad_id
    num_rows, tp = tokens.shape
    num_slots = tp + tn + k  # the furthest write: slot Tp + (Tn - 1) + k, by a stopped row
    width = tn + k + 1  # output buffers: a round writes k + 1 columns from column n
    rows = jnp.arange(num_rows)

    def sampling_logits(logits):
        """The sampling distribution's logits: temperature, then truncation."""
        if plan.greedy:  # only the argmax matters (and temperature may be 0)
            return logits.astype(jnp.float32)
        return truncate_logits(
            logits.astype(jnp.float32) / temperature,
            plan.top_k,
            top_p if plan.use_top_p else 1.0,
            min_p if plan.use_min_p else 0.0,
        )

    def sample(logits, keys):
        """logits [B, V] (sampling logits), keys [B] -> tokens int32 [B]."""
        if plan.greedy:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return jax.vmap(jax.random.categorical)(keys, logits).astype(jnp.int32)

    # Per-row key streams (a row's completion does not depend on the rest of the batch).
    row_keys = jax.vmap(lambda r: jax.random.fold_in(key, r))(rows)
    pair = jax.vmap(jax.random.split)(row_keys)  # [B, 2]
    first_keys, stream_keys = pair[:, 0], pair[:, 1]

    # -- prefill: both models over the prompt (slots [0, Tp)), first token from the policy
    prompt_len = jnp.sum(mask, axis=1, dtype=jnp.int32)
    hidden, p_cache = policy.hidden_states(
        tokens, mask, cache=policy.init_cache(num_rows, num_slots)
    )
    _, d_cache = draft.hidden_states(tokens, mask, cache=draft.init_cache(num_rows, num_slots))
    logits0 = policy.logits(hidden[:, -1])  # left padding: column Tp-1 is the last real one
    q0 = sampling_logits(logits0)
    y0 = sample(q0, first_keys)

    def is_stop(tok):
        return jnp.any(tok[..., None] == stop_ids, axis=-1)

    out_tokens = jnp.full((num_rows, width), pad, jnp.int32).at[:, 0].set(y0)
    out_policy_logp = jnp.zeros((num_rows, width), jnp.float32)
    out_policy_logp = out_policy_logp.at[:, 0].set(_log_prob(logits0, y0))
    out_sample_logp = jnp.zeros((num_rows, width), jnp.float32)
    if not plan.greedy:
        out_sample_logp = out_sample_logp.at[:, 0].set(_log_prob(q0, y0))
    state = dict(
        p_cache=p_cache,
        d_cache=d_cache,
        prev=tokens[:, -1],  # x_{n-1}: here the last prompt token (slot Tp - 1)
        last=y0,  # x_n: emitted, not yet in either cache
        n=jnp.ones((num_rows,), jnp.int32),  # tokens emitted so far
        done=is_stop(y0) | (tn <= 1),
        out=(out_tokens, out_policy_logp, out_sample_logp),
        round=jnp.zeros((), jnp.int32),
        live_rounds=jnp.zeros((), jnp.int32),  # sum over rounds of the rows still running
        accepted=jnp.zeros((), jnp.int32),  # draft tokens accepted by running rows
    )

    def speculation_round(s):
        n, live = s["n"], ~s["done"]
        keys = jax.vmap(lambda kk: jax.random.split(jax.random.fold_in(kk, s["round"]), k + 2))(
            stream_keys
        )  # [B, k + 2]: k draft samples, the acceptance uniforms, the correction

        # -- draft: k proposals. First call: [x_{n-1}, x_n] at slots Tp+n-2, Tp+n-1.
        pos = prompt_len + n - 1  # position of x_n
        slot = tp + n - 1  # slot of x_n
        logits, d_cache = forward_rows(
            draft,
            jnp.stack([s["prev"], s["last"]], 1),
            jnp.stack([pos - 1, pos], 1),
            s["d_cache"],
            slot - 1,
        )
        q1 = sampling_logits(logits[:, 1])
        d1 = sample(q1, keys[:, 0])

        def draft_step(carry, i):  # d_i at slot + i, position pos + i -> d_{i+1}
            d_cache, tok = carry
            logits, d_cache = forward_rows(
                draft, tok[:, None], (pos + i)[:, None], d_cache, slot + i
            )
            q = sampling_logits(logits[:, 0])
            nxt = sample(q, keys[:, i])
            return (d_cache, nxt), (nxt, q)

        (d_cache, _), (d_rest, q_rest) = jax.lax.scan(draft_step, (d_cache, d1), jnp.arange(1, k))
        drafts = jnp.concatenate([d1[:, None], jnp.moveaxis(d_rest, 0, 1)], 1)  # [B, k]
        q_logits = jnp.concatenate([q1[:, None], jnp.moveaxis(q_rest, 0, 1)], 1)  # [B, k, V]

        # -- verify: one policy forward over [x_n, d_1, .., d_k]
        verify = jnp.concatenate([s["last"][:, None], drafts], 1)  # [B, k+1]
        p_raw, p_cache = forward_rows(
            policy, verify, pos[:, None] + jnp.arange(k + 1), s["p_cache"], slot
        )
        p_logits = sampling_logits(p_raw)  # [B, k+1, V]

        # -- accept the longest prefix, then one corrected (or bonus) token
        if plan.greedy:
            target = jnp.argmax(p_logits, axis=-1).astype(jnp.int32)  # [B, k+1]
            accept = drafts == target[:, :k]
        else:
            ratio = jnp.exp(_log_prob(p_logits[:, :k], drafts) - _log_prob(q_logits, drafts))
            u = jax.vmap(lambda kk: jax.random.uniform(kk, (k,)))(keys[:, k])
            accept = u < ratio
        a = jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=1), axis=1)  # [B] in [0, k]
        if plan.greedy:
            t = jnp.take_along_axis(target, a[:, None], 1)[:, 0]
        else:
            p = jax.nn.softmax(p_logits, axis=-1)  # [B, k+1, V]
            q = jnp.concatenate(  # q_{k+1} = 0: the residual after k accepts is p_{k+1}
                [jax.nn.softmax(q_logits, axis=-1), jnp.zeros_like(p[:, :1])], 1
            )
            p_a = jnp.take_along_axis(p, a[:, None, None], 1)[:, 0]  # [B, V]
            q_a = jnp.take_along_axis(q, a[:, None, None], 1)[:, 0]
            residual = jnp.maximum(p_a - q_a, 0.0)
            # a rejection with an all-zero residual means p == q up to rounding: use p
            residual = jnp.where(jnp.sum(residual, -1, keepdims=True) > 0, residual, p_a)
            t = jax.vmap(jax.random.categorical)(keys[:, k + 1], jnp.log(residual))
            t = t.astype(jnp.int32)

        # -- emit d_1..d_a, t; cut at the first stop token and at max_new_tokens
        col = jnp.arange(k + 1)
        emitted = jnp.where(col < a[:, None], jnp.pad(drafts, ((0, 0), (0, 1))), t[:, None])
        stops = is_stop(emitted) & (col <= a[:, None])
        stop_at = jnp.where(jnp.any(stops, 1), jnp.argmax(stops, 1), k + 1)
        count = jnp.minimum(jnp.minimum(a + 1, stop_at + 1), tn - n)
        count = jnp.where(live, count, 0)
        keep = col < count[:, None]
        emitted = jnp.where(keep, emitted, pad)
        policy_logp = jnp.where(keep, _log_prob(p_raw, emitted), 0.0)
        sample_logp = jnp.where(keep, _log_prob(p_logits, emitted), 0.0)
        if plan.greedy:
            sample_logp = jnp.zeros_like(sample_logp)  # log 1: q is a point mass
        out = tuple(
            _write_rows(buf, x, n) for buf, x in zip(s["out"], (emitted, policy_logp, sample_logp))
        )

        # -- advance: x_n <- the last token emitted, x_{n-1} <- the one before it
        n_new = n + count
        last = jnp.take_along_axis(emitted, jnp.maximum(count - 1, 0)[:, None], 1)[:, 0]
        before = jnp.take_along_axis(emitted, jnp.maximum(count - 2, 0)[:, None], 1)[:, 0]
        prev = jnp.where(count >= 2, before, s["last"])
        return dict(
            p_cache=p_cache,
            d_cache=d_cache,
            prev=jnp.where(live, prev, s["prev"]),
            last=jnp.where(live, last, s["last"]),
            n=n_new,
            done=s["done"] | jnp.any(stops & keep, 1) | (n_new >= tn),
            out=out,
            round=s["round"] + 1,
            live_rounds=s["live_rounds"] + jnp.sum(live, dtype=jnp.int32),
            accepted=s["accepted"] + jnp.sum(jnp.where(live, a, 0)),
        )

    state = jax.lax.while_loop(lambda s: ~jnp.all(s["done"]), speculation_round, state)

    lengths = state["n"]
    tokens_out, policy_logp, sample_logp = (x[:, :tn] for x in state["out"])
    stopped = jnp.take_along_axis(tokens_out, jnp.maximum(lengths - 1, 0)[:, None], 1)[:, 0]
    finish = jnp.where(is_stop(stopped), FinishReason.STOP, FinishReason.LENGTH)
    live_rounds = jnp.maximum(state["live_rounds"], 1)
    stats = dict(
        acceptance_rate=state["accepted"] / (k * live_rounds),
        # emitted tokens per (row, policy forward); the prefill forward emits one token
        tokens_per_policy_forward=jnp.sum(lengths) / (num_rows + state["live_rounds"]),
        rounds=state["round"],
        # batched policy forwards (prefill + verifies): the normal sampler needs Tn
        policy_forwards=state["round"] + 1,
        draft_tokens_proposed=k * state["live_rounds"],
        draft_tokens_accepted=state["accepted"],
    )
    rollout = dict(
        completion_tokens=tokens_out,
        completion_mask=(jnp.arange(tn)[None, :] < lengths[:, None]).astype(jnp.int32),
        lengths=lengths,
        finish_reason=finish.astype(jnp.int32),
        policy_logp=policy_logp,
        sample_logp=sample_logp,
    )
    return rollout, stats


@functools.cache
def _jitted_generate(compiler_options: tuple[tuple[str, str], ...]):
    """`_generate` under jit with these XLA options (one jit object per option set)."""
    return jax.jit(
        _generate, static_argnames=("graphdefs", "plan"), compiler_options=dict(compiler_options)
    )


# ----------------------------------------------------------------------------- sampler


class SpeculativeSampler:
    """Rollouts from `policy`, sped up by a `draft` proposing `k` tokens per policy forward.

    The emitted tokens are distributed exactly as the plain `Sampler`'s (same
    `SamplingParams`: temperature, top-k/top-p/min-p, greedy, stop ids, n); the `Rollout`
    has the same fields. Not supported: Dropout-GRPO masks (`dropout_rate > 0`) and meshes
    (single device).

    Args:
      policy: the target `Transformer`; its parameters are read at every `generate`.
      draft: a `Transformer` with the same vocabulary (e.g. the SFT student, or
        `shallow_draft(policy, 1)`); it may be the policy itself (acceptance rate 1).
      pad_id: token id written after the end of a completion.
      k: draft tokens proposed per round.
      prompt_buckets: prompt lengths compiled for (left-padded to the smallest that fits).
      compiler_options: XLA options for the rollout program, as in `Sampler` (None: the
        backend's `xla_options.rollout_compiler_options`; {}: XLA's defaults).
      cast_weights_once: as in `Sampler`: with bf16 compute on f32 parameters, cast both
        models' weight matrices once per rollout instead of at every use.
    """

    def __init__(
        self,
        policy: Transformer,
        draft: Transformer,
        *,
        pad_id: int,
        k: int = 4,
        prompt_buckets=DEFAULT_PROMPT_BUCKETS,
        compiler_options: dict | None = None,
        cast_weights_once: bool = True,
    ):
        if k < 1:
            raise ValueError(f"k={k}; must be >= 1")
        if draft.cfg.vocab_size != policy.cfg.vocab_size:
            raise ValueError(
                f"draft vocab_size={draft.cfg.vocab_size} != policy vocab_size="
                f"{policy.cfg.vocab_size}"
            )
        self.policy, self.draft = policy, draft
        self.pad_id, self.k = int(pad_id), int(k)
        self.cast_weights_once = bool(cast_weights_once)
        self.prompt_buckets = tuple(sorted(int(b) for b in prompt_buckets))
        self.policy_version = 0
        if compiler_options is None:
            compiler_options = rollout_compiler_options()
        self.compiler_options = dict(compiler_options)
        self._generate = _jitted_generate(tuple(sorted(self.compiler_options.items())))

    def plan(self, params: SamplingParams) -> _Plan:
        if params.dropout_rate > 0.0:
            raise ValueError("SpeculativeSampler does not support dropout_rate > 0")
        return _Plan(
            k=self.k,
            max_new_tokens=params.max_new_tokens,
            greedy=params.greedy,
            top_k=params.top_k,
            use_top_p=params.top_p < 1.0,
            use_min_p=params.min_p > 0.0,
            num_stop_ids=params.stop_id_slots,
            pad_id=self.pad_id,
            cast_weights_once=self.cast_weights_once,
        )

    # -- public ------------------------------------------------------------------------------
    def generate(
        self,
        prompt_tokens,
        prompt_mask,
        params: SamplingParams,
        key: jax.Array,
        *,
        policy_version: int | None = None,
    ) -> tuple[Rollout, dict]:
        """Sample `params.n` completions for each of P left-padded host prompts [P, T].

        Returns (Rollout of B = P * n rows, prompt-major, like `Sampler.generate`; stats):
          acceptance_rate            accepted / proposed draft tokens (rows still running)
          tokens_per_policy_forward  emitted tokens per (row, policy forward); 1 without
                                     speculation
          rounds, policy_forwards    speculation rounds; batched policy forwards (+ prefill)
          draft_tokens_proposed, draft_tokens_accepted
        Stats are device scalars (no host sync).
        """
        plan = self.plan(params)
        tokens, mask = left_pad_prompts(
            prompt_tokens,
            prompt_mask,
            pad_id=self.pad_id,
            prompt_buckets=self.prompt_buckets,
            owner="SpeculativeSampler",
        )
        tokens, mask = np.repeat(tokens, params.n, 0), np.repeat(mask, params.n, 0)
        if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.wrap_key_data(key)
        stop_ids = np.full((plan.num_stop_ids,), -1, np.int32)  # -1 never matches a token
        stop_ids[: len(params.all_stop_ids)] = params.all_stop_ids
        f32 = np.float32
        out, stats = self._generate(
            (nnx.graphdef(self.policy), nnx.graphdef(self.draft)),
            nnx.state(self.policy),
            nnx.state(self.draft),
            jnp.asarray(tokens),
            jnp.asarray(mask),
            key,
            jnp.asarray(stop_ids),
            f32(params.temperature),
            f32(params.top_p),
            f32(params.min_p),
            plan=plan,
        )
        version = self.policy_version if policy_version is None else policy_version
        rollout = Rollout(
            prompt_tokens=jnp.asarray(tokens),
            prompt_mask=jnp.asarray(mask),
            policy_mask=out["completion_mask"],
            policy_version=jnp.full((tokens.shape[0],), version, jnp.int32),
            group_size=params.n,
            **out,
        )
        return rollout, stats
