"""Continuous batching: a fixed number of decode slots, and a slot whose row stops takes the
next pending row of the batch at once instead of idling until the batch's longest row ends.

    prefill   cache[P, Tp + Tn], logits_0 = model(prompt[P, Tp]): each prompt once
    start     slot i takes row r (prompt r // n): its cache <- the prompt's, y_0 ~ q(. | logits_0)
    step      every busy slot feeds its row's last token at its own cache slot Tp + t - 1
              (a `KVCache` with per-row indices [S]), y_t ~ q(. | logits_t); a row that emits
              a stop token or its Tn-th token frees its slot, which starts the next row
    until     every row has finished

Row r draws its t-th token from uniform t of its own stream (`fold_in(key, r)`, as
`Sampler`), reads the same prompt cache and the same positions whatever slot runs it, so the
batch's tokens do not depend on the slot count: the same as `Sampler` gives (their
log-probs differ by f32 reduction order only). The Rollout is the same record, rows in
prompt-major order. No Dropout-GRPO masks (their prompt caches differ per row).

On a mesh the rows are split over the batch axes (data x fsdp; tensor must be 1): each device
runs its own slot loop (`jax.shard_map`) over its contiguous share of the prompts and rows,
with `slots / devices` slots and a full copy of the weights, and talks to no other device
inside the loop; a device whose rows finish first waits at the end. The rows' keys are
global, so the tokens are those of one device.

`stats` after a rollout (logged as rollout/continuous_*): slot_busy_share (busy slot-steps /
all slot-steps: 1 - the share spent on finished rows) and steps (decode steps run).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxrl_frontier.core import sharding as shd
from jaxrl_frontier.core.capabilities import Capabilities
from jaxrl_frontier.core.xla_options import rollout_compiler_options
from jaxrl_frontier.models.kv_cache import KVCache
from jaxrl_frontier.sampling import ops
from jaxrl_frontier.sampling import records as ro
from jaxrl_frontier.sampling.params import Knobs, Plan, SamplingParams
from jaxrl_frontier.sampling.sampler import Sampler, as_key


@flax.struct.dataclass
class SlotState:
    """The continuous decode's carry. Per slot [S]: row int32 (the row it runs; B: idle),
    t int32 (tokens of that row emitted), token int32 (the last: the next input), and its
    cache (every layer [S, K, Tp + Tn, Dh]). Per row [B]: out = (tokens, policy_logp,
    sample_logp) [B, Tn], lengths int32, stopped bool. next_row int32 []: the first place of
    the `RowPlan`'s order no slot has taken; steps, busy int32 []: decode steps run, busy
    slot-steps among them."""

    cache: KVCache
    row: jax.Array
    t: jax.Array
    token: jax.Array
    next_row: jax.Array
    out: tuple
    lengths: jax.Array
    stopped: jax.Array
    steps: jax.Array
    busy: jax.Array


# What a decode of rows in slots cannot serve (ContinuousSampler, PartialSampler).
SLOTS_LACK = dict(
    partial_rows="the rows start in its idle slots",
    dropout_masks="each row's prompt cache differs",
    speculative_draft="the keys are exclusive: set one of them",
    routing_record="the experts are recorded by the plain sampler only",
)


class ContinuousSampler(Sampler):
    """A `Sampler` whose decode runs `slots` rows at a time and refills a slot as soon as its
    row stops (module docstring). slots: the decode's batch (capped at the batch's rows);
    the other arguments as `Sampler`'s (a mesh: rows over data x fsdp, tensor 1; slots a
    multiple of those devices, `slots / devices` per device's loop)."""

    capabilities = Capabilities.all_but(**SLOTS_LACK)

    def __init__(self, model, *, slots: int, pad_id: int, mesh=None, **kw):
        if mesh is not None and mesh.shape.get("tensor", 1) > 1:
            raise ValueError(
                f"continuous batching (rollout.continuous_slots={slots}) splits rows, not "
                f"heads: the mesh's tensor axis must be 1, got {dict(mesh.shape)}"
            )
        super().__init__(model, pad_id=pad_id, mesh=mesh, **kw)
        if slots < 1 or slots % self.batch_multiple:
            raise ValueError(
                f"continuous batching (rollout.continuous_slots={slots}): slots must be a "
                f"positive multiple of the {self.batch_multiple} devices the rows are split over"
            )
        self.slots = int(slots)
        self.stats: dict[str, float] = {}
        self.stats_prefix = "rollout/continuous_"  # the stats' metric names

    @property
    def shard_slots(self) -> int:
        """The slots of each device's loop."""
        return self.slots // self.batch_multiple

    def busy_share(self, steps: int, busy: int, rows: int) -> float:
        """Busy slot-steps over all slot-steps (`steps`: the longest device loop's)."""
        slots = min(self.shard_slots, rows // self.batch_multiple) * self.batch_multiple
        return busy / max(steps * slots, 1)

    @staticmethod
    def merge_stats(per_process: list[dict]) -> dict:
        """Every process's `stats` of one batch (each ran its own devices' loops, with equal
        slots) -> the stats of all of them: steps the longest, slot_busy_share over every
        slot-step, counts summed."""
        steps = max(s["steps"] for s in per_process)
        busy = sum(s["slot_busy_share"] * s["steps"] for s in per_process)  # x slots each
        merged = {k: sum(s[k] for s in per_process) for k in per_process[0]}
        merged.update(steps=steps, slot_busy_share=busy / max(len(per_process) * steps, 1))
        return merged

    def per_shard(self, local):
        """local(shared, rows) -> (row outputs, steps, busy) run on each device's share of
        the rows (their leading axis split over the batch axes; `shared` replicated), steps
        the longest loop's, busy summed; `local` itself without a mesh of several."""
        if self.batch_multiple == 1:
            return local
        axes = tuple(a for a in shd.BATCH_AXES if a in self.mesh.shape)

        def body(shared, rows):
            out, steps, busy = local(shared, rows)
            return out, jax.lax.pmax(steps, axes), jax.lax.psum(busy, axes)

        split = P(axes)  # the loop's carry mixes per-device and replicated values: unchecked
        return jax.shard_map(
            body, mesh=self.mesh, in_specs=(P(), split), out_specs=(split, P(), P()),
            check_vma=False,
        )  # fmt: skip

    def slot_program(self, name: str, rows: int):
        """The jitted `_<name>` ('continuous', or a subclass's slot program) for a decode
        over `rows` rows (XLA options by the slots that run at once on a device)."""
        options = rollout_compiler_options(self.platform, min(self.shard_slots, rows))
        if (name, options) not in self._jits:
            self._jits[name, options] = jax.jit(
                getattr(self, f"_{name}"), static_argnames=("plan",), compiler_options=dict(options)
            )
        return self._jits[name, options]

    def generate(
        self,
        prompt_tokens,
        prompt_mask,
        params: SamplingParams,
        key,
        *,
        policy_version=None,
        first_row: int = 0,
    ):
        """As `Sampler.generate`, through the continuous decode."""
        if params.dropout_rate > 0:
            raise ValueError("continuous batching takes no Dropout-GRPO masks (dropout_rate > 0)")
        (tokens, mask), num_prompts = self.pad_prompts(
            prompt_tokens, prompt_mask, "ContinuousSampler"
        )
        plan, knobs, key = Plan.of(params), Knobs.of(params, first_row), as_key(key)
        state = self.weights()
        cache, logits0, prompt_len = self.prefill(
            state, tokens, mask, key, knobs, n=1, use_dropout=False, slots=plan.max_new_tokens
        )
        version = np.int32(self.policy_version if policy_version is None else policy_version)
        run = self.slot_program("continuous", tokens.shape[0] * plan.n)
        rollout, steps, busy = run(
            state, cache, logits0, prompt_len, (tokens, mask), key, knobs, version, plan=plan
        )
        steps, busy = int(steps), int(busy)
        share = self.busy_share(steps, busy, tokens.shape[0] * plan.n)
        self.stats = dict(slot_busy_share=share, steps=float(steps))
        return rollout.take_rows(num_prompts * plan.n)

    def _continuous(
        self, state, cache_p, logits0_p, prompt_len_p, prompts, key, knobs, version, *, plan
    ):
        """Prefilled prompts (cache_p [P, ...], logits0_p [P, V], prompt_len_p [P]) ->
        (`Rollout` of B = P * n rows, decode steps, busy slot-steps)."""
        n, tn = plan.n, plan.max_new_tokens
        num_rows = logits0_p.shape[0] * n
        _, streams = ops.row_keys(key, num_rows, knobs.first_row)

        def local(shared, row_args):  # a device's prompts and their rows
            state, knobs = shared
            cache_p, logits0_p, prompt_len_p, u = row_args
            rows = RowPlan.fresh(u.shape[0], n, tn, jnp.repeat(prompt_len_p, n))
            s = self.slot_decode(
                self.decode_model(state), cache_p, logits0_p, rows, u,
                empty_rows(u.shape[0], tn, self.pad_id), plan, knobs,
            )  # fmt: skip
            return (s.out, s.lengths, s.stopped), s.steps, s.busy

        cache_p = cache_p.replace(index=jnp.zeros(prompt_len_p.shape, jnp.int32))  # per prompt
        row_args = (cache_p, logits0_p, prompt_len_p, uniforms(streams, tn))
        (out, lengths, stopped), steps, busy = self.per_shard(local)((state, knobs), row_args)
        # a row's tokens past its end stay pad / 0, as Sampler's
        rollout = ro.make_rollout(
            *prompts, out, lengths, stopped, n=n, version=version, dropout_keys=None
        )
        return rollout, steps, busy

    def slot_decode(self, model, start_cache, start_logits, rows, u, buffers, plan, knobs):
        """The slot loop (module docstring) over R rows -> the final `SlotState`.

        start_cache [C, K, Tp + Tn, Dh] per layer, start_logits [C, V]: the caches and next-
        token logits rows start from (`RowPlan.src` indexes them); rows: a `RowPlan`;
        u f32 [R, Tn]: each row's uniforms (uniform t draws token t); buffers: (out, lengths,
        stopped) of the rows before the loop (`empty_rows`, or rows continued with their
        tokens so far)."""
        loop = _SlotLoop(model, start_cache, start_logits, rows, u, plan, knobs, self.shard_slots)
        slot_cache = jax.tree.map(
            lambda x: jnp.zeros((loop.num_slots,) + x.shape[1:], x.dtype), start_cache
        )
        zeros = jnp.zeros((loop.num_slots,), jnp.int32)
        out, lengths, stopped = buffers
        s = SlotState(
            cache=slot_cache.replace(index=zeros),  # per-slot write indices, set each step
            row=zeros + loop.idle, t=zeros, token=zeros, next_row=jnp.int32(0), out=out,
            lengths=lengths, stopped=stopped, steps=jnp.int32(0), busy=jnp.int32(0),
        )  # fmt: skip
        s = jax.lax.while_loop(loop.any_free_and_pending, loop.start_rows, s)
        return jax.lax.while_loop(loop.running, loop.step, s)


@flax.struct.dataclass
class RowPlan:
    """Which rows a slot decode runs, in which order and from where (R rows, device arrays).

    order int32 [R]: the rows in the order free slots take them; the first `count` run.
    must_end int32 []: the loop runs until every row r < must_end it runs has finished; the
      first `must_count` of `order` are these (a later row is cut where it is at the end).
    src int32 [R]: the row's start cache and logits (an index into the decode's start arrays).
    t0 int32 [R]: tokens the row holds already; its first token in this decode is token t0.
    limit int32 [R]: the row leaves its slot once it holds this many tokens (Tn: when it
      stops or is full; less: a budget).
    prompt_len int32 [R]: real tokens of the row's prompt (the positions of its tokens).
    """

    order: jax.Array
    count: jax.Array
    must_end: jax.Array
    must_count: jax.Array
    src: jax.Array
    t0: jax.Array
    limit: jax.Array
    prompt_len: jax.Array

    @classmethod
    def fresh(cls, num_rows: int, n: int, tn: int, prompt_len) -> RowPlan:
        """Every row of a batch from its prompt's cache (row r: prompt r // n), run to its end."""
        every = jnp.arange(num_rows, dtype=jnp.int32)
        count = jnp.int32(num_rows)
        full = jnp.full((num_rows,), tn, jnp.int32)
        return cls(every, count, count, count, every // n, every * 0, full, prompt_len)


def uniforms(streams, tn: int):
    """Each row's Tn uniforms [R, Tn] from its stream key (`ops.row_keys`): uniform t draws
    token t, whichever decode samples it."""
    return jax.vmap(lambda k: jax.random.uniform(k, (tn,)))(streams)


def empty_rows(num_rows: int, tn: int, pad_id: int):
    """(out, lengths, stopped) of rows with no token yet: out = (tokens pad_id, policy_logp
    0, sample_logp 0) [R, Tn], lengths 0, stopped False."""
    buf = jnp.zeros((num_rows, tn), jnp.float32)
    out = (jnp.full((num_rows, tn), pad_id, jnp.int32), buf, buf)
    return out, jnp.zeros((num_rows,), jnp.int32), jnp.zeros((num_rows,), bool)


class _SlotLoop:
    """The parts of `slot_decode`'s loop over `num_slots` slots and R rows (its arguments;
    `idle` = R is the row index of an idle slot, whose writes are dropped)."""

    def __init__(self, model, start_cache, start_logits, rows, u, plan, knobs, shard_slots):
        self.model, self.start_cache, self.start_logits = model, start_cache, start_logits
        self.rows, self.u, self.plan, self.knobs = rows, u, plan, knobs
        self.tn = plan.max_new_tokens
        self.idle = u.shape[0]
        self.num_slots = min(shard_slots, self.idle)
        self.tp = start_cache.max_len - self.tn

    def row_of(self, s: SlotState):  # idle slots: row 0
        return jnp.where(s.row < self.idle, s.row, 0)

    def record(self, s: SlotState, live, token, sample_logp, policy_logp) -> SlotState:
        """Token t of each live slot's row into the row buffers; a row that stopped or
        reached its limit (Tn, or a budget) frees its slot."""
        row = jnp.where(live, s.row, self.idle)
        put = lambda buf, x: buf.at[row, s.t].set(x, mode="drop")  # noqa: E731
        out = tuple(map(put, s.out, (token, policy_logp, sample_logp)))
        stop = live & ops.is_stop(token, self.knobs.stop_ids)
        lengths = s.lengths.at[row].set(s.t + 1, mode="drop")
        stopped = s.stopped.at[row].set(stop, mode="drop")
        freed = live & (stop | (s.t + 1 >= self.rows.limit[self.row_of(s)]))
        return s.replace(
            out=out, lengths=lengths, stopped=stopped, token=token,
            t=jnp.where(live, s.t + 1, s.t),  # an idle slot's counter stays <= Tn
            row=jnp.where(freed, self.idle, s.row),
        )  # fmt: skip

    def start_rows(self, s: SlotState) -> SlotState:
        """Every idle slot takes the next row of the plan's order: its start cache and
        its next token (token t0 of the row)."""
        rows, start_cache = self.rows, self.start_cache
        free = s.row == self.idle
        place = s.next_row + jnp.cumsum(free) - 1
        take = free & (place < rows.count)
        new_row = rows.order[jnp.where(take, place, 0)]
        src, t0 = rows.src[new_row], rows.t0[new_row]
        # only the slots that take a row are written (a scatter of their rows): a select
        # over every slot rewrote the whole cache at almost every step
        slot = jnp.where(take, jnp.arange(self.num_slots), self.num_slots)
        fill = lambda old, new: old.at[slot].set(new[src], mode="drop")  # noqa: E731
        cache = s.cache.replace(
            k=tuple(map(fill, s.cache.k, start_cache.k)),
            v=tuple(map(fill, s.cache.v, start_cache.v)),
            valid=fill(s.cache.valid, start_cache.valid),
            # linear-attention layers' own state (None elsewhere: no leaves to fill)
            conv=jax.tree.map(fill, s.cache.conv, start_cache.conv),
            delta=jax.tree.map(fill, s.cache.delta, start_cache.delta),
        )
        s = s.replace(
            cache=cache, row=jnp.where(take, new_row, s.row), t=jnp.where(take, t0, s.t),
            next_row=s.next_row + jnp.sum(take, dtype=jnp.int32),
        )  # fmt: skip
        u0 = self.u[new_row, jnp.minimum(t0, self.tn - 1)]
        token, sample_logp, policy_logp = ops.draw(
            self.start_logits[src], u0, self.plan, self.knobs
        )
        first = self.record(s, take, token, sample_logp, policy_logp)
        keep = lambda a, b: jnp.where(take, a, b)  # noqa: E731  (running slots keep their row)
        return first.replace(
            token=keep(first.token, s.token), t=keep(first.t, s.t), row=keep(first.row, s.row)
        )

    def any_free_and_pending(self, s: SlotState):
        return jnp.any(s.row == self.idle) & (s.next_row < self.rows.count)

    def running(self, s: SlotState):  # a row the loop must finish is running or pending
        return jnp.any(s.row < self.rows.must_end) | (s.next_row < self.rows.must_count)

    def step(self, s: SlotState) -> SlotState:
        live = s.row < self.idle
        pos = self.rows.prompt_len[self.row_of(s)] + s.t - 1
        # an idle slot writes at its last row's final slot, inside its cache, where nothing
        # reads it (a new row replaces the slot's cache and mask)
        index = self.tp + jnp.maximum(s.t, 1) - 1
        logits, cache = self.model(
            s.token[:, None], None, positions=pos[:, None], cache=s.cache.replace(index=index)
        )
        u_t = self.u[self.row_of(s), jnp.minimum(s.t, self.tn - 1)]
        token, sample_logp, policy_logp = ops.draw(logits[:, 0], u_t, self.plan, self.knobs)
        s = s.replace(cache=cache, steps=s.steps + 1, busy=s.busy + jnp.sum(live, dtype=jnp.int32))
        s = self.record(s, live, token, sample_logp, policy_logp)
        return jax.lax.while_loop(self.any_free_and_pending, self.start_rows, s)
