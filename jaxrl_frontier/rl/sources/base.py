"""Prompt sources: which prompts an RL (or SFT) step trains on.

A `PromptSource` is the first stage of a step:

    next_batch() -> this process's examples          (list of example dicts, prompt-major)
    observe(results)                                  per-prompt results after scoring
    state() / restore(state)                          saved with every checkpoint (JSON)

The loop calls `next_batch()`, hands the examples to the `RolloutProducer`, and passes the
Experience's per-prompt results back through `observe`, so a source that schedules by
difficulty (dynamic sampling, ADS, replay) sees how its prompts went.

Sources are chosen by `data.source` from `SOURCES` (name -> builder). Every process runs the
same global stream and keeps its own slice of each global batch: the same run sees the same
prompts on one host or many, and a group never spans processes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import grain
import numpy as np

from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.data.tasks.base import Example, Task, check_split
from jaxrl_frontier.data.tasks.pipeline import _READ_OPTIONS, _LoadExample
from jaxrl_frontier.rl.sources.clustering import CLUSTERINGS, TaskClusters
from jaxrl_frontier.rl.sources.utils import (
    _allgather_json,
    _rng_from,
    _rng_state,
    _slice,
    _sum_over_processes,
    prompt_text,
)
from jaxrl_frontier.rl.sources.zppo import ZPPOSource


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


class PromptSource(Protocol):
    """The prompt-scheduling stage (see the module docstring)."""

    def next_batch(self) -> list[Example]: ...

    def observe(self, results: Sequence[PromptResult]) -> None: ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...


SOURCES = Registry("prompt source")


class _LocalSlice:
    """A global batch of indices -> this process's examples (picklable for grain)."""

    def __init__(self, task: Task, split: str, process_index: int, process_count: int):
        self.load = _LoadExample(task, split)
        self.process_index, self.process_count = process_index, process_count

    def __call__(self, indices: np.ndarray) -> list[Example]:
        per = len(indices) // self.process_count
        mine = indices[self.process_index * per : (self.process_index + 1) * per]
        return [self.load(i) for i in mine]


class UniformSource:
    """Uniform prompts: a seeded shuffle of the split, reshuffled every epoch (grain).

    range(n).seed(seed).shuffle().repeat()  ->  global batches of `batch_size` indices  ->
    this process's slice [i B / N, (i + 1) B / N), loaded. The iterator state is exact: a
    restored source yields the batches the original would have yielded next.
    """

    def __init__(
        self,
        task: Task,
        *,
        batch_size: int,
        seed: int,
        split: str = "train",
        process_index: int = 0,
        process_count: int = 1,
    ):
        check_split(split)
        if batch_size < 1 or batch_size % process_count:
            raise ValueError(
                f"prompt batch {batch_size} must be a positive multiple of the "
                f"{process_count} processes (each owns whole prompts)"
            )
        self.batch_size = batch_size
        ds = grain.MapDataset.range(task.num_examples(split)).seed(seed).shuffle().repeat(None)
        ds = ds.batch(batch_size, drop_remainder=True, batch_fn=np.asarray)
        ds = ds.map(_LocalSlice(task, split, process_index, process_count))
        self._it = iter(ds.to_iter_dataset(_READ_OPTIONS))

    def next_batch(self) -> list[Example]:
        return next(self._it)

    def observe(self, results: Sequence[PromptResult]) -> None:
        del results  # uniform: how prompts went does not change what comes next

    def state(self) -> dict[str, Any]:
        return {"iterator": _jsonable_state(self._it.get_state())}

    def restore(self, state: dict[str, Any]) -> None:
        self._it.set_state(_from_jsonable_state(state["iterator"]))


@SOURCES.register("uniform")
def uniform(task: Task, config, *, batch_size: int, process_index: int, process_count: int):
    """`data.source = 'uniform'`: every prompt equally often (the default)."""
    return UniformSource(
        task,
        batch_size=batch_size,
        seed=config.seed,
        process_index=process_index,
        process_count=process_count,
    )


def make_source(
    task: Task, config, *, batch_size: int, process_index: int = 0, process_count: int = 1
) -> PromptSource:
    """The configured source (`config.data.source`) for global batches of `batch_size`."""
    name = config.data.source
    try:
        builder = SOURCES.get(name)
    except KeyError as e:
        from jaxrl_frontier.run.config import ConfigError

        raise ConfigError(f"config key 'data.source': {e.args[0]}") from None
    return builder(
        task,
        config,
        batch_size=batch_size,
        process_index=process_index,
        process_count=process_count,
    )


def _jsonable_state(state):
    """grain states may hold bytes; the checkpoint's metadata is JSON."""
    if isinstance(state, bytes):
        return {"__bytes__": state.decode("latin-1")}
    return state


def _from_jsonable_state(state):
    if isinstance(state, dict) and "__bytes__" in state:
        return state["__bytes__"].encode("latin-1")
    return state


# ============================================================================ DAPO dynamic sampling


def signal_groups(rewards: np.ndarray, group_size: int) -> np.ndarray:
    """bool [P]: the groups whose reward vectors are not all equal (rewards [P * G, K]).

    A group of equal rewards has zero group-relative advantage under every group baseline:
    it carries no policy-gradient signal.
    """
    r = np.asarray(rewards).reshape(-1, group_size, np.shape(rewards)[-1])
    return np.ptp(r, axis=1).max(axis=-1) > 0


class DynamicSource:
    """DAPO dynamic sampling ("DAPO: An Open-Source LLM Reinforcement Learning System at
    Scale"): groups whose rewards are all equal are dropped and fresh prompts drawn until the
    batch holds `prompt_batch` groups with signal, at most `max_draws` draws per step.

    The prompts come from the uniform stream. The source is also the producer's group
    selector (`select(draw, more)`): after the first draw it asks for more while any process
    lacks signal groups (a global count, so every process draws the same number of times),
    then keeps, per process, its first P_l signal groups in draw order, topped up with
    zero-signal groups only when the draw budget is spent. Shapes stay static: the
    Experience always has P groups. Metrics: `dynamic/draws` (this step),
    `dynamic/signal_groups` (found, all processes), `dynamic/filled_zero_signal` (groups
    without signal kept because the budget ran out) and `dynamic/draws_total`.
    """

    def __init__(self, fresh: UniformSource, *, max_draws: int, weights=None):
        if max_draws < 1:
            raise ValueError(f"config key 'data.dynamic.max_draws' must be >= 1, got {max_draws}")
        self.fresh, self.max_draws = fresh, int(max_draws)
        self.weights = None if weights is None else np.asarray(weights, np.float32)
        self.draws_total = 0

    def _signal(self, draw) -> np.ndarray:
        """bool [P]: groups whose weighted sequence rewards sum_k w_k r_k are not all equal
        (all reward components when no weights are given)."""
        r = draw.rewards if self.weights is None else draw.rewards @ self.weights[:, None]
        return signal_groups(r, draw.rows.group_size)

    def next_batch(self) -> list[Example]:
        self.draws_total += 1
        return self.fresh.next_batch()

    def observe(self, results: Sequence[PromptResult]) -> None:
        del results  # the filter acts inside the step (select)

    def select(self, draw, more):
        """(ScoredRows of the first draw's prompt count, metrics); see the class docstring."""
        p = len(draw.rows.examples)
        parts = [draw]
        found = int(self._signal(draw).sum())
        while len(parts) < self.max_draws and _sum_over_processes(max(0, p - found)) > 0:
            parts.append(more(len(parts)))
            found += int(self._signal(parts[-1]).sum())
        every = type(draw).concat(parts) if len(parts) > 1 else draw
        signal = self._signal(every)
        order = np.concatenate([np.flatnonzero(signal), np.flatnonzero(~signal)])[:p]
        metrics = {
            "dynamic/draws": float(len(parts)),
            "dynamic/signal_groups": _sum_over_processes(found),
            "dynamic/filled_zero_signal": _sum_over_processes(max(0, p - found)),
            "dynamic/draws_total": float(self.draws_total),
        }
        return every.take_groups(np.sort(order)), metrics

    def state(self) -> dict[str, Any]:
        return {"fresh": self.fresh.state(), "draws_total": self.draws_total}

    def restore(self, state: dict[str, Any]) -> None:
        self.fresh.restore(state["fresh"])
        self.draws_total = int(state["draws_total"])


@SOURCES.register("dynamic")
def dynamic(task: Task, config, *, batch_size: int, process_index: int, process_count: int):
    """`data.source = 'dynamic'`: DAPO dynamic sampling (`data.dynamic.max_draws`); signal is
    judged on the weighted reward the advantages use (`objective.reward_weights`, with the
    rollout shapers' components)."""
    from jaxrl_frontier.rl.produce.editors import effective_reward_weights, shaper_reward_names

    fresh = uniform(
        task,
        config,
        batch_size=batch_size,
        process_index=process_index,
        process_count=process_count,
    )
    shaped = shaper_reward_names(config)
    w = effective_reward_weights(config.objective.reward_weights.to_dict(), shaped)
    names = list(task.reward_names) + shaped
    vector = [w.get(n, 0.0) for n in names] if w else [float(n == "correctness") for n in names]
    return DynamicSource(fresh, max_draws=config.data.dynamic.max_draws, weights=vector)


# ============================================================================ ADS


class ADSSource:
    """Adaptive Data Scheduling ("Learning at the Right Pace: Adaptive Data Scheduling
    Improves LLM Reinforcement Learning"): a distribution over prompt clusters moved toward
    the clusters where the policy is at its boundary, and boundary prompts preferred inside a
    cluster.

    Cluster level, after each step, for every cluster k seen so far:

        acc_k  <- mean solve rate of its prompts this step (kept when none ran)
        s_k     = acc_k (1 - acc_k) + floor                 progress score, largest at 0.5
        p_k    <- momentum p_k + (1 - momentum) s_k / sum_j s_j,   renormalised

    (momentum 0.7; a newly seen cluster enters with acc 0.5, p = the mean of the others).
    Clusters come from `clusters` (`clustering.TaskClusters`: the task's key, the default;
    or `clustering.KMeansClusters`: k-means on prompt features), whose state is saved too.
    Sample level: each step draws a pool of `pool` x P candidates from the uniform stream,
    then fills each of the P slots by drawing a cluster from p (restricted to the pool's
    clusters) and a prompt of that cluster with weight `boundary_weight` if its last solve
    rate is within `boundary` (0.17) of 0.5, `off_weight` if it was seen off the boundary,
    1 if never seen. All draws use one seeded generator whose state is in the checkpoint;
    results are gathered from every process, so every process holds the same state and
    computes the same global batch, keeping its own slice. Metrics: `ads/p/<cluster>`,
    `ads/acc/<cluster>`, `ads/boundary_share`.
    """

    def __init__(
        self,
        task: Task,
        fresh: UniformSource,
        *,
        seed: int,
        pool: int = 4,
        momentum: float = 0.7,
        boundary: float = 0.17,
        boundary_weight: float = 4.0,
        off_weight: float = 0.25,
        floor: float = 0.01,
        process_index: int = 0,
        process_count: int = 1,
        clusters=None,
    ):
        if pool < 1 or not 0 <= momentum < 1:
            raise ValueError(
                f"config keys 'data.ads.pool' (>= 1) and 'data.ads.momentum' (in [0, 1)): "
                f"got {pool}, {momentum}"
            )
        self.task, self.fresh, self.pool = task, fresh, int(pool)
        self.clusters = clusters or TaskClusters(task, lambda e: prompt_text(task, e))
        self.momentum, self.boundary, self.floor = momentum, boundary, floor
        self.boundary_weight, self.off_weight = boundary_weight, off_weight
        self.pi, self.pn = process_index, process_count
        self.rng = np.random.default_rng(seed)
        self.p: dict[str, float] = {}  # cluster -> probability
        self.acc: dict[str, float] = {}  # cluster -> last solve rate
        self.solve: dict[str, float] = {}  # str(prompt index) -> last solve rate
        self._last_boundary_share = 0.0

    def _add_cluster(self, k: str) -> None:
        if k not in self.p:
            self.p[k] = float(np.mean(list(self.p.values()))) if self.p else 1.0
            self.acc[k] = 0.5
            total = sum(self.p.values())
            self.p = {c: v / total for c, v in self.p.items()}

    def _weight(self, example: Example) -> float:
        sr = self.solve.get(str(example["index"]))
        if sr is None:
            return 1.0
        return self.boundary_weight if abs(sr - 0.5) <= self.boundary else self.off_weight

    def next_batch(self) -> list[Example]:
        # every process builds the whole global pool (pool x its own slice from each process
        # would differ), so the uniform stream here is the un-sliced global one
        cands = [ex for _ in range(self.pool) for ex in self.fresh.next_batch()]
        keys = [self.clusters.key(ex) for ex in cands]
        for k in keys:
            self._add_cluster(k)
        by = {}
        for ex, k in zip(cands, keys):
            by.setdefault(k, []).append(ex)
        present = sorted(by)
        probs = np.asarray([self.p[k] for k in present])
        probs = probs / probs.sum()
        chosen, boundary = [], 0
        for _ in range(self.fresh.batch_size):
            k = present[int(self.rng.choice(len(present), p=probs))]
            members = by[k]
            w = np.asarray([self._weight(ex) for ex in members])
            j = int(self.rng.choice(len(members), p=w / w.sum()))
            boundary += w[j] == self.boundary_weight
            chosen.append(members.pop(j) if len(members) > 1 else members[j])
        self._last_boundary_share = boundary / len(chosen)
        return _slice(chosen, self.pi, self.pn)

    def observe(self, results: Sequence[PromptResult]) -> None:
        mine = [[int(r.index), float(r.correct), self.clusters.key(r.example)] for r in results]
        every = [x for part in _allgather_json(mine) for x in part]
        seen: dict[str, list[float]] = {}
        for index, correct, k in every:
            self.solve[str(index)] = correct
            self._add_cluster(k)
            seen.setdefault(k, []).append(correct)
        for k, v in seen.items():
            self.acc[k] = float(np.mean(v))
        s = {k: a * (1 - a) + self.floor for k, a in self.acc.items()}
        total = sum(s.values())
        p = {k: self.momentum * self.p[k] + (1 - self.momentum) * s[k] / total for k in self.p}
        z = sum(p.values())
        self.p = {k: v / z for k, v in p.items()}

    def metrics(self) -> dict[str, float]:
        out = {f"ads/p/{k}": v for k, v in sorted(self.p.items())}
        out.update({f"ads/acc/{k}": v for k, v in sorted(self.acc.items())})
        out["ads/boundary_share"] = float(self._last_boundary_share)
        return out

    def state(self) -> dict[str, Any]:
        return {
            "fresh": self.fresh.state(),
            "rng": _rng_state(self.rng),
            "p": self.p,
            "acc": self.acc,
            "solve": self.solve,
            "clusters": self.clusters.state(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.fresh.restore(state["fresh"])
        self.rng = _rng_from(state["rng"])
        self.p, self.acc = dict(state["p"]), dict(state["acc"])
        self.solve = dict(state["solve"])
        self.clusters.restore(state.get("clusters", {}))


@SOURCES.register("ads")
def ads(task: Task, config, *, batch_size: int, process_index: int, process_count: int):
    """`data.source = 'ads'`: Adaptive Data Scheduling (`data.ads.*`; the clusters:
    `data.ads.clusters`, a `clustering.CLUSTERINGS` name)."""
    a = config.data.ads
    try:
        make_clusters = CLUSTERINGS.get(a.clusters)
    except KeyError as e:
        from jaxrl_frontier.run.config import ConfigError

        raise ConfigError(f"config key 'data.ads.clusters': {e.args[0]}") from None
    clusters = make_clusters(task, a, seed=config.seed, prompt_of=lambda e: prompt_text(task, e))
    fresh = UniformSource(task, batch_size=batch_size, seed=config.seed)  # the global stream
    return ADSSource(
        task,
        fresh,
        seed=config.seed,
        pool=a.pool,
        momentum=a.momentum,
        boundary=a.boundary,
        boundary_weight=a.boundary_weight,
        off_weight=a.off_weight,
        floor=a.floor,
        process_index=process_index,
        process_count=process_count,
        clusters=clusters,
    )


# ============================================================================ ZPPO replay


@SOURCES.register("zppo")
def zppo(task: Task, config, *, batch_size: int, process_index: int, process_count: int):
    """`data.source = 'zppo'`: hard-prompt replay with BCQ / NCQ prompts (`data.zppo.*`)."""
    z = config.data.zppo
    return ZPPOSource(
        task,
        UniformSource(task, batch_size=batch_size, seed=config.seed),  # the global stream
        seed=config.seed,
        capacity=z.capacity,
        replay_fraction=z.replay_fraction,
        max_wrong=z.max_wrong,
        bcq_template=z.bcq_template,
        ncq_template=z.ncq_template,
        process_index=process_index,
        process_count=process_count,
    )


# 3SPO's allocation lives with the environments; importing it registers 'sspo'.
from jaxrl_frontier.rl.sources import sspo as _allocation  # noqa: E402, F401
