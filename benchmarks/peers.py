"""Each side of a comparison in a process of its own.

Two frameworks in one process skew both: torch's and XLA's thread pools contend for the
same cores, so an in-process ratio measures the contention, not the two implementations.
`run_child(module, request)` runs `python -m <module>` with the request as JSON on stdin
and reads the result (one JSON object) from its last stdout line. The process that calls
it imports neither jax nor torch; a child that times JAX never imports torch, nor the
reverse, and each child reports the frameworks it holds (`foreign_modules`).

Torch peers run once per thread count (`torch.set_num_threads`, also OMP/MKL env); the
faster is the figure compared (`best_of`), and every count is reported.

A side is timed only on a quiet machine: before each child, the CPU time other processes
use over a short window (`busy_share`, from /proc/stat) must be under `QUIET_SHARE` of the
cores, waited for up to `QUIET_WAIT_S`; otherwise the comparison is refused (`NotQuiet`).
Each result records that share before and after its side, with the load averages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable

from benchmarks import common
from jaxrl_frontier.core import host_memory

JAX_SIDE = ("jax", "jaxlib", "flax")
TORCH_SIDE = ("torch", "transformers", "trl", "accelerate")


class ChildError(RuntimeError):
    """A child process failed; the message holds the end of its stderr."""


class NotQuiet(RuntimeError):
    """Other work kept the machine busy: a timing taken now would measure it too."""


# at most this share of the cores busy with other work before a side (JAXRL_BENCH_QUIET_SHARE
# overrides it: the tests, which run beside each other, set 1.0 and time nothing)
QUIET_SHARE = float(os.environ.get("JAXRL_BENCH_QUIET_SHARE", "0.10"))
QUIET_WAIT_S = 300.0  # how long to wait for the machine to become quiet before refusing
WINDOW_S = 2.0


def cpu_times(stat: str = "/proc/stat") -> tuple[float, float]:
    """(busy, total) jiffies of all cores since boot, from the first line of /proc/stat."""
    with open(stat) as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_share(window_s: float = WINDOW_S, times=cpu_times, sleep=None) -> float:
    """The share of all cores busy over the next `window_s` seconds (this process idles)."""
    import time

    b0, t0 = times()
    (sleep or time.sleep)(window_s)
    b1, t1 = times()
    return (b1 - b0) / max(t1 - t0, 1e-9)


def wait_for_quiet(
    share=busy_share, limit: float = QUIET_SHARE, wait_s: float = QUIET_WAIT_S, clock=None
) -> float:
    """Block until the machine is quiet; the busy share measured then. `NotQuiet` when it
    stays busy for `wait_s` (the comparison is refused, not taken under load)."""
    import time

    clock = clock or time.monotonic
    start = clock()
    while True:
        busy = share()
        if busy <= limit:
            return busy
        if clock() - start >= wait_s:
            raise NotQuiet(
                f"other work keeps {busy:.0%} of the cores busy (the bar is {limit:.0%}) after "
                f"{wait_s:.0f} s of waiting: stop it and run the benchmark again"
            )


def run_child(
    module: str,
    request: dict,
    *,
    threads: int | None = None,
    huge_pages: bool = True,
    timeout=1800,
) -> dict:
    """`python -m module` with `request` on stdin -> the JSON dict on its last stdout line.

    threads: the intra-op threads of a torch child (OMP_NUM_THREADS and MKL_NUM_THREADS
    too, so no pool starts wider). huge_pages False: the child's allocator as the machine
    sets it (`host_memory.without_huge_pages`), else it inherits bench.py's huge pages. stderr
    passes through (progress lines)."""
    # the child imports `benchmarks` from this checkout, whatever the working directory
    env = dict(
        os.environ if huge_pages else host_memory.without_huge_pages(dict(os.environ)),
        PYTHONPATH=os.pathsep.join(filter(None, [str(common.REPO), os.environ.get("PYTHONPATH")])),
    )
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        request = dict(request, threads=threads)
    busy_before, load_before = wait_for_quiet(), os.getloadavg()
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
    result = json.loads(lines[-1])
    result["quiet"] = dict(
        busy_share_before=busy_before,
        busy_share_after=busy_share(),  # other work that started while this side ran
        load_average_before=list(load_before),
        load_average_after=list(os.getloadavg()),
    )
    return result


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


PAGES = ("huge", "default")  # a peer's host allocator: bench.py's huge pages, the machine's


def add_pages_argument(p, flag: str, peer: str) -> None:
    """`flag`: the peer's host allocators to time, a comma-separated list of `PAGES`."""
    p.add_argument(
        flag,
        type=common.choices_of(*PAGES),
        default=list(PAGES),
        help=f"{peer}'s host allocator, each timed: huge (the huge pages every side inherits "
        "from bench.py), default (as the machine sets it); the compared figure is the fastest",
    )


def setting_name(base: str, pages: str) -> str:
    """A peer setting's name in the JSON: `base`, or `base/default_pages` for a run with the
    machine's default pages."""
    return base if pages == "huge" else f"{base}/default_pages"


def thread_runs(
    module: str, request: dict, threads: Iterable[int], pages: Iterable[str] = ("huge",)
) -> dict[str, dict]:
    """The torch child once per thread count and host allocator (`PAGES`) ->
    {'threads_N' or 'threads_N/default_pages': result with its `pages`}."""
    return {
        setting_name(f"threads_{n}", p): dict(
            run_child(module, request, threads=n, huge_pages=p == "huge"), pages=p
        )
        for n in threads
        for p in pages
    }
