"""A run's parts and what it needs of them: one check against their declared capabilities.

`parts_of(c)` names the class each part of a run would be (registry lookups and the
config's choices, nothing built): the training rollouts' sampler, the rollouts-ahead
scheduler, the producer and its PACT wrapper, the prompt source and each rollout editor.
Each declares `capabilities` (core/capabilities.py). `needs_of(c, procs)` lists the features
the run's keys ask for; `check_capabilities` raises one `ConfigError` naming, for each such
key, every part's key that lacks it and why. A new mode is a feature here and one
declaration on each part that lacks it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from jaxrl_frontier.core import records
from jaxrl_frontier.core.capabilities import Capabilities, refusal
from jaxrl_frontier.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Part:
    """One part of a run: `key`, the config choice that selects it, as a refusal names it
    (e.g. "data.source = 'dynamic'"), and the capabilities its class declares."""

    key: str
    capabilities: Capabilities

    @property
    def subject(self) -> str:
        """The key as the subject of a refusal: "'data.source' = 'dynamic'"."""
        name, _, value = self.key.partition(" = ")
        return f"'{name}' = {value}" if value else f"'{name}'"


@dataclasses.dataclass(frozen=True)
class Need:
    """A feature the run needs of its parts: `subject`, the key that asks for it, as a
    refusal names it; `rows`, what else stands in its way (a rule between two keys, not a
    part), each "key (why)"; `headline`: the refusal's text before its rows (None: "config
    key <subject> does not go with: "); `tail`: its text after them (what to change)."""

    feature: str
    subject: str
    rows: tuple[str, ...] = ()
    headline: str | None = None
    tail: str = ""


LOCAL_HEADLINE = (
    "config key 'rollout.max_staleness' > 0 on several processes samples each process's rows "
    "in a background thread that must not talk to other processes; not with: "
)


def parts_of(c) -> list[Part]:
    """The parts the config `c` composes, each from its choice (no instance built)."""
    from jaxrl_frontier.models.moe import MoE
    from jaxrl_frontier.rl.ahead import FreeRunningRollouts, RolloutsAhead
    from jaxrl_frontier.rl.methods.critic import CRITICS
    from jaxrl_frontier.rl.methods.pact import PactProducer
    from jaxrl_frontier.rl.produce.agent import AgentRolloutProducer
    from jaxrl_frontier.rl.produce.editors import EDITORS
    from jaxrl_frontier.rl.produce.producer import RolloutProducer
    from jaxrl_frontier.rl.sources import SOURCES
    from jaxrl_frontier.sampling.factory import sampler_class, sampler_key
    from jaxrl_frontier.sampling.rollout_section import RolloutSection

    r = c.rollout
    rollout = records.build(RolloutSection, r, "rollout")
    sampler = sampler_class(rollout, partial=True)  # the training rollouts' sampler
    parts = [Part(sampler_key(rollout, sampler), sampler.capabilities)]
    if r.max_staleness and r.free_running_queue:
        key = f"rollout.free_running_queue = {r.free_running_queue}"
        parts.append(Part(key, FreeRunningRollouts.capabilities))
    elif r.max_staleness:
        parts.append(Part("rollout.max_staleness > 0", RolloutsAhead.capabilities))
    producer = AgentRolloutProducer if c.env.name else RolloutProducer
    parts.append(Part(f"env.name = {c.env.name!r}", producer.capabilities))
    if c.get("pact") is not None and c.pact.get("enabled", False):
        parts.append(Part("pact.enabled", PactProducer.capabilities))
    if c.get("critic") is not None and c.critic.kind != "none":
        parts.append(Part(f"critic.kind = {c.critic.kind!r}", CRITICS.capabilities(c.critic.kind)))
    parts.append(Part(f"data.source = {c.data.source!r}", SOURCES.capabilities(c.data.source)))
    for name in dict.fromkeys(r.editors):
        parts.append(Part(f"rollout.editors with {name!r}", EDITORS.capabilities(name)))
    if c.model.moe.num_experts:  # a scratch MoE (a checkpoint's experts: at build time)
        parts.append(Part(f"model.moe.num_experts = {c.model.moe.num_experts}", MoE.capabilities))
    return parts


@dataclasses.dataclass(frozen=True)
class Mode:
    """A run feature and when a run needs it: `asks(c, procs)` returns the `Need` (the key
    that asks, and the rules between keys in its way), or None when the run does not."""

    feature: str
    asks: Callable[[Any, int], Need | None]


def _partial(c, procs: int) -> Need | None:
    r = c.rollout
    if not r.partial_budget:
        return None
    rows = []
    if r.continuous_slots % procs:
        slots = r.continuous_slots
        rows.append(f"rollout.continuous_slots = {slots} (each of {procs} processes runs a share)")
    subject = f"'rollout.partial_budget' = {r.partial_budget} (partial rollouts)"
    return Need("partial_rows", subject, tuple(rows))


def _free_running(c, procs: int) -> Need | None:
    r = c.rollout
    if not r.free_running_queue:
        return None
    rows = () if r.max_staleness else ("rollout.max_staleness = 0 (no bound)",)
    return Need("free_running", f"'rollout.free_running_queue' = {r.free_running_queue}", rows)


def _environment(c, procs: int) -> Need | None:
    """An environment run: the parts that serve episodes, and Dropout-GRPO's per-row masks
    (no part: the rows of the sampled completions) refused."""
    if not c.env.name:
        return None
    rows = ()
    if c.rollout.dropout_rate > 0:
        rows = (f"rollout.dropout_rate = {c.rollout.dropout_rate} (per-row MLP masks of one turn)",)
    return Need("environment", f"'env.name' = {c.env.name!r}", rows)


def _population(c, procs: int) -> Need | None:
    """A population (`population.size`, `vary` or `grid` set): its members step in turn in
    one process over shared programs; RL runs only."""
    from jaxrl_frontier.run.knobs import set_entries

    p = c.get("population")
    if p is None or not (p.size or set_entries(p.vary) or set_entries(p.grid)):
        return None
    rows = []
    if c.mode != "rl":
        rows.append(f"mode = {c.mode!r} (a population trains RL runs (mode = 'rl'))")
    if tuple(c.stages):
        rows.append("stages (stages rebuild each member's programs)")
    if (c.distributed.num_processes or 1) > 1:
        rows.append(
            f"distributed.num_processes = {c.distributed.num_processes} (a population runs on "
            "one process)"
        )
    return Need("population", "population", tuple(rows), "config keys in a population: ")


def _packed(c, procs: int) -> Need | None:
    """Packed rows (`train.pack_tokens`): the parts that run on padded rows (a critic, PACT)
    and the keys that need them (a group's shared prompt, Dropout-GRPO's per-row masks)."""
    n = c.train.pack_tokens
    if not n or c.mode != "rl":  # RL's update and log-prob passes
        return None
    rows = []
    if c.train.share_prompt_forward:
        rows.append(
            "train.share_prompt_forward = True (a group's prompt once; packing removes the "
            "padding instead: set train.share_prompt_forward = False)"
        )
    if c.rollout.dropout_rate > 0:
        rows.append("rollout.dropout_rate > 0 (per-row MLP masks)")
    head = f"config key 'train.pack_tokens' = {n} does not run with "
    return Need("packed_rows", f"'train.pack_tokens' = {n}", tuple(rows), head, PACK_TAIL)


PACK_TAIL = "; set train.pack_tokens = 0"


def _process_local(c, procs: int) -> Need | None:
    if not (c.rollout.max_staleness and procs > 1):
        return None
    return Need("process_local", "'rollout.max_staleness'", (), LOCAL_HEADLINE)


def _distill_rows(c) -> list[str]:
    """A full-vocabulary distillation loss, in the way of a teacher with its own tokenizer:
    the update reads the teachers' logits over the student's vocabulary."""
    if not c.objective.distill:
        return []
    why = "a full-vocabulary loss reads the teachers' logits over the student's vocabulary"
    return [f"objective.distill = {c.objective.distill!r} ({why})"]


def _several_teachers(c, procs: int) -> Need | None:
    """Several teachers (`teacher.by_tag`): each row's own, for the sampled-token objectives
    and, the teachers sharing the policy's vocabulary, for a full-vocabulary loss (each
    teacher runs on every row in the update: rl/learn/loss.py); a teacher with its own
    tokenizer is refused by `_teacher_tokenizer`."""
    t = c.teacher
    if not t.by_tag:
        return None
    rows = []
    if t.init not in ("hf", "checkpoint"):
        rows.append(f"teacher.init = {t.init!r} (its tags name checkpoints: 'hf' or 'checkpoint')")
    return Need("several_teachers", "'teacher.by_tag'", tuple(rows))


def _teacher_tokenizer(c, procs: int) -> Need | None:
    """A teacher with its own tokenizer: one checkpoint's sampled-token log-probs, the rows
    decoded on one process's host."""
    t = c.teacher
    if t.tokenizer != "own":
        return None
    rows = _distill_rows(c)
    if t.by_tag:
        rows.append("teacher.by_tag (one teacher re-tokenizes the rows)")
    if t.init not in ("hf", "checkpoint"):
        rows.append(f"teacher.init = {t.init!r} (its tokenizer comes with its checkpoint)")
    if procs > 1:
        rows.append(f"{procs} processes (the rows are decoded on one host)")
    return Need("teacher_tokenizer", "'teacher.tokenizer' = 'own'", tuple(rows))


# The run features a config may ask for; a new mode is one row here (and its feature in
# core.capabilities.FEATURES) and one `capabilities` declaration on each part that lacks it.
MODES: list[Mode] = [
    Mode("partial_rows", _partial),
    Mode("free_running", _free_running),
    Mode("process_local", _process_local),
    Mode(
        "multi_process",
        lambda c, procs: Need("multi_process", f"{procs} processes") if procs > 1 else None,
    ),
    Mode("stages", lambda c, procs: Need("stages", "stages") if tuple(c.stages) else None),
    Mode("environment", _environment),
    Mode("population", _population),
    Mode("packed_rows", _packed),
    Mode(
        "sequence_axis",
        lambda c, procs: (
            Need("sequence_axis", f"'mesh.sequence' = {c.mesh.sequence}")
            if c.mesh.sequence > 1
            else None
        ),
    ),
    Mode("several_teachers", _several_teachers),
    Mode("teacher_tokenizer", _teacher_tokenizer),
]


def needs_of(c, procs: int) -> list[Need]:
    """The features the run `c` on `procs` processes asks of its parts (`MODES`)."""
    return [need for mode in MODES if (need := mode.asks(c, procs)) is not None]


# Features a run needs of every part at once (the parts name themselves as the subject).
RUN_WIDE = ("multi_process", "stages")


def refusals(c, procs: int, only: tuple[str, ...] | None = None) -> list[str]:
    """Each refusal of the run `c` on `procs` processes (a message naming its keys), one per
    subject; `only`: just these features."""
    parts = parts_of(c)
    groups: dict[str, tuple[str, str, list[str]]] = {}  # subject -> (head, tail, rows)

    def add(subject: str, row: str, headline: str | None = None, tail: str = ""):
        head = headline or refusal(subject, [])
        groups.setdefault(subject, (head, tail, []))[2].append(row)

    for need in needs_of(c, procs):
        if only is not None and need.feature not in only:
            continue
        for row in need.rows:
            add(need.subject, row, need.headline, need.tail)
        for part in parts:
            if part.capabilities.supports(need.feature):
                continue
            why = part.capabilities.why_not(need.feature)
            if need.feature in RUN_WIDE:  # the part is the subject; the run's feature, the row
                add(part.subject, f"{need.subject} ({why})")
            else:
                add(need.subject, f"{part.key} ({why})", need.headline, need.tail)
    return [head + "; ".join(rows) + tail for head, tail, rows in groups.values()]


def check_capabilities(c, procs: int, only: tuple[str, ...] | None = None) -> None:
    """One ConfigError naming every key whose part lacks a feature the run needs."""
    found = refusals(c, procs, only)
    if found:
        raise ConfigError("\n".join(found))


def supports(c, feature: str) -> bool:
    """Whether every part of the run `c` supports `feature` (e.g. 'keeps_rows_in_flight':
    batches produced ahead cross a checkpoint, saved whole with it)."""
    return all(part.capabilities.supports(feature) for part in parts_of(c))
