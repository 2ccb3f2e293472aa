"""Scalar writers: where a run's logged scalars go, one registry entry per destination.

`metrics.writers` names them (default ('tensorboard', 'jsonl')):

    tensorboard  event files in the run directory (the `tensorboard` package's own writer)
    jsonl        `metrics.jsonl`: one JSON object per write, {"step", "time", name: value}
    console      one line per write on stdout: `step 10: train/loss 0.31 reward/total 0.5`
    wandb        a Weights & Biases run (`pip install 'jaxrl_frontier[wandb]'`): offline unless
                 an API key is set; keys `metrics.wandb.*` (`WandbOptions`)

A writer is a small class with `write_scalars(step, scalars)`, `flush(sync)`, `close()` and
`truncate_after(step)` (on resume, drop the rows after the checkpoint's step: `jsonl` does; the
others are append-only and return 0). Scalars arrive as Python floats (the caller converts
once); writers are only built on process 0 (`MetricsWriter`).

A new destination is one class registered here (or in a user's module imported before the run
is built):

    @WRITERS.register("mlflow")
    class MlflowWriter(ScalarWriter):
        def __init__(self, logdir, options, run_config): ...
        def write_scalars(self, step, scalars): ...

This module also holds the JSONL file primitives `metrics.jsonl` and `rollouts.jsonl` share:
an append is one write of the whole row, cut back if it fails, and `truncate_jsonl` drops the
rows after a step in place.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from jaxrl_frontier.core import records
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.core.records import key, section
from jaxrl_frontier.core.registry import Registry

METRICS_FILE = "metrics.jsonl"

WRITERS = Registry("metrics writer", key="metrics.writers")


# --------------------------------------------------------------------------- options


WANDB_MODES = ("", "online", "offline", "disabled")


@dataclasses.dataclass(frozen=True)
class WandbOptions:
    """`metrics.wandb`: the Weights & Biases run (used when `metrics.writers` has 'wandb').

    project: the W&B project. name: the run's name ('': the run directory's name). entity:
    the team or user ('': the API key's default). mode: 'online' | 'offline' | 'disabled'
    ('': $WANDB_MODE if set, else 'online' when $WANDB_API_KEY is set, else 'offline': no
    network; `wandb sync DIR/wandb/offline-run-*` uploads later). dir: where W&B writes its
    files ('': the run directory, under `wandb/`)."""

    project: str = key("jaxrl_frontier", "the W&B project")
    name: str = key("", "the run's name ('': the run directory's name)")
    entity: str = key("", "the team or user ('': the API key's default)")
    mode: str = key("", "'' | online | offline | disabled", choices=WANDB_MODES)
    dir: str = key("", "where W&B writes ('': the run directory)")

    def resolved_mode(self, env: Mapping[str, str] = os.environ) -> str:
        """The mode W&B runs in: the key's value, else $WANDB_MODE, else online iff an API key
        is set."""
        if self.mode:
            return self.mode
        return env.get("WANDB_MODE") or ("online" if env.get("WANDB_API_KEY") else "offline")


@dataclasses.dataclass(frozen=True)
class MetricsOptions:
    """`metrics`: which writers a run's scalars go to (`WRITERS` names) and their options.
    flush_secs: TensorBoard's event files are flushed at least this often."""

    writers: tuple[str, ...] = key(("tensorboard", "jsonl"), "WRITERS names")
    flush_secs: float = key(30.0, "TensorBoard's flush interval", low=0, low_open=True)
    wandb: WandbOptions = section(WandbOptions, "the Weights & Biases run")

    def __post_init__(self) -> None:
        names = (self.writers,) if isinstance(self.writers, str) else tuple(self.writers)
        object.__setattr__(self, "writers", names)
        for name in names:
            WRITERS.get(name)  # an UnknownNameError naming `metrics.writers` and the known names
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ConfigError(f"config key 'metrics.writers' = {names!r}: {repeated} named twice")
        if self.wandb.mode not in WANDB_MODES:
            raise ConfigError(
                f"config key 'metrics.wandb.mode' = {self.wandb.mode!r}; allowed: "
                + ", ".join(map(repr, WANDB_MODES))
            )
        records.check(self, "metrics")
        if "wandb" in names:  # checked on every process, so all of them fail alike
            _require_wandb()

    @classmethod
    def from_section(cls, section: Mapping[str, Any]) -> MetricsOptions:
        """The record of a `metrics` section given as a mapping (keys not given: defaults)."""
        return records.build(cls, section, "metrics")


# --------------------------------------------------------------------------- scalars, files


def is_writer(process_index: int | None) -> bool:
    """Whether this process writes the run's files: process 0 only."""
    if process_index is None:
        import jax  # deferred: pure-logging users and tests need no backend

        process_index = jax.process_index()
    return process_index == 0


def to_float(name: str, value: Any) -> float:
    """A Python/NumPy/JAX scalar or size-1 array as a float (ValueError naming `name` else)."""
    arr = np.asarray(value)
    if arr.size != 1:
        raise ValueError(f"metric {name!r} must be a scalar, got shape {arr.shape}")
    return float(arr.reshape(()))


def json_number(x: float) -> float | None:
    """`x`, or None for NaN/inf: strict JSON has no NaN/Infinity (jq, JS and many readers
    reject them). The event file keeps the exact non-finite value."""
    return x if math.isfinite(x) else None


def open_appending(path: Path) -> io.RawIOBase:
    """An unbuffered append handle: each row reaches the OS in `append_line`'s own writes, so
    no half-written row waits in a Python buffer to be flushed later (at close, or after the
    disk filled up)."""
    return open(path, "ab", buffering=0)


def append_line(f: io.RawIOBase, line: str) -> None:
    """Append `line` + newline; on failure (disk full) cut the file back to where it was, so a
    reader (and a resumed run) never sees a torn row, then re-raise."""
    data = memoryview((line + "\n").encode("utf-8"))
    fd = f.fileno()
    start = os.lseek(fd, 0, os.SEEK_END)
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        try:
            os.ftruncate(fd, start)
        except OSError:
            pass  # truncate_jsonl drops the torn line on resume
        raise


def truncate_jsonl(path: str | Path, step: int) -> int:
    """Keep the rows of the JSONL file at `path` whose "step" <= `step`, in place (the same
    inode: an open append handle keeps writing to it); drop later rows and lines that do not
    parse (a write torn by a kill). Returns the number of lines dropped."""
    path = Path(path)
    if not path.exists():
        return 0
    with open(path, "r+", encoding="utf-8") as f:
        lines = f.read().split("\n")
        keep = []
        for line in lines:
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a torn line: the step it belonged to is logged again
            if isinstance(row, dict) and int(row.get("step", 0)) <= step:
                keep.append(line)
        f.seek(0)
        f.write("".join(k + "\n" for k in keep))
        f.truncate()
        f.flush()
        os.fsync(f.fileno())
    return sum(1 for line in lines if line) - len(keep)


def format_value(x: float) -> str:
    """A scalar for a console line: 4 significant digits; nan/inf as Python prints them."""
    return f"{x:.4g}" if math.isfinite(x) else str(x)


# --------------------------------------------------------------------------- writers


class ScalarWriter:
    """One destination of a run's scalars. Built as `cls(logdir, options, run_config)` with
    the run directory, the `MetricsOptions` and the resolved config (a plain dict, or None)."""

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        raise NotImplementedError

    def write_text(self, step: int, tag: str, text: str) -> None:
        """A text record (the resolved config, a sample); destinations without one skip it."""

    def flush(self, sync: bool = False) -> None:
        """Hand buffered records to the OS (`sync`: and to the disk)."""

    def truncate_after(self, step: int) -> int:
        """Drop the records after `step` (a resume); append-only destinations keep them: 0."""
        return 0

    def close(self) -> None:
        """Flush and release the destination."""


@WRITERS.register("tensorboard")
class TensorBoardWriter(ScalarWriter):
    """Scalars and text to TensorBoard event files in the run directory. Event files are
    append-only: after a resume a re-run step appears twice and TensorBoard shows the newest."""

    def __init__(self, logdir, options: MetricsOptions, run_config=None):
        # Deferred imports: the event writer pulls in tensorboard's proto stack.
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._events = EventFileWriter(str(logdir), flush_secs=options.flush_secs)

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        value = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()]
        summary = summary_pb2.Summary(value=value)
        self._events.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def write_text(self, step: int, tag: str, text: str) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.text.summary_v2 import text_pb

        event = event_pb2.Event(wall_time=time.time(), step=step, summary=text_pb(tag, text))
        self._events.add_event(event)

    def flush(self, sync: bool = False) -> None:
        self._events.flush()

    def close(self) -> None:
        self._events.close()


@WRITERS.register("jsonl")
class JsonlWriter(ScalarWriter):
    """`metrics.jsonl`: one JSON object per `write_scalars` call,
    {"step": int, "time": unix seconds, "<name>": float | null, ...} (null = NaN/inf)."""

    def __init__(self, logdir, options: MetricsOptions, run_config=None):
        self.path = Path(logdir) / METRICS_FILE
        self._file = open_appending(self.path)

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        row = {"step": step, "time": time.time()}
        row.update({k: json_number(v) for k, v in scalars.items()})
        append_line(self._file, json.dumps(row))

    def flush(self, sync: bool = False) -> None:
        self._file.flush()
        if sync:
            os.fsync(self._file.fileno())

    def truncate_after(self, step: int) -> int:
        self._file.flush()
        return truncate_jsonl(self.path, step)

    def close(self) -> None:
        self._file.close()


@WRITERS.register("console")
class ConsoleWriter(ScalarWriter):
    """One line per write on stdout, every scalar in the order given:
    `step 10: train/loss 0.3125 reward/total 0.5` (4 significant digits)."""

    def __init__(self, logdir, options: MetricsOptions, run_config=None, *, stream=None):
        self.stream: TextIO = sys.stdout if stream is None else stream

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        values = " ".join(f"{k} {format_value(v)}" for k, v in scalars.items())
        self.stream.write(f"step {step}: {values}\n")
        self.stream.flush()


def _require_wandb() -> None:
    if importlib.util.find_spec("wandb") is None:
        raise ConfigError(
            "config key 'metrics.writers' names 'wandb', but the wandb package is not "
            "installed: pip install 'jaxrl_frontier[wandb]' (or pip install wandb)"
        )


@WRITERS.register("wandb")
class WandbWriter(ScalarWriter):
    """A Weights & Biases run (`WandbOptions`): each write is one `run.log(scalars, step)`;
    writes at the same step (a step's train scalars, then its eval) land in one history row.
    The resolved config is the W&B run config. Offline by default without an API key: the run
    is written under `<dir>/wandb/offline-run-*` with no network, for `wandb sync` later.
    A resumed run is a new W&B run (from the checkpoint's step on). `close` returns once W&B's
    own process has the run's end; that process may finish writing the run's file a moment
    later, and always before the Python process exits."""

    def __init__(self, logdir, options: MetricsOptions, run_config=None):
        _require_wandb()
        import wandb

        o = options.wandb
        config = json.loads(json.dumps(dict(run_config or {}), default=str))  # JSON-able
        directory = Path(o.dir or logdir)
        directory.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=o.project,
            entity=o.entity or None,
            name=o.name or Path(logdir).resolve().name,
            dir=str(directory),
            mode=o.resolved_mode(),
            config=config,
            reinit="create_new",  # a process may hold several runs (tests, sweeps in process)
        )

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def close(self) -> None:
        self._run.finish()


def make_writers(logdir, options: MetricsOptions, run_config=None) -> list[ScalarWriter]:
    """The writers `options.writers` names, in that order."""
    return [WRITERS.get(name)(logdir, options, run_config) for name in options.writers]
