"""Multi-turn sampling over one fixed-width KV cache: an episode session for B rows.

    start     prefill the first observations (left-padded prompts [P, Tp], each once for its
              G rows) into a cache of S = Tp + max_turns * (Ta + To) slots
    turn      decode one turn for every live row: y_0 ~ q(. | logits), then each step feeds
              the last emitted token of the rows still in the turn at the next slot (the
              others write an invalid slot) until every row has emitted its stop token or its
              cap (<= Ta: the turn cap, or less where an episode's token budget is nearly
              spent); the stop token is fed too, so the cache holds the whole turn
    observe   prefill ONLY the new observation tokens [B, To] (left-padded within the chunk,
              padding invalid) at the next To slots, never re-running the history; the last
              column's logits start the next turn

Positions are per row: a row's next token sits at position = its count of valid tokens so
far, so the gaps other rows' longer turns leave in slot space change nothing (attention
skips invalid slots). Causality in slot space is causality in time, as in `Sampler`.

Static shapes: one turn program and one observation program per (rows, S, Ta, To); the
cache index, the caps and the live rows are traced, so every turn of every episode runs the
same two compiled programs. A turn uses at most Ta slots and an observation To, so the
cache never overflows. The cache is donated to each program and updated in place.

Per token the session records the sampled token, log p(token) under the policy (the
behaviour log-prob), so a trajectory's old log-probs come from
the same forward that sampled it. Rows past the real prompts (batch-bucket padding) and
finished episodes are never live.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.core import sharding as shd
from jaxrl_frontier.core.xla_options import rollout_compiler_options
from jaxrl_frontier.models.kv_cache import KVCache
from jaxrl_frontier.sampling import ops
from jaxrl_frontier.sampling.params import Knobs, Plan, SamplingParams
from jaxrl_frontier.sampling.sampler import as_key


@flax.struct.dataclass
class TurnState:
    """The turn loop's carry. step int32 [] (column of the next emitted token); cache;
    token int32 [B] (the last emitted, fed next); pending bool [B] (token still to feed);
    active bool [B] (the row goes on sampling this turn); pos int32 [B] (next position);
    n int32 [B] (tokens emitted this turn); out = (tokens, logp) [B, Ta]."""

    step: jax.Array
    cache: KVCache
    token: jax.Array
    pending: jax.Array
    active: jax.Array
    pos: jax.Array
    n: jax.Array
    out: tuple


def observation_positions(pos: jax.Array, mask: jax.Array) -> jax.Array:
    """Positions [B, To] of a left-padded observation chunk appended after `pos` [B] valid
    tokens: pos + (count of valid chunk tokens before) (padding: its neighbour's, unused)."""
    return (pos[:, None] + jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)).astype(jnp.int32)


def observe(model, cache: KVCache, pos, tokens, mask, *, all_logits: bool = False):
    """Append an observation chunk tokens / mask [B, To] at slots [index, index + To) ->
    (logits f32 [B, V] after each row's last valid token, or [B, To, V] with all_logits;
    the cache; pos + the chunk's valid counts). Only the To new tokens run through the
    model; each attends to its row's valid slots (the history) and its own chunk."""
    positions = observation_positions(pos, mask)
    hidden, cache = model.hidden_states(tokens, mask, positions=positions, cache=cache)
    logits = model.logits(hidden if all_logits else hidden[:, -1])  # left-padded: last column
    return logits, cache, pos + jnp.sum(mask, axis=1, dtype=jnp.int32)


class TurnSession:
    """An episode session over one KV cache (module docstring).

    Args:
      sampler: a `Sampler` (its weights, prompt padding, prefill and decode model are used).
      params: SamplingParams of every turn: temperature / top-k / top-p / min-p / greedy, n =
        the rows per prompt (G), max_new_tokens = the turn cap Ta, eos_ids + stop_ids = the
        turn's end tokens.
      obs_tokens: To, the largest observation chunk (chat markup included).
      max_turns: turns the cache holds.
    """

    def __init__(self, sampler, params: SamplingParams, *, obs_tokens: int, max_turns: int):
        if params.dropout_rate:
            raise ValueError(
                "TurnSession: dropout_rate > 0 is not supported in multi-turn rollouts"
            )
        if obs_tokens < 1 or max_turns < 1:
            raise ValueError(f"TurnSession: obs_tokens={obs_tokens}, max_turns={max_turns} (>= 1)")
        self.sampler, self.params = sampler, params
        self.plan, self.knobs = Plan.of(params), Knobs.of(params)
        self.turn_tokens, self.obs_tokens, self.max_turns = (
            params.max_new_tokens,
            int(obs_tokens),
            int(max_turns),
        )
        self.pad_id = sampler.pad_id
        self._jits: dict = {}

    @classmethod
    def shared(cls, sampler, params: SamplingParams, *, obs_tokens: int, max_turns: int):
        """The sampler's session for these settings: built at the first call and kept by the
        sampler (`Sampler.turn_sessions`), so every later call (each evaluation of a run, the
        members of a population sharing the sampler) reuses its compiled programs."""
        key = (params, int(obs_tokens), int(max_turns))
        if key not in sampler.turn_sessions:
            sampler.turn_sessions[key] = cls(
                sampler, params, obs_tokens=obs_tokens, max_turns=max_turns
            )
        return sampler.turn_sessions[key]

    # ------------------------------------------------------------------ programs

    def _program(self, name: str, rows: int, statics=()):
        s = self.sampler
        options = rollout_compiler_options(s.platform, rows // s.batch_multiple)
        if (name, options) not in self._jits:
            self._jits[name, options] = jax.jit(
                getattr(self, f"_{name}"),
                static_argnames=statics,
                donate_argnames=("cache",),
                compiler_options=dict(options),
            )
        return self._jits[name, options]

    def _turn(self, state, cache, logits, pos, caps, key, knobs, *, plan: Plan):
        """One turn for every row with caps > 0 (module docstring) -> (tokens, logp) [B, Ta],
        emitted counts [B], positions [B], cache."""
        s_ = self.sampler
        model = s_.decode_model(state)
        b, ta = logits.shape[0], plan.max_new_tokens
        _, streams = ops.row_keys(key, b)
        u = None
        if not plan.greedy:
            u = jax.vmap(lambda k: jax.random.uniform(k, (ta,)))(streams)
            u = s_.constrain(u, ("batch", None))
        columns = jnp.arange(ta)[None, :]

        def emit(s: TurnState, logits) -> TurnState:
            u_s = None if u is None else jax.lax.dynamic_index_in_dim(u, s.step, 1, False)
            token, sample_logp, policy_logp = ops.draw(logits, u_s, plan, knobs)
            on = s.active
            token = jnp.where(on, token, self.pad_id)
            logp = policy_logp  # the behaviour log-prob the objectives' ratios read
            here = on[:, None] & (columns == s.step)  # never past Ta: no clamped write
            out = (
                jnp.where(here, token[:, None], s.out[0]),
                jnp.where(here, logp[:, None], s.out[1]),
            )
            n = s.n + on.astype(jnp.int32)
            active = on & ~ops.is_stop(token, knobs.stop_ids) & (n < caps)
            return s.replace(step=s.step + 1, token=token, pending=on, active=active, n=n, out=out)

        def step(s: TurnState) -> TurnState:
            step_model, token = s_.step_model(model, s.token)
            feed = s.pending.astype(jnp.int32)[:, None]
            lg, cache = step_model(token[:, None], feed, positions=s.pos[:, None], cache=s.cache)
            s = s.replace(cache=s_.constrain_cache(cache), pos=s.pos + s.pending)
            return emit(s, lg[:, 0])

        zeros = jnp.zeros((b,), jnp.int32)
        start = TurnState(
            step=zeros[0],
            cache=cache,
            token=zeros,
            pending=zeros > 0,
            active=caps > 0,
            pos=pos,
            n=zeros,
            out=(jnp.full((b, ta), self.pad_id, jnp.int32), jnp.zeros((b, ta), jnp.float32)),
        )
        s = jax.lax.while_loop(lambda s: jnp.any(s.pending), step, emit(start, logits))
        return s.out, s.n, s.pos, s.cache

    def _observe(self, state, cache, pos, tokens, mask):
        model = self.sampler.decode_model(state)
        logits, cache, pos = observe(model, cache, pos, tokens, mask)
        return logits, self.sampler.constrain_cache(cache), pos

    # ------------------------------------------------------------------ episode

    def _put(self, *arrays):
        if self.sampler.mesh is None:
            return tuple(map(jnp.asarray, arrays))
        return tuple(shd.shard_batch(list(arrays), self.sampler.mesh))

    def start(self, prompt_tokens, prompt_mask, key) -> int:
        """Prefill P left-padded host prompts [P, T] (G rows each). Returns the real rows
        P * G (the session's rows may be more: batch-bucket padding, never live)."""
        s = self.sampler
        (tokens, mask), num_prompts = s.pad_prompts(prompt_tokens, prompt_mask, "TurnSession")
        self.key, self.state = as_key(key), s.weights()
        self.prompt_len = tokens.shape[1]
        slots = self.max_turns * (self.turn_tokens + self.obs_tokens)
        self.cache, self.logits, self.pos = s.prefill(
            self.state, tokens, mask, self.key, self.knobs, n=self.plan.n, use_dropout=False,
            slots=slots,
        )  # fmt: skip
        self.prompts = (np.asarray(tokens), np.asarray(mask))
        self.rows, self.turns = self.pos.shape[0], 0
        self.real_rows = num_prompts * self.plan.n
        return self.real_rows

    def _rows(self, x, fill) -> np.ndarray:
        """A host per-row array for the real rows -> the session's rows (padding: fill)."""
        out = np.full((self.rows,) + np.shape(x)[1:], fill, np.asarray(x).dtype)
        out[: len(x)] = x
        return out

    def turn(self, caps) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Decode one turn; caps int [real rows]: this turn's token cap per row (0: the
        episode is over). Returns host (tokens int32 [R, Ta], logp f32 [R, Ta], lengths
        int32 [R]) for the R real rows; tokens past a row's length are pad_id."""
        if self.turns >= self.max_turns:
            raise RuntimeError(f"TurnSession: the cache holds {self.max_turns} turns")
        caps = np.minimum(np.asarray(caps, np.int32), self.turn_tokens)
        (caps_d,) = self._put(self._rows(caps, 0))
        key = jax.random.fold_in(self.key, self.turns)
        run = self._program("turn", self.rows, ("plan",))
        (tokens, logp), n, self.pos, self.cache = run(
            self.state, self.cache, self.logits, self.pos, caps_d, key, self.knobs, plan=self.plan
        )
        self.turns += 1
        r = self.real_rows
        return shd.all_rows(tokens)[:r], shd.all_rows(logp)[:r], shd.all_rows(n)[:r]

    def append(self, observations) -> None:
        """Prefill each row's observation ids (a list of ints, or None / [] for none) into
        the cache after its last turn; at most `obs_tokens` ids each."""
        to = self.obs_tokens
        tokens = np.full((self.rows, to), self.pad_id, np.int32)
        mask = np.zeros((self.rows, to), np.int32)
        for i, ids in enumerate(observations):
            if not ids:
                continue
            if len(ids) > to:
                raise ValueError(f"TurnSession.append: row {i} has {len(ids)} ids > {to}")
            tokens[i, to - len(ids) :], mask[i, to - len(ids) :] = ids, 1
        run = self._program("observe", self.rows)
        self.logits, self.cache, self.pos = run(
            self.state, self.cache, self.pos, *self._put(tokens, mask)
        )
