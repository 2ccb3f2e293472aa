"""The top layer, the composition root: the only layer that reads a whole config.

config/       the config's path from the file to one typed record per layer: schema,
              presets, the command line, validation, stages, capabilities, sections
cli.py        the training entry point (`scripts/train.py`)
trainer.py    the loop: begin, advance a `Step` with its hooks, end
roles.py      the models a run holds (policy, reference, teacher) and their samplers
build.py      the tokenizer, meshes, models and train state a config asks for
steps.py      the `Step` protocol, the SFT step, `STEPS` by mode, built from a
              `StepContext`
rl_step.py    the RL step: its stages wired, and what they hold across steps
rl_build.py   the RL stages from a config: log-prob passes, learner, producer
knobs.py      the keys a schedule or a controller moves during a run
periodic.py   the hooks after each step (metrics, eval, checkpoint, export) and the
              watchdog
population/   N runs of one config in one job: driver, section, PBT, batched programs
"""

import importlib


def __getattr__(name: str):
    """`from jaxrl_frontier.run import presets`, as config files written before the config
    folder say it: the module now at `jaxrl_frontier.run.config.presets`."""
    if name == "presets":
        return importlib.import_module("jaxrl_frontier.run.config.presets")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
