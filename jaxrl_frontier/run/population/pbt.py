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

import numpy as np

from jaxrl_frontier.core import records
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.core.records import key


@dataclasses.dataclass(frozen=True)
class PBTSection:
    """`population.pbt` (module docstring)."""

    every: int = key(0, "a PBT step every K steps (0: off), a multiple of train.eval_every", low=0)
    metric: str = key("eval/pass@1_greedy", "the members' ranking metric, higher is better")
    fraction: float = key(
        0.25, "the share of members that copy, and that are copied", low=0, low_open=True, high=0.5
    )
    factors: tuple = key((0.8, 1.25), "explore: a copied value times one of these, drawn")


@dataclasses.dataclass(frozen=True)
class PBTOptions(PBTSection):
    """`population.pbt` with the run's seed (the draws' stream), checked where built."""

    seed: int = 0

    @classmethod
    def from_config(cls, c) -> PBTOptions:
        try:
            options = records.build(cls, c.population.pbt, "population.pbt", seed=int(c.seed))
            records.check(options, "population.pbt")
        except ValueError as e:  # a range, or a key the section does not declare
            raise ConfigError(str(e)) from None
        if options.every % c.train.eval_every:
            raise ConfigError(
                f"config key 'population.pbt.every' = {options.every}: PBT ranks the members "
                f"by the eval of its step; make it a multiple of train.eval_every "
                f"({c.train.eval_every})"
            )
        factors = tuple(float(f) for f in options.factors)
        if not factors or min(factors) <= 0:
            raise ConfigError(
                f"config key 'population.pbt.factors' = {options.factors}: positive factors, "
                "e.g. (0.8, 1.25)"
            )
        return dataclasses.replace(options, factors=factors)

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
