"""Prompt clusters for ADS: a task-provided key, or k-means on prompt features.

    TaskClusters(task)                   the task's `cluster_key(example)` (or a fallback)
    KMeansClusters.fit(task, k, ...)     seeded k-means on `prompt_features` of a sample of
                                         the train split; `key(example)` -> 'k<j>'

Both have `key(example) -> str` and `state()` / `restore(state)` (JSON, in the
checkpoint): a resumed run assigns every prompt to the cluster it had.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.data.tasks.base import Example, Task

# name -> builder(task, ads_config, *, seed, prompt_of) -> clusters (`data.ads.clusters`)
CLUSTERINGS = Registry("ADS clustering", key="data.ads.clusters")

_SYMBOLS = string.punctuation  # 32 printable non-alphanumeric characters, one feature each


def prompt_features(text: str) -> np.ndarray:
    """f32 [7 + 32] features of a prompt: log(1 + characters), log(1 + words), the shares of
    digits, letters and spaces, log(1 + digit runs), log(1 + longest digit run), and the
    count of each punctuation / operator character. Task-agnostic: for arithmetic the
    operator and the operand lengths dominate, for text the length and the punctuation."""
    n = len(text)
    runs = [len(r) for r in "".join(ch if ch.isdigit() else " " for ch in text).split()]
    head = [
        np.log1p(n),
        np.log1p(len(text.split())),
        sum(ch.isdigit() for ch in text) / max(n, 1),
        sum(ch.isalpha() for ch in text) / max(n, 1),
        sum(ch.isspace() for ch in text) / max(n, 1),
        np.log1p(len(runs)),
        np.log1p(max(runs, default=0)),
    ]
    return np.asarray(head + [text.count(s) for s in _SYMBOLS], np.float32)


def kmeans(x: np.ndarray, k: int, *, seed: int, iters: int = 25) -> np.ndarray:
    """Centroids [k, F] of rows x [N, F]: k-means++ seeding from `np.random.default_rng(seed)`,
    then Lloyd iterations (at most `iters`, stopping when no assignment changes). An emptied
    cluster moves to the point farthest from its centroid. k > N distinct points: k = N."""
    x = np.asarray(x, np.float64)
    rng = np.random.default_rng(seed)
    distinct = np.unique(x, axis=0)
    k = int(min(k, len(distinct)))
    centres = [x[rng.integers(len(x))]]
    for _ in range(1, k):
        d2 = ((x[:, None] - np.asarray(centres)[None]) ** 2).sum(-1).min(1)
        centres.append(x[rng.choice(len(x), p=d2 / d2.sum())] if d2.sum() > 0 else x[0])
    c = np.asarray(centres)
    assign = None
    for _ in range(iters):
        d2 = ((x[:, None] - c[None]) ** 2).sum(-1)
        new = d2.argmin(1)
        if assign is not None and np.array_equal(new, assign):
            break
        assign = new
        for j in range(k):
            members = x[assign == j]
            if len(members):
                c[j] = members.mean(0)
            else:  # refill from the worst-served point
                c[j] = x[d2[np.arange(len(x)), assign].argmax()]
    return c.astype(np.float32)


def _fallback_key(task: Task, example: Example, prompt_of: Callable[[Example], str]) -> str:
    key = task.cluster_key
    if key is not None:
        return str(key(example))
    if {"a", "b", "op"} <= set(example):
        return f"{example['op']}{len(str(abs(example['a'])))}x{len(str(abs(example['b'])))}"
    return f"len{len(prompt_of(example).split())}"


class TaskClusters:
    """A prompt's cluster: the task's `cluster_key(example)` when it defines one, else
    operation x operand digit counts for examples with `a`, `op`, `b` (arithmetic), else the
    number of whitespace-separated words of the prompt (a coarse length bucket)."""

    def __init__(self, task: Task, prompt_of: Callable[[Example], str]):
        self.task, self.prompt_of = task, prompt_of

    def key(self, example: Example) -> str:
        return _fallback_key(self.task, example, self.prompt_of)

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        del state  # a function of the task alone


class KMeansClusters:
    """Clusters 'k0' .. 'k<k-1>': the nearest centroid of a prompt's standardised
    `prompt_features`. The centroids and the standardisation are fitted once on a seeded
    sample of the train split and kept in the checkpoint."""

    def __init__(self, mean, std, centroids, prompt_of: Callable[[Example], str]):
        self.mean = np.asarray(mean, np.float32)
        self.std = np.asarray(std, np.float32)
        self.centroids = np.asarray(centroids, np.float32)
        self.prompt_of = prompt_of

    @classmethod
    def fit(
        cls,
        task: Task,
        k: int,
        *,
        seed: int,
        prompt_of: Callable[[Example], str],
        sample: int = 1024,
        iters: int = 25,
    ) -> KMeansClusters:
        n = task.num_examples("train")
        rng = np.random.default_rng([seed, 1])  # its own stream: the source's draws unchanged
        idx = np.sort(rng.choice(n, size=min(sample, n), replace=False))
        feats = np.stack([prompt_features(prompt_of(task.example("train", int(i)))) for i in idx])
        mean, std = feats.mean(0), feats.std(0)
        std = np.where(std > 1e-6, std, 1.0)  # constant features carry no distance
        centroids = kmeans((feats - mean) / std, k, seed=seed, iters=iters)
        return cls(mean, std, centroids, prompt_of)

    def assign(self, examples: list[Example]) -> np.ndarray:
        """int [N]: each example's nearest centroid."""
        f = np.stack([prompt_features(self.prompt_of(e)) for e in examples])
        z = (f - self.mean) / self.std
        return ((z[:, None] - self.centroids[None]) ** 2).sum(-1).argmin(1)

    def key(self, example: Example) -> str:
        return f"k{int(self.assign([example])[0])}"

    def state(self) -> dict[str, Any]:
        return {
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "centroids": self.centroids.tolist(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.mean = np.asarray(state["mean"], np.float32)
        self.std = np.asarray(state["std"], np.float32)
        self.centroids = np.asarray(state["centroids"], np.float32)


@CLUSTERINGS.register("task")
def task_clusters(task: Task, ads_config, *, seed: int, prompt_of):
    """`data.ads.clusters = 'task'`: the task's own key (see `TaskClusters`)."""
    del ads_config, seed
    return TaskClusters(task, prompt_of)


@CLUSTERINGS.register("kmeans")
def kmeans_clusters(task: Task, ads_config, *, seed: int, prompt_of):
    """`data.ads.clusters = 'kmeans'`: `data.ads.kmeans_k` clusters fitted on
    `data.ads.kmeans_sample` prompts in at most `data.ads.kmeans_iters` iterations."""
    if ads_config.kmeans_k < 1:
        raise ValueError(f"config key 'data.ads.kmeans_k' must be >= 1, got {ads_config.kmeans_k}")
    return KMeansClusters.fit(
        task,
        ads_config.kmeans_k,
        seed=seed,
        prompt_of=prompt_of,
        sample=ads_config.kmeans_sample,
        iters=ads_config.kmeans_iters,
    )
