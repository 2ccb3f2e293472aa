"""Each layer's typed records, built once from the resolved config: the only place below the
trainer where a whole config is read (docs/design.md, "Sections").

A section a layer declares (`schema.RECORD_SECTIONS`) is built as its record by
`record(c, name)`; a builder below `run/` takes its record (`task_for(task_options(c),
tokenizer)`, `make_source(task, source_options(c), ...)`), never the whole config or a
ConfigDict. What spans sections is settled here, once: the effective reward weights a
dynamic source filters on, the environment an environment run's parts read (with the prompt
budget), the critic's optimizer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxrl_frontier.core import records
from jaxrl_frontier.core.distributed import DistributedOptions
from jaxrl_frontier.data.defaults import EnvOptions
from jaxrl_frontier.data.rewards.scorer import RewardOptions
from jaxrl_frontier.data.rewards.shaping import (
    LEARNED_REWARDS,
    effective_reward_weights,
    shaper_reward_names,
)
from jaxrl_frontier.data.tasks.options import TaskOptions
from jaxrl_frontier.models import pretrained
from jaxrl_frontier.objectives import schema
from jaxrl_frontier.objectives.schema import ObjectiveSection
from jaxrl_frontier.rl.learn.optimizer import OptimizerSection
from jaxrl_frontier.rl.methods.pact import PactOptions
from jaxrl_frontier.rl.methods.ppo import CriticOptions
from jaxrl_frontier.rl.produce.editors import EditorOptions
from jaxrl_frontier.rl.sources.base import SourceOptions
from jaxrl_frontier.run.config.schema import RECORD_SECTIONS
from jaxrl_frontier.sampling.rollout_section import RolloutSection
from jaxrl_frontier.train.collapse import PeakOptions
from jaxrl_frontier.train.defaults import TrainSection
from jaxrl_frontier.train.evaluation import EvalOptions
from jaxrl_frontier.train.guards import GuardOptions
from jaxrl_frontier.train.sft import SFTOptions


def record(c, name: str, **extra) -> Any:
    """Section `name` of the resolved config `c` as the record its layer declares
    (`schema.RECORD_SECTIONS`), checked as it is built; `extra`: the record's fields that
    are not config keys."""
    return records.build(RECORD_SECTIONS[name], c[name], name, **extra)


def rollout_section(c) -> RolloutSection:
    return record(c, "rollout")


def optimizer_section(c) -> OptimizerSection:
    return record(c, "optimizer")


def train_section(c) -> TrainSection:
    return record(c, "train")


def env_options(c) -> EnvOptions | None:
    """The `env` section with `max_prompt_len` (data.max_prompt_len), which the environment's
    task, producer and evaluation read; None unless `env.name` is set."""
    if not c.env.name:
        return None
    return records.build(EnvOptions, c.env, "env", max_prompt_len=int(c.data.max_prompt_len))


def task_options(c) -> TaskOptions:
    """`task.*`, where the chat template is read (`tokenizer.*`), `data.max_prompt_len`,
    `data.truncate_prompts` and the environment (`env_options`)."""
    return TaskOptions(
        name=c.task.name,
        kwargs=c.task.kwargs.to_dict(),
        chat_template=bool(c.task.chat_template),
        system_prompt=c.task.system_prompt or "",
        tokenizer_kind=c.tokenizer.kind,
        tokenizer_path=pretrained.local_path(c.tokenizer.path or ""),
        max_prompt_len=int(c.data.max_prompt_len),
        truncate_prompts=bool(c.data.truncate_prompts),
        env=env_options(c),
    )


def objective_section(objective) -> ObjectiveSection:
    """The objective's record from a resolved `config.objective` (without `as_written`, the
    file's own choices kept for the command line's restarts; an empty distill as None)."""
    out = {k: v for k, v in objective.items() if k in schema.DEFAULTS}
    out["distill"] = out.get("distill") or None
    return schema.objective_of(out)


def reward_options(c) -> RewardOptions:
    return record(c, "rewards")


def shaped_rewards(c) -> list[str]:
    """The reward components the rollout shapers append (`rollout.editors`, `overlong_cache`,
    a reward model)."""
    learned = [name for name in LEARNED_REWARDS if c[name].init != "none"]
    return shaper_reward_names(tuple(c.rollout.editors), c.rollout.overlong_cache, learned)


def source_options(c) -> SourceOptions:
    """`data.source` and its block, the seed, and the reward weights the advantages use."""
    shaped = shaped_rewards(c)
    weights = effective_reward_weights(c.objective.reward_weights.to_dict(), shaped)
    d = record(c, "data")
    return SourceOptions(
        name=d.source,
        seed=c.seed if d.seed is None else d.seed,
        dynamic=d.dynamic,
        ads=d.ads,
        sspo=d.sspo,
        zppo=d.zppo,
        reward_weights=weights,
        shaped=tuple(shaped),
        environment=env_options(c),
    )


def editor_options(c) -> EditorOptions:
    r = c.rollout
    return EditorOptions(
        editors=tuple(r.editors),
        mask_truncated=bool(r.mask_truncated),
        overlong_cache=int(r.overlong_cache),
        max_new_tokens=int(r.max_new_tokens),
        dre_bonus=float(r.dre_bonus),
    )


def pact_options(c) -> PactOptions | None:
    """PACT's options, None when `pact.enabled` is off."""
    options = record(c, "pact")
    return options if options.enabled else None


def critic_options(c) -> CriticOptions:
    """`critic.*`, the seed, and the critic's optimizer: `optimizer.*` at `critic.lr`."""
    optimizer = optimizer_section(c)
    if c.critic.lr is not None:
        optimizer = dataclasses.replace(optimizer, lr=c.critic.lr)
    return records.build(CriticOptions, c.critic, "critic", seed=c.seed, optimizer=optimizer)


def eval_options(c) -> EvalOptions:
    return records.build(
        EvalOptions,
        c.eval,
        "eval",
        seed=c.seed,
        max_new_tokens=c.rollout.max_new_tokens,
        max_prompt_len=c.data.max_prompt_len,
        prompts=task_options(c),
        environment=env_options(c),
    )


def peak_options(c) -> PeakOptions:
    """`train.export` and `train.collapse.*`: the loop's decisions after an eval."""
    t = train_section(c)
    return PeakOptions(export=t.export, collapse=t.collapse)


def guard_options(c) -> GuardOptions:
    return GuardOptions(
        max_skipped_updates=c.train.max_skipped_updates,
        max_failure_steps=c.rewards.max_failure_steps,
    )


def sft_options(c) -> SFTOptions:
    return SFTOptions(
        grad_accum=c.optimizer.grad_accum,
        max_prompt_len=c.data.max_prompt_len,
        max_new_tokens=c.rollout.max_new_tokens,
    )


def distributed_options(c) -> DistributedOptions:
    """`distributed.*` (a config without the section: every key unset)."""
    return records.build(DistributedOptions, c.get("distributed") or {}, "distributed")


BUILDERS = {
    "task": task_options,
    "rewards": reward_options,
    "source": source_options,
    "editors": editor_options,
    "pact": pact_options,
    "critic": critic_options,
    "eval": eval_options,
    "peak": peak_options,
    "guard": guard_options,
    "sft": sft_options,
    "distributed": distributed_options,
    "rollout": rollout_section,
    "optimizer": optimizer_section,
    "train": train_section,
}


def build_all(c) -> dict[str, Any]:
    """Every record of a resolved config, by name (each checks itself as it is built)."""
    return {name: build(c) for name, build in BUILDERS.items()}
