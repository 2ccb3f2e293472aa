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
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.data.rewards.scorer import RewardScorer
from jaxrl_frontier.data.tasks.base import Example
from jaxrl_frontier.objectives.stats import TokenStats
from jaxrl_frontier.rl import credit, diagnostics
from jaxrl_frontier.rl.experience import Experience
from jaxrl_frontier.rl.methods.self_conditioning import chunked_kl_and_logp, conditioned_rows
from jaxrl_frontier.rl.sources.base import PromptResult
from jaxrl_frontier.run.build import encode_prompts
from jaxrl_frontier.sampling import SamplingParams
from jaxrl_frontier.train.evaluation import decode

Array = jax.Array


# ----------------------------------------------------------------------------- editing


@dataclasses.dataclass(frozen=True)
class RolloutRows:
    """This process's rows of a rollout on the host, as editors see them (prompt-major).

    examples: P_l examples; row b is completion b % G of examples[b // G].
    completion_tokens int32 [B_l, Tn], completion_mask int32 [B_l, Tn] (1 up to and with the
    stop token), policy_mask int32 [B_l, Tn] (1 on tokens the policy sampled: an editor that
    inserts tokens sets 0 there, so they get no gradient), policy_logp f32 [B_l, Tn],
    texts: the decoded completions (an editor that changes tokens re-decodes them).
    """

    examples: tuple[Example, ...]
    completion_tokens: np.ndarray
    completion_mask: np.ndarray
    policy_mask: np.ndarray
    policy_logp: np.ndarray
    texts: tuple[str, ...]

    @property
    def group_size(self) -> int:
        return len(self.texts) // len(self.examples)

    def replace(self, **changes) -> RolloutRows:
        return dataclasses.replace(self, **changes)

    def take_groups(self, groups: Sequence[int]) -> RolloutRows:
        """The rows of these groups (prompt indices into `examples`), in that order."""
        g = self.group_size
        rows = _group_rows(groups, g)
        return RolloutRows(
            examples=tuple(self.examples[i] for i in groups),
            completion_tokens=self.completion_tokens[rows],
            completion_mask=self.completion_mask[rows],
            policy_mask=self.policy_mask[rows],
            policy_logp=self.policy_logp[rows],
            texts=tuple(self.texts[r] for r in rows),
        )


def _group_rows(groups: Sequence[int], g: int) -> np.ndarray:
    """Row indices [len(groups) * G] of whole groups, prompt-major."""
    return (np.asarray(groups, np.int64)[:, None] * g + np.arange(g)[None]).reshape(-1)


@dataclasses.dataclass(frozen=True)
class ScoredRows:
    """One draw of this process's rows after editing and scoring (host, prompt-major).

    rows: the `RolloutRows`; prompt_tokens / prompt_mask int32 [B_l, Tp]; rewards f32
    [B_l, K]; dropout_keys [B_l, ...] or None; n_failed: completions whose scoring failed.
    """

    rows: RolloutRows
    prompt_tokens: np.ndarray
    prompt_mask: np.ndarray
    rewards: np.ndarray
    dropout_keys: np.ndarray | None
    n_failed: int

    def take_groups(self, groups: Sequence[int]) -> ScoredRows:
        rows = _group_rows(groups, self.rows.group_size)
        keys = None if self.dropout_keys is None else self.dropout_keys[rows]
        return ScoredRows(
            self.rows.take_groups(groups),
            self.prompt_tokens[rows],
            self.prompt_mask[rows],
            self.rewards[rows],
            keys,
            self.n_failed,
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
        )
        keys = None if parts[0].dropout_keys is None else cat(lambda p: p.dropout_keys)
        return ScoredRows(
            rows,
            cat(lambda p: p.prompt_tokens),
            cat(lambda p: p.prompt_mask),
            cat(lambda p: p.rewards),
            keys,
            sum(p.n_failed for p in parts),
        )


class GroupSelector(Protocol):
    """Chooses the groups that enter the Experience after scoring (e.g. dynamic sampling).

    select(draw, more) -> (ScoredRows of exactly the draw's prompt count, host metrics);
    more(i) -> the i-th extra draw (i = 1, 2, ...) of fresh prompts from the source. Every
    process must call `more` the same number of times (the sampler runs on the global
    batch): decide on global counts.
    """

    def select(
        self, draw: ScoredRows, more: Callable[[int], ScoredRows]
    ) -> tuple[ScoredRows, dict[str, float]]: ...


class RewardShaper(Protocol):
    """Adds reward components from the scored rows: `reward_names` (the new components)
    and `__call__(rows, rewards [B_l, K]) -> [B_l, K + len(reward_names)]`."""

    reward_names: tuple[str, ...]

    def __call__(self, rows: RolloutRows, rewards: np.ndarray) -> np.ndarray: ...


class RolloutEditor(Protocol):
    """Edits rollouts before they are scored: `edit(rows) -> rows` (same shapes)."""

    def edit(self, rows: RolloutRows) -> RolloutRows: ...


# ----------------------------------------------------------------------------- passes


@dataclasses.dataclass(frozen=True)
class LogprobPass:
    """One extra forward over the assembled rollout.

    field: the Experience field it fills (`old_logp`, `ref_logp`, `teacher_logp`, or any
      other name, which lands in `Experience.extras` for a loss to read).
    role: whose weights it takes: 'policy', 'reference' or 'teacher'.
    fn: (params, experience) -> [B, T] (jitted by its builder), or {field name: [B, T]} for a
      pass that fills several fields from the same forwards; the producer masks each with
      the loss mask.
    """

    field: str
    role: str
    fn: Callable[[Any, Experience], Array | dict[str, Array]]


# name -> builder(**context) -> LogprobPass; the trainer passes graphdefs and layouts.
PASSES = Registry("log-prob pass")


def logprob_pass(field: str, role: str, logp_fn, mlp_masks=None) -> LogprobPass:
    """A pass from a `forward.make_logp_fn`; mlp_masks(dropout_keys) -> [L, B, F] or None
    runs it under the rollout's Dropout-GRPO masks (the policy's own sub-networks)."""

    def fn(params, exp: Experience):
        masks = None if mlp_masks is None else mlp_masks(exp.dropout_keys)
        return logp_fn(params, exp.tokens, exp.attention_mask, masks)

    return LogprobPass(field, role, fn)


def run_passes(passes: Sequence[LogprobPass], weights: dict, exp: Experience) -> Experience:
    """`exp` with each pass's arrays (masked to the policy's tokens) filled in: old_logp /
    ref_logp / teacher_logp in place, any other field in `extras`."""
    for p in passes:
        out = p.fn(weights[p.role], exp)
        for name, value in (out if isinstance(out, dict) else {p.field: out}).items():
            value = value * exp.loss_mask
            if name in ("old_logp", "ref_logp", "teacher_logp"):
                exp = exp.replace(**{name: value})
            else:
                exp = exp.replace(extras={**exp.extras, name: value})
    return exp


@PASSES.register("behaviour")
def behaviour_pass(*, policy_logp_fn, mlp_masks=None, **_):
    """old_logp recomputed by the trainer's forward (`train.recompute_old_logp`), not the
    sampler's: removes the sampler/trainer numerics mismatch from the ratio."""
    return logprob_pass("old_logp", "policy", policy_logp_fn, mlp_masks)


@PASSES.register("reference")
def reference_pass(*, policy_logp_fn, mlp_masks=None, **_):
    """ref_logp: the frozen starting policy (KL penalties, the progress advantage)."""
    return logprob_pass("ref_logp", "reference", policy_logp_fn, mlp_masks)


@PASSES.register("teacher")
def teacher_pass(*, teacher_logp_fn, **_):
    """teacher_logp: the teacher on the student's own samples (OPD)."""
    return logprob_pass("teacher_logp", "teacher", teacher_logp_fn)


@PASSES.register("self_conditioned")
def self_conditioned_pass(
    *,
    scored_logp_fn,
    group_size: int,
    completion_len: int,
    correct_column: int,
    hidden_fn=None,
    vocab_chunk: int = 2048,
    **_,
):
    """SC-GRPO's pass ("Learning from Own Solutions: Self-Conditioned Credit Assignment for
    RLVR"): each completion teacher-forced after its group's first verified solution
    (`self_conditioning.conditioned_rows`: [prompt | solution | completion]),

        sc_logp[b, t] = log pi(y_bt | prompt_g, solution_g, y_b<t),
        sc_kl[b, t]   = KL( pi(. | prompt_g, y_b<t) || pi(. | prompt_g, solution_g, y_b<t) ),

    the KL a sum over the vocabulary in chunks of `vocab_chunk` (`rollout.sc_vocab_chunk`),
    from the hidden states of the plain and the conditioned forward. A group with no correct
    completion takes sc_logp = old_logp and sc_kl = 0, so SC-GRPO's weight is 1 there.
    Computed once per rollout with the sampling weights, as the behaviour log-probs are (the
    weight holds it constant). Runs when the objective needs `sc_kl` or `sc_logp`.

    hidden_fn: `forward.apply_hidden(graphdef)`; given, fn returns {'sc_logp', 'sc_kl'} (both
    from the same two forwards); without it only sc_logp, through `scored_logp_fn`.
    """
    tn = completion_len

    # jitted over arrays, not the Experience: its host fields (results, texts) are static
    # pytree metadata, and a change there would recompile
    def rows(tokens, mask, rewards):
        correct = rewards[:, correct_column] > 0
        return conditioned_rows(tokens, mask, correct, group_size=group_size, completion_len=tn)

    @jax.jit
    def logp_only(params, tokens, mask, rewards, old_logp):
        b, t = tokens.shape
        sc_tokens, sc_mask, solved = rows(tokens, mask, rewards)
        logp = scored_logp_fn(params, sc_tokens, sc_mask)[:, t:]  # the completion's Tn
        logp = jnp.where(solved[:, None], logp, old_logp[:, t - tn :])
        return jnp.concatenate([jnp.zeros((b, t - tn), logp.dtype), logp], axis=1)

    @jax.jit
    def with_kl(params, tokens, mask, rewards, old_logp):
        b, t = tokens.shape
        tp = t - tn
        sc_tokens, sc_mask, solved = rows(tokens, mask, rewards)
        h_u, w_out = hidden_fn(params, tokens, mask)
        h_c, _ = hidden_fn(params, sc_tokens, sc_mask)
        # positions t - 1 predict token t: the completion's Tn tokens on each side
        h_u = h_u[:, tp - 1 : t - 1].reshape(b * tn, -1)
        h_c = h_c[:, tp + tn - 1 : t + tn - 1].reshape(b * tn, -1)
        y = tokens[:, tp:].reshape(-1)
        kl, logq = chunked_kl_and_logp(h_u, h_c, w_out, y, vocab_chunk=vocab_chunk)
        kl, logq = kl.reshape(b, tn), logq.reshape(b, tn)
        zeros = jnp.zeros((b, tp), jnp.float32)
        sc_logp = jnp.where(solved[:, None], logq, old_logp[:, tp:])
        sc_kl = jnp.where(solved[:, None], kl, 0.0)
        return dict(
            sc_logp=jnp.concatenate([zeros, sc_logp], 1), sc_kl=jnp.concatenate([zeros, sc_kl], 1)
        )

    inner = logp_only if hidden_fn is None else with_kl

    def fn(params, exp: Experience):
        return inner(params, exp.tokens, exp.attention_mask, exp.rewards, exp.old_logp)

    return LogprobPass("sc_logp", "policy", fn)


# ----------------------------------------------------------------------------- producer


def _gather_prompts(tokens: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every process's prompts, in process order (a few ids per prompt)."""
    if jax.process_count() == 1:
        return tokens, mask
    from jax.experimental import multihost_utils

    both = multihost_utils.process_allgather(np.stack([tokens, mask]))  # [N, 2, P_l, T]
    return (np.concatenate(list(both[:, 0])), np.concatenate(list(both[:, 1])))


def sum_over_processes(x: float) -> float:
    if jax.process_count() == 1:
        return float(x)
    from jax.experimental import multihost_utils

    return float(np.sum(multihost_utils.process_allgather(np.asarray([x], np.float64))))


@functools.partial(jax.jit, static_argnames=("objective", "reward_names", "group_size"))
def _advantages_and_metrics(
    exp: Experience, objective, reward_names: tuple[str, ...], group_size: int
) -> tuple[Array, Array, dict[str, Array]]:
    """Advantages [B, T], per-row sequence rewards [B] and the rollout's scalar metrics,
    over the global batch."""
    b, k = exp.rewards.shape
    stats = TokenStats(
        logp=exp.old_logp,
        old_logp=exp.old_logp,
        mask=exp.loss_mask,
        ref_logp=exp.ref_logp,
        teacher_logp=exp.teacher_logp,
    )
    adv, r_pg = credit.compute_advantages(
        dict(objective), exp.rewards.reshape(b // group_size, group_size, k), reward_names, stats
    )
    lengths = jnp.sum(exp.loss_mask, axis=1)
    metrics = {f"reward/{n}": jnp.mean(exp.rewards[:, i]) for i, n in enumerate(reward_names)}
    metrics.update(
        {
            "reward/total": jnp.mean(r_pg),
            "rollout/zero_variance_groups": credit.zero_variance_groups(r_pg).astype(jnp.float32),
            "rollout/response_length": jnp.mean(lengths),
            "rollout/tokens": jnp.sum(lengths),
        }
    )
    names = tuple(reward_names)
    correct = exp.rewards[:, names.index("correctness") if "correctness" in names else 0] > 0
    metrics.update(diagnostics.rollout_diagnostics(exp.old_logp, exp.loss_mask, r_pg, correct))
    weighted = dict(objective).get("reward_weights") or {}
    if sum(1 for v in weighted.values() if v) > 1:  # several rewards: how often they pull apart
        w_k = credit.reward_weight_vector(weighted, reward_names)
        r_pgk = exp.rewards.reshape(b // group_size, group_size, k)
        metrics["diag/conflict_share"] = diagnostics.conflict_share(r_pgk, w_k)
    if exp.teacher_logp is not None:  # sampled-token reverse KL(student || teacher), per token
        gap = (exp.old_logp - exp.teacher_logp) * exp.loss_mask
        metrics["opd/reverse_kl"] = jnp.sum(gap) / jnp.maximum(jnp.sum(exp.loss_mask), 1.0)
    return adv, r_pg.reshape(-1), metrics


def _freeze(d: dict) -> tuple:
    """A hashable copy of a (nested) config dict, for a static jit argument."""
    return tuple(
        sorted((k, _freeze(v) if isinstance(v, dict) else _hashable(v)) for k, v in d.items())
    )


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


class _FrozenObjective(dict):
    """The objective section as a hashable mapping (a static argument of the jitted step)."""

    def __hash__(self):
        return hash(_freeze(self))


class RolloutProducer:
    """Samples, decodes, edits, scores and annotates one batch of this process's prompts."""

    def __init__(
        self,
        sampler,
        tokenizer,
        scorer: RewardScorer,
        *,
        mesh,
        sampling: SamplingParams,
        max_prompt_len: int,
        objective: dict,
        prompt_of: Callable[[Example], str],
        passes: Sequence[LogprobPass] = (),
        editors: Sequence[RolloutEditor] = (),
        shapers: Sequence[RewardShaper] = (),
        teacher_answers=None,
    ):
        self.sampler, self.tokenizer, self.scorer = sampler, tokenizer, scorer
        self.teacher_answers = teacher_answers  # ZPPO's BCQ references (teacher_answers.py)
        self.mesh, self.sampling, self.max_prompt_len = mesh, sampling, max_prompt_len
        self.objective = _FrozenObjective(objective)
        self.prompt_of = prompt_of
        self.passes, self.editors = tuple(passes), tuple(editors)
        self.shapers = tuple(shapers)
        self.reward_names = tuple(scorer.reward_names) + tuple(
            n for s in self.shapers for n in s.reward_names
        )

    def produce(
        self,
        examples: Sequence[Example],
        weights: dict[str, Any],
        key,
        *,
        version: int = 0,
        source=None,
    ) -> tuple[Experience, dict[str, Any]]:
        """One rollout batch: (Experience, info). weights: role -> params ('policy' samples).

        source: the PromptSource the examples came from. One that is also a `GroupSelector`
        (has `select`: dynamic sampling) chooses the groups, drawing more of its prompts
        (`source.next_batch()`) when it needs them; one with `use_teacher` (ZPPO) is handed
        the producer's `teacher_answers` when the run has a teacher.
        info: device scalars `metrics` (global; with the selector's, editors' and shapers'
        host metrics), `n_failed` (global), `rollout_seconds` (sampling, editing, scoring).
        """
        g = self.sampling.n
        if self.teacher_answers is not None and hasattr(source, "use_teacher"):
            source.use_teacher(self.teacher_answers)
        t0 = time.perf_counter()
        self.sampler.update_weights(weights["policy"], version)
        draw = self._draw(examples, key)
        selected: dict[str, float] = {}
        if hasattr(source, "select"):
            more = lambda i: self._draw(source.next_batch(), jax.random.fold_in(key, i))
            draw, selected = source.select(draw, more)
        for part in (source, *self.editors, *self.shapers):  # e.g. ADS's p before this step
            selected.update(part.metrics() if hasattr(part, "metrics") else {})
        t_rollout = time.perf_counter() - t0
        rows, rewards = draw.rows, draw.rewards

        exp = self._assemble(
            rows, draw.prompt_tokens, draw.prompt_mask, rewards, draw.dropout_keys, version
        )
        exp = run_passes(self.passes, weights, exp)
        adv, r_b, metrics = _advantages_and_metrics(exp, self.objective, self.reward_names, g)
        metrics = {**metrics, **{k: jnp.float32(v) for k, v in selected.items()}}
        for name, value in getattr(self.sampler, "stats", {}).items():  # speculative rollouts
            metrics[f"rollout/speculative_{name}"] = jnp.float32(value)
        exp = exp.replace(advantages=adv)
        local = lambda x: sharding.local_rows(x, self.mesh)
        results = self._results(rows, rewards, local(r_b))
        exp = exp.replace(results=results, texts=rows.texts)
        info = dict(
            metrics=metrics,
            n_failed=sum_over_processes(draw.n_failed),
            rollout_seconds=t_rollout,
            policy_version=version,
        )
        return exp, info

    def _draw(self, examples: Sequence[Example], key) -> ScoredRows:
        """Sample, decode, edit and score one batch of this process's prompts."""
        tok, mask = encode_prompts(
            self.tokenizer, [self.prompt_of(e) for e in examples], self.max_prompt_len
        )
        all_tok, all_mask = _gather_prompts(tok, mask)
        rollout = self.sampler.generate(all_tok, all_mask, self.sampling, key)
        local = lambda x: sharding.local_rows(x, self.mesh)
        rows = RolloutRows(
            examples=tuple(examples),
            completion_tokens=local(rollout.completion_tokens),
            completion_mask=local(rollout.completion_mask),
            policy_mask=local(rollout.policy_mask),
            policy_logp=local(rollout.policy_logp),
            texts=(),
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
        host["advantages"] = np.zeros_like(host["loss_mask"])
        if dropout_keys is not None:
            host["dropout_keys"] = np.asarray(dropout_keys)
        return Experience(**sharding.shard_local_batch(host, self.mesh))

    def _results(self, rows: RolloutRows, rewards: np.ndarray, r_b: np.ndarray):
        g = rows.group_size
        correct_col = (
            self.reward_names.index("correctness") if "correctness" in self.reward_names else 0
        )
        lengths = rows.completion_mask.sum(1)
        return tuple(
            PromptResult(
                index=int(ex["index"]),
                example=ex,
                rewards=rewards[i * g : (i + 1) * g],
                reward=r_b[i * g : (i + 1) * g],
                correct=float(np.mean(rewards[i * g : (i + 1) * g, correct_col] > 0)),
                lengths=lengths[i * g : (i + 1) * g],
                texts=rows.texts[i * g : (i + 1) * g],
            )
            for i, ex in enumerate(rows.examples)
        )
