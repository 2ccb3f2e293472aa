"""3SPO's rollout allocation as a prompt source: `data.source = 'sspo'` (environment runs).

3SPO: State-Score-Supervised Policy Optimization for LLM Agents (2026) keeps a history of
every state the policy has visited and scores it (`rl.step_credit.StateScores`):

    S(s) = exp(-alpha * log(t) * success_rate(s))     (1 for a state never seen, 0 for a
                                                       dead end: >= xi failures, rate <= zeta)
    n(s) = ceil(G_max * S(s))                          rollouts allocated to state s

and spends more rollouts where the policy has rarely succeeded. This source owns that
history for the run, so it is one history, saved with every checkpoint and resumed:

    next_batch():  `data.sspo.pool` x P candidate seeds from the uniform stream; P of them
                   drawn without replacement with probability n(s0) / sum n(s0) over their
                   start states s0 (dead start states, n = 0, only when too few others live)
    observe():     every finished episode's visited states and success go into the history
    scores:        the history the environment producer's 3SPO step rewards read
                   (`env.credit = '3spo'`), as they stand before this batch is observed

Every group still plays G episodes (shapes are static, so the update compiles once): the
allocation decides which start states are played, in proportion to n(s0), not how many
rollouts each gets. `data.sspo.allocate = False` keeps the history (3SPO's step rewards)
with uniform seeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from jaxrl_frontier.core.capabilities import Capabilities
from jaxrl_frontier.data.envs.base import env_from_config
from jaxrl_frontier.data.tasks.base import Example, Task
from jaxrl_frontier.rl.experience import PromptResult
from jaxrl_frontier.rl.methods.step_credit import StateScores
from jaxrl_frontier.rl.sources.base import SOURCES, PromptSource, SourceOptions, UniformSource
from jaxrl_frontier.rl.sources.utils import rng_from, rng_state


def _hashable(x: Any) -> Hashable:
    """A state read back from JSON: lists become tuples again (states are built from tuples,
    strings and numbers)."""
    return tuple(_hashable(v) for v in x) if isinstance(x, list) else x


class SSPOSource(PromptSource):
    """3SPO's state history and start-state allocation (module docstring).

    Args:
      fresh: the uniform stream candidates come from, `pool` batches of P at a time.
      start_state: seed -> the environment's state after reset (s0).
      scores: the `StateScores` history.
      pool: candidates per batch, in batches of P.
      allocate: draw seeds by n(s0); False: the fresh stream's batches as they come.
    """

    capabilities = Capabilities.all_but(
        free_running="it reads the results as it draws", multi_process="it runs in one process"
    )

    def __init__(
        self,
        fresh: UniformSource,
        *,
        batch_size: int,
        start_state,
        scores: StateScores,
        seed: int,
        pool: int = 4,
        allocate: bool = True,
    ):
        self.fresh, self.batch_size, self.start_state = fresh, batch_size, start_state
        self.pool = int(pool)
        self.state_scores, self.allocate = scores, bool(allocate)
        self.rng = np.random.default_rng(seed)
        self._s0: dict[int, Hashable] = {}  # seed -> s0 (recomputed after a restore)
        self._last: dict[str, float] = {}

    def _start(self, seed: int) -> Hashable:
        if seed not in self._s0:
            self._s0[seed] = self.start_state(seed)
        return self._s0[seed]

    def next_batch(self) -> list[Example]:
        if not self.allocate:
            return self.fresh.next_batch()
        pool = [e for _ in range(self.pool) for e in self.fresh.next_batch()]
        n = [self.state_scores.rollouts(self._start(int(e["seed"]))) for e in pool]
        n = np.asarray(n, np.float64)
        live = np.flatnonzero(n > 0)
        if len(live) >= self.batch_size:
            pick = self.rng.choice(live, self.batch_size, replace=False, p=n[live] / n[live].sum())
        else:  # too few live start states: every live one, then dead ones at random
            dead = self.rng.permutation(np.flatnonzero(n == 0))
            pick = np.concatenate([live, dead[: self.batch_size - len(live)]])
        self._last = {
            "sspo/dead_fraction": float(np.mean(n == 0)),
            "sspo/allocation_mean": float(n[pick].mean()),
            "sspo/allocation_pool_mean": float(n.mean()),
            "sspo/states": float(len(self.state_scores.counts)),
        }
        return [pool[i] for i in np.sort(pick)]

    def observe(self, results: Sequence[PromptResult]) -> None:
        for r in results:
            for states, ok in zip(r.episode_states, r.rewards[:, 1] > 0):
                self.state_scores.update(states, bool(ok))

    def metrics(self) -> dict[str, float]:
        return dict(self._last)

    def state(self) -> dict[str, Any]:
        history = self.state_scores.state_dict()
        return {
            "fresh": self.fresh.state(),
            "rng": rng_state(self.rng),
            "t": history["t"],
            "counts": [[s, n, k] for s, n, k in history["counts"]],
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.fresh.restore(state["fresh"])
        self.rng = rng_from(state["rng"])
        counts = [(_hashable(s), n, k) for s, n, k in state["counts"]]
        self.state_scores.load_state_dict({"t": state["t"], "counts": counts})


@SOURCES.register("sspo", part=SSPOSource)
def sspo(
    task: Task, options: SourceOptions, *, batch_size: int, process_index: int, process_count: int
):
    """`data.source = 'sspo'`: 3SPO's state history and start-state allocation
    (`data.sspo.pool`, `data.sspo.allocate`; the scores: `env.sspo.*`)."""
    from jaxrl_frontier.core.errors import ConfigError

    if options.environment is None:
        raise ConfigError("config key 'data.source' = 'sspo' needs an environment (env.name)")
    if process_count > 1:
        raise ConfigError("config key 'data.source' = 'sspo' runs in one process")
    pool = options.sspo.pool
    if pool < 1:
        raise ConfigError(f"config key 'data.sspo.pool' = {pool} must be >= 1")

    def start_state(seed: int) -> Hashable:
        env = env_from_config(options.environment)
        env.reset(seed)
        return env.state_key()

    return SSPOSource(
        UniformSource(task, batch_size=batch_size, seed=options.seed),
        batch_size=batch_size,
        start_state=start_state,
        scores=StateScores(**dataclasses.asdict(options.environment.sspo)),
        seed=options.seed,
        pool=pool,
        allocate=options.sspo.allocate,
    )
