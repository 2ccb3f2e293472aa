"""Speed benchmarks: `python benchmarks/bench.py <name> [--config=FILE[:ARG]] [options]`.

Each benchmark is registered under a name with `benchmark(name, add_arguments)(run)`; `run`
gets the parsed options (and `args.config_args`, the `--config=` / `--config.KEY=VALUE`
arguments, read as training reads them) and returns a JSON-able dict, written to `--out`
(default artifacts/<name>.json) and printed. Speed is measured here, never asserted in tests.

    python benchmarks/bench.py sampler --config=benchmarks/configs/random_qwen2.py:tiny
    python benchmarks/bench.py rl --config=benchmarks/configs/grpo_random_qwen2.py
    python benchmarks/bench.py train                  # train-step MFU (train.py)
    python benchmarks/bench.py train --workload spread  # padded vs packed rows
    python benchmarks/bench.py memory                 # the trainer's programs' bytes per device
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
import os
import sys
from collections.abc import Callable

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
    rl,
    sampler,
    speculative,
    train,
    train_spread,
)

BENCHMARKS: dict[str, tuple[Callable, Callable]] = {}  # name -> (add_arguments, run)


def benchmark(name: str, add_arguments: Callable[[argparse.ArgumentParser], None]):
    """Register `run(args) -> dict` as `bench.py <name>`; `add_arguments` adds its flags."""

    def register(run):
        if name in BENCHMARKS:
            raise ValueError(f"benchmark {name!r} is registered twice")
        BENCHMARKS[name] = (add_arguments, run)
        return run

    return register


benchmark("sampler", sampler.add_arguments)(sampler.bench_sampler)
benchmark("rl", rl.add_arguments)(rl.bench_rl)
benchmark("train", train.add_mfu_arguments)(train_spread.bench_train)
benchmark("memory", memory.add_arguments)(memory.bench_memory)
benchmark("speculative", speculative.add_arguments)(speculative.bench_speculative)
benchmark("profile", decode_profile.add_arguments)(decode_profile.bench_profile)
benchmark("async", async_rl.add_arguments)(async_rl.bench_async)
benchmark("agents", agents.add_arguments)(agents.bench_agents)
benchmark("continuous", continuous.add_arguments)(continuous.bench_continuous)


# Benchmarks with command lines of their own, run as `python -m benchmarks.<module> ARGS`:
# name -> (module, what it measures, extra environment). `bench.py <name> --help` shows
# the module's flags (or, for one without flags, its docstring).
SCRIPTS: dict[str, tuple[str, str, dict]] = {
    "before-after": (
        "decode_before_after",
        "decode speed of two checkouts' Sampler, side by side",
        {},
    ),
    "population": ("population", "a population of N seeds vs N solo runs, wall time", {}),
    "stop-agreement": (
        "stop_agreement",
        "the per-step cost of the stop agreement on 2 processes",
        {},
    ),
    "moe-experts": ("moe_experts", "an MoE layer's ragged vs dense experts, ms per call", {}),
    "moe-parallel": (
        "moe_parallel",
        "expert parallelism vs XLA's partitioner vs plain FSDP, 8 fake devices",
        {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
    ),
    "moe-replay": ("moe_replay_mismatch", "replayed vs recomputed MoE routing", {}),
    "multi-lora": (
        "multi_lora",
        "a LoRA population's adapter forms: grouped, gathered, ragged",
        {},
    ),
    "vocab-bytes": (
        "vocab_bytes",
        "the log-prob path's compiled bytes at a 262k vocabulary, chunked vs whole",
        {},
    ),
    "targets": ("targets", "the targets table from benchmark JSON files (--doc FILE)", {}),
}
NO_FLAGS = ("moe_parallel",)  # modules without an argument parser


def run_script(name: str, args: list[str]) -> None:
    """Replace this process with `python -m benchmarks.<module> args` (its environment
    added where unset)."""
    module, _, env = SCRIPTS[name]
    if module in NO_FLAGS and {"-h", "--help"} & set(args):
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{module}.py")
        with open(path) as f:
            print(ast.get_docstring(ast.parse(f.read())))
        raise SystemExit(0)
    for key, value in env.items():  # a flag the caller set already is kept as set
        current = os.environ.get(key, "")
        if value.split("=")[0] not in current:
            os.environ[key] = (current + " " + value).strip()
    os.execv(sys.executable, [sys.executable, "-m", f"benchmarks.{module}", *args])


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SCRIPTS:
        run_script(argv[0], argv[1:])
    config_args, argv = common.split_config_args(argv)
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="--config=FILE[:ARG] and --config.KEY=VALUE: the experiment config, as in "
        "training (each benchmark's docstring names its default)",
    )
    sub = parser.add_subparsers(dest="name", required=True, metavar="name")
    for name, (add_arguments, run) in BENCHMARKS.items():
        p = sub.add_parser(
            name,
            help=(run.__doc__ or "").strip().splitlines()[0],
            description=sys.modules[run.__module__].__doc__,  # its examples and what it measures
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("--out", default=None, help="JSON path (default artifacts/<name>.json)")
        add_arguments(p)
    for name, (module, what, _) in SCRIPTS.items():
        sub.add_parser(name, help=f"{what} (benchmarks/{module}.py, its own flags)")
    args = parser.parse_args(argv)
    args.config_args = config_args
    _, run = BENCHMARKS[args.name]
    result = dict(benchmark=args.name, **run(args))
    return common.write_json(result, args.out or f"artifacts/{args.name}.json")


if __name__ == "__main__":
    main()
