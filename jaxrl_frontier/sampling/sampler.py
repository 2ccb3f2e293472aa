"""Rollouts: one jitted prefill and one jitted decode loop over a fixed-size KV cache.

    prefill  cache[P, Tp], logits_0 = model(prompt[P, Tp]), each prompt once; the cache
             repeated n times (B = P * n rows, prompt-major) and widened to Tp + Tn slots
    decode   y_0 ~ q(. | logits_0); while s < Tn and some row runs:
             logits_s = model(y_{s-1} at slot Tp+s-1, position len+s-1), y_s ~ q(. | logits_s)

The decode runs in phases (`decode_windows`): phase j is one `lax.while_loop` over a named
state (`DecodeState`) with a cache of W_j slots, just enough for its last step, grown to
W_{j+1} between phases; a step attends to the cache the rows have filled (rounded up to its
phase), not to the capacity of the whole rollout. Within a phase the cache is updated in
place; weights cast to the compute dtype once and split per layer (scanned on fsdp meshes).
Row r draws from `fold_in(key, r)`. Details: docs/sampling.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from jaxrl_frontier.core import sharding as shd
from jaxrl_frontier.core.capabilities import Capabilities
from jaxrl_frontier.core.xla_options import rollout_compiler_options
from jaxrl_frontier.models import model_forms
from jaxrl_frontier.models.kv_cache import KVCache
from jaxrl_frontier.models.sliding_cache import to_ring
from jaxrl_frontier.models.transformer import Transformer
from jaxrl_frontier.sampling import ops
from jaxrl_frontier.sampling import records as ro
from jaxrl_frontier.sampling.params import Knobs, Plan, SamplingParams

CACHE_DTYPES = (None, "float32", "bfloat16")
COMPUTE_DTYPES = (None, "float32", "bfloat16")
WINDOW_MULTIPLE = 8  # window sizes are rounded up to this many slots (vector-friendly)


def decode_windows(prompt_len: int, max_new_tokens: int, phases: int) -> tuple[int, ...]:
    """The cache sizes W_1 < ... < W_m = Tp + Tn of a decode in `phases` phases (m <= phases).

    Step s = 1 .. Tn-1 feeds token s-1 at slot Tp+s-1 and attends to slots [0, Tp+s), so
    a phase with W slots runs the steps s <= W - Tp. The steps are split evenly, each bound
    rounded up to a multiple of `WINDOW_MULTIPLE` slots; the last is the whole rollout's.
    With P phases a step reads at most Tn / P + 8 slots it does not need.
    """
    if phases < 1:
        raise ValueError(f"decode phases={phases}; must be >= 1")
    size, steps = prompt_len + max_new_tokens, max_new_tokens - 1
    m = WINDOW_MULTIPLE
    bounds = {-(-(prompt_len + -(-j * steps // phases)) // m) * m for j in range(1, phases)}
    return tuple(sorted({min(size, b) for b in bounds} | {size}))


@flax.struct.dataclass
class DecodeState:
    """The decode loop's carry: step int32 [] (the next token's index), cache, token int32
    [B] (the last emitted: the next input), done bool [B] (emitted a stop token), lengths
    int32 [B], out = (tokens, policy_logp, sample_logp) [B, Tn] (pad_id / 0 past the end);
    routing: int16 [B, Tn, L, k] the experts each fed completion token went to (-1: none),
    or None (not recorded)."""

    step: jax.Array
    cache: KVCache
    token: jax.Array
    done: jax.Array
    lengths: jax.Array
    out: tuple
    routing: jax.Array | None = None

    @classmethod
    def start(cls, cache: KVCache, num_rows: int, width: int, pad_id: int) -> DecodeState:
        row, buf = jnp.zeros((num_rows,), jnp.int32), jnp.zeros((num_rows, width))
        out = (jnp.full((num_rows, width), pad_id, jnp.int32), buf, buf)
        return cls(step=row[0], cache=cache, token=row, done=row > 0, lengths=row, out=out)

    def emit(self, token, sample_logp, policy_logp, stop_ids, pad_id: int) -> DecodeState:
        """Record token `step` for the rows still running; retire rows that stopped."""
        live = ~self.done
        token = jnp.where(live, token, pad_id)
        columns = (token, jnp.where(live, policy_logp, 0.0), jnp.where(live, sample_logp, 0.0))
        write = lambda b, c: jax.lax.dynamic_update_slice_in_dim(b, c[:, None], self.step, 1)
        out, lengths = tuple(map(write, self.out, columns)), self.lengths + live.astype(jnp.int32)
        done = self.done | (live & ops.is_stop(token, stop_ids))
        return self.replace(step=self.step + 1, token=token, done=done, lengths=lengths, out=out)


class Sampler:
    """Prompts -> a `Rollout` by one prefill and one decode program per (batch bucket, prompt
    bucket, `Plan`). model: read at every `generate` (on a mesh: `sharding.shard_model` it
    first); mesh: rows over data x fsdp, heads over tensor; prompt_buckets / batch_buckets:
    prompt lengths / counts compiled for (None: the count rounded up to the batch devices);
    cache_dtype: of the KV cache (None: the compute dtype; 'bfloat16' halves it);
    dtype: the sampler's compute dtype (None: the model's `cfg.dtype`); 'bfloat16' over f32
    weights samples from the weights rounded to bf16, in bf16, while the learner stays in
    f32 (`models.model_forms.with_compute_dtype`); its decode reads bf16 weights;
    decode_phases: the decode's cache sizes (`decode_windows`; 1: one cache of Tp + Tn
    slots for every step), each a trace of the step: more phases read less, compile
    longer; sliding_window_cache: a model's sliding-window layers (Gemma) decode from a ring
    of window slots (`models.sliding_cache`; not on fsdp meshes, whose decode is scanned),
    same tokens, a cache that does not grow with the completion; record_routing: a mixture
    of experts' rollouts carry each token's experts per layer (`Rollout.routing`, from the
    prefill and every decode step) for routing replay."""

    # the last batch's statistics (continuous, partial, speculative decodes set theirs)
    stats: Mapping[str, float] = MappingProxyType({})

    capabilities = Capabilities.all_but(partial_rows="the rows start in its idle slots")

    def __init__(
        self,
        model: Transformer,
        *,
        pad_id: int,
        mesh: Mesh | None = None,
        prompt_buckets: Sequence[int] = ro.DEFAULT_PROMPT_BUCKETS,
        batch_buckets: Sequence[int] | None = None,
        cache_dtype: str | None = None,
        dtype: str | None = None,
        decode_phases: int = 4,
        sliding_window_cache: bool = True,
        record_routing: bool = False,
    ):
        if dtype not in COMPUTE_DTYPES:
            raise ValueError(f"dtype={dtype!r}; allowed: {COMPUTE_DTYPES}")
        # the programs' module tree (its compute dtype); the weights stay the model's
        computing = model if dtype is None else model_forms.with_compute_dtype(model, dtype)
        self.model, self.cfg, self.pad_id, self.mesh = model, computing.cfg, int(pad_id), mesh
        if record_routing and not model.cfg.num_experts:
            raise ValueError("Sampler(record_routing=True): the model has no experts")
        self.record_routing = bool(record_routing)
        decode_windows(1, 2, decode_phases)  # validates the count
        self.decode_phases = int(decode_phases)
        self.prompt_buckets = tuple(sorted(int(b) for b in prompt_buckets))
        self.batch_multiple = 1 if mesh is None else shd.batch_size_multiple(mesh)
        self.batch_buckets = None if batch_buckets is None else tuple(sorted(batch_buckets))
        if any(b % self.batch_multiple for b in self.batch_buckets or ()):
            raise ValueError(
                f"batch_buckets {self.batch_buckets} must be multiples of the "
                f"{self.batch_multiple} devices on the batch axes of mesh {dict(mesh.shape)}"
            )
        if cache_dtype not in CACHE_DTYPES:
            raise ValueError(f"cache_dtype={cache_dtype!r}; allowed: {CACHE_DTYPES}")
        self.cache_dtype = None if cache_dtype is None else jnp.dtype(cache_dtype)
        self.policy_version = 0
        self._state = None  # explicit weights from update_weights, else the model's own
        self.graphdef = nnx.graphdef(computing)
        devices = None if mesh is None else set(mesh.devices.flat)
        if devices and any(
            set(x.sharding.device_set) != devices for x in jax.tree.leaves(nnx.state(model))
        ):
            raise ValueError(
                "the model's parameters are not placed on the sampler's mesh; call "
                "jaxrl_frontier.core.sharding.shard_model(model, mesh) first"
            )
        # fsdp-split weights: scan the layers (unstacked, XLA gathers every layer before the
        # loop); elsewhere per-layer weights are read in place (2.8x faster per step on CPU)
        self.scan_decode = mesh is not None and mesh.shape.get("fsdp", 1) > 1
        rings = sliding_window_cache and any(self.cfg.sliding_layers)
        self.ring_cache = rings and not self.scan_decode
        self.platform = (jax.devices() if mesh is None else mesh.devices.flat)[0].platform
        self._jits = {}  # (program, XLA options) -> jitted program
        # (SamplingParams, obs_tokens, max_turns) -> the multi-turn session over this sampler
        # that `TurnSession.shared` built (its compiled programs reused by later evaluations)
        self.turn_sessions: dict = {}

    def program(self, name: str, rows: int):
        """The jitted prefill or decode for matmuls of `rows` rows (XLA options per device)."""
        options = rollout_compiler_options(self.platform, rows // self.batch_multiple)
        if (name, options) not in self._jits:
            statics = dict(prefill=("n", "use_dropout", "slots", "hidden"), decode=("plan",))
            # a cache that grows between phases is a new buffer: nothing to donate
            # (nor with rings: the sliding layers' buffers change shape)
            one_cache = self.decode_phases == 1 and not self.ring_cache
            donate = ("cache",) if name == "decode" and one_cache else ()
            fn = getattr(self, f"{name}_body")
            self._jits[name, options] = jax.jit(
                fn,
                static_argnames=statics[name],
                donate_argnames=donate,
                compiler_options=dict(options),
            )
        return self._jits[name, options]

    def prefill(
        self, state, tokens, mask, key, knobs, *, n: int, use_dropout: bool, slots: int,
        hidden: bool = False,
    ):  # fmt: skip
        """The prefill program (`prefill_body`) for these prompts [P, Tp]."""
        run = self.program("prefill", tokens.size * (n if use_dropout else 1))
        statics = dict(n=n, use_dropout=use_dropout, slots=slots, hidden=hidden)
        return run(state, tokens, mask, key, knobs, **statics)

    def decode(self, state, cache, *args, plan: Plan):
        """The decode program (`decode_body`) for this prefilled cache (its buffers donated)."""
        return self.program("decode", cache.valid.shape[0])(state, cache, *args, plan=plan)

    def update_weights(self, model_or_state, version: int | None = None) -> None:
        """Sample from these weights from now on (rollouts stamped with `version`): a model
        live (read at every call), or an `nnx.State`, placed once on the sampler's mesh."""
        state = None if isinstance(model_or_state, nnx.Module) else model_or_state
        if state is None:
            self.model = model_or_state
        elif self.mesh is not None:
            state = jax.device_put(state, shd.state_shardings(state, self.mesh))
        self._state = state
        self.policy_version = self.policy_version if version is None else int(version)

    @staticmethod
    def merge_stats(per_process: list[dict]) -> dict:
        """Every process's `stats` of one batch (a subclass's, e.g. the speculative
        acceptance rate) -> one figure each: their mean (subclasses with counts override)."""
        return {k: sum(s[k] for s in per_process) / len(per_process) for k in per_process[0]}

    def weights(self):
        """The `nnx.State` the next `generate` samples from."""
        return self._state if self._state is not None else nnx.state(self.model)

    def constrain(self, x, logical_axes):
        if self.mesh is None:
            return x
        spec = shd.logical_to_spec(logical_axes, x.shape, self.mesh)
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    def constrain_cache(self, cache: KVCache) -> KVCache:
        kv_axes = ("batch", "kv_heads", None, None)  # per layer [B, K, S, Dh]
        return cache.replace(
            k=tuple(self.constrain(x, kv_axes) for x in cache.k),
            v=tuple(self.constrain(x, kv_axes) for x in cache.v),
            valid=self.constrain(cache.valid, ("batch", None)),
            ring_valid=None
            if cache.ring_valid is None
            else self.constrain(cache.ring_valid, ("batch", None)),
            # linear-attention layers' states (Qwen3.5): rows over the batch axes
            conv=jax.tree.map(lambda x: self.constrain(x, ("batch", None, None)), cache.conv),
            delta=jax.tree.map(
                lambda x: self.constrain(x, ("batch", None, None, None)), cache.delta
            ),
        )

    def mlp_mask(self, key, num_rows: int, knobs: Knobs, use_dropout: bool):
        """(the rows' [L, B, F] Dropout-GRPO masks, their keys), or (None, None)."""
        if not use_dropout:
            return None, None
        keys, cfg = ops.row_keys(key, num_rows, knobs.first_row)[0], self.cfg
        shape = (cfg.num_layers, cfg.intermediate_size)
        mask = ops.mlp_dropout_mask(keys, knobs.dropout_rate, *shape, cfg.compute_dtype)
        return self.constrain(mask, (None, "batch", "mlp")), keys

    def prefill_body(
        self,
        state,
        tokens,
        mask,
        key,
        knobs,
        *,
        n: int,
        use_dropout: bool,
        slots: int,
        hidden: bool = False,
    ):
        """Prompts [P, Tp] -> (cache [P*n, Tp + slots], last logits [P*n, V], lengths [P*n]),
        then with `record_routing` the experts, with `hidden` the prompts' final-normed
        hidden states [P, Tp, D] (a multi-token-prediction draft's input). A prompt runs
        once for its n rows, except under per-row dropout masks (the rows then differ from
        the first layer on)."""
        model = nnx.merge(self.graphdef, state)
        if use_dropout and n > 1:
            tokens, mask = jnp.repeat(tokens, n, axis=0), jnp.repeat(mask, n, axis=0)
        num_rows, tp = tokens.shape
        mlp_mask, _ = self.mlp_mask(key, num_rows, knobs, use_dropout)
        cache = self.constrain_cache(model.init_cache(num_rows, tp, self.cache_dtype))
        out = model.hidden_states(
            tokens, mask, cache=cache, mlp_mask=mlp_mask, router_stats=self.record_routing
        )
        states, cache = out[:2]
        logits = model.logits(states[:, -1])  # left padding: column Tp-1 is the last token
        reps = 1 if use_dropout else n
        routing = None
        if self.record_routing:  # [P, Tp, L, k], -1 on padding
            routing = recorded_experts(out[2].experts, mask)
            routing = jnp.repeat(routing, reps, axis=0)
        lengths = jnp.repeat(jnp.sum(mask, axis=1, dtype=jnp.int32), reps)
        cache = self.constrain_cache(fitted(cache, reps, slots))
        out = cache, jnp.repeat(logits, reps, 0), lengths
        return out + ((routing,) if self.record_routing else ()) + ((states,) if hidden else ())

    def decode_model(self, state) -> Transformer:
        """The model a decode loop runs: weights cast once, layers split unless scanned."""
        model = model_forms.with_compute_weights(nnx.merge(self.graphdef, state))
        return model if self.scan_decode else model_forms.unstack_layers(model)

    def step_model(self, model: Transformer, token):
        """(model, token) for one step; scanned, the weights are tied to the step, so XLA
        gathers each layer in the step's scan, not all before the loop (a full copy)."""
        if not self.scan_decode:
            return model, token
        graphdef, weights = nnx.split(model)
        weights, token = jax.lax.optimization_barrier((weights, token))
        return nnx.merge(graphdef, weights), token

    def decode_body(
        self, state, cache, logits0, prompt_len, prompts, key, knobs, version, routing=None, *, plan
    ):
        """Sample Tn tokens per row from the prefilled cache -> (`Rollout`, the final cache);
        see the module docstring. prompts: (tokens, mask) [P, Tp] for the record; routing:
        the prefill's recorded experts [B, Tp, L, k] (`record_routing`)."""
        model = self.decode_model(state)
        if self.ring_cache:  # sliding layers: their last W slots, in rings
            cache = self.constrain_cache(to_ring(cache, self.cfg))
        num_rows, tn = logits0.shape[0], plan.max_new_tokens
        mlp_mask, dropout_keys = self.mlp_mask(key, num_rows, knobs, plan.use_dropout)
        _, streams = ops.row_keys(key, num_rows, knobs.first_row)
        u = jax.vmap(lambda k: jax.random.uniform(k, (tn,)))(streams)  # every uniform: [B, Tn]
        u = None if plan.greedy else self.constrain(u, ("batch", None))

        def emit(s: DecodeState, logits) -> DecodeState:
            u_s = None if u is None else jax.lax.dynamic_index_in_dim(u, s.step, 1, False)
            token, sample_logp, policy_logp = ops.draw(logits, u_s, plan, knobs)
            return s.emit(token, sample_logp, policy_logp, knobs.stop_ids, self.pad_id)

        def step(s: DecodeState) -> DecodeState:
            step_model, token = self.step_model(model, s.token)
            pos = (prompt_len + s.step - 1)[:, None]
            out = step_model.hidden_states(
                token[:, None], None, positions=pos, cache=s.cache, mlp_mask=mlp_mask,
                router_stats=self.record_routing,
            )  # fmt: skip
            if self.record_routing:  # the fed token s - 1's experts, for the rows still live
                rec = recorded_experts(out[2].experts, ~s.done[:, None])
                s = s.replace(
                    routing=jax.lax.dynamic_update_slice_in_dim(s.routing, rec, s.step - 1, 1)
                )
            s = s.replace(cache=self.constrain_cache(out[1]))
            return emit(s, step_model.logits(out[0])[:, 0])

        s = DecodeState.start(cache, num_rows, tn, self.pad_id)
        if self.record_routing:
            shape = (num_rows, tn, self.cfg.num_layers, self.cfg.num_experts_per_tok)
            s = s.replace(routing=jnp.full(shape, -1, jnp.int16))
        s = emit(s, logits0)
        tp = prompts[0].shape[1]
        for size in decode_windows(tp, tn, self.decode_phases):
            last = min(tn, size - tp + 1)  # this phase runs the steps s < last
            s = s.replace(cache=self.constrain_cache(grow_cache(s.cache, size)))
            s = jax.lax.while_loop(lambda s, last=last: (s.step < last) & ~jnp.all(s.done), step, s)
        keys = None if dropout_keys is None else jax.random.key_data(dropout_keys)
        if self.record_routing:  # [B, Tp + Tn, L, k], aligned with the rollout's sequences
            routing = jnp.concatenate([routing, s.routing], axis=1)
        rollout = ro.make_rollout(
            *prompts, s.out, s.lengths, s.done, n=plan.n, version=version, dropout_keys=keys,
            routing=routing,
        )  # fmt: skip
        return rollout, s.cache  # the cache out too: XLA then updates the donated buffers

    def first_cache_size(self, prompt_len: int, plan: Plan) -> int:
        """Slots of the prefilled cache: the first decode phase's (`decode_windows`)."""
        return decode_windows(prompt_len, plan.max_new_tokens, self.decode_phases)[0]

    def pad_prompts(self, prompt_tokens, prompt_mask, owner: str = "Sampler"):
        """Host prompts -> (left-padded [P_bucket, Tp_bucket] device arrays, P)."""
        p, m = len(prompt_tokens), self.batch_multiple
        buckets = self.batch_buckets or (-(-p // m) * m,)
        rows = ro.bucket(p, buckets, "number of prompts", "batch_buckets", owner)
        prompts = ro.left_pad_prompts(
            prompt_tokens, prompt_mask, pad_id=self.pad_id, prompt_buckets=self.prompt_buckets,
            num_rows=rows, owner=owner,
        )  # fmt: skip
        if self.mesh is None:
            return tuple(map(jnp.asarray, prompts)), p
        return shd.shard_batch(prompts, self.mesh), p

    def generate(
        self,
        prompt_tokens,
        prompt_mask,
        params: SamplingParams,
        key: jax.Array,
        *,
        policy_version: int | None = None,
        first_row: int = 0,
    ) -> ro.Rollout:
        """`params.n` completions of each of P left-padded host prompts [P, T]: a `Rollout`
        of B = P * n rows, prompt-major, on device (sharded on the mesh). first_row: the
        global index of row 0, whose keys row r draws from (`Knobs`; 0 for a whole batch)."""
        (tokens, mask), num_prompts = self.pad_prompts(prompt_tokens, prompt_mask)
        plan, knobs, key = Plan.of(params), Knobs.of(params, first_row), as_key(key)
        state = self.weights()
        cache, logits0, prompt_len, *routing = self.prefill(
            state, tokens, mask, key, knobs, n=plan.n, use_dropout=plan.use_dropout,
            slots=self.first_cache_size(tokens.shape[1], plan) - tokens.shape[1],
        )  # fmt: skip
        version = np.int32(self.policy_version if policy_version is None else policy_version)
        rollout, _ = self.decode(
            state, cache, logits0, prompt_len, (tokens, mask), key, knobs, version, *routing,
            plan=plan,
        )  # fmt: skip
        return rollout.take_rows(num_prompts * plan.n)


def recorded_experts(experts: jax.Array, real: jax.Array) -> jax.Array:
    """A forward's experts [L, B, T, k] (`moe.RouterStats.experts`) -> int16 [B, T, L, k],
    -1 where real [B, T] is 0 (padding, finished rows)."""
    rec = jnp.moveaxis(experts, 0, 2).astype(jnp.int16)
    return jnp.where(real.astype(bool)[:, :, None, None], rec, jnp.int16(-1))


def grow_cache(cache: KVCache, size: int) -> KVCache:
    """The cache with empty (invalid) slots appended up to `size` slots (static); sliding
    layers' rings (`cache.ring_layers`) keep their size."""
    extra = size - cache.max_len
    if extra == 0:
        return cache
    grow = lambda x, axis: jnp.pad(x, [(0, extra * (a == axis)) for a in range(x.ndim)])
    rings = cache.ring_layers or (False,) * len(cache.k)
    return cache.replace(
        k=tuple(x if r else grow(x, 2) for x, r in zip(cache.k, rings)),
        v=tuple(x if r else grow(x, 2) for x, r in zip(cache.v, rings)),
        valid=grow(cache.valid, 1),
    )


def fitted(cache: KVCache, reps: int, slots: int) -> KVCache:
    """A prefilled cache for the decode: each prompt's row repeated `reps` times (its n
    samples) and `slots` empty slots added; a linear layer's fixed-size state has no slots."""

    def fit(x):  # axis 2 of a layer's [B, K, S, Dh], axis 1 of valid [B, S]
        return jnp.pad(
            jnp.repeat(x, reps, 0), [(0, slots * (a == min(x.ndim - 1, 2))) for a in range(x.ndim)]
        )

    repeat = lambda x: jnp.repeat(x, reps, 0)  # noqa: E731
    return cache.replace(
        k=jax.tree.map(fit, cache.k), v=jax.tree.map(fit, cache.v), valid=fit(cache.valid),
        conv=jax.tree.map(repeat, cache.conv), delta=jax.tree.map(repeat, cache.delta),
    )  # fmt: skip


def per_row(call, cache: KVCache, index, *xs):
    """call(*x, cache) -> (out, cache) on a batch of one, run for every row b (`jax.vmap`)
    with its inputs x[b] ([B, ...] each) at its own cache slots from index_b (int32 [B]) ->
    (out [B, ...], the cache; its `index` kept)."""

    def one_row(row, *x):  # a batch of one: per layer [1, K, S, Dh]
        row = jax.tree.map(lambda a: a[None], row).replace(index=row.index)
        out, row = call(*(a[None] for a in x), row)
        row = jax.tree.map(lambda a: a[0], row.replace(index=row.index[None]))
        return jax.tree.map(lambda a: a[0], out), row

    out, rows = jax.vmap(one_row)(cache.replace(index=index), *xs)
    return out, rows.replace(index=cache.index)


def forward_rows(model: Transformer, tokens, positions, cache: KVCache, index, hidden=False):
    """tokens, positions int32 [B, T] written at per-row slots [index_b, index_b + T) (index
    int32 [B]) -> (logits f32 [B, T, V], the cache; its `index` kept); hidden=True: ((logits,
    the final-normed hidden states [B, T, D]), the cache)."""

    def call(tok, pos, row):
        states, row = model.hidden_states(tok, None, positions=pos, cache=row)
        logits = model.logits(states)
        return ((logits, states) if hidden else logits), row

    return per_row(call, cache, index, tokens, positions)


def as_key(key) -> jax.Array:
    """A typed jax.random key (raw uint32 key data is wrapped)."""
    if not isinstance(key, jax.Array):
        raise TypeError(f"key must be a jax.random key, got {type(key).__name__}")
    return key if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else jax.random.wrap_key_data(key)
