"""The config sections of the data layer: the task, the prompt batch and its source (`data`),
the reward scorers and the environment."""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict


def task_section() -> ml_collections.ConfigDict:
    """`task`: the task (a TASKS name) and how its prompts are written."""
    s = ml_collections.ConfigDict()
    s.name = "arithmetic"
    # a Python module to import before the task is looked up (a dotted name on sys.path or a
    # .py file), so a task or reward registered there needs no edit of the package
    s.module = ""
    s.kwargs = ml_collections.ConfigDict()
    # the task and its kwargs as the config file wrote them (presets.with_defaults): how
    # run.config.resolve tells a command-line switch of task.name from the file's choice
    s.as_written = ml_collections.ConfigDict()
    # True: format each prompt with the instruct model's own chat template (data/tasks/chat.py),
    # read from tokenizer.path's directory (chat_template.jinja or tokenizer_config.json);
    # rollouts then also stop at the token that ends an assistant turn. False: raw text
    s.chat_template = False
    s.system_prompt = ""  # with a chat template: a system message first ('' : none)
    return s


def data_section() -> ml_collections.ConfigDict:
    """`data`: the prompt batch and the prompt source (`data.source`) with each source's knobs."""
    # P prompts per RL step (all processes together); source: a scheduling.SOURCES name
    # truncate_prompts: cut prompts longer than max_prompt_len (keeping their end) instead of
    # refusing the prompt file before training
    s = ml_collections.ConfigDict(
        dict(prompt_batch=16, max_prompt_len=16, source="uniform", truncate_prompts=False)
    )
    # the prompt stream's seed (None: the run's `seed`); a population with same_prompts
    # gives every member the same one (run/population/driver.py)
    s.seed = config_dict.placeholder(int)
    # the loop-level sources (rl/sources/, docs/methods.md): DAPO dynamic sampling (at most
    # max_draws draws of prompt_batch prompts per step), ADS, ZPPO's hard-prompt replay
    s.dynamic = dict(max_draws=4)
    # ADS clusters: 'task' (the task's cluster key) or 'kmeans' (kmeans_k clusters of prompt
    # features fitted on kmeans_sample train prompts; rl/sources/clustering.py)
    s.ads = dict(
        pool=4,
        momentum=0.7,
        boundary=0.17,
        boundary_weight=4.0,
        off_weight=0.25,
        floor=0.01,
        clusters="task",
        kmeans_k=8,
        kmeans_sample=1024,
        kmeans_iters=25,
    )
    # 3SPO's state history and start-state allocation (environment runs; rl/sources/sspo.py):
    # pool x prompt_batch candidate seeds, prompt_batch drawn by n(s0); allocate=False: uniform
    s.sspo = dict(pool=4, allocate=True)
    s.zppo = dict(
        capacity=64,
        replay_fraction=0.25,
        max_wrong=3,
        bcq_template="{candidates};{question}",
        ncq_template="not {wrong};{question}",
    )
    return s


def rewards_section() -> ml_collections.ConfigDict:
    """`rewards`: how completions are scored (in process or sandboxed) and when failing rewards stop a run."""
    # Reward scoring (data/rewards/scorer.py). scorer: auto (the task's choice) | in_process | sandboxed
    # (each completion run as a program in a locked-down subprocess: data/rewards/sandbox.py). A reward
    # that fails on every completion for max_failure_steps steps in a row stops the run (0:
    # never). The limits apply per completion in the sandbox.
    s = ml_collections.ConfigDict()
    s.scorer = "auto"
    s.max_failure_steps = 3
    s.workers = 4  # completions run in parallel
    s.cpu_seconds = 2.0
    s.wall_seconds = 5.0
    s.memory_mb = 512
    s.max_output_bytes = 65536
    return s


def env_section() -> ml_collections.ConfigDict:
    """`env`: the multi-turn environment a run trains on (none by default)."""
    # Multi-turn environments (envs/, rl/produce/agent.py, docs/agents.md): a non-empty name
    # trains on episodes of that environment (the examples are its seeds, the prompt its
    # first observation) instead of task prompts. module: imported first (a user's
    # environment). Per episode: max_turns turns of at most turn_tokens sampled tokens, each
    # ending at EOS or a `stop` string (one token each); observations of at most obs_tokens
    # tokens, formatted by observation_template; max_tokens: the episode's token budget (0:
    # none). credit: 'episode' (objective.advantage on episode returns), 'gigpo' (anchor-state
    # step groups: gamma, step_weight, scale) or '3spo' (state scores: sspo.*, on GiGPO; needs
    # data.source='sspo', which keeps the history).
    s = ml_collections.ConfigDict()
    s.name = ""
    s.module = ""
    s.kwargs = ml_collections.ConfigDict()
    s.max_turns = 6
    s.max_tokens = 0
    s.turn_tokens = 8
    s.obs_tokens = 64
    s.stop = ()
    s.observation_template = "{observation}"
    # mode='sft' on an environment: each seed's demonstration is one of these action texts,
    # drawn uniformly (a warm start that clones a uniformly random policy over them)
    s.demonstrations = ()
    s.credit = "episode"
    s.gamma = 0.95
    s.step_weight = 1.0
    s.scale = "mean"
    s.sspo = dict(alpha=1.0, xi=10.0, zeta=0.1, g_max=8, omega_k=0.1)
    s.eval_fraction = 0.1
    s.train_size = 1_000_000
    s.eval_size = 10_000
    return s


# The allowed values of this layer's keys with a closed set of them (run/config.py checks).
CHOICES: dict[str, tuple] = {
    "rewards.scorer": ("auto", "in_process", "sandboxed"),
}

# This layer's numeric keys: (low, high, low inclusive, high inclusive); None = open.
RANGES: dict[str, tuple] = {
    "data.prompt_batch": (0, None, False, None),
    "data.max_prompt_len": (0, None, False, None),
    "rewards.max_failure_steps": (0, None, True, None),
    "rewards.workers": (0, None, False, None),
    "rewards.cpu_seconds": (0, None, False, None),
    "rewards.wall_seconds": (0, None, False, None),
    "rewards.memory_mb": (0, None, False, None),
    "rewards.max_output_bytes": (0, None, False, None),
}
