"""ADS: adaptive difficulty sampling over task clusters (`data.source = 'ads'`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxrl_frontier.core.distributed import allgather_json
from jaxrl_frontier.data.tasks.base import Example, Task
from jaxrl_frontier.rl.experience import PromptResult
from jaxrl_frontier.rl.sources.base import SOURCES, PromptSource, SourceOptions, UniformSource
from jaxrl_frontier.rl.sources.clustering import CLUSTERINGS, TaskClusters
from jaxrl_frontier.rl.sources.utils import process_slice, prompt_text, rng_from, rng_state


class ADSSource(PromptSource):
    """Adaptive Data Scheduling ("Learning at the Right Pace: Adaptive Data Scheduling
    Improves LLM Reinforcement Learning"): a distribution over prompt clusters moved toward
    the clusters where the policy is at its boundary, and boundary prompts preferred inside a
    cluster.

    Cluster level, after each step, for every cluster k in O, the clusters whose prompts have
    run at least once:

        acc_k  <- mean solve rate of its prompts this step (kept when none ran)
        s_k     = acc_k (1 - acc_k) + floor                 progress score, largest at 0.5
        p_k    <- momentum p_k + (1 - momentum) M s_k / sum_{j in O} s_j,   M = sum_{j in O} p_j

    (momentum 0.7). A newly seen cluster enters with p = the mean of the others and no
    accuracy, and keeps its p until its prompts have run: a score made up for it (say 0.5,
    the top of s) would pull probability toward clusters nobody has measured.
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

    def add_cluster(self, k: str) -> None:
        """Enter cluster `k` (seen in a pool) at the mean probability of the others (1 when
        first), then renormalise; a known cluster is left as it is."""
        if k not in self.p:
            self.p[k] = float(np.mean(list(self.p.values()))) if self.p else 1.0
            total = sum(self.p.values())
            self.p = {c: v / total for c, v in self.p.items()}

    def prompt_weight(self, example: Example) -> float:
        """A prompt's draw weight inside its cluster: `boundary_weight` when its last solve
        rate is within `boundary` of 0.5, `off_weight` when seen off it, 1 when never seen."""
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
            self.add_cluster(k)
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
            w = np.asarray([self.prompt_weight(ex) for ex in members])
            j = int(self.rng.choice(len(members), p=w / w.sum()))
            boundary += w[j] == self.boundary_weight
            chosen.append(members.pop(j) if len(members) > 1 else members[j])
        self._last_boundary_share = boundary / len(chosen)
        return process_slice(chosen, self.pi, self.pn)

    def observe(self, results: Sequence[PromptResult]) -> None:
        mine = [[int(r.index), float(r.correct), self.clusters.key(r.example)] for r in results]
        every = [x for part in allgather_json(mine) for x in part]
        seen: dict[str, list[float]] = {}
        for index, correct, k in every:
            self.solve[str(index)] = correct
            self.add_cluster(k)
            seen.setdefault(k, []).append(correct)
        for k, v in seen.items():
            self.acc[k] = float(np.mean(v))
        s = {k: a * (1 - a) + self.floor for k, a in self.acc.items()}  # the clusters O
        total, mass = sum(s.values()), sum(self.p[k] for k in s)
        p = dict(self.p)
        for k in s:
            p[k] = self.momentum * p[k] + (1 - self.momentum) * mass * s[k] / total
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
            "rng": rng_state(self.rng),
            "p": self.p,
            "acc": self.acc,
            "solve": self.solve,
            "clusters": self.clusters.state(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.fresh.restore(state["fresh"])
        self.rng = rng_from(state["rng"])
        self.p, self.acc = dict(state["p"]), dict(state["acc"])
        self.solve = dict(state["solve"])
        self.clusters.restore(state.get("clusters", {}))


@SOURCES.register("ads", part=ADSSource)
def ads(
    task: Task, options: SourceOptions, *, batch_size: int, process_index: int, process_count: int
):
    """`data.source = 'ads'`: Adaptive Data Scheduling (`data.ads.*`; the clusters:
    `data.ads.clusters`, a `clustering.CLUSTERINGS` name)."""
    a = options.ads
    make_clusters = CLUSTERINGS.get(a.clusters)
    clusters = make_clusters(task, a, seed=options.seed, prompt_of=lambda e: prompt_text(task, e))
    fresh = UniformSource(task, batch_size=batch_size, seed=options.seed)  # the global stream
    return ADSSource(
        task,
        fresh,
        seed=options.seed,
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
