"""Stage 1, prompt sources: which prompts each step trains on (`data.source`).

Importing the package registers every built-in source in `SOURCES`.
"""

# ruff: noqa: F401  (the package's public names; importing the modules registers the sources)
from jaxrl_frontier.rl.sources import ads, dynamic, sspo, zppo
from jaxrl_frontier.rl.sources.base import (
    SOURCES,
    PromptSource,
    SourceOptions,
    UniformSource,
    make_source,
)
