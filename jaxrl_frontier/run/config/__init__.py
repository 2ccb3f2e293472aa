"""A run's config, from the file to the records the parts receive (docs/design.md, "The
config's path"):

    schema.py     the ConfigDict generated from each layer's section records
                  (`base_config`), and `resolve`, which merges any config over it
    presets.py    what `configs/*.py` start from (`presets.arithmetic("rl")`, `finish`)
    flags.py      the command line: `--config=FILE[:ARG]`, `--config.KEY=VALUE`, help, errors
    validate.py   the checks before anything is built: choices, ranges, sizes against each
                  other and the devices, registry names and kwargs, schedules, stages
    stages.py     keys switched at chosen steps (`config.stages`)
    parts.py      what a run needs of its parts, from their declared capabilities
    sections.py   the resolved config as one typed record per layer, built once

The names below are the config API (`from jaxrl_frontier.run import config as config_lib`).
"""

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.run.config.validate import (
    CHOICES,
    FREE_FORM,
    RANGES,
    at_step,
    base_config,
    check_env_run,
    check_local_rollouts,
    entry_defaults,
    registry_entry,
    resolve,
    validate,
    with_overrides,
)

__all__ = [
    "CHOICES",
    "FREE_FORM",
    "RANGES",
    "ConfigError",
    "at_step",
    "base_config",
    "check_env_run",
    "check_local_rollouts",
    "entry_defaults",
    "registry_entry",
    "resolve",
    "validate",
    "with_overrides",
]
