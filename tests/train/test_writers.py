"""Metrics writers: the registry, the console line, and a Weights & Biases offline run read
back from its own transaction log against `metrics.jsonl`."""

import importlib.util
import io
import json
import math
import os
import struct
import time

import pytest

from jaxrl_frontier.core.errors import ConfigError, UnknownNameError
from jaxrl_frontier.train import writers
from jaxrl_frontier.train.metrics import METRICS_FILE, MetricsWriter
from jaxrl_frontier.train.writers import WRITERS, MetricsOptions, WandbOptions


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_registry_names_and_default_files(tmp_path):
    assert WRITERS.names() == ["console", "jsonl", "tensorboard", "wandb"]
    assert WRITERS.key == "metrics.writers"
    with MetricsWriter(tmp_path, process_index=0) as w:  # the default: what a run wrote before
        w.write_scalars(1, {"loss": 0.5})
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files[1] == METRICS_FILE and len(files) == 2
    assert files[0].startswith("events.out.tfevents.")
    assert MetricsOptions().writers == ("tensorboard", "jsonl")
    assert MetricsOptions.from_section({"writers": "jsonl"}).writers == ("jsonl",)  # one name


def test_bad_writer_names_name_the_key(monkeypatch):
    with pytest.raises(UnknownNameError, match=r"'metrics.writers'.*Did you mean 'jsonl'\?"):
        MetricsOptions.from_section({"writers": ["tensorboard", "jsnol"]})
    with pytest.raises(ConfigError, match=r"'metrics.writers'.*\['jsonl'\] named twice"):
        MetricsOptions(writers=("jsonl", "jsonl"))
    with pytest.raises(ConfigError, match=r"'metrics.wandb.mode' = 'onlin'; allowed: "):
        MetricsOptions.from_section({"wandb": {"mode": "onlin"}})
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"'metrics.writers' names 'wandb'.*not installed"):
        MetricsWriter("unused", {"writers": ("jsonl", "wandb")}, process_index=1)


def test_only_process_zero_starts_a_wandb_run(tmp_path):
    pytest.importorskip("wandb")
    with MetricsWriter(tmp_path / "p1", {"writers": ("wandb",)}, process_index=1) as w:
        w.write_scalars(1, {"loss": 1.0})
    assert not (tmp_path / "p1").exists()


def test_wandb_mode_offline_unless_a_key_or_the_config_says_otherwise():
    o = WandbOptions()
    assert o.resolved_mode({}) == "offline"
    assert o.resolved_mode({"WANDB_API_KEY": "k"}) == "online"
    assert o.resolved_mode({"WANDB_API_KEY": "k", "WANDB_MODE": "disabled"}) == "disabled"
    assert WandbOptions(mode="offline").resolved_mode({"WANDB_API_KEY": "k"}) == "offline"


def test_console_line_and_jsonl_side_by_side(tmp_path):
    out = io.StringIO()
    console = writers.ConsoleWriter(tmp_path, MetricsOptions(), stream=out)
    console.write_scalars(10, {"train/loss": 0.3125, "reward/total": 2 / 3, "x": math.nan})
    assert out.getvalue() == "step 10: train/loss 0.3125 reward/total 0.6667 x nan\n"
    opts = {"writers": ("jsonl", "console")}
    with MetricsWriter(tmp_path, opts, process_index=0) as w:
        w.write_scalars(3, {"loss": 1})
    assert [(r["step"], r["loss"]) for r in _jsonl(tmp_path / METRICS_FILE)] == [(3, 1.0)]


def _wandb_records(path):
    """The records of a W&B transaction log (`run-ID.wandb`): a 7-byte header (':W&B', magic,
    version), then LevelDB-log records in 32 KiB blocks (7-byte chunk header: crc32c, length,
    type FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4), each a `wandb_internal_pb2.Record`."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunks, block = 7, [], 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        assert kind in (1, 2, 3, 4), (pos, kind)
        if pos + 7 + n > len(data):
            return  # a chunk still being written
        chunks.append(data[pos + 7 : pos + 7 + n])
        pos += 7 + n
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def test_wandb_offline_run_holds_the_jsonl_scalars(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "grpo_seed3"
    config = {"seed": 3, "optimizer": {"lr": 1e-5}, "metrics": {"writers": ["jsonl", "wandb"]}}
    opts = {"writers": ("jsonl", "wandb"), "wandb": {"project": "proj"}}
    with MetricsWriter(run_dir, opts, run_config=config, process_index=0) as w:
        w.write_scalars(0, {"eval/pass@1": 0.125})  # the eval at the start
        w.write_scalars(2, {"train/loss": 0.5, "reward/total": 1 / 3})
        w.write_scalars(2, {"eval/pass@1": 0.25})  # a step's eval: a second row, same step
        w.write_scalars(4, {"train/loss": math.nan, "reward/total": 0.75})
    expected: dict[int, dict] = {}  # metrics.jsonl, rows of a step merged; null = NaN
    for row in _jsonl(run_dir / METRICS_FILE):
        row.pop("time")
        step = row.pop("step")
        expected.setdefault(step, {}).update(
            {k: math.nan if v is None else v for k, v in row.items()}
        )
    assert sorted(expected) == [0, 2, 4] and len(expected[2]) == 3

    (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")  # offline: no network, no key
    # `finish` returns once wandb-core has the run's end; the core process may still be
    # writing the log (seen on a process's first run): wait for its exit record
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        records = list(_wandb_records(log))
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        time.sleep(0.05)
    history, run = {}, None
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "history":
            # wandb-core writes each name in nested_key (one part); older versions in key
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            history[record.history.step.num] = {
                k: v for k, v in items.items() if not k.startswith("_")
            }
        elif kind == "run":
            run = record.run
    assert sorted(history) == sorted(expected)
    for step, row in expected.items():
        got = history[step]
        assert sorted(got) == sorted(row), step
        for k, v in row.items():  # the same float64 through JSON: equal, NaN as NaN
            assert got[k] == v or (math.isnan(v) and math.isnan(got[k])), (step, k)
    assert (run.project, run.display_name) == ("proj", "grpo_seed3")
    recorded = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert {k: recorded[k] for k in config} == config


def test_a_failed_append_leaves_no_torn_line(tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n')
    f = writers.open_appending(path)
    real_write = os.write
    calls = []

    def full_disk_write(fd, data):
        """The first write lands 5 bytes, the next finds the disk full (ENOSPC)."""
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:5]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writers.os, "write", full_disk_write)
    with pytest.raises(OSError, match="No space"):
        writers.append_line(f, '{"step": 2, "loss": 1.0}')
    monkeypatch.undo()
    assert calls == [25, 20]
    assert path.read_text() == '{"step": 1}\n'
    writers.append_line(f, '{"step": 2}')  # the handle keeps appending after the cut
    f.close()
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
