"""core/errors.py: the error types' family tree (what an `except` catches) and
UnknownNameError's message, shown as written (KeyError would quote it)."""

from jaxrl_frontier.core import errors


def test_unknown_name_error_is_a_config_error_and_a_key_error_with_its_message_unquoted():
    e = errors.UnknownNameError("config key 'task.name': unknown task 'x'")
    assert isinstance(e, errors.ConfigError) and isinstance(e, KeyError)
    assert isinstance(e, ValueError)
    assert str(e) == "config key 'task.name': unknown task 'x'"
    assert str(KeyError("a")) == "'a'"  # what the override avoids


def test_error_families():
    assert issubclass(errors.ObjectiveConfigError, errors.ConfigError)
    assert issubclass(errors.CheckpointSaveError, errors.CheckpointError)
    assert issubclass(errors.CheckpointError, RuntimeError)
    assert issubclass(errors.ModelFileError, ValueError)
    assert not issubclass(errors.ModelFileError, errors.ConfigError)
    assert issubclass(errors.SweepError, ValueError)
    assert issubclass(errors.TrainingFault, RuntimeError)
    assert issubclass(errors.WorkdirLocked, RuntimeError)
