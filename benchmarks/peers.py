"""Each side of a comparison in a process of its own.

Two frameworks in one process skew both: torch's and XLA's thread pools contend for the
same cores, so an in-process ratio measures the contention, not the two implementations.
`run_child(module, request)` runs `python -m <module>` with the request as JSON on stdin
and reads the result (one JSON object) from its last stdout line. The process that calls
it imports neither jax nor torch; a child that times JAX never imports torch, nor the
reverse, and each child reports the frameworks it holds (`foreign_modules`).

Torch peers run once per thread count (`torch.set_num_threads`, also OMP/MKL env); the
faster is the figure compared (`best_of`), and every count is reported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable

from benchmarks import common

JAX_SIDE = ("jax", "jaxlib", "flax")
TORCH_SIDE = ("torch", "transformers", "trl", "accelerate")


class ChildError(RuntimeError):
    """A child process failed; the message holds the end of its stderr."""


def run_child(module: str, request: dict, *, threads: int | None = None, timeout=1800) -> dict:
    """`python -m module` with `request` on stdin -> the JSON dict on its last stdout line.

    threads: the intra-op threads of a torch child (OMP_NUM_THREADS and MKL_NUM_THREADS
    too, so no pool starts wider). stderr passes through (progress lines)."""
    # the child imports `benchmarks` from this checkout, whatever the working directory
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [str(common.REPO), os.environ.get("PYTHONPATH")])),
    )
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        request = dict(request, threads=threads)
    proc = subprocess.run(
        [sys.executable, "-m", module],
        input=json.dumps(request),
        env=env,
        stdout=subprocess.PIPE,
        stderr=None,
        text=True,
        timeout=timeout,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        raise ChildError(f"{module} exited with {proc.returncode}: {proc.stdout[-2000:]}")
    return json.loads(lines[-1])


def child_main(run, side: tuple[str, ...]) -> None:
    """The body of a child's `__main__`: request from stdin -> run(request) -> one JSON line,
    with the frameworks of the other side this process imported (none, by construction)."""
    request = json.loads(sys.stdin.read())
    result = run(request)
    other = TORCH_SIDE if side == JAX_SIDE else JAX_SIDE
    result["foreign_modules"] = common.foreign_modules(*other)
    sys.stdout.write("\n" + json.dumps(result) + "\n")


def best_of(runs: dict[str, dict], key: str, *, lower_is_better: bool) -> str:
    """The name of the fastest of `runs` (name -> result) by `key`."""
    pick = min if lower_is_better else max
    return pick(runs, key=lambda name: runs[name][key])


def thread_runs(module: str, request: dict, threads: Iterable[int]) -> dict[str, dict]:
    """The torch child once per thread count -> {'threads_N': result}."""
    return {f"threads_{n}": run_child(module, request, threads=n) for n in threads}
