"""Run the test suite as pytest processes, N at a time: `make test`.

    python tests/run_files.py [--workers 2] [--group 12] [--alone 60] [--timeout 1500]
                              [--keep-going] [--record-times] [PATH ...]

Scheduling, from each file's seconds in an earlier full run (tests/file_seconds.json, through
`file_order.seconds`): a file expected to take `--alone` seconds or more runs in a process of
its own; the shorter ones share processes, first-fit by decreasing time, up to `--alone`
seconds and `--group` files a process (files of one conftest root, no two of the same name),
since starting a process that imports jax and the package costs about 3 s, more than many
short files take. Processes start longest first, so that no long one starts last.
`--record-times` rewrites tests/file_seconds.json from a passing run's own figures.

Why not pytest-xdist: the suite is compile-bound, and each long-lived xdist worker grew to
several GB and, in about one full run in three, died in XLA:CPU's executable
(de)serialization inside JAX's persistent compilation cache (a segfault whose place depended
on what the worker had run before); xdist's `loadfile` scheduling then waited forever for
the dead worker's files (pytest-xdist issue 1323, fixed after 3.8.0). Here each process is
fresh and short-lived, so no state crosses processes but the persistent compilation cache: a
worker slot's processes share one cache directory (they run one after another there, so an
entry is written by one process at a time), which keeps the compile reuse across files. (One
directory for both workers under JAX's file lock, `jax_compilation_cache_max_size` set,
took the suite from about 22 to 39 minutes here, each file's own tests up to 8x slower.) A process that dies from a signal is run once more
and reported as such; any other failure fails the run at once.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from file_order import seconds  # noqa: E402

SUMMARY = re.compile(
    r"^=*\s*(\d+ (?:passed|failed|skipped|error|errors|deselected|xfailed|warnings?)\b.*?) in [0-9.]+s",
    re.M,
)


def test_files(paths: list[str]) -> list[str]:
    """The test files under `paths`, in path order."""
    found = []
    for path in paths:
        if os.path.isfile(path):
            found.append(path)
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
            found += [os.path.join(root, f) for f in sorted(files) if re.match(r"test_.*\.py$", f)]
    return found


def conftest_root(path: str) -> str:
    """The nearest folder above `path` holding a conftest.py (tests import it by name, so
    files under two roots cannot share a process)."""
    d = os.path.dirname(os.path.abspath(path))
    while d != os.path.dirname(d) and not os.path.exists(os.path.join(d, "conftest.py")):
        d = os.path.dirname(d)
    return d


def group_files(files: list[str], size: int, alone: float) -> list[list[str]]:
    """The processes to run, longest first (module docstring)."""
    rel = {f: os.path.relpath(os.path.abspath(f), REPO) for f in files}
    est = {f: seconds(rel[f]) for f in files}
    groups = [[f] for f in files if est[f] >= alone]
    bins: list[list[str]] = []
    for f in sorted((f for f in files if est[f] < alone), key=lambda f: (-est[f], rel[f])):
        for b in bins:
            if (
                len(b) < size
                and sum(est[g] for g in b) + est[f] <= alone
                and conftest_root(b[0]) == conftest_root(f)
                and os.path.basename(f) not in {os.path.basename(g) for g in b}
            ):
                b.append(f)
                break
        else:
            bins.append([f])
    return sorted(groups + bins, key=lambda g: -sum(est[f] for f in g))


def run_file(paths: list[str], env: dict, timeout: float) -> tuple[int, str, float]:
    """(return code, output, seconds) of `pytest -q paths` in a fresh process; -9 on timeout."""
    t0 = time.monotonic()
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "file_times",
        *paths,
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        out += f"\n[run_files] {' '.join(paths)}: killed after {timeout:.0f} s\n"
    return proc.returncode, out, time.monotonic() - t0


def died(code: int) -> bool:
    """The process ended by a signal (a segfault, an abort), not by a test outcome."""
    return code < 0 or code in (128 + signal.SIGSEGV, 128 + signal.SIGABRT)


def summary_of(out: str) -> str:
    lines = [m.group(1) for m in SUMMARY.finditer(out)]
    return lines[-1] if lines else "no summary"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="*", default=[HERE])
    p.add_argument("--workers", type=int, default=2, help="files run at once")
    p.add_argument("--group", type=int, default=12, help="short files to a process (1: each alone)")
    p.add_argument(
        "--alone", type=float, default=60.0, help="expected seconds from which a file runs alone"
    )
    p.add_argument(
        "--record-times",
        action="store_true",
        help="write each file's seconds to tests/file_seconds.json after a passing run",
    )
    p.add_argument("--timeout", type=float, default=1500, help="seconds per process")
    p.add_argument(
        "--keep-going", action="store_true", help="run every file, whatever fails (default: stop)"
    )
    args = p.parse_args(argv)

    files = test_files(args.paths)
    work: queue.Queue[list[str]] = queue.Queue()
    for group in group_files(files, args.group, args.alone):
        work.put(group)
    results: dict[str, tuple[int, str, float, bool]] = {}  # file -> code, summary, s, rerun
    failed = threading.Event()
    lock = threading.Lock()
    caches = [tempfile.mkdtemp(prefix=f"jaxrl_test_jax_cache_w{i}_") for i in range(args.workers)]
    times_path = os.path.join(caches[0], "file_times.jsonl")  # tests/file_times.py writes it
    t0 = time.monotonic()

    def say(msg: str) -> None:
        with lock:
            print(msg, flush=True)

    def worker(i: int) -> None:
        path = os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=caches[i], JAXRL_FILE_TIMES=times_path,
                   PYTHONPATH=path)  # fmt: skip
        env.pop("PYTEST_XDIST_WORKER", None)
        while args.keep_going or not failed.is_set():
            try:
                paths = work.get_nowait()
            except queue.Empty:
                return
            rel = " ".join(os.path.relpath(path, REPO) for path in paths)
            code, out, seconds = run_file(paths, env, args.timeout)
            rerun = False
            if died(code):
                say(f"[w{i}] {rel}: its pytest process died (return code {code}); the last "
                    f"lines:\n{out[-3000:]}\n[w{i}] {rel}: running it once more")  # fmt: skip
                code, out, seconds2 = run_file(paths, env, args.timeout)
                seconds, rerun = seconds + seconds2, True
            line = f"[w{i}] {rel}: {summary_of(out)} ({seconds:.0f} s{', rerun' if rerun else ''})"
            if code not in (0, 5):  # 5: no tests collected
                failed.set()
                say(f"{line}\n{out}")
            else:
                say(line)
            with lock:
                results[rel] = (code, summary_of(out), seconds, rerun)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    file_seconds: dict[str, float] = {}
    if os.path.exists(times_path):
        for line in open(times_path):
            row = json.loads(line)
            file_seconds[row["file"]] = file_seconds.get(row["file"], 0.0) + row["seconds"]
    for c in caches:
        shutil.rmtree(c, ignore_errors=True)

    counts: dict[str, int] = {}
    for _, summary, _, _ in results.values():
        for n, word in re.findall(r"(\d+) (\w+)", summary):
            counts[word] = counts.get(word, 0) + int(n)
    print("\nslowest processes:")
    for rel, (_, _, s, _) in sorted(results.items(), key=lambda kv: -kv[1][2])[:15]:
        print(f"  {s:7.1f} s  {rel}")
    print("\nslowest files (their tests' seconds, without the process start):")
    for rel, s in sorted(file_seconds.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {s:7.1f} s  {rel}")
    reruns = [rel for rel, r in results.items() if r[3]]
    if reruns:
        print(f"run again after their process died: {', '.join(reruns)}")
    total = ", ".join(f"{n} {w}" for w, n in sorted(counts.items()))
    missing = len(files) - sum(len(rel.split()) for rel in results)
    ok = not failed.is_set() and not missing
    print(
        f"{'PASSED' if ok else 'FAILED'}: {len(files) - missing} of {len(files)} files "
        f"({len(results)} processes), {total}, "
        f"in {time.monotonic() - t0:.0f} s"
    )
    if ok and args.record_times:
        with open(os.path.join(HERE, "file_seconds.json"), "w") as f:
            rows = sorted(file_seconds.items(), key=lambda kv: (-kv[1], kv[0]))
            json.dump({rel: round(s, 1) for rel, s in rows}, f, indent=0)
            f.write("\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
