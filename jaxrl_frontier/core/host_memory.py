"""Transparent huge pages for the host buffers a process allocates (no jax import).

XLA:CPU allocates each program's outputs and temporaries with the C library's malloc at every
call, and glibc serves a buffer over 32 MiB with a fresh mmap, whose 4 KiB pages the kernel
faults in and zeroes on first write: on the 2-core AMD EPYC of docs/performance.md a fresh
113 MB buffer (SmolLM2-135M's embedding gradient) was written at 2.2 GB/s against 8.4 GB/s
in 2 MiB pages. Where the kernel gives huge pages on request (`transparent_hugepage` set to
`madvise`), glibc's tunable `glibc.malloc.hugetlb=1` (glibc 2.35 and later) makes malloc
request them; torch's CPU allocator has its own switch, `THP_MEM_ALLOC_ENABLE=1` (a
reference model in tests, the benchmarks' peers). Both are read when the process starts, so
an entry point applies them by restarting itself, as the same process (`os.execve` keeps
the pid, so a signal sent to a trainer still reaches it):

    restart_with_huge_pages()   # first thing in a command-line entry point

`JAXRL_HUGE_PAGES=0` turns it off. A GPU or TPU run's device memory has its own allocator;
there the setting only touches host buffers (data, checkpoints).
"""

from __future__ import annotations

import os
import platform
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
TORCH_SWITCH = "THP_MEM_ALLOC_ENABLE"
OFF_SWITCH = "JAXRL_HUGE_PAGES"  # '0': leave the allocator as the machine set it
THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode(path: str = THP_MODE) -> str | None:
    """The kernel's transparent huge page mode ('always', 'madvise' or 'never'; the one in
    brackets), None where the file is absent (not Linux, or no THP)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def glibc_version() -> tuple[int, ...] | None:
    """(major, minor) of the C library where it is glibc, else None."""
    name, version = platform.libc_ver()
    if name != "glibc" or not version:
        return None
    return tuple(int(p) for p in version.split(".")[:2] if p.isdigit())


def huge_page_env(
    environ: dict[str, str], mode: str | None, glibc: tuple[int, ...] | None
) -> dict[str, str] | None:
    """The environment to restart with so that malloc asks for huge pages, or None where
    there is nothing to do: turned off, already set, glibc older than 2.35 (no tunable),
    or a kernel that gives huge pages to every large mapping anyway ('always') or never."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    if environ.get(OFF_SWITCH) == "0" or "glibc.malloc.hugetlb" in tunables:
        return None
    if mode != "madvise" or glibc is None or glibc < (2, 35):
        return None
    env = dict(environ, GLIBC_TUNABLES=":".join(filter(None, [tunables, TUNABLE])))
    env.setdefault(TORCH_SWITCH, "1")
    return env


def without_huge_pages(environ: dict[str, str]) -> dict[str, str]:
    """`environ` with the allocator as the machine sets it: the tunable and torch's switch
    removed, and `JAXRL_HUGE_PAGES=0` so that no entry point asks for them again (a
    benchmark's peer timed both ways)."""
    env = {k: v for k, v in environ.items() if k != TORCH_SWITCH}
    kept = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and t != TUNABLE]
    env["GLIBC_TUNABLES"] = ":".join(kept)
    env[OFF_SWITCH] = "0"
    return env


def restart_with_huge_pages(argv: list[str] | None = None) -> None:
    """Replace this process by the same command (`sys.orig_argv`: the interpreter's own
    flags and `-m` kept; argv[0] the interpreter's full path, which a virtual environment is
    found from) under `huge_page_env`; return at once where it has nothing to do. Call it
    before anything else starts: threads, files being written, devices."""
    env = huge_page_env(dict(os.environ), thp_mode(), glibc_version())
    if env is None:
        return
    argv = [sys.executable, *(sys.orig_argv if argv is None else argv)[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)


def host_memory_info() -> dict:
    """What a benchmark's JSON records of the allocator settings this process runs under."""
    return dict(
        transparent_hugepage=thp_mode(),
        glibc=".".join(map(str, glibc_version() or ())) or None,
        glibc_tunables=os.environ.get("GLIBC_TUNABLES", ""),
        thp_mem_alloc_enable=os.environ.get(TORCH_SWITCH, ""),
    )
