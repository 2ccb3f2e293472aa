"""The RolloutProducer: this process's prompts and the current weights in, an `Experience` out.

    examples (this process's P_l prompts)
      -> sample          Sampler.generate on the global prompt batch (every device samples its rows)
      -> decode          the rows this process owns [P_l * G], to text
      -> edit            a chain of `RolloutEditor`s (none by default)
      -> score           the `RewardScorer` (rewards [B_l, K], failures contained)
      -> assemble        global arrays from process-local rows (`sharding.shard_local_batch`)
      -> extra passes    `LogprobPass`es: behaviour / reference / teacher log-probs, or any a
                         method registers (each fills one Experience field)
      -> advantages      `credit.compute_advantages`, jitted over the global batch, so batch
                         statistics (whitening, zero-variance counts) span every process

Each process owns its rows end to end until the update; nothing but prompts (a few ids)
crosses hosts before the arrays enter the mesh.

`produce` = `finish(draw(...))`. `draw` samples, decodes, edits and scores (a `Drawn`);
`finish` assembles, runs the passes and the advantages. When the sampler's mesh is this
process's own devices on a run of several processes (asynchronous rollouts,
`rollout.max_staleness > 0`), `draw` talks to no other process: each samples its own
prompts, its rows' keys taken by their global index (`first_row`), so the rows are those one
process sampling the whole batch would draw; it can then run in a background thread while
every collective (`finish`, the weights' all-gather, the update) stays in the main loop.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.capabilities import ALL
from jaxrl_frontier.core.distributed import allgather_json, sum_over_processes
from jaxrl_frontier.data.rewards.scorer import RewardScorer
from jaxrl_frontier.data.tasks.base import Example
from jaxrl_frontier.models.text import decode, encode_prompts
from jaxrl_frontier.objectives.schema import ObjectiveSection, objective_of
from jaxrl_frontier.rl.experience import Experience, RolloutRows, ScoredRows
from jaxrl_frontier.rl.produce.advantages_and_metrics import (
    advantages_and_metrics,
    prompt_results,
)
from jaxrl_frontier.rl.produce.editors import RewardShaper, RolloutEditor
from jaxrl_frontier.rl.produce.passes import TEACHER_INDEX, LogprobPass, run_passes
from jaxrl_frontier.sampling import SamplingParams

Array = jax.Array


# ----------------------------------------------------------------------------- producer


def token_lags(exp: Experience, version: int) -> dict[str, Array]:
    """Partial rollouts' per-token staleness: version - token_version over the loss mask
    (mean, max, and the share of tokens sampled by older weights)."""
    on = exp.loss_mask > 0
    lag = jnp.where(on, version - exp.token_version, 0).astype(jnp.float32)
    tokens = jnp.maximum(jnp.sum(on), 1)
    return {
        "rollout/token_lag_mean": jnp.sum(lag) / tokens,
        "rollout/token_lag_max": jnp.max(lag),
        "rollout/lagged_token_share": jnp.sum(lag > 0) / tokens,
    }


def oldest_version(rows: RolloutRows, version: int, local: bool = False) -> int:
    """The oldest weights' version among the sampled tokens (`local`: each process holds its
    own rows, so the oldest of every process's; a collective)."""
    sampled = rows.token_version[rows.completion_mask > 0]
    oldest = int(min(sampled.min(initial=version), version))
    return min(allgather_json(oldest)) if local else oldest


def _gather_prompts(tokens: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every process's prompts, in process order (a few ids per prompt)."""
    if jax.process_count() == 1:
        return tokens, mask
    from jax.experimental import multihost_utils

    both = multihost_utils.process_allgather(np.stack([tokens, mask]))  # [N, 2, P_l, T]
    return (np.concatenate(list(both[:, 0])), np.concatenate(list(both[:, 1])))


@dataclasses.dataclass(frozen=True)
class Drawn:
    """One batch drawn on this process (`RolloutProducer.draw`), before `finish`: the scored
    rows, the policy version that sampled them, the sampling time, the host metrics of the
    source, editors and shapers, and the sampler's stats of this draw."""

    scored: ScoredRows
    version: int
    seconds: float
    host_metrics: dict[str, float]
    sampler_stats: dict[str, float]


@dataclasses.dataclass(frozen=True)
class TeacherLinks:
    """What the producer hands to the teachers' side: ZPPO's BCQ references (`answers`,
    rl/sources/teacher_answers.py) and, with several teachers (`teacher.by_tag`), each
    example's teacher (`index_of`: its index into the teachers, `passes.TEACHER_INDEX`)."""

    answers: Any = None
    index_of: Callable[[Example], int] | None = None


class RolloutProducer:
    """Samples, decodes, edits, scores and annotates one batch of this process's prompts."""

    capabilities = ALL  # every feature a run may need (core/capabilities.py)

    def __init__(
        self,
        sampler,
        tokenizer,
        scorer: RewardScorer,
        *,
        mesh,
        sampling: SamplingParams,
        max_prompt_len: int,
        objective: ObjectiveSection,
        prompt_of: Callable[[Example], str],
        passes: Sequence[LogprobPass] = (),
        editors: Sequence[RolloutEditor] = (),
        shapers: Sequence[RewardShaper] = (),
        teachers: TeacherLinks | None = None,
    ):
        self.sampler, self.tokenizer, self.scorer = sampler, tokenizer, scorer
        self.teachers = teachers or TeacherLinks()
        self.mesh, self.sampling, self.max_prompt_len = mesh, sampling, max_prompt_len
        self.objective = objective_of(objective)
        self.prompt_of = prompt_of
        self.passes, self.editors = tuple(passes), tuple(editors)
        self.shapers = tuple(shapers)
        self.reward_names = tuple(scorer.reward_names) + tuple(
            n for s in self.shapers for n in s.reward_names
        )
        # this process samples its own prompts on its own devices (module docstring)
        sampler_mesh = sampler.mesh
        self.local = (
            jax.process_count() > 1
            and sampler_mesh is not None
            and sharding.is_process_local(sampler_mesh)
        )

    def produce(
        self, examples: Sequence[Example], weights: dict[str, Any], key, **options
    ) -> tuple[Experience, dict[str, Any]]:
        """One rollout batch: (Experience, info) = `finish(draw(...))`; weights: role ->
        params ('policy' samples); options: `draw`'s (version, source, sampling).

        info: device scalars `metrics` (global; with the source's, editors' and shapers'
        host metrics), `n_failed` (global), `rollout_seconds` (sampling, editing, scoring),
        `policy_version`, and this process's `results` (one `PromptResult` per prompt, for
        `PromptSource.observe`) and `texts` (the decoded completions of its rows).
        """
        return self.finish(self.draw(examples, weights, key, **options), weights)

    def begin_next(self, examples: Sequence[Example], key) -> None:
        """Partial rollouts (`rollout.partial_budget`): the batch the next `draw` starts
        ahead in its idle slots, to be drawn itself by the `draw` after it with this key."""
        tok, mask = self.encode(examples)
        self.sampler.begin_next(tok, mask, key)

    def encode(self, examples: Sequence[Example]) -> tuple[np.ndarray, np.ndarray]:
        """This process's prompts of `examples` as host tokens and mask [P, T]."""
        texts = [self.prompt_of(e) for e in examples]
        return encode_prompts(self.tokenizer, texts, self.max_prompt_len)

    def draw(
        self,
        examples: Sequence[Example],
        weights: dict[str, Any],
        key,
        *,
        version: int = 0,
        source=None,
        sampling: dict[str, float] | None = None,
    ) -> Drawn:
        """Sample, decode, edit and score this process's prompts (and those the source's
        `select` draws more of): the first half of `produce`.

        source: the `PromptSource` the examples came from (or None). Its `select` chooses the
        groups (dynamic sampling draws more of its prompts through `next_batch()`), its
        `metrics()` are logged, and its `use_teacher` is handed the producer's
        `teachers.answers` when the run has a teacher (ZPPO).
        sampling: {field: value} replacing fields of the producer's `SamplingParams` for
        this batch (a scheduled `rollout.temperature`); the sampler traces them (`Knobs`),
        so a new value compiles nothing."""
        params = dataclasses.replace(self.sampling, **(sampling or {}))
        if self.teachers.answers is not None and source is not None:
            source.use_teacher(self.teachers.answers)
        t0 = time.perf_counter()
        self.sampler.update_weights(weights["policy"], version)
        draw = self._draw(examples, key, params)
        selected: dict[str, float] = {}
        if source is not None:
            more = lambda i: self._draw(source.next_batch(), jax.random.fold_in(key, i), params)
            draw, selected = source.select(draw, more)
            selected.update(source.metrics())  # e.g. ADS's p before this step
        for part in (*self.editors, *self.shapers):
            selected.update(part.metrics())
        stats = dict(self.sampler.stats)  # speculative, continuous: this draw's
        return Drawn(draw, version, time.perf_counter() - t0, selected, stats)

    def finish(self, drawn: Drawn, weights: dict[str, Any]) -> tuple[Experience, dict[str, Any]]:
        """A `Drawn` batch -> (Experience, info): the global arrays, the passes (reference,
        teacher, ... log-probs by `weights`), the advantages and the metrics; the second
        half of `produce`. Every process calls it at the same point (it runs collectives)."""
        draw, version, g = drawn.scored, drawn.version, self.sampling.n
        rows, rewards = draw.rows, draw.rewards
        exp = self._assemble(
            rows, draw.prompt_tokens, draw.prompt_mask, rewards, draw.dropout_keys, version
        )
        if draw.routing is not None:  # the sampler's experts, for the update to replay
            exp = exp.replace(routing=sharding.shard_local_batch(draw.routing, self.mesh))
        exp, pass_metrics = run_passes(self.passes, weights, exp)
        adv, r_b, metrics = advantages_and_metrics(exp, self.objective, self.reward_names, g)
        host = {k: jnp.float32(v) for k, v in drawn.host_metrics.items()}
        metrics = {**metrics, **pass_metrics, **host}
        stats = drawn.sampler_stats  # speculative, continuous: each process's own loops
        if self.local and stats:
            stats = self.sampler.merge_stats(allgather_json(stats))
        for name, value in stats.items():
            metrics[f"{self.sampler.stats_prefix}{name}"] = jnp.float32(value)
        if exp.token_version is not None:  # partial rollouts: tokens sampled by older weights
            metrics.update(token_lags(exp, version))
        exp = exp.replace(advantages=adv)
        local = lambda x: sharding.local_rows(x, self.mesh)
        results = prompt_results(
            rows.examples, rewards, local(r_b), rows.completion_mask.sum(1), rows.texts,
            self.reward_names,
        )  # fmt: skip
        info = dict(
            metrics=metrics,
            n_failed=sum_over_processes(draw.n_failed),
            rollout_seconds=drawn.seconds,
            policy_version=(
                version if rows.token_version is None else oldest_version(rows, version, self.local)
            ),
            results=results,
            texts=rows.texts,
        )
        return exp, info

    def _draw(self, examples: Sequence[Example], key, params: SamplingParams) -> ScoredRows:
        """Sample, decode, edit and score one batch of this process's prompts."""
        tok, mask = self.encode(examples)
        if self.local:  # this process's prompts on its own devices, keys by global row
            first_row = jax.process_index() * len(examples) * params.n
            rollout = self.sampler.generate(tok, mask, params, key, first_row=first_row)
            local = lambda x: np.asarray(jax.device_get(x))  # noqa: E731
        else:
            all_tok, all_mask = _gather_prompts(tok, mask)
            rollout = self.sampler.generate(all_tok, all_mask, params, key)
            local = lambda x: sharding.local_rows(x, self.mesh)  # noqa: E731
        rows = RolloutRows(
            examples=tuple(examples),
            completion_tokens=local(rollout.completion_tokens),
            completion_mask=local(rollout.completion_mask),
            policy_mask=local(rollout.policy_mask),
            policy_logp=local(rollout.policy_logp),
            texts=(),
            token_version=None if rollout.token_version is None else local(rollout.token_version),
        )
        rows = rows.replace(
            texts=decode(self.tokenizer, rows.completion_tokens, rows.completion_mask)
        )
        for editor in self.editors:
            rows = editor.edit(rows)
        rewards, n_failed = self.scorer(list(rows.examples), list(rows.texts))
        rewards = np.asarray(rewards, np.float32)
        for shaper in self.shapers:
            rewards = np.asarray(shaper(rows, rewards), np.float32)
        keys = None if rollout.dropout_keys is None else local(rollout.dropout_keys)
        return ScoredRows(
            rows,
            local(rollout.prompt_tokens),
            local(rollout.prompt_mask),
            rewards,
            keys,
            int(n_failed),
            None if rollout.routing is None else local(rollout.routing),
        )

    def _assemble(self, rows, prompt_tok, prompt_mask, rewards, dropout_keys, version):
        """Process-local host rows -> a global Experience (advantages still zero)."""
        b_local, tn = rows.completion_tokens.shape
        completion = rows.completion_mask.astype(np.float32)
        loss_mask = completion * rows.policy_mask.astype(np.float32)
        zeros_p = np.zeros(prompt_mask.shape, np.float32)
        g = rows.group_size
        first_group = jax.process_index() * len(rows.examples)
        host = dict(
            tokens=np.concatenate([prompt_tok, rows.completion_tokens], 1).astype(np.int32),
            attention_mask=np.concatenate([prompt_mask, rows.completion_mask], 1).astype(np.int32),
            loss_mask=np.concatenate([zeros_p, loss_mask], 1),
            old_logp=np.concatenate([zeros_p, rows.policy_logp * loss_mask], 1).astype(np.float32),
            rewards=np.asarray(rewards, np.float32),
            prompt_index=np.repeat([int(e["index"]) for e in rows.examples], g).astype(np.int32),
            group_id=(first_group + np.arange(b_local) // g).astype(np.int32),
            policy_version=np.full((b_local,), version, np.int32),
            turn_index=np.zeros(prompt_tok.shape[:1] + (prompt_tok.shape[1] + tn,), np.int32),
        )
        if rows.token_version is not None:  # partial rollouts: a row's first token is its oldest
            sampled = np.where(rows.completion_mask > 0, rows.token_version, -1)
            host["token_version"] = np.concatenate([zeros_p - 1, sampled], 1).astype(np.int32)
            oldest = np.where(sampled >= 0, sampled, version).min(1)
            host["policy_version"] = oldest.astype(np.int32)
        host["advantages"] = np.zeros_like(host["loss_mask"])
        if dropout_keys is not None:
            host["dropout_keys"] = np.asarray(dropout_keys)
        extras = {}
        index_of = self.teachers.index_of
        if index_of is not None:  # several teachers: each row's, on every position
            index = np.repeat([index_of(e) for e in rows.examples], g).astype(np.float32)
            extras[TEACHER_INDEX] = np.repeat(index[:, None], host["loss_mask"].shape[1], 1)
        placed = sharding.shard_local_batch({**host, **extras}, self.mesh)
        fields = {k: v for k, v in placed.items() if k not in extras}
        return Experience(**fields, extras={k: placed[k] for k in extras})
