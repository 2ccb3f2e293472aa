"""The package's error types, in one leaf module every layer may import.

Each message names what is wrong and where: the config key and its allowed values, the file
and the line, the checkpoint step.
"""


class ConfigError(ValueError):
    """A config value is unknown, mistyped or inconsistent; the message names the key."""


class UnknownNameError(ConfigError, KeyError):
    """A name no registry entry has; the message names the config key that gave it and lists
    the known names. A `ConfigError`, and a `KeyError` for code that looks names up."""

    __str__ = ValueError.__str__  # the message as it is (KeyError's would quote it)


class ObjectiveConfigError(ConfigError):
    """A bad `config.objective`: the message names the key and the allowed values."""


class ModelFileError(ValueError):
    """A model or tokenizer file (config.json, *.safetensors, tokenizer.json) is unreadable;
    the message names the file."""


class CheckpointError(RuntimeError):
    """No checkpoint could be restored, or one could not be written; the message names it."""


class CheckpointSaveError(CheckpointError):
    """A save failed (e.g. disk full); the message names the path and the cause."""


class TrainingFault(RuntimeError):
    """The run cannot usefully go on (diverged updates, a reward that always fails)."""


class SweepError(ValueError):
    """A sweep file that cannot be expanded (the message names the file and the problem)."""


class WorkdirLocked(RuntimeError):
    """Another live trainer holds the run directory; the message names it (host, pid)."""
