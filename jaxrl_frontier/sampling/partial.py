"""Partial rollouts: the next batch's rows start in the slots the current batch leaves idle,
and a row not finished when the current batch is stays in flight into the next call, where
it continues with the weights of then.

    call t   rows   current batch b_t: each row continued from the tokens it holds (prompt and
                    those tokens re-prefilled with the weights of now), run to its end
                    next batch b_{t+1} (`begin_next`): fresh rows, each up to `budget` tokens
             slots  b_t's unfinished rows first, then b_{t+1}'s (continuous batching)
             until  every row of b_t has finished; b_{t+1}'s rows in a slot are cut there
             out    b_t's `Rollout`; b_{t+1}'s rows kept (`RowsInFlight`) for call t + 1

A token keeps the behaviour log-probs and the weights' version it was sampled with
(`Rollout.token_version` [B, Tn]), so a loss weighting by the behaviour log-probs (`tis`,
`ppo_clip`, `dppo`, ...) corrects for the tokens sampled one version back. Row r of a batch
draws token t from uniform t of its own stream (`fold_in(key, r)`), whichever call samples
it, so with unchanged weights a continued row gives the tokens of an uncut one (its
continuation's logits come from a prefill instead of decode steps: the same up to f32
reduction order). On a mesh each device begins and continues its own share of both batches'
rows (`shard_plans`; the same tokens, but how far a row of the next batch gets depends on its
device's loop). The rows in flight are host arrays (`state` / `restore`: checkpointed with
the run); on several processes each holds its own share (`generate(first_row=...)`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_frontier.core import sharding as shd
from jaxrl_frontier.core.capabilities import Capabilities
from jaxrl_frontier.core.serialize import array_from_text, array_to_text
from jaxrl_frontier.sampling import ops
from jaxrl_frontier.sampling import records as ro
from jaxrl_frontier.sampling.continuous import SLOTS_LACK, ContinuousSampler, RowPlan, uniforms
from jaxrl_frontier.sampling.params import Knobs, Plan, SamplingParams
from jaxrl_frontier.sampling.sampler import as_key

PREFIX_BUCKETS = 4  # re-prefill widths: the held tokens rounded up to a quarter of Tn


@dataclasses.dataclass
class RowsInFlight:
    """One batch's rows on the host between calls: prompts [P, T] (as given), key_data
    uint32 [2] (its sampling key), and per row [B, Tn] tokens (pad_id past `lengths`),
    policy_logp, sample_logp, version (the weights' version of each token; -1 where none),
    lengths int32 [B] (tokens held), stopped bool [B] (emitted a stop token)."""

    prompt_tokens: np.ndarray
    prompt_mask: np.ndarray
    key_data: np.ndarray
    tokens: np.ndarray
    policy_logp: np.ndarray
    sample_logp: np.ndarray
    version: np.ndarray
    lengths: np.ndarray
    stopped: np.ndarray

    @classmethod
    def fresh(cls, prompt_tokens, prompt_mask, key, n: int, tn: int, pad_id: int):
        rows = np.asarray(prompt_tokens).shape[0] * n
        zeros = np.zeros((rows, tn), np.float32)
        return cls(
            np.asarray(prompt_tokens, np.int32), np.asarray(prompt_mask, np.int32),
            np.asarray(jax.random.key_data(as_key(key))), np.full((rows, tn), pad_id, np.int32),
            zeros, zeros.copy(), np.full((rows, tn), -1, np.int32), np.zeros((rows,), np.int32),
            np.zeros((rows,), bool),
        )  # fmt: skip

    @property
    def finished(self) -> np.ndarray:
        """bool [B]: the row stopped or holds Tn tokens."""
        return self.stopped | (self.lengths >= self.tokens.shape[1])

    def matches(self, prompt_tokens, prompt_mask, key) -> bool:
        key_data = np.asarray(jax.random.key_data(as_key(key)))
        return (
            np.array_equal(self.prompt_tokens, np.asarray(prompt_tokens))
            and np.array_equal(self.prompt_mask, np.asarray(prompt_mask))
            and np.array_equal(self.key_data, key_data)
        )

    def state(self) -> dict[str, str]:
        """JSON-able: each array as base64 of its .npy bytes (exact, dtype kept)."""
        return {f.name: array_to_text(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_state(cls, state: dict[str, str]) -> RowsInFlight:
        return cls(**{f.name: array_from_text(state[f.name]) for f in dataclasses.fields(cls)})


class PartialSampler(ContinuousSampler):
    """A `ContinuousSampler` whose calls overlap batches (module docstring). budget: the most
    tokens a row of the next batch samples during the current batch's call (>= 1)."""

    capabilities = Capabilities.all_but(  # it holds the next batch's rows between calls
        population="partial rollouts hold rows in the shared sampler: set "
        "rollout.partial_budget to 0",
        **{k: v for k, v in SLOTS_LACK.items() if k != "partial_rows"},
    )

    def __init__(self, model, *, slots: int, budget: int, pad_id: int, mesh=None, **kw):
        if budget < 1:
            raise ValueError(f"partial rollouts: budget={budget}; must be >= 1")
        super().__init__(model, slots=slots, pad_id=pad_id, mesh=mesh, **kw)
        self.budget = int(budget)
        self.stats_prefix = "rollout/partial_"
        self.in_flight: RowsInFlight | None = None  # the batch begun ahead by the last call
        self._next = None  # (prompt_tokens, prompt_mask, key) of `begin_next`

    def begin_next(self, prompt_tokens, prompt_mask, key) -> None:
        """The batch the next `generate` call starts ahead (in its idle slots)."""
        self._next = (np.asarray(prompt_tokens), np.asarray(prompt_mask), as_key(key))

    def state(self) -> dict | None:
        """The rows in flight, JSON-able (None: none)."""
        return None if self.in_flight is None else self.in_flight.state()

    def restore(self, state: dict | None) -> None:
        self.in_flight = None if state is None else RowsInFlight.from_state(state)
        self._next = None

    def generate(
        self,
        prompt_tokens,
        prompt_mask,
        params: SamplingParams,
        key,
        *,
        policy_version=None,
        first_row: int = 0,
    ) -> ro.Rollout:
        """This batch's `Rollout` (B = P * n rows), continuing its rows begun by the last
        call if it began them; the batch of `begin_next`, if any, begun in the idle slots
        and kept in flight. Each token's version is in `Rollout.token_version`. first_row:
        the global index of row 0 (a process's share of the batch), the rows' keys' offset,
        the same for the rows begun ahead (a process keeps its share from call to call)."""
        if params.dropout_rate > 0:
            raise ValueError("partial rollouts take no Dropout-GRPO masks")
        plan, knobs = Plan.of(params), Knobs.of(params)
        n, tn = plan.n, plan.max_new_tokens
        version = np.int32(self.policy_version if policy_version is None else policy_version)
        cur = self.in_flight
        if cur is None:
            cur = RowsInFlight.fresh(prompt_tokens, prompt_mask, key, n, tn, self.pad_id)
        elif not cur.matches(prompt_tokens, prompt_mask, key):
            raise ValueError(
                "partial rollouts: this batch is not the one the last call began (its "
                "prompts or key differ); restore() the rows in flight or start from none"
            )
        if cur.tokens.shape != (len(cur.prompt_tokens) * n, tn):
            raise ValueError(
                f"partial rollouts: the rows in flight are {cur.tokens.shape}; this call "
                f"samples [{len(cur.prompt_tokens) * n}, {tn}] (group size or max_new_tokens changed)"
            )
        ahead = self._next
        if ahead is not None and len(ahead[0]) != len(cur.prompt_tokens):
            raise ValueError(
                f"partial rollouts: the batch begun ahead has {len(ahead[0])} prompts, this "
                f"one {len(cur.prompt_tokens)}; both run in one slot decode of equal halves"
            )
        nxt = RowsInFlight.fresh(
            *(ahead or (cur.prompt_tokens, cur.prompt_mask, key)), n, tn, self.pad_id
        )
        out, lengths, stopped = self._run(cur, nxt, ahead is not None, plan, knobs, first_row)
        b = cur.tokens.shape[0]
        done, kept = (
            self._rows_after(rows, out, lengths, stopped, part, version)
            for rows, part in ((cur, slice(0, b)), (nxt, slice(b, None)))
        )
        self.in_flight, self._next = (kept if ahead is not None else None), None
        return self._rollout(done, n, version)

    def _run(self, cur: RowsInFlight, nxt: RowsInFlight, ahead: bool, plan, knobs, first_row):
        """One call's slot decode over [cur rows; next rows] -> host (out, lengths, stopped).
        On a mesh each device decodes its share of both batches (`shard_plans`)."""
        n, tn, b = plan.n, plan.max_new_tokens, cur.tokens.shape[0]
        (cur_tok, cur_mask), (nxt_tok, nxt_mask) = self._left_pad(cur, nxt)
        rows, buffers = self.shard_plans(cur, nxt, ahead, n, tn, cur_mask, nxt_mask)
        # the current rows re-prefilled: prompt | held tokens, the held tokens' width rounded
        # up to a quarter of Tn (a few programs, not one per width)
        quarter = -(-tn // PREFIX_BUCKETS)
        width = min(tn, -(-max(int(cur.lengths.max()), 1) // quarter) * quarter)
        held_mask = (np.arange(width)[None, :] < cur.lengths[:, None]).astype(np.int32)
        rows_tok = np.concatenate([np.repeat(cur_tok, n, 0), cur.tokens[:, :width]], 1)
        rows_mask = np.concatenate([np.repeat(cur_mask, n, 0), held_mask], 1)
        state = self.weights()
        nxt_key = jax.random.wrap_key_data(nxt.key_data)
        nxt_cache, nxt_logits, _ = self.prefill(
            state, *self.place_rows(nxt_tok, nxt_mask), nxt_key, knobs,
            n=1, use_dropout=False, slots=tn,
        )  # fmt: skip
        keys = (jax.random.wrap_key_data(cur.key_data), nxt_key)
        out, lengths, stopped, steps, busy = self.slot_program("partial", 2 * b)(
            state, *self.place_rows(rows_tok, rows_mask), nxt_cache, nxt_logits, rows, keys,
            np.int32(first_row), knobs, buffers, plan=plan,
        )  # fmt: skip
        steps, busy = int(steps), int(busy)
        todo = ~cur.finished
        self.stats = dict(
            slot_busy_share=self.busy_share(steps, busy, 2 * b),
            steps=float(steps),
            continued_rows=float(np.sum(cur.lengths[todo] > 0)),
        )

        def unshard(x):  # [D, 2 B / D, ...]: each device's current rows, then its next
            bl = b // x.shape[0]
            return np.concatenate([x[:, :bl], x[:, bl:]]).reshape(2 * b, *x.shape[2:])

        return jax.tree.map(unshard, jax.device_get((out, lengths, stopped)))

    def place_rows(self, *arrays):
        """Host arrays with rows on their leading axis, split over the mesh's batch axes."""
        if self.mesh is None:
            return tuple(map(jnp.asarray, arrays))
        return shd.shard_batch(arrays, self.mesh)

    def shard_plans(self, cur: RowsInFlight, nxt: RowsInFlight, ahead, n, tn, cur_mask, nxt_mask):
        """Each device's `RowPlan` and row buffers, stacked [D, ...]: device d takes the d-th
        share of the current rows (its unfinished ones first) and of the next batch's (fresh,
        up to the budget), its rows numbered [its current; its next], its start arrays
        [its current rows' caches; its next prompts']."""
        devices, b = self.batch_multiple, cur.tokens.shape[0]
        if b % devices or (b // n) % devices:
            raise ValueError(
                f"partial rollouts: {b // n} prompts do not split over {devices} devices"
            )
        bl = b // devices  # rows per device, of each batch
        i = np.arange(2 * bl)
        cur_len, nxt_len = cur_mask.sum(1).repeat(n), nxt_mask.sum(1).repeat(n)
        plans, buffers = [], []
        for d in range(devices):
            mine = slice(d * bl, (d + 1) * bl)
            todo = np.flatnonzero(~cur.finished[mine])
            order = np.concatenate([todo, bl + np.arange(bl if ahead else 0)])
            plans.append(RowPlan(
                order=np.pad(order, (0, 2 * bl - len(order))).astype(np.int32),
                count=np.int32(len(order)),
                must_end=np.int32(bl),
                must_count=np.int32(len(todo)),
                src=np.where(i < bl, i, bl + (i - bl) // n).astype(np.int32),  # next: its prompt
                t0=np.concatenate([cur.lengths[mine], nxt.lengths[mine]]).astype(np.int32),
                limit=np.where(i < bl, tn, min(self.budget, tn)).astype(np.int32),
                prompt_len=np.concatenate([cur_len[mine], nxt_len[mine]]).astype(np.int32),
            ))  # fmt: skip
            fields = ("tokens", "policy_logp", "sample_logp", "lengths", "stopped")
            both = [np.concatenate([getattr(cur, f)[mine], getattr(nxt, f)[mine]]) for f in fields]
            buffers.append((tuple(both[:3]), both[3], both[4]))
        stack = lambda *xs: np.stack(xs)  # noqa: E731
        return jax.tree.map(stack, *plans), jax.tree.map(stack, *buffers)

    def _left_pad(self, *batches: RowsInFlight):
        """Each batch's prompts left-padded to one width (the larger bucket), so their
        caches share the slot layout [prompt Tp | completion Tn]."""
        bucket = lambda mask: ro.bucket(  # noqa: E731
            int(mask.sum(1).max()), self.prompt_buckets, "prompt length", "prompt_buckets",
            "PartialSampler",
        )  # fmt: skip
        tp = max(bucket(rows.prompt_mask) for rows in batches)
        return [
            ro.left_pad_prompts(
                rows.prompt_tokens,
                rows.prompt_mask,
                pad_id=self.pad_id,
                prompt_buckets=(tp,),
                owner="PartialSampler",
            )  # fmt: skip
            for rows in batches
        ]

    @staticmethod
    def _rows_after(
        rows: RowsInFlight, out, lengths, stopped, part: slice, version
    ) -> RowsInFlight:
        """`rows` after the call: their tokens, log-probs and lengths, the new tokens stamped
        with `version`."""
        tokens, policy_logp, sample_logp = (np.asarray(x[part]) for x in out)
        new_len = np.asarray(lengths[part])
        sampled_now = (np.arange(tokens.shape[1])[None, :] >= rows.lengths[:, None]) & (
            np.arange(tokens.shape[1])[None, :] < new_len[:, None]
        )
        return dataclasses.replace(
            rows, tokens=tokens, policy_logp=policy_logp, sample_logp=sample_logp,
            version=np.where(sampled_now, version, rows.version).astype(np.int32),
            lengths=new_len.astype(np.int32), stopped=np.asarray(stopped[part]),
        )  # fmt: skip

    def _rollout(self, rows: RowsInFlight, n: int, version) -> ro.Rollout:
        """The finished batch as a `Rollout` (prompts left-padded to their bucket)."""
        if not rows.finished.all():
            raise AssertionError("partial rollouts: a row of the current batch did not finish")
        (tok, mask), _ = self.pad_prompts(rows.prompt_tokens, rows.prompt_mask, "PartialSampler")
        p = len(rows.prompt_tokens)
        out = (rows.tokens, rows.policy_logp, rows.sample_logp)
        rollout = ro.make_rollout(
            tok[:p], mask[:p], tuple(map(jnp.asarray, out)), jnp.asarray(rows.lengths),
            jnp.asarray(rows.stopped), n=n, version=version, dropout_keys=None,
        )  # fmt: skip
        held = np.where(rows.version >= 0, rows.version, np.iinfo(np.int32).max)
        first = np.where(rows.lengths > 0, held.min(1), version).astype(np.int32)
        return rollout.replace(
            policy_version=jnp.asarray(first), token_version=jnp.asarray(rows.version)
        )

    def _partial(
        self,
        state,
        rows_tok,
        rows_mask,
        nxt_cache,
        nxt_logits,
        rows,
        keys,
        first_row,
        knobs,
        buffers,
        *,
        plan,
    ):
        """The current batch's rows re-prefilled (prompt and held tokens, [B, Tp + W]), then
        one slot decode over [current rows; next rows], per device on a mesh -> (out,
        lengths, stopped) [D, 2 B / D, ...], steps, busy."""
        tn, b = plan.max_new_tokens, rows_tok.shape[0]
        u_cur, u_nxt = (uniforms(ops.row_keys(k, b, first_row)[1], tn) for k in keys)

        def local(shared, row_args):  # a device's current rows and next prompts
            state, knobs = shared
            rows_tok, rows_mask, nxt_cache, nxt_logits, u_cur, u_nxt, rows, buffers = row_args
            rows, buffers = jax.tree.map(lambda x: x[0], (rows, buffers))  # [1, ...] -> [...]
            bl = rows_tok.shape[0]
            model = nnx.merge(self.graphdef, state)
            cache = model.init_cache(bl, rows_tok.shape[1], self.cache_dtype)
            hidden, cache = model.hidden_states(rows_tok, rows_mask, cache=cache)
            tp = nxt_cache.max_len - tn
            last = tp + rows.t0[:bl] - 1  # the last held token (the prompt's last if none)
            logits = model.logits(hidden[jnp.arange(bl), last])
            grow = tp + tn - rows_tok.shape[1]
            fit = lambda x, axis: jnp.pad(x, [(0, grow * (a == axis)) for a in range(x.ndim)])
            cat = lambda a, c: jnp.concatenate([a, c])  # noqa: E731
            start_cache = nxt_cache.replace(
                k=tuple(cat(fit(x, 2), y) for x, y in zip(cache.k, nxt_cache.k, strict=True)),
                v=tuple(cat(fit(x, 2), y) for x, y in zip(cache.v, nxt_cache.v, strict=True)),
                valid=cat(fit(cache.valid, 1), nxt_cache.valid),
                # linear-attention layers' fixed-size state (None elsewhere: no leaves)
                conv=jax.tree.map(cat, cache.conv, nxt_cache.conv),
                delta=jax.tree.map(cat, cache.delta, nxt_cache.delta),
            )  # fmt: skip
            s = self.slot_decode(
                self.decode_model(state), start_cache, cat(logits, nxt_logits), rows,
                cat(u_cur, u_nxt), buffers, plan, knobs,
            )  # fmt: skip
            out = jax.tree.map(lambda x: x[None], (s.out, s.lengths, s.stopped))
            return out, s.steps, s.busy

        nxt_cache = nxt_cache.replace(index=jnp.zeros(nxt_logits.shape[:1], jnp.int32))
        row_args = (rows_tok, rows_mask, nxt_cache, nxt_logits, u_cur, u_nxt, rows, buffers)
        (out, lengths, stopped), steps, busy = self.per_shard(local)((state, knobs), row_args)
        return out, lengths, stopped, steps, busy
