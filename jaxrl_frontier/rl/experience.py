"""`Experience`: the one record a rollout batch travels in, from the producer to the learner.

Every array is global (sharded over the mesh's batch axes; on several hosts each process
holds the rows its own prompts produced) and aligned with `tokens` as the objectives expect:
`x[b, t]` is about `tokens[b, t]` given `tokens[b, :t]`. Rows are prompt-major: rows
g*G .. g*G+G-1 are the G completions of prompt g, and a group never spans processes.

    tokens          int32 [B, T]   prompt (left-padded) | completion (right-padded)
    attention_mask  int32 [B, T]   1 on real tokens
    loss_mask       f32   [B, T]   completion AND sampled by the policy (not observations)
    old_logp        f32   [B, T]   behaviour log-probs (0 off the loss mask)
    ref_logp        f32   [B, T]   reference log-probs, or None
    teacher_logp    f32   [B, T]   teacher log-probs, or None
    advantages      f32   [B, T]   per token (a sequence advantage broadcast), 0 off the mask
    rewards         f32   [B, K]   reward vectors (the task's `reward_names` order)
    prompt_index    int32 [B]      dataset index of each row's prompt
    group_id        int32 [B]      global group (prompt) number within the batch
    policy_version  int32 [B]      version of the weights that sampled the row (its first token)
    turn_index      int32 [B, T]   0 for single-turn rollouts; the turn of each token
    dropout_keys    uint32 [B, 2]  Dropout-GRPO row keys (the update rebuilds their masks), or None
    routing         int16 [B, T, L, k]  a mixture of experts' experts per token and layer as the
                    sampler routed them (-1: none), which the update replays; or None
    token_version   int32 [B, T]   partial rollouts: the version that sampled each token (-1 off
                                   the completion), or None (every token: policy_version)
    extras          {name: [B, T]} arrays filled by registered log-prob passes (e.g. sc_logp)

The host-side results travel beside it, in the producer's `info`: `info["results"]`, one
`PromptResult` per prompt this process owns (for `PromptSource.observe`), and `info["texts"]`,
the decoded completions of this process's rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import numpy as np
from jax.sharding import NamedSharding

from jaxrl_frontier.core.distributed import allgather_json
from jaxrl_frontier.core.serialize import array_from_text, array_to_text
from jaxrl_frontier.data.tasks.base import Example

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class PromptResult:
    """How one prompt's group went (host values; one per prompt this process owns).

    index: the example's dataset index.  rewards: [G, K] reward vectors of its completions.
    reward: [G] combined sequence rewards.  correct: fraction of completions with
    correctness > 0.  lengths: [G] completion lengths.  texts: the G decoded completions.
    episode_states: in environment runs, the G episodes' visited states.
    """

    index: int
    example: Example
    rewards: np.ndarray
    reward: np.ndarray
    correct: float
    lengths: np.ndarray
    texts: tuple[str, ...] = ()
    episode_states: tuple = ()  # environment runs: each episode's visited states (3SPO)


@dataclasses.dataclass(frozen=True)
class RolloutRows:
    """This process's rows of a rollout on the host, as editors see them (prompt-major).

    examples: P_l examples; row b is completion b % G of examples[b // G].
    completion_tokens int32 [B_l, Tn], completion_mask int32 [B_l, Tn] (1 up to and with the
    stop token), policy_mask int32 [B_l, Tn] (1 on tokens the policy sampled: an editor that
    inserts tokens sets 0 there, so they get no gradient), policy_logp f32 [B_l, Tn],
    texts: the decoded completions (an editor that changes tokens re-decodes them),
    token_version int32 [B_l, Tn] or None: partial rollouts' per-token policy versions.
    """

    examples: tuple[Example, ...]
    completion_tokens: np.ndarray
    completion_mask: np.ndarray
    policy_mask: np.ndarray
    policy_logp: np.ndarray
    texts: tuple[str, ...]
    token_version: np.ndarray | None = None

    @property
    def group_size(self) -> int:
        return len(self.texts) // len(self.examples)

    def replace(self, **changes) -> RolloutRows:
        return dataclasses.replace(self, **changes)

    def take_groups(self, groups: Sequence[int]) -> RolloutRows:
        """The rows of these groups (prompt indices into `examples`), in that order."""
        g = self.group_size
        rows = group_rows(groups, g)
        return RolloutRows(
            examples=tuple(self.examples[i] for i in groups),
            completion_tokens=self.completion_tokens[rows],
            completion_mask=self.completion_mask[rows],
            policy_mask=self.policy_mask[rows],
            policy_logp=self.policy_logp[rows],
            texts=tuple(self.texts[r] for r in rows),
            token_version=None if self.token_version is None else self.token_version[rows],
        )


def group_rows(groups: Sequence[int], g: int) -> np.ndarray:
    """Row indices [len(groups) * G] of whole groups, prompt-major."""
    return (np.asarray(groups, np.int64)[:, None] * g + np.arange(g)[None]).reshape(-1)


@dataclasses.dataclass(frozen=True)
class ScoredRows:
    """One draw of this process's rows after editing and scoring (host, prompt-major).

    rows: the `RolloutRows`; prompt_tokens / prompt_mask int32 [B_l, Tp]; rewards f32
    [B_l, K]; dropout_keys [B_l, ...] or None; n_failed: completions whose scoring failed;
    routing: the recorded experts [B_l, Tp + Tn, L, k] (`Rollout.routing`) or None.
    """

    rows: RolloutRows
    prompt_tokens: np.ndarray
    prompt_mask: np.ndarray
    rewards: np.ndarray
    dropout_keys: np.ndarray | None
    n_failed: int
    routing: np.ndarray | None = None

    def take_groups(self, groups: Sequence[int]) -> ScoredRows:
        rows = group_rows(groups, self.rows.group_size)
        keys = None if self.dropout_keys is None else self.dropout_keys[rows]
        return ScoredRows(
            self.rows.take_groups(groups),
            self.prompt_tokens[rows],
            self.prompt_mask[rows],
            self.rewards[rows],
            keys,
            self.n_failed,
            None if self.routing is None else self.routing[rows],
        )

    @staticmethod
    def concat(parts: Sequence[ScoredRows]) -> ScoredRows:
        """Several draws as one (their groups in draw order; failures summed)."""
        cat = lambda f: np.concatenate([f(p) for p in parts])
        r = [p.rows for p in parts]
        rows = RolloutRows(
            examples=sum((x.examples for x in r), ()),
            completion_tokens=np.concatenate([x.completion_tokens for x in r]),
            completion_mask=np.concatenate([x.completion_mask for x in r]),
            policy_mask=np.concatenate([x.policy_mask for x in r]),
            policy_logp=np.concatenate([x.policy_logp for x in r]),
            texts=sum((x.texts for x in r), ()),
            token_version=None
            if any(x.token_version is None for x in r)
            else np.concatenate([x.token_version for x in r]),
        )
        keys = None if parts[0].dropout_keys is None else cat(lambda p: p.dropout_keys)
        routing = None if parts[0].routing is None else cat(lambda p: p.routing)
        return ScoredRows(
            rows,
            cat(lambda p: p.prompt_tokens),
            cat(lambda p: p.prompt_mask),
            cat(lambda p: p.rewards),
            keys,
            sum(p.n_failed for p in parts),
            routing,
        )


# Fields the update reads (besides the optional ones present): see `Experience.update_batch`.
UPDATE_FIELDS = ("tokens", "attention_mask", "loss_mask", "old_logp", "advantages")
OPTIONAL_FIELDS = ("ref_logp", "teacher_logp", "dropout_keys", "routing")
# several teachers (`teacher.by_tag`): each row's teacher, an extra [B, T] (the row's index
# into the teachers, on every position, so that slicing and packing carry it as any other);
# the teacher pass and a full-vocabulary distillation loss read it
TEACHER_INDEX = "teacher_index"


@flax.struct.dataclass
class Experience:
    tokens: Array
    attention_mask: Array
    loss_mask: Array
    old_logp: Array
    advantages: Array
    rewards: Array
    prompt_index: Array
    group_id: Array
    policy_version: Array
    turn_index: Array
    ref_logp: Array | None = None
    teacher_logp: Array | None = None
    dropout_keys: Array | None = None
    token_version: Array | None = None
    routing: Array | None = None
    extras: dict[str, Array] = flax.struct.field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]

    def update_batch(self) -> dict[str, Array]:
        """The arrays the update reads: the required fields, the optional ones present, and
        the extras (a loss reads them by name, e.g. `sc_logp`)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in UPDATE_FIELDS}
        out.update({k: getattr(self, k) for k in OPTIONAL_FIELDS if getattr(self, k) is not None})
        out.update(self.extras)
        return out


def log_rollouts(logger, step: int, exp: Experience, info: dict, mesh, prompt_of, reward_names):
    """The first two groups of this process's rows to `logger` (a RolloutLogger on process 0,
    None elsewhere), from the Experience and the producer's `info` (results, texts); every
    process must call it (it joins a collective)."""
    groups = 2
    import jax.numpy as jnp

    from jaxrl_frontier.core import sharding

    seq_adv = exp.advantages.sum(-1) / jnp.maximum(exp.loss_mask.sum(-1), 1)
    adv = sharding.local_rows(seq_adv, mesh)
    if logger is None:
        return
    results, texts = info["results"], info["texts"]
    g = len(texts) // max(len(results), 1)
    for i in range(min(len(texts), groups * g)):
        res = results[i // g]
        logger.write(
            step=step,
            prompt=prompt_of(res.example),
            completion=texts[i],
            rewards=dict(zip(reward_names, map(float, res.rewards[i % g]))),
            advantage=float(adv[i]),
        )


# ---------------------------------------------------------------- batches across a checkpoint


def batch_state(exp: Experience, info: dict) -> dict:
    """A produced batch (Experience, the producer's info) as JSON-able host state, exactly:
    each array's bits and its partition spec, the info's metrics, results and texts. For a
    checkpoint taken with batches in flight (`rl/ahead.py`). On several processes every
    process calls it (the arrays are gathered whole) and gets the same arrays and metrics,
    and its own prompts' results and texts (`batch_from_state` takes them back apart)."""
    if any(r.episode_states for r in info["results"]):
        raise ValueError("batch_state: episodes' visited states are not saved (environment runs)")
    from jax.experimental import multihost_utils

    arrays = {}
    for name, x in {**_fields(exp), **{f"extras.{k}": v for k, v in exp.extras.items()}}.items():
        spec = x.sharding.spec if isinstance(x.sharding, NamedSharding) else ()
        whole = x if x.is_fully_addressable else multihost_utils.process_allgather(x, tiled=True)
        arrays[name] = dict(data=array_to_text(jax.device_get(whole)), spec=_spec_state(spec))
    results = [
        {**dataclasses.asdict(r), **{k: array_to_text(getattr(r, k)) for k in _RESULT_ARRAYS}}
        for r in info["results"]
    ]
    return dict(
        arrays=arrays,
        metrics={k: float(v) for k, v in jax.device_get(info["metrics"]).items()},
        results=results,
        **{k: _plain(jax.device_get(info[k])) for k in _INFO_SCALARS if k in info},
        texts=list(info["texts"]),
    )


def batch_from_state(state: dict, mesh) -> tuple[Experience, dict]:
    """`batch_state`'s inverse: the Experience placed on `mesh` as it was sharded (each
    process placing its devices' shards of the whole arrays)."""
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    def place(a):
        whole = array_from_text(a["data"])
        spec = PartitionSpec(*[tuple(p) if isinstance(p, list) else p for p in a["spec"]])
        sharding = NamedSharding(mesh, spec)
        return jax.make_array_from_callback(whole.shape, sharding, lambda index: whole[index])

    placed = {name: place(a) for name, a in state["arrays"].items()}
    extras = {k.split(".", 1)[1]: v for k, v in placed.items() if k.startswith("extras.")}
    fields = {k: v for k, v in placed.items() if not k.startswith("extras.")}
    results = [
        PromptResult(**{**r, **{k: array_from_text(r[k]) for k in _RESULT_ARRAYS},
                        "texts": tuple(r["texts"]), "episode_states": ()})
        for r in state["results"]
    ]  # fmt: skip
    info = dict(
        metrics={k: jnp.float32(v) for k, v in state["metrics"].items()},
        results=results,
        texts=tuple(state["texts"]),
        **{k: state[k] for k in _INFO_SCALARS if k in state},
    )
    return Experience(**fields, extras=extras), info


def batches_state(outs: list[tuple]) -> list[dict]:
    """`batch_state` of each (Experience, info); on several processes the arrays once and
    every process's results and texts apart (`per_process`, gathered: a collective)."""
    states = [batch_state(*out) for out in outs]
    if jax.process_count() == 1:
        return states
    mine = [{k: s.pop(k) for k in ("results", "texts")} for s in states]
    every = allgather_json(mine)  # [process][batch]
    for i, s in enumerate(states):
        s["per_process"] = [p[i] for p in every]
    return states


def batches_from_state(states: list[dict], mesh) -> list[tuple]:
    """`batches_state`'s inverse, each process taking its own results and texts back."""
    own = lambda s: {**s, **s["per_process"][jax.process_index()]} if "per_process" in s else s  # noqa: E731
    return [batch_from_state(own(s), mesh) for s in states]


_RESULT_ARRAYS = ("rewards", "reward", "lengths")
_INFO_SCALARS = ("n_failed", "rollout_seconds", "policy_version", "knobs")


def _fields(exp: Experience) -> dict:
    names = [f.name for f in dataclasses.fields(exp) if f.name != "extras"]
    return {n: getattr(exp, n) for n in names if getattr(exp, n) is not None}


def _plain(v):
    """numpy scalars (and dicts of them) as Python numbers, for JSON."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v.item() if isinstance(v, np.generic | np.ndarray | jax.Array) else v


def _spec_state(spec) -> list:
    return [list(p) if isinstance(p, tuple) else p for p in spec]
