"""Rollout editors and reward shapers: what happens to completions between sampling and credit.

    RolloutEditor   edit(rows) -> rows           before scoring (rl/produce/producer.py `RolloutRows`)
    RewardShaper    (rows, rewards) -> rewards   after scoring: appends reward components

Editors are chosen by `rollout.editors` (names in `EDITORS`), built with the run's task,
tokenizer and `EditorOptions`; `rollout.mask_truncated` adds `mask_truncated`,
`rollout.overlong_cache` > 0 the `overlong` shaper. An editor declares on its class what it is
and what it supports: `reward_names` (a shaper too when not empty), `changes_tokens` (the
behaviour log-probs are recomputed) and `capabilities` (core/capabilities.py). An editor
or shaper with `metrics()` has them logged every step.
A shaper's components enter the sequence reward through `objective.reward_weights` (when
that is empty, correctness and every shaper component weigh 1).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np

from jaxrl_frontier.core.capabilities import Capabilities
from jaxrl_frontier.core.distributed import sum_over_processes
from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.rl.experience import RolloutRows


class RewardShaper(Protocol):
    """Adds reward components from the scored rows: `reward_names` (the new components)
    and `__call__(rows, rewards [B_l, K]) -> [B_l, K + len(reward_names)]`."""

    reward_names: tuple[str, ...]

    def __call__(self, rows: RolloutRows, rewards: np.ndarray) -> np.ndarray: ...

    def metrics(self) -> dict[str, float]:
        """This batch's metrics of the shaper's (empty when it logs none)."""


class RolloutEditor:
    """Edits rollouts before they are scored: `edit(rows) -> rows` (same shapes). What it is
    and supports is declared here, as data: `reward_names` (not empty: it is a `RewardShaper`
    too), `changes_tokens` (its tokens need their behaviour log-probs recomputed) and
    `capabilities` (the features of a run it can serve; its builder's registration repeats
    it so run/ reads it without building the editor)."""

    reward_names: tuple[str, ...] = ()
    changes_tokens: bool = False
    capabilities: Capabilities = Capabilities.all_but(
        partial_rows="they rewrite tokens", environment="it edits single-turn completions"
    )

    def edit(self, rows: RolloutRows) -> RolloutRows:
        raise NotImplementedError

    def metrics(self) -> dict[str, float]:
        """This batch's metrics of the editor's (none unless it logs some)."""
        return {}


@dataclasses.dataclass(frozen=True)
class EditorOptions:
    """The `rollout` keys the editors and shapers read: `editors` (EDITORS names),
    `mask_truncated`, `overlong_cache` (0: off) against `max_new_tokens`, `dre_bonus`."""

    editors: tuple[str, ...] = ()
    mask_truncated: bool = False
    overlong_cache: int = 0
    max_new_tokens: int = 8
    dre_bonus: float = 0.1


# name -> builder(*, task, tokenizer, options: EditorOptions) -> RolloutEditor
EDITORS = Registry("rollout editor", key="rollout.editors", default_part=RolloutEditor)


def completion_ends(rows: RolloutRows, eos_id: int) -> np.ndarray:
    """bool [B]: the completion ends with the stop token (False: cut off by the budget)."""
    n = rows.completion_mask.sum(1)
    last = rows.completion_tokens[np.arange(len(n)), np.maximum(n - 1, 0)]
    return (n > 0) & (last == eos_id)


# ----------------------------------------------------------------------------- DAPO


def overlong_penalty(lengths: np.ndarray, l_max: int, l_cache: int) -> np.ndarray:
    """DAPO's soft overlong punishment ("DAPO: An Open-Source LLM Reinforcement Learning
    System at Scale"), per completion of |y| tokens:

        R_len = 0                              |y| <= L_max - L_cache
              = (L_max - L_cache - |y|) / L_cache    L_max - L_cache < |y| <= L_max
              = -1                             |y| > L_max
    """
    y = np.asarray(lengths, np.float32)
    soft = l_max - l_cache
    return np.where(y <= soft, 0.0, np.where(y <= l_max, (soft - y) / l_cache, -1.0)).astype(
        np.float32
    )


class OverlongShaping:
    """The `overlong` reward component, 1 + R_len in [0, 1]: `overlong_penalty` of each
    completion's length (tokens, stop token included), L_max = `rollout.max_new_tokens`,
    L_cache = `rollout.overlong_cache`. The constant 1 keeps every reward in [0, 1] (and
    reward/total comparable across runs); it cancels in every group baseline, so the
    advantages are DAPO's R + R_len ones."""

    reward_names = ("overlong",)

    def __init__(self, l_max: int, l_cache: int):
        if not 0 < l_cache <= l_max:
            raise ValueError(
                f"config key 'rollout.overlong_cache' must be in (0, rollout.max_new_tokens="
                f"{l_max}], got {l_cache}"
            )
        self.l_max, self.l_cache = l_max, l_cache

    def __call__(self, rows: RolloutRows, rewards: np.ndarray) -> np.ndarray:
        pen = overlong_penalty(rows.completion_mask.sum(1), self.l_max, self.l_cache)
        return np.concatenate([rewards, 1.0 + pen[:, None]], axis=1)

    def metrics(self) -> dict[str, float]:
        return {}


class MaskTruncated(RolloutEditor):
    """DAPO's overlong filtering: a completion cut off by the token budget (no stop token)
    keeps its reward but is masked out of the loss (policy_mask 0 on the whole row).
    Metric: `rollout/truncated_share` (of this process's rows)."""

    def __init__(self, eos_id: int):
        self.eos_id, self._share = eos_id, 0.0

    def edit(self, rows: RolloutRows) -> RolloutRows:
        ends = completion_ends(rows, self.eos_id)
        self._share = float(np.mean(~ends))
        return rows.replace(policy_mask=rows.policy_mask * ends[:, None].astype(np.int32))

    def metrics(self) -> dict[str, float]:
        return {"rollout/truncated_share": self._share}


@EDITORS.register("mask_truncated", part=MaskTruncated)
def mask_truncated(*, tokenizer, **_):
    """`rollout.editors = ('mask_truncated',)` (or `rollout.mask_truncated = True`)."""
    return MaskTruncated(tokenizer.eos_id)


# ----------------------------------------------------------------------------- DRE


class DynamicRolloutEditing(RolloutEditor):
    """DRE ("Dynamic Rollout Editing for Reducing Overthinking in RL-Trained Reasoning
    Models"): a correct rollout that keeps generating after its answer has appeared is cut
    to its verified prefix.

    For each completion y whose full text is correct, find the shortest prefix y_<=k (k
    tokens, before the stop token) whose decoded text the task already verifies as correct;
    if k + 1 < |y| the row becomes [y_1 .. y_k, EOS] (completion mask k + 1, the rest
    padding), re-decoded and re-scored by the producer as usual. The inserted stop token is
    trained (policy_mask 1: teaching the policy to stop is the point of the edit); its
    behaviour log-prob is recomputed by a teacher-forced forward (the builder turns on the
    `behaviour` pass, which recomputes every row's). The edited rollout is preferred within
    its group through the `dre` reward component, `bonus` on edited rows and 0 elsewhere.

    Metrics (all processes): `dre/edited` (rows edited), `dre/tokens_after_answer_before` and
    `dre/tokens_after_answer_after`: `tokens_after_answer` of the rows before and after
    editing (after is 0 when every correct row with a verified strict prefix was cut there).
    """

    reward_names = ("dre",)
    changes_tokens = True  # the builder recomputes the behaviour log-probs
    capabilities = Capabilities.all_but(
        partial_rows="they rewrite tokens",
        process_local="its counts are summed across hosts",
        environment="it edits single-turn completions",
    )

    def __init__(self, task, tokenizer, *, bonus: float = 0.1):
        self.task, self.tokenizer, self.bonus = task, tokenizer, float(bonus)
        self._edited = np.zeros((0,), bool)
        self._counts = (0, 0, 0)

    def _correct(self, example, text: str) -> bool:
        return float(self.task.reward(example, text).get("correctness", 0.0)) > 0

    def verified_prefix(self, example, tokens: np.ndarray, n: int) -> int | None:
        """The shortest k < n - 1 with the first k tokens verified correct, or None."""
        eos = self.tokenizer.eos_id
        body = n - 1 if n > 0 and tokens[n - 1] == eos else n
        for k in range(1, body):
            if self._correct(example, self.tokenizer.decode(tokens[:k].tolist())):
                return k
        return None

    def tokens_after_answer(self, rows: RolloutRows) -> int:
        """Tokens after the shortest verified strict prefix and its stop token, summed over
        the correct rows (a row with no verified strict prefix counts 0)."""
        total = 0
        for b, text in enumerate(rows.texts):
            example = rows.examples[b // rows.group_size]
            if not self._correct(example, text):
                continue
            n = int(rows.completion_mask[b].sum())
            k = self.verified_prefix(example, rows.completion_tokens[b], n)
            total += 0 if k is None else n - (k + 1)
        return total

    def edit(self, rows: RolloutRows) -> RolloutRows:
        g, eos = rows.group_size, self.tokenizer.eos_id
        tok, cmask = rows.completion_tokens.copy(), rows.completion_mask.copy()
        pmask, logp = rows.policy_mask.copy(), rows.policy_logp.copy()
        texts, edited = list(rows.texts), np.zeros(len(rows.texts), bool)
        before = 0
        for b, text in enumerate(rows.texts):
            example = rows.examples[b // g]
            if not self._correct(example, text):
                continue
            n = int(cmask[b].sum())
            k = self.verified_prefix(example, tok[b], n)
            if k is None:
                continue
            before += n - (k + 1)
            tok[b, k] = eos
            tok[b, k + 1 :] = self.tokenizer.pad_id
            cmask[b, k + 1 :] = 0
            pmask[b, k] = pmask[b, k - 1]  # trained where the prefix is
            pmask[b, k + 1 :] = 0
            logp[b, k:] = 0.0  # the stop token's log-prob comes from the recompute
            texts[b] = self.tokenizer.decode(tok[b, :k].tolist())
            edited[b] = True
        out = rows.replace(
            completion_tokens=tok,
            completion_mask=cmask,
            policy_mask=pmask,
            policy_logp=logp,
            texts=tuple(texts),
        )
        self._edited = edited
        self._counts = (int(edited.sum()), before, self.tokens_after_answer(out))
        return out

    def __call__(self, rows: RolloutRows, rewards: np.ndarray) -> np.ndarray:
        """The `dre` preference component of the rows just edited."""
        if len(self._edited) != len(rewards):
            raise ValueError("DRE shapes the rows it edited last: call edit first")
        return np.concatenate([rewards, (self.bonus * self._edited)[:, None]], axis=1)

    def metrics(self) -> dict[str, float]:
        edited, before, after = (sum_over_processes(x) for x in self._counts)
        return {
            "dre/edited": edited,
            "dre/tokens_after_answer_before": before,
            "dre/tokens_after_answer_after": after,
        }


@EDITORS.register("dre", part=DynamicRolloutEditing)
def dre(*, task, tokenizer, options, **_):
    """`rollout.editors = ('dre',)`: DRE (`rollout.dre_bonus`: the edited rows' bonus)."""
    return DynamicRolloutEditing(task, tokenizer, bonus=options.dre_bonus)


def build_editors(options: EditorOptions, *, task, tokenizer) -> tuple[list[Any], list[Any]]:
    """(editors, shapers) from `rollout.editors`, `rollout.mask_truncated` and
    `rollout.overlong_cache`. An editor that is also a shaper (DRE: declared `reward_names`)
    is both."""
    r = options
    names = list(r.editors) + (["mask_truncated"] if r.mask_truncated else [])
    editors = []
    for name in dict.fromkeys(names):
        builder = EDITORS.get(name)
        editors.append(builder(task=task, tokenizer=tokenizer, options=options))
    shapers = [e for e in editors if e.reward_names]
    if r.overlong_cache:
        shapers.append(OverlongShaping(r.max_new_tokens, r.overlong_cache))
    return editors, shapers
