"""The training entry point (`scripts/train.py`, `jaxrl-train`): parse the command line
(run/config/flags.py), start the processes, train one run or a population, print each
member's last eval as a JSON line, and turn each kind of failure into one line."""

from __future__ import annotations

import json
import logging
import sys

from jaxrl_frontier.core import host_memory
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.run.config.flags import USAGE, parse, usage, wants_help


def train_main(argv: list[str] | None = None) -> None:
    """`scripts/train.py` / `jaxrl-train`: --config=FILE[:ARG] --workdir=DIR [--config.k=v ...].
    From the command line (argv None) the process first restarts itself with huge pages for
    its host buffers where the machine offers them (`core/host_memory.py`)."""
    if argv is None:
        host_memory.restart_with_huge_pages()
    argv = list(sys.argv if argv is None else argv)
    if wants_help(argv):
        print(usage())
        return
    try:
        config, workdir = parse(argv)
    except ConfigError as e:
        raise SystemExit(f"config error: {e}") from None
    if config is None or not workdir:
        raise SystemExit(USAGE.split("\n\n")[0] + "\n(--help lists the config keys)")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "orbax", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # A failed async save (disk full) makes orbax (through absl) and asyncio log the same
    # error with a traceback from every thread of the save; the one line that matters is the
    # CheckpointSaveError printed below, so orbax's own error records are dropped.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    logging.getLogger("absl").addFilter(_not_orbax_errors)
    sys.unraisablehook = _quiet_closed_loop(sys.unraisablehook)

    from jaxrl_frontier.core import distributed
    from jaxrl_frontier.run.config import sections

    try:  # once, before anything touches a device (docs/distributed.md)
        distributed.initialize(sections.distributed_options(config))
    except ValueError as e:
        raise SystemExit(f"config error: {e}") from None

    from jaxrl_frontier.core.errors import (
        CheckpointError,
        ModelFileError,
        TrainingFault,
        WorkdirLocked,
    )
    from jaxrl_frontier.run.population import driver as population

    try:
        summary = _train_then_finish(population, config, workdir)
    except ConfigError as e:
        raise SystemExit(f"config error: {e}") from None
    except CheckpointError as e:  # a failed save, or no checkpoint that restores
        raise SystemExit(f"checkpoint error: {e}") from None
    except TrainingFault as e:
        raise SystemExit(f"training stopped: {e}") from None
    except WorkdirLocked as e:  # another live trainer writes this workdir
        raise SystemExit(f"workdir locked: {e}") from None
    except ModelFileError as e:
        raise SystemExit(f"model file error: {e}") from None
    except OSError as e:  # e.g. a full disk while writing the logs
        raise SystemExit(f"error: {e.filename or ''}: {e.strerror or e}") from None
    for member in summary.get("members", [summary]):  # a population: a line per member
        last = member["history"]["eval"][-1] if member["history"]["eval"] else {}
        values = {"values": member["values"]} if "values" in member else {}
        print(json.dumps({"step": member["step"], "stopped": member["stopped"], **values, **last}))


def _train_then_finish(population, config, workdir) -> dict:
    """Train; then, on several processes, leave in order (`distributed.finish`: process 0,
    which runs the coordination service, last), whatever the run's outcome."""
    from jaxrl_frontier.core import distributed

    try:
        return population.train(config, workdir)  # one run, or a population
    finally:
        distributed.finish(float(config.distributed.get("shutdown_timeout_s", 300)))


def _not_orbax_errors(record: logging.LogRecord) -> bool:
    """False for ERROR records logged from orbax's code (reported once by the trainer)."""
    return not (record.levelno >= logging.ERROR and "/orbax/" in record.pathname)


def _quiet_closed_loop(hook):
    """An unraisable-exception hook that drops the 'Event loop is closed' errors TensorStore's
    callbacks raise after a failed orbax save has closed its event loop."""

    def quiet(unraisable):
        exc = unraisable.exc_value
        if isinstance(exc, RuntimeError) and "Event loop is closed" in str(exc):
            return
        hook(unraisable)

    return quiet
