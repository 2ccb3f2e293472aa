"""Tasks: prompts, demonstrations and named reward vectors; one file per task.

`TASKS` maps a config name to a task class; build one with `make_task(name, **kwargs)`.
Importing this package registers every task below.
"""

from jaxrl_frontier.core.registry import import_user_module
from jaxrl_frontier.data.tasks import (  # noqa: F401
    arithmetic,
    chat,
    code,
    column_addition,
    countdown,
    humaneval,
    jsonl_math,
    reasoning_gym_tasks,
)
from jaxrl_frontier.data.tasks.base import (
    REWARD_NAMES,
    SPLITS,
    TASKS,
    Example,
    SyntheticTask,
    Task,
    length_score,
)
from jaxrl_frontier.data.tasks.options import TaskOptions
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


def task_for(options: TaskOptions, tokenizer) -> Task:
    """The run's task (`options.name`, `options.kwargs`; with `options.env` set, the
    environment's seeds: `envs.task.EnvTask`), its prompts in the model's chat template
    when `options.chat_template`, with every prompt's length checked against
    `options.max_prompt_len`, or truncated when `options.truncate_prompts`."""
    template = chat.template_for(options)
    if options.env is not None:  # an environment run: its seeds are the examples
        from jaxrl_frontier.data.envs.task import EnvTask

        task = EnvTask(options.env, template, tokenizer, options.system_prompt)
    else:
        kwargs = {k: v for k, v in dict(options.kwargs).items() if v is not None}
        task = make_task(options.name, **kwargs)  # None: a knob of another task, unset
        if template is not None:
            task = chat.ChatPrompts(task, template, options.system_prompt)
    return check_prompt_lengths(
        task, tokenizer, options.max_prompt_len, truncate=options.truncate_prompts
    )


__all__ = [
    "REWARD_NAMES",
    "SPLITS",
    "TASKS",
    "Example",
    "check_prompt_lengths",
    "load_task_module",
    "SyntheticTask",
    "Task",
    "TaskOptions",
    "eval_examples",
    "length_score",
    "make_prompt_iterator",
    "make_task",
    "task_for",
    "unbatch",
]
