"""Run outputs: scalars to the writers `metrics.writers` names (TensorBoard + JSONL by default;
console and Weights & Biases on request: train/writers.py), JSONL rollout dumps, a console
progress line.

Nothing here needs TensorFlow or torch: event files are written with the `tensorboard`
package's own `EventFileWriter` and protos. Every run writes machine-readable JSONL next to the
event files (`metrics.jsonl`, `rollouts.jsonl`) so reports and sweeps never parse TensorBoard.

Multi-host: only process 0 writes (`jax.process_index() == 0`); on other processes the writers
are no-ops that create no files, so every process can call them unconditionally.

Callers hand over host values: `jax.device_get` the step's metrics once at a log step
(metrics stay on device in between), then call `write_scalars`.

Nothing lost, nothing twice. The trainer flushes (and fsyncs) both JSONL files before every
checkpoint save, so every row up to a checkpoint's step is on disk when the checkpoint is, and
on resume `truncate_after(step)` drops the rows written after the restored step (they are
written again by the resumed run) and any torn last line. A row is appended with one write of
the whole line; if that write fails (disk full), the file is cut back to the row before.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from jaxrl_frontier.train.writers import (
    METRICS_FILE,
    MetricsOptions,
    ScalarWriter,
    make_writers,
    truncate_jsonl,
)
from jaxrl_frontier.train.writers import append_line as _append_line
from jaxrl_frontier.train.writers import format_value as _format_value
from jaxrl_frontier.train.writers import is_writer as _is_writer
from jaxrl_frontier.train.writers import json_number as _json_number
from jaxrl_frontier.train.writers import open_appending as _open_appending
from jaxrl_frontier.train.writers import to_float as _to_float

ROLLOUTS_FILE = "rollouts.jsonl"
__all__ = [
    "METRICS_FILE",
    "ROLLOUTS_FILE",
    "MetricsWriter",
    "ProgressBar",
    "RolloutLogger",
    "format_duration",
    "rl_step_scalars",
    "truncate_jsonl",
]


class MetricsWriter:
    """A run's scalars to each writer `metrics.writers` names (train/writers.py: by default
    TensorBoard event files and `metrics.jsonl`); text to those that keep it (TensorBoard).

    `metrics.jsonl` holds one JSON object per `write_scalars` call:
    {"step": int, "time": unix seconds, "<name>": float | null, ...} (null = NaN/inf).
    Use "/" in names to group them in TensorBoard and W&B ("reward/correctness").

    options: a `MetricsOptions`, or the `metrics` section as a plain mapping; run_config: the
    resolved config as a plain dict (W&B records it as the run's config).
    """

    def __init__(
        self,
        logdir: str | Path,
        options: MetricsOptions | Mapping[str, Any] | None = None,
        *,
        run_config: Mapping[str, Any] | None = None,
        process_index: int | None = None,
        flush_secs: float | None = None,
    ):
        if options is None or isinstance(options, Mapping):
            options = MetricsOptions.from_section(options or {})
        if flush_secs is not None:
            options = dataclasses.replace(options, flush_secs=flush_secs)
        self.logdir = Path(logdir)
        self.options = options
        self.active = _is_writer(process_index)
        self._writers: list[ScalarWriter] = []
        self._closed = False
        if self.active:
            self.logdir.mkdir(parents=True, exist_ok=True)
            self._writers = make_writers(self.logdir, options, run_config)

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        """Write each name -> scalar (Python/NumPy/JAX scalar or size-1 array) at `step`."""
        self._check_open()
        if not self.active:
            return
        values = {name: _to_float(name, v) for name, v in scalars.items()}
        for k in ("step", "time"):
            if k in values:
                raise ValueError(f"metric name {k!r} collides with a reserved JSONL key")
        for writer in self._writers:
            writer.write_scalars(int(step), values)

    def write_text(self, step: int, tag: str, text: str) -> None:
        """A text summary (TensorBoard's Text tab), e.g. the resolved config or a sample."""
        self._check_open()
        for writer in self._writers:
            writer.write_text(int(step), tag, text)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"MetricsWriter for {self.logdir} is closed")

    def flush(self, sync: bool = False) -> None:
        """Hand buffered rows to the OS (`sync`: and to the disk: the trainer syncs with each
        checkpoint, so a checkpoint's rows survive a power cut as well as a kill)."""
        if not self._closed:
            for writer in self._writers:
                writer.flush(sync)

    def truncate_after(self, step: int) -> int:
        """Drop the `metrics.jsonl` rows after `step` (and torn lines); returns how many.

        Called on resume from the checkpoint at `step`: the resumed run logs those steps
        again. (TensorBoard event files are append-only; TensorBoard shows the newest value of
        a repeated step.)"""
        return sum(writer.truncate_after(step) for writer in self._writers)

    def close(self) -> None:
        """Flush and close; later writes are an error. Safe to call twice."""
        if not self._closed:
            for writer in self._writers:
                writer.close()
        self._closed = True

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RolloutLogger:
    """Sampled rollouts to `rollouts.jsonl`, one JSON object per completion:

    {"step", "prompt", "completion", "rewards": {name: float | null}, "advantage": float | null,
     **extra}

    `write` logs one rollout; `write_batch` logs rows of arrays as they leave the scorer.
    """

    def __init__(self, logdir: str | Path, *, process_index: int | None = None):
        self.path = Path(logdir) / ROLLOUTS_FILE
        self.active = _is_writer(process_index)
        self._file: io.RawIOBase | None = None
        if self.active:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = _open_appending(self.path)

    def write(
        self,
        *,
        step: int,
        prompt: str,
        completion: str,
        rewards: Mapping[str, float],
        advantage: float,
        **extra: Any,
    ) -> None:
        """Log one rollout. `advantage`: the sequence advantage (per-token mean for token-level
        estimators). `extra`: more JSON-able fields (e.g. policy_version=3)."""
        if not self.active:
            return
        row = {
            "step": int(step),
            "prompt": prompt,
            "completion": completion,
            "rewards": {k: _json_number(_to_float(k, v)) for k, v in rewards.items()},
            "advantage": _json_number(_to_float("advantage", advantage)),
        }
        for k, v in extra.items():  # (a name clash with the fields above is a TypeError)
            row[k] = v.item() if isinstance(v, np.generic) else v
        _append_line(self._file, json.dumps(row, ensure_ascii=False))

    def write_batch(
        self,
        step: int,
        prompts: Sequence[str],
        completions: Sequence[str],
        rewards_nk: Any,
        reward_names: Sequence[str],
        advantages_n: Any,
        *,
        max_rows: int | None = None,
        extra: Mapping[str, Sequence[Any]] | None = None,
    ) -> None:
        """Log N rollouts (the first `max_rows` if given).

        prompts, completions: N strings (repeat each prompt G times for groups).
        rewards_nk: [N, K] in `reward_names` order; advantages_n: [N]. extra: more per-row
        fields, each a length-N sequence of JSON-able values.
        """
        if not self.active:
            return
        rewards_nk = np.asarray(rewards_nk, dtype=np.float64)
        advantages_n = np.asarray(advantages_n, dtype=np.float64).reshape(-1)
        n = len(completions)
        if rewards_nk.shape != (n, len(reward_names)):
            raise ValueError(
                f"RolloutLogger: rewards shape {rewards_nk.shape}, expected ({n}, {len(reward_names)})"
            )
        sizes = {"prompts": len(prompts), "advantages": len(advantages_n)}
        sizes.update({f"extra[{k!r}]": len(v) for k, v in (extra or {}).items()})
        bad = {k: v for k, v in sizes.items() if v != n}
        if bad:
            raise ValueError(f"RolloutLogger: {n} completions but lengths {bad}")
        for i in range(n if max_rows is None else min(n, max_rows)):
            self.write(
                step=step,
                prompt=prompts[i],
                completion=completions[i],
                rewards=dict(zip(reward_names, rewards_nk[i], strict=True)),
                advantage=advantages_n[i],
                **{k: v[i] for k, v in (extra or {}).items()},
            )

    def flush(self, sync: bool = False) -> None:
        if self._file is not None and sync:
            os.fsync(self._file.fileno())

    def truncate_after(self, step: int) -> int:
        """Drop the rollout rows after `step` (and torn lines); returns how many."""
        if not self.active:
            return 0
        return truncate_jsonl(self.path, step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            self.active = False


def format_duration(seconds: float | None) -> str:
    """Compact duration: 7s, 4m05s, 1h02m, 2d03h; '?' when unknown (None, NaN, inf, < 0)."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


class ProgressBar:
    """One console line: step/total, percent, rate, ETA and a few chosen metrics.

    On a TTY the line is redrawn in place (carriage return) at most every `tty_interval_s`;
    otherwise (CI logs, files) a plain line is printed every `log_interval_s` and at the last
    step, so logs stay readable. The rate is measured from the first `update` on, so the first
    step's compilation time does not distort the ETA; the first update's line (no rate yet)
    is followed by one at the next update, whatever the interval. Only process 0 should own one.

        bar = ProgressBar(total=1000, metrics=("loss", "reward/correctness"))
        bar.update(step, {"loss": 0.3, ...});  bar.close()

    `initial` is the step a resumed run starts from: when > 0, a first line shows it at once;
    `desc` prefixes the line (e.g. "sft", "rl"). Metrics passed to `update` are shown if
    listed in `metrics`, or all of them (in the order given) when `metrics` is None.
    """

    def __init__(
        self,
        total: int,
        *,
        initial: int = 0,
        desc: str = "",
        metrics: Sequence[str] | None = None,
        stream: TextIO | None = None,
        tty_interval_s: float = 0.1,
        log_interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if total < 1:
            raise ValueError(f"ProgressBar: total must be >= 1, got {total}")
        self.total = total
        self.initial = initial
        self.desc = desc
        self.metrics = None if metrics is None else tuple(metrics)
        self.stream = sys.stdout if stream is None else stream
        self.is_tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = tty_interval_s if self.is_tty else log_interval_s
        self.clock = clock
        self._start: tuple[float, int] | None = None  # (time, step) of the first update
        self._last_print = -math.inf
        self._width = 0
        self._values: dict[str, float] = {}
        if not 0 <= initial <= total:
            raise ValueError(f"ProgressBar: need 0 <= initial <= total, got {initial}, {total}")
        if initial:
            self._emit(self.line(initial, clock()))

    def rate(self, step: int, now: float) -> float | None:
        """Steps per second since the first update (None before a second one)."""
        if self._start is None:
            return None
        t0, s0 = self._start
        return (step - s0) / (now - t0) if now > t0 and step > s0 else None

    def line(self, step: int, now: float) -> str:
        """The progress text for `step` at clock time `now` (no I/O)."""
        rate = self.rate(step, now)
        eta = (self.total - step) / rate if rate else None
        parts = [
            f"{self.desc + ' ' if self.desc else ''}step {step}/{self.total} ({100.0 * step / self.total:.1f}%)",
            f"{rate:.2f} it/s" if rate else "? it/s",
            f"eta {format_duration(eta)}",
        ]
        names = self._values if self.metrics is None else self.metrics
        shown = [f"{k} {_format_value(self._values[k])}" for k in names if k in self._values]
        if shown:
            parts.append(" ".join(shown))
        return " | ".join(parts)

    def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Record progress at `step` (steps done); print if the interval has passed."""
        now = self.clock()
        if self._start is None:
            self._start = (now, step)
        for k, v in (metrics or {}).items():
            if self.metrics is None or k in self.metrics:
                self._values[k] = _to_float(k, v)
        if now - self._last_print < self.interval and step < self.total:
            return
        # a line without a rate (the first update's) is followed by one at the next update
        self._last_print = now if self.rate(step, now) is not None else -math.inf
        self._emit(self.line(step, now))

    def _emit(self, text: str) -> None:
        if self.is_tty:
            # Pad with spaces so a shorter line fully overwrites the previous one.
            self.stream.write("\r" + text.ljust(self._width))
            self._width = max(self._width, len(text))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the in-place line (TTY) so later output starts on a fresh line."""
        if self.is_tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0


def rl_step_scalars(step_metrics, info, seconds: float, skipped) -> dict[str, float]:
    """One RL step's logged scalars: the updates' metrics (mean over its optimizer steps),
    the rollout's (`RolloutProducer.produce`'s info) and throughput. Fetches from device."""
    import jax

    m = jax.device_get(step_metrics)
    out = {f"train/{k}": float(np.mean([x[k] for x in m])) for k in m[0]}
    out.update({k: float(v) for k, v in jax.device_get(info["metrics"]).items()})
    tokens = out.pop("rollout/tokens")
    out["reward/failed"] = float(info["n_failed"])
    out["rollout/seconds"] = info["rollout_seconds"]
    out["perf/step_seconds"] = seconds
    out["perf/tokens_per_second"] = tokens / max(seconds, 1e-9)
    out["train/skipped_updates_total"] = float(skipped)
    return out
