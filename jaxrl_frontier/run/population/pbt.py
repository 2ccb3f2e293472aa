"""Population-based training inside a population (`population.pbt.*`; Jaderberg et al., 2017,
"Population Based Training of Neural Networks").

Every `pbt.every` steps, after every member's evaluation of that step:

    rank the members by `pbt.metric` (their held-out eval of the step, higher is better)
    exploit: each of the bottom `fraction` x N members copies the params and optimizer
             state of a member drawn from the top `fraction` x N (its own RNG stream and
             step count stay its own)
    explore: its varied float keys become the source's values, each times a factor drawn
             from `pbt.factors`

The draws come from `np.random.default_rng([seed, step])`, so a resumed population redoes
the decision of a step exactly. Each copy is one row of `workdir/lineage.jsonl`
(`scripts/report.py` draws it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections
import numpy as np

from jaxrl_frontier.core.errors import ConfigError


def pbt_section() -> ml_collections.ConfigDict:
    """`population.pbt`: every = 0 (off) or K steps (a multiple of train.eval_every)."""
    return ml_collections.ConfigDict(
        dict(every=0, metric="eval/pass@1_greedy", fraction=0.25, factors=(0.8, 1.25))
    )


@dataclasses.dataclass(frozen=True)
class PBTOptions:
    """`population.pbt` (module docstring), checked where built."""

    every: int
    metric: str
    fraction: float
    factors: tuple[float, ...]
    seed: int

    @classmethod
    def from_config(cls, c) -> PBTOptions:
        p = c.population.pbt
        if p.every and p.every % c.train.eval_every:
            raise ConfigError(
                f"config key 'population.pbt.every' = {p.every}: PBT ranks the members by "
                f"the eval of its step; make it a multiple of train.eval_every "
                f"({c.train.eval_every})"
            )
        if not 0 < p.fraction <= 0.5:
            raise ConfigError(
                f"config key 'population.pbt.fraction' = {p.fraction}: the share of members "
                "that copy (and that are copied) lies in (0, 0.5]"
            )
        factors = tuple(float(f) for f in p.factors)
        if not factors or min(factors) <= 0:
            raise ConfigError(
                f"config key 'population.pbt.factors' = {p.factors}: positive factors, e.g. "
                "(0.8, 1.25)"
            )
        return cls(int(p.every), str(p.metric), float(p.fraction), factors, int(c.seed))

    def due(self, step: int, steps: int) -> bool:
        """A PBT step: a multiple of `every` before the run's last step."""
        return bool(self.every) and step % self.every == 0 and 0 < step < steps


def plan(
    options: PBTOptions, step: int, scores: list[float], values: list[dict[str, float]]
) -> list[dict[str, Any]]:
    """The copies of step `step`: [{member, copied_from, score, source_score, values}], from
    each member's score and its varied float values now (module docstring)."""
    n = len(scores)
    k = max(1, int(options.fraction * n))
    order = sorted(range(n), key=lambda i: (-scores[i], i))  # best first; ties by index
    top, bottom = order[:k], order[n - k :]
    rng = np.random.default_rng([options.seed, step])
    rows = []
    for j in sorted(bottom):
        i = top[int(rng.integers(k))]
        new = {key: v * float(rng.choice(options.factors)) for key, v in values[i].items()}
        rows.append(
            dict(
                step=step,
                member=j,
                copied_from=i,
                score=scores[j],
                source_score=scores[i],
                values_before=values[j],
                values={key: float(np.float32(v)) for key, v in new.items()},
            )
        )
    return rows
