"""Tasks: prompts, demonstrations and named reward vectors; one file per task.

`TASKS` maps a config name to a task class; build one with `make_task(name, **kwargs)`.
Importing this package registers every task below.
"""

from jaxrl_frontier.core.registry import import_user_module
from jaxrl_frontier.data.tasks import arithmetic, chat, code, column_addition, countdown, jsonl_math  # noqa: F401
from jaxrl_frontier.data.tasks.base import (
    REWARD_NAMES,
    SPLITS,
    TASKS,
    Example,
    SyntheticTask,
    Task,
    length_score,
)
from jaxrl_frontier.data.tasks.pipeline import (
    check_prompt_lengths,
    eval_examples,
    make_prompt_iterator,
    unbatch,
)


def load_task_module(module: str) -> None:
    """Import `module` (a dotted name on sys.path, or a path to a .py file) so the tasks and
    rewards it registers (`@TASKS.register("name")`) can be named in the config
    (`task.module`, then `task.name`). Importing twice is a no-op: the module is cached in
    sys.modules under its name, or for a file under a name derived from its absolute path."""
    import_user_module(module, key="task.module")


def make_task(name: str, **kwargs) -> Task:
    """The task registered as `name`, built from keyword arguments (e.g. a config's task block)."""
    return TASKS.get(name)(**kwargs)


def task_for(config, tokenizer) -> Task:
    """The config's task (`task.name`, `task.kwargs`; with `env.name` set, the environment's
    seeds: `envs.task.EnvTask`), its prompts in the model's chat template
    when `task.chat_template`, with every prompt's length checked against
    `data.max_prompt_len`, or truncated when `data.truncate_prompts`."""
    env = config.get("env")
    if env is not None and env.name:  # an environment run: its seeds are the examples
        from jaxrl_frontier.data.envs.task import EnvTask

        system = config.task.get("system_prompt", "")
        task = EnvTask(env, chat.template_for(config), tokenizer, system)
    else:
        kwargs = {k: v for k, v in config.task.kwargs.to_dict().items() if v is not None}
        task = make_task(config.task.name, **kwargs)  # None: a knob of another task, unset
        template = chat.template_for(config)
        if template is not None:
            task = chat.ChatPrompts(task, template, config.task.get("system_prompt", ""))
    d = config.data
    return check_prompt_lengths(task, tokenizer, d.max_prompt_len, truncate=d.truncate_prompts)


__all__ = [
    "REWARD_NAMES",
    "SPLITS",
    "TASKS",
    "Example",
    "check_prompt_lengths",
    "load_task_module",
    "SyntheticTask",
    "Task",
    "eval_examples",
    "length_score",
    "make_prompt_iterator",
    "make_task",
    "task_for",
    "unbatch",
]
