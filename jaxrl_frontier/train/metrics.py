"""Run outputs: TensorBoard + JSONL scalars, JSONL rollout dumps, a console progress line.

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

METRICS_FILE = "metrics.jsonl"
ROLLOUTS_FILE = "rollouts.jsonl"


def _is_writer(process_index: int | None) -> bool:
    if process_index is None:
        import jax  # deferred: pure-logging users and tests need no backend

        process_index = jax.process_index()
    return process_index == 0


def _to_float(name: str, value: Any) -> float:
    arr = np.asarray(value)
    if arr.size != 1:
        raise ValueError(f"metric {name!r} must be a scalar, got shape {arr.shape}")
    return float(arr.reshape(()))


def _json_number(x: float) -> float | None:
    # Strict JSON has no NaN/Infinity (jq, JS and many readers reject them): write null.
    # The event file keeps the exact non-finite value.
    return x if math.isfinite(x) else None


class MetricsWriter:
    """Scalars to TensorBoard event files and `metrics.jsonl`; text to TensorBoard.

    `metrics.jsonl` holds one JSON object per `write_scalars` call:
    {"step": int, "time": unix seconds, "<name>": float | null, ...} (null = NaN/inf).
    Use "/" in names to group them in TensorBoard ("reward/correctness").
    """

    def __init__(
        self, logdir: str | Path, *, process_index: int | None = None, flush_secs: float = 30
    ):
        self.logdir = Path(logdir)
        self.active = _is_writer(process_index)
        self._events = None
        self._jsonl: io.RawIOBase | None = None
        self._closed = False
        if self.active:
            # Deferred imports: the event writer pulls in tensorboard's proto stack.
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self.logdir.mkdir(parents=True, exist_ok=True)
            self._events = EventFileWriter(str(self.logdir), flush_secs=flush_secs)
            self._jsonl = _open_appending(self.logdir / METRICS_FILE)

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        """Write each name -> scalar (Python/NumPy/JAX scalar or size-1 array) at `step`."""
        self._check_open()
        if not self.active:
            return
        from tensorboard.compat.proto import event_pb2, summary_pb2

        values = {name: _to_float(name, v) for name, v in scalars.items()}
        for k in ("step", "time"):
            if k in values:
                raise ValueError(f"metric name {k!r} collides with a reserved JSONL key")
        now = time.time()
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in values.items()]
        )
        self._events.add_event(event_pb2.Event(wall_time=now, step=int(step), summary=summary))
        row = {"step": int(step), "time": now}
        row.update({k: _json_number(v) for k, v in values.items()})
        _append_line(self._jsonl, json.dumps(row))

    def write_text(self, step: int, tag: str, text: str) -> None:
        """A text summary (TensorBoard's Text tab), e.g. the resolved config or a sample."""
        self._check_open()
        if not self.active:
            return
        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.text.summary_v2 import text_pb

        event = event_pb2.Event(wall_time=time.time(), step=int(step), summary=text_pb(tag, text))
        self._events.add_event(event)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"MetricsWriter for {self.logdir} is closed")

    def flush(self, sync: bool = False) -> None:
        """Hand buffered rows to the OS (`sync`: and to the disk: the trainer syncs with each
        checkpoint, so a checkpoint's rows survive a power cut as well as a kill)."""
        if self.active and not self._closed:
            self._events.flush()
            self._jsonl.flush()
            if sync:
                os.fsync(self._jsonl.fileno())

    def truncate_after(self, step: int) -> int:
        """Drop the `metrics.jsonl` rows after `step` (and torn lines); returns how many.

        Called on resume from the checkpoint at `step`: the resumed run logs those steps
        again. (TensorBoard event files are append-only; TensorBoard shows the newest value of
        a repeated step.)"""
        if not self.active:
            return 0
        self._jsonl.flush()
        return truncate_jsonl(self.logdir / METRICS_FILE, step)

    def close(self) -> None:
        """Flush and close; later writes are an error. Safe to call twice."""
        if self.active and not self._closed:
            self._events.close()
            self._jsonl.close()
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


def _open_appending(path: Path) -> io.RawIOBase:
    """An unbuffered append handle: each row reaches the OS in `_append_line`'s own writes, so
    no half-written row waits in a Python buffer to be flushed later (at close, or after the
    disk filled up)."""
    return open(path, "ab", buffering=0)


def _append_line(f: io.RawIOBase, line: str) -> None:
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


def _format_value(x: float) -> str:
    if not math.isfinite(x):
        return str(x)
    return f"{x:.4g}"


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
