"""The config sections of the data layer: the `task`, the prompt batch and its source
(`data`) and the environment (`env`). (`rewards`, the scorers, is
`rewards.scorer.RewardOptions`.)"""

from __future__ import annotations

import dataclasses

from jaxrl_frontier.core import records
from jaxrl_frontier.core.records import key, section


@dataclasses.dataclass(frozen=True)
class TaskSection:
    """`task`: the task (a TASKS name) and how its prompts are written. chat_template: True
    formats each prompt with the instruct model's own chat template (data/tasks/chat.py),
    read from tokenizer.path's directory (chat_template.jinja or tokenizer_config.json);
    rollouts then also stop at the token that ends an assistant turn. False: raw text."""

    name: str = key("arithmetic", "a TASKS name")
    module: str = key("", "a module imported before the task is looked up (dotted or .py)")
    kwargs: dict = key({}, "the task's keyword arguments (checked against its __init__)")
    # how run.config.resolve tells a command-line switch of task.name from the file's choice
    as_written: dict = key({}, "the task and kwargs as the config file wrote them")
    chat_template: bool = key(False, "format prompts with the checkpoint's chat template")
    system_prompt: str = key("", "with a chat template: a system message first ('': none)")

    def __post_init__(self):
        records.check(self, "task")


@dataclasses.dataclass(frozen=True)
class DynamicSection:
    """`data.dynamic`: DAPO's dynamic sampling (rl/sources/)."""

    max_draws: int = key(4, "draws of prompt_batch prompts a step, at most")


@dataclasses.dataclass(frozen=True)
class AdsSection:
    """`data.ads`: ADS's prompt clusters and their sampling weights (rl/sources/ads.py).
    clusters: 'task' (the task's cluster key) or 'kmeans' (kmeans_k clusters of prompt
    features fitted on kmeans_sample train prompts; rl/sources/clustering.py)."""

    pool: int = key(4, "candidates drawn per slot (pool x P a step)")
    momentum: float = key(0.7, "the clusters' probability momentum")
    boundary: float = key(0.17, "a solve rate within this of 0.5 is at the boundary")
    boundary_weight: float = key(4.0, "a boundary prompt's weight in its cluster")
    off_weight: float = key(0.25, "a prompt seen off the boundary's weight")
    floor: float = key(0.01, "added to each cluster's progress score")
    clusters: str = key("task", "'task' or 'kmeans'")
    kmeans_k: int = key(8, "k-means clusters")
    kmeans_sample: int = key(1024, "train prompts the k-means is fitted on")
    kmeans_iters: int = key(25, "k-means iterations")


@dataclasses.dataclass(frozen=True)
class DataSspoSection:
    """`data.sspo`: 3SPO's state history and start-state allocation (environment runs;
    rl/sources/sspo.py): pool x prompt_batch candidate seeds, prompt_batch drawn by n(s0)."""

    pool: int = key(4, "candidate seeds per seed drawn")
    allocate: bool = key(True, "draw by n(s0); False: uniform")


@dataclasses.dataclass(frozen=True)
class ZppoSection:
    """`data.zppo`: ZPPO's hard-prompt replay and its question templates (rl/sources/zppo.py)."""

    capacity: int = key(64, "hard prompts kept (the oldest evicted)")
    replay_fraction: float = key(0.25, "a batch's share of replayed prompts")
    max_wrong: int = key(3, "a replayed prompt's wrong answers kept")
    bcq_template: str = key("{candidates};{question}", "BCQ: candidates, then the question")
    ncq_template: str = key("not {wrong};{question}", "NCQ: the wrong answers, then the question")


@dataclasses.dataclass(frozen=True)
class DataSection:
    """`data`: the prompt batch and the prompt source (`data.source`) with each source's
    knobs: DAPO dynamic sampling, ADS, 3SPO, ZPPO's hard-prompt replay (rl/sources/,
    docs/methods.md)."""

    prompt_batch: int = key(16, "P prompts per RL step (all processes)", low=0, low_open=True)
    max_prompt_len: int = key(16, "a prompt's tokens, at most", low=0, low_open=True)
    source: str = key("uniform", "a scheduling.SOURCES name")
    truncate_prompts: bool = key(False, "cut longer prompts (keeping their end), not refuse them")
    # a population with same_prompts gives every member the same one (run/population/driver.py)
    seed: int | None = key(None, "the prompt stream's seed (None: the run's seed)")
    dynamic: DynamicSection = section(DynamicSection, "DAPO's dynamic sampling")
    ads: AdsSection = section(AdsSection, "ADS's clusters")
    sspo: DataSspoSection = section(DataSspoSection, "3SPO's start states")
    zppo: ZppoSection = section(ZppoSection, "ZPPO's replay")

    def __post_init__(self):
        records.check(self, "data")


@dataclasses.dataclass(frozen=True)
class EnvSspoSection:
    """`env.sspo`: 3SPO's state scores (rl/methods/step_credit.py)."""

    alpha: float = key(1.0, "how fast a state's score falls with its success rate")
    xi: float = key(10.0, "failures before a low-success state is a dead end")
    zeta: float = key(0.1, "a dead end's success rate, at most")
    g_max: int = key(8, "rollouts allocated to a state of score 1")
    omega_k: float = key(0.1, "how fast the novelty weight decays with visits")


@dataclasses.dataclass(frozen=True)
class EnvSection:
    """`env`: the multi-turn environment a run trains on (none by default; envs/,
    rl/produce/agent.py, docs/agents.md). A non-empty name trains on episodes of that
    environment (the examples are its seeds, the prompt its first observation) instead of
    task prompts. Per episode: max_turns turns of at most turn_tokens sampled tokens, each
    ending at EOS or a `stop` string (one token each); observations of at most obs_tokens
    tokens, formatted by observation_template; max_tokens: the episode's token budget (0:
    none). credit: 'episode' (objective.advantage on episode returns), 'gigpo' (anchor-state
    step groups: gamma, step_weight, scale) or '3spo' (state scores: sspo.*, on GiGPO; needs
    data.source='sspo', which keeps the history)."""

    name: str = key("", "an ENVS name ('': a task run)")
    module: str = key("", "a module imported first (a user's environment)")
    kwargs: dict = key({}, "the environment's keyword arguments")
    max_turns: int = key(6, "turns an episode")
    max_tokens: int = key(0, "the episode's token budget (0: none)")
    turn_tokens: int = key(8, "sampled tokens a turn, at most")
    obs_tokens: int = key(64, "an observation's tokens, at most")
    stop: tuple = key((), "strings that end a turn (one token each)")
    observation_template: str = key("{observation}", "how an observation is written")
    # a warm start that clones a uniformly random policy over them
    demonstrations: tuple = key((), "mode='sft': action texts a seed's demonstration draws from")
    credit: str = key("episode", "episode | gigpo | 3spo")
    gamma: float = key(0.95, "GiGPO's step discount")
    step_weight: float = key(1.0, "GiGPO's step-advantage weight")
    scale: str = key("mean", "GiGPO's group normalisation")
    sspo: EnvSspoSection = section(EnvSspoSection, "3SPO's state scores")
    eval_fraction: float = key(0.1, "the seeds held out")
    train_size: int = key(1_000_000, "train seeds")
    eval_size: int = key(10_000, "held-out seeds")

    def __post_init__(self):
        records.check(self, "env")


@dataclasses.dataclass(frozen=True)
class EnvOptions(EnvSection):
    """What an environment run's task, producer, sources and evaluation read: the `env`
    section with the prompt budget (`data.max_prompt_len`: the first observation's)."""

    max_prompt_len: int = 16
