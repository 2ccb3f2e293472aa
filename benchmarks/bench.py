"""Speed benchmarks: `python benchmarks/bench.py <name> [--config=FILE[:ARG]] [options]`.

Each benchmark is registered under a name with `benchmark(name, add_arguments)(run)`; `run`
gets the parsed options (and `args.config_args`, the `--config=` / `--config.KEY=VALUE`
arguments, read as training reads them) and returns a JSON-able dict, written to `--out`
(default artifacts/<name>.json) and printed. Speed is measured here, never asserted in tests.

    python benchmarks/bench.py sampler --config=benchmarks/configs/random_qwen2.py:tiny
    python benchmarks/bench.py rl --config=benchmarks/configs/grpo_random_qwen2.py
    python benchmarks/bench.py train                  # train-step MFU (train.py)
    python benchmarks/bench.py train --workload spread  # padded vs packed rows
    python benchmarks/bench.py memory                 # FSDP bytes per device, 8 fake CPUs
    python benchmarks/bench.py speculative            # speculative vs plain rollouts
    python benchmarks/bench.py profile                # a decode step's ops (decode_profile.py)
    python benchmarks/bench.py async                  # roles on devices, rollouts ahead
    python benchmarks/bench.py agents                 # multi-turn vs single-turn rollouts
    python benchmarks/bench.py continuous             # continuous vs static batching

`python -m benchmarks.bench ...` is the same from the repository root.
"""

from __future__ import annotations

import argparse
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
benchmark("memory", train.add_memory_arguments)(train.bench_memory)
benchmark("speculative", speculative.add_arguments)(speculative.bench_speculative)
benchmark("profile", decode_profile.add_arguments)(decode_profile.bench_profile)
benchmark("async", async_rl.add_arguments)(async_rl.bench_async)
benchmark("agents", agents.add_arguments)(agents.bench_agents)
benchmark("continuous", continuous.add_arguments)(continuous.bench_continuous)


def main(argv=None) -> dict:
    config_args, argv = common.split_config_args(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="--config=FILE[:ARG] and --config.KEY=VALUE: the experiment config, as in "
        "training (each benchmark's docstring names its default)",
    )
    sub = parser.add_subparsers(dest="name", required=True, metavar="name")
    for name, (add_arguments, run) in BENCHMARKS.items():
        p = sub.add_parser(name, help=(run.__doc__ or "").strip().splitlines()[0])
        p.add_argument("--out", default=None, help="JSON path (default artifacts/<name>.json)")
        add_arguments(p)
    args = parser.parse_args(argv)
    args.config_args = config_args
    _, run = BENCHMARKS[args.name]
    result = dict(benchmark=args.name, **run(args))
    return common.write_json(result, args.out or f"artifacts/{args.name}.json")


if __name__ == "__main__":
    main()
