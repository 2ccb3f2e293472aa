"""`TaskOptions`: what the task's builders read (`task_for`, `chat.template_for`, `chat.stop_ids`),
built by `run/config/sections.py` from the `task`, `tokenizer`, `data` and `env` sections."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jaxrl_frontier.data.defaults import EnvOptions


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    """The run's task and how its prompts are written.

    name, kwargs: `task.name` / `task.kwargs` (unset knobs left out); chat_template,
    system_prompt: `task.*`; tokenizer_kind, tokenizer_path: where a chat template is read;
    max_prompt_len, truncate_prompts: `data.*` (every prompt's length checked); env: the `env`
    section when `env.name` is set (its seeds are the examples), else None.
    """

    name: str = "arithmetic"
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    chat_template: bool = False
    system_prompt: str = ""
    tokenizer_kind: str = "char"
    tokenizer_path: str = ""
    max_prompt_len: int = 16
    truncate_prompts: bool = False
    env: EnvOptions | None = None

    def __post_init__(self):
        if self.max_prompt_len < 1:
            raise ValueError(
                f"config key 'data.max_prompt_len' = {self.max_prompt_len} must be positive"
            )
