"""Speed benchmarks: `python benchmarks/bench.py <name> [--config=FILE[:ARG]] [options]`.

Every benchmark is one entry of `BENCHMARKS` (name -> `Benchmark`). Most run in this process,
registered with `benchmark(name, add_arguments)(run)`: `run` gets the parsed options (and
`args.config_args`, the `--config=` / `--config.KEY=VALUE` arguments, read as training reads
them) and returns a JSON-able dict, written to `--out` (default artifacts/<name>.json) and
printed. The others, registered with `script(name, module, what)`, are modules with command
lines of their own, run as `python -m benchmarks.<module>`. Speed is measured here, never
asserted in tests.

    python benchmarks/bench.py sampler --config=benchmarks/configs/random_qwen2.py:tiny
    python benchmarks/bench.py rl --config=benchmarks/configs/grpo_random_qwen2.py
    python benchmarks/bench.py train                  # train-step MFU (train.py)
    python benchmarks/bench.py train --workload spread  # padded vs packed rows
    python benchmarks/bench.py memory                 # the trainer's programs' bytes per device
    python benchmarks/bench.py plan                   # frontier MoE shapes' memory, by formula
    python benchmarks/bench.py speculative            # speculative vs plain rollouts
    python benchmarks/bench.py profile                # a decode step's ops (decode_profile.py)
    python benchmarks/bench.py async                  # roles on devices, rollouts ahead
    python benchmarks/bench.py agents                 # multi-turn vs single-turn rollouts
    python benchmarks/bench.py continuous             # continuous vs static batching
    python benchmarks/bench.py population --members 8 # and the others `bench.py --help` lists

`python -m benchmarks.bench ...` is the same from the repository root; `bench.py <name>
--help` shows a benchmark's flags and examples. The benchmarks' own tests: benchmarks/tests/.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import sys
from collections.abc import Callable

if __name__ == "__main__":
    from jaxrl_frontier.core import host_memory

    # huge pages for the host buffers, before anything imports jax; every side's process
    # (ours, transformers, TRL) inherits the same settings (core/host_memory.py)
    host_memory.restart_with_huge_pages()

if __name__ == "__main__" and not __package__:
    # Run as a file: run again as the module `benchmarks.bench` of this checkout, so the
    # benchmarks import each other as a package (the working directory stays the caller's).
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    os.environ["PYTHONPATH"] = path
    os.execv(sys.executable, [sys.executable, "-m", "benchmarks.bench", *sys.argv[1:]])

from benchmarks import (  # noqa: E402  (after the re-run as a module above)
    agents,
    async_rl,
    common,
    continuous,
    decode_profile,
    memory,
    memory_plan,
    rl,
    sampler,
    sampler_mismatch,
    speculative,
    train,
    train_spread,
)


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One `bench.py <name>`: either `run(args) -> dict` in this process, its flags added by
    `add_arguments`, its result written as JSON; or, with `run` None, `python -m
    benchmarks.<module>` with a command line of its own (`env` added where unset)."""

    module: str
    what: str
    run: Callable | None = None
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    env: dict = dataclasses.field(default_factory=dict)
    has_flags: bool = True  # False: the module reads no flags (--help prints its docstring)


BENCHMARKS: dict[str, Benchmark] = {}  # name -> its Benchmark, both kinds in one table


def register(name: str, entry: Benchmark) -> Benchmark:
    if name in BENCHMARKS:
        raise ValueError(f"benchmark {name!r} is registered twice")
    BENCHMARKS[name] = entry
    return entry


def benchmark(name: str, add_arguments: Callable[[argparse.ArgumentParser], None]):
    """Register `run(args) -> dict` as `bench.py <name>`; `add_arguments` adds its flags."""

    def add(run):
        what = (run.__doc__ or "").strip().splitlines()[0]
        register(name, Benchmark(run.__module__.split(".")[-1], what, run, add_arguments))
        return run

    return add


def script(name: str, module: str, what: str, env: dict | None = None, has_flags=True):
    """Register `benchmarks/<module>.py`, run with its own command line, as `bench.py <name>`."""
    register(name, Benchmark(module, what, env=env or {}, has_flags=has_flags))


benchmark("sampler", sampler.add_arguments)(sampler.bench_sampler)
benchmark("rl", rl.add_arguments)(rl.bench_rl)
benchmark("train", train.add_mfu_arguments)(train_spread.bench_train)
benchmark("memory", memory.add_arguments)(memory.bench_memory)
benchmark("plan", memory_plan.add_arguments)(memory_plan.bench_plan)
benchmark("speculative", speculative.add_arguments)(speculative.bench_speculative)
benchmark("profile", decode_profile.add_arguments)(decode_profile.bench_profile)
benchmark("async", async_rl.add_arguments)(async_rl.bench_async)
benchmark("agents", agents.add_arguments)(agents.bench_agents)
benchmark("continuous", continuous.add_arguments)(continuous.bench_continuous)
benchmark("mismatch", sampler_mismatch.add_arguments)(sampler_mismatch.bench_mismatch)
script(
    "before-after", "decode_before_after", "decode speed of two checkouts' Sampler, side by side"
)
script("population", "population", "a population of N seeds vs N solo runs, wall time")
script("stop-agreement", "stop_agreement", "the per-step cost of the stop agreement on 2 processes")
script("moe-experts", "moe_experts", "an MoE layer's ragged vs dense experts, ms per call")
script(
    "moe-parallel",
    "moe_parallel",
    "expert parallelism vs XLA's partitioner vs plain FSDP, 8 fake devices",
    env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
    has_flags=False,
)
script("moe-replay", "moe_replay_mismatch", "replayed vs recomputed MoE routing")
script("multi-lora", "multi_lora", "a LoRA population's adapter forms: grouped, gathered, ragged")
script(
    "vocab-bytes",
    "vocab_bytes",
    "the log-prob path's compiled bytes at a 262k vocabulary, chunked vs whole",
)
script("targets", "targets", "the targets table from benchmark JSON files (--doc FILE)")


def run_script(entry: Benchmark, args: list[str]) -> None:
    """Replace this process with `python -m benchmarks.<module> args` (its environment
    added where unset)."""
    if not entry.has_flags and {"-h", "--help"} & set(args):
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{entry.module}.py")
        with open(path) as f:
            print(ast.get_docstring(ast.parse(f.read())))
        raise SystemExit(0)
    for key, value in entry.env.items():  # a flag the caller set already is kept as set
        current = os.environ.get(key, "")
        if value.split("=")[0] not in current:
            os.environ[key] = (current + " " + value).strip()
    os.execv(sys.executable, [sys.executable, "-m", f"benchmarks.{entry.module}", *args])


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in BENCHMARKS and BENCHMARKS[argv[0]].run is None:
        run_script(BENCHMARKS[argv[0]], argv[1:])
    config_args, argv = common.split_config_args(argv)
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="--config=FILE[:ARG] and --config.KEY=VALUE: the experiment config, as in "
        "training (each benchmark's docstring names its default)",
    )
    sub = parser.add_subparsers(dest="name", required=True, metavar="name")
    for name, entry in BENCHMARKS.items():
        if entry.run is None:
            sub.add_parser(name, help=f"{entry.what} (benchmarks/{entry.module}.py, its own flags)")
            continue
        p = sub.add_parser(
            name,
            help=entry.what,
            description=sys.modules[entry.run.__module__].__doc__,  # its examples, what it measures
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("--out", default=None, help="JSON path (default artifacts/<name>.json)")
        entry.add_arguments(p)
    args = parser.parse_args(argv)
    args.config_args = config_args
    result = dict(benchmark=args.name, **BENCHMARKS[args.name].run(args))
    return common.write_json(result, args.out or f"artifacts/{args.name}.json")


if __name__ == "__main__":
    main()
