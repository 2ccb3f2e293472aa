"""Helpers shared by the benchmarks: the config, the machine, timing, the matmul peak, JSON.

Nothing here imports jax or torch at module level: the orchestrating process of a benchmark
with a torch peer imports neither (`benchmarks/peers.py`), and each side's timing runs in a
process of its own.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from jaxrl_frontier.core.host_memory import host_memory_info
from jaxrl_frontier.core.machine import cpu_info

REPO = Path(__file__).resolve().parents[1]

# The packages whose versions a figure depends on (recorded in every JSON).
VERSIONED = (
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "numpy",
    "torch",
    "transformers",
    "trl",
    "accelerate",
)

# Qwen2.5-0.5B's shape, the ~0.5B model of the GPU benchmarks (train.py; the sampler's comes
# from benchmarks/configs/random_qwen2.py).
QWEN2_5_0_5B = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_layers=24,
    num_heads=14,
    num_kv_heads=2,
)


def ints(text: str) -> list[int]:
    """'16,64' -> [16, 64] (a comma-separated list option)."""
    return [int(x) for x in text.split(",") if x]


# ----------------------------------------------------------------------------- config


def choices_of(*allowed: str):
    """An argparse type: a comma-separated list of `allowed` values."""

    def parse(text: str) -> list[str]:
        values = text.split(",")
        bad = [v for v in values if v not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad} not among {list(allowed)}")
        return values

    return parse


def split_config_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """argv -> (the `--config=FILE[:ARG]` / `--config.KEY=VALUE` arguments, the others)."""
    config, rest = [], []
    for a in argv:
        (config if a == "--config" or a.startswith(("--config=", "--config.")) else rest).append(a)
    return config, rest


def load_config(config_args: list[str], default: str):
    """The experiment config as training reads it: `--config=FILE[:ARG]` (default `default`)
    and `--config.KEY=VALUE` overrides, parsed by ml_collections' config flags."""
    from absl import flags
    from ml_collections import config_flags

    if not any(a.startswith("--config=") for a in config_args):  # default: in this checkout
        config_args = [f"--config={REPO / default}", *config_args]
    argv = ["benchmark", *config_args]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config", None, "config file", flag_values=values, sys_argv=argv
    )
    try:
        values(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError) as e:
        raise SystemExit(f"config error ({' '.join(config_args)}): {e}") from None
    return values.config


def checkpoint(config) -> dict | None:
    """The checkpoint the config's policy is read from (`model.init = 'hf'`: `model.path`),
    as `checkpoint_of` describes it, or None for a random model (`model.init` 'scratch')."""
    if config.model.init == "scratch":
        return None
    if config.model.init != "hf":
        raise SystemExit(
            f"config key 'model.init' = {config.model.init!r}: a benchmark reads 'scratch' "
            "(a random model) or 'hf' (model.path: a pretrained name, .gguf file or directory)"
        )
    return checkpoint_of(config.model.path)


def checkpoint_of(path: str) -> dict:
    """A checkpoint by pretrained name (`scripts/fetch_model.py`), .gguf file or Hugging Face
    directory: its directory (`dir`: every side loads it), its `config.json` and the sha256
    of each weight file (and of the GGUF file a fetched name was converted from), so a
    figure names the exact weights. Imports neither jax nor torch."""
    from jaxrl_frontier.models import pretrained

    try:
        where = Path(pretrained.local_path(path))
    except FileNotFoundError as e:
        raise SystemExit(str(e)) from None
    if not (where / "config.json").is_file():
        raise SystemExit(f"checkpoint {path!r}: no config.json in {where}")

    out = dict(
        path=path,
        dir=str(where),
        config=json.loads((where / "config.json").read_text()),
        sha256={f.name: pretrained.sha256_of(f) for f in sorted(where.glob("*.safetensors"))},
    )
    source = where.parent / "source.json"  # a fetched name: the GGUF file it came from
    if path in pretrained.PRETRAINED and source.is_file():
        out["gguf_sha256"] = json.loads(source.read_text()).get("sha256")
    return out


def config_text(config) -> dict:
    """A config as JSON-able nested dicts (what the benchmark ran, in its JSON)."""
    return json.loads(config.to_json_best_effort())


# ----------------------------------------------------------------------------- machine


def versions() -> dict:
    """Installed versions of `VERSIONED` (read from metadata: nothing is imported)."""
    out = {}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine_info(jax_device: bool = True) -> dict:
    """Where a figure was measured: CPU model and extensions, cores, load average, library
    versions, XLA flags and (with `jax_device`, which imports jax) JAX's device."""
    out = dict(
        **cpu_info(),
        load_average=list(os.getloadavg()),
        platform=platform.platform(),
        python=platform.python_version(),
        versions=versions(),
        xla_flags=os.environ.get("XLA_FLAGS", ""),
        host_memory=host_memory_info(),  # huge pages for every side alike (core/host_memory.py)
    )
    if jax_device:
        import jax

        dev = jax.devices()[0]
        out.update(device=str(dev), device_kind=dev.device_kind, device_count=jax.device_count())
    return out


def foreign_modules(*roots: str) -> list[str]:
    """The top-level modules among `roots` this process has imported (a timing process
    reports which of the other side's frameworks it holds: none)."""
    return sorted({m.split(".")[0] for m in sys.modules} & set(roots))


# ----------------------------------------------------------------------------- timing


def median_time(fn, repeats: int) -> tuple[float, list[float]]:
    """Median wall time of `repeats` calls of `fn` (already compiled), and every time."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def median_of_rounds(runs: list[dict], keys: tuple[str, ...]) -> dict:
    """One side's record over its rounds: the first round's, each of `keys` it holds the
    median of the rounds' figures, the rounds kept (`rounds`); a single round as it is."""
    if len(runs) == 1:
        return runs[0]
    out = {k: statistics.median(r[k] for r in runs) for k in keys if k in runs[0]}
    return dict(runs[0], **out, rounds=runs)


def decode_step_rounds(full, prefill, repeats: int, each_round=None):
    """Rounds for timing a decode step as (T(full) - T(prefill)) / (Tn - 1): a rollout of Tn
    >= 2 new tokens is the prefill (which samples the first token) plus Tn - 1 decode steps,
    and a 1-token rollout is the prefill alone. Each round runs `each_round()` (e.g. a
    matmul-peak probe; its results are returned), then the two warm rollouts back to back.
    Returns (full seconds, prefill seconds, each_round's results), one per round."""
    t_full, t_prefill, probes = [], [], []
    for _ in range(repeats):
        probes.append(each_round() if each_round else None)
        for run, times in ((full, t_full), (prefill, t_prefill)):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
    return t_full, t_prefill, probes


def matmul_peak(n: int = 2048, repeats: int = 5) -> dict:
    """GFLOP/s of an n x n jnp matmul in f32 and bf16 (median of repeats); peak = the best."""
    import jax
    import jax.numpy as jnp

    out = {}
    for name, dt in (("float32", jnp.float32), ("bfloat16", jnp.bfloat16)):
        a = jax.random.normal(jax.random.key(0), (n, n), dt)
        b = jax.random.normal(jax.random.key(1), (n, n), dt)
        mm = jax.jit(lambda x, y: x @ y)
        mm(a, b).block_until_ready()
        t, _ = median_time(lambda mm=mm, a=a, b=b: mm(a, b).block_until_ready(), repeats)
        out[f"{name}_gflops"] = 2 * n**3 / t / 1e9
    out["peak_gflops"] = max(out["float32_gflops"], out["bfloat16_gflops"])
    out["n"] = n
    return out


class CompileCounter:
    """Counts XLA compilations while active (`jax.monitoring`'s backend-compile event): a
    same-shaped second call compiles nothing."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self):
        import jax

        self.times: list[float] = []  # time.time() at the end of each compilation
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    @property
    def count(self) -> int:
        return len(self.times)

    def _listen(self, event: str, duration: float, **kwargs) -> None:
        if event == self.EVENT:
            self.times.append(time.time())


# ----------------------------------------------------------------------------- output


def compiled_memory(compiled) -> dict | None:
    """Per-device bytes of a compiled program (`compiled.memory_analysis()`): arguments,
    temporaries, outputs, aliased (outputs written over donated arguments) and the peak they
    add up to; None where the backend reports none. Every benchmark's memory figure."""
    m = compiled.memory_analysis()
    if m is None:
        return None
    row = dict(
        arguments=m.argument_size_in_bytes,
        temporaries=m.temp_size_in_bytes,
        outputs=m.output_size_in_bytes,
        aliased=m.alias_size_in_bytes,
    )
    row["peak"] = row["arguments"] + row["temporaries"] + row["outputs"] - row["aliased"]
    return row


MIB = 2**20


def write_json(result: dict, path: str | Path, *, echo: bool = True) -> dict:
    """Write `result` to `path` (parents created) and, with `echo`, print it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2)
    path.write_text(text + "\n")
    if echo:
        print(text)
    return result


def standalone_main(name: str, doc: str, add_arguments, run, argv=None) -> dict:
    """`python -m benchmarks.<module> [--out PATH] [options]`: one benchmark, JSON written."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default=f"artifacts/{name}.json", help="JSON path")
    add_arguments(parser)
    args = parser.parse_args(argv)
    return write_json(dict(benchmark=name, **run(args)), args.out)
