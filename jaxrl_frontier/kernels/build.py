"""Builds a C++ XLA FFI kernel of this package on first use and registers it with jax.

The source (`<name>.cc` beside this file, which may include the shared `*.h` here) is
compiled with the machine's C++ compiler (`$CXX`, else `c++`, `g++` or `clang++`) against
jaxlib's FFI headers, for this CPU
(`-march=native`, retried without it), into a cache directory
(`$JAXRL_FRONTIER_CACHE_DIR/kernels`, default `~/.cache/jaxrl_frontier/kernels`). The file
name carries a hash of the source and the shared headers, the flags, the compiler, jaxlib's version and the CPU, so
a changed kernel, toolchain or machine builds anew and a cached build is never used on a
CPU it was not built for. Builds are written to a temporary file and renamed into place,
so concurrent processes can build the same kernel. A failed build raises `KernelBuildError`
with the compiler's message; callers decide whether to fall back to plain XLA.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax
import jaxlib

_SOURCE_DIR = Path(__file__).resolve().parent
_BASE_FLAGS = (
    "-O3",
    "-std=c++20",
    "-shared",
    "-fPIC",
    # lets the compiler vectorise the kernels' sums; no finite-math assumption (masked slots)
    "-fno-math-errno",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-fno-trapping-math",
)


class KernelBuildError(RuntimeError):
    """A kernel could not be compiled or loaded here (no compiler, or it failed)."""


def cache_dir() -> Path:
    """Where built kernels are kept: `$JAXRL_FRONTIER_CACHE_DIR/kernels`, else
    `~/.cache/jaxrl_frontier/kernels`; a per-user temporary directory where that cannot be
    written (a read-only home on a cluster)."""
    root = os.environ.get("JAXRL_FRONTIER_CACHE_DIR") or Path.home() / ".cache" / "jaxrl_frontier"
    preferred = Path(root) / "kernels"
    try:
        preferred.mkdir(parents=True, exist_ok=True)
        if os.access(preferred, os.W_OK):
            return preferred
    except OSError:
        pass
    user = getattr(os, "getuid", lambda: "user")()
    return Path(tempfile.gettempdir()) / f"jaxrl_frontier-{user}" / "kernels"


def _compiler() -> str:
    for candidate in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    raise KernelBuildError(
        "no C++ compiler found ($CXX, c++, g++, clang++); install one (e.g. apt-get install "
        "g++) or set rollout.decode_attention='xla'"
    )


def _cpu_signature() -> str:
    """What -march=native compiles for: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        wanted = ("model name", "flags", "Features", "CPU part")
        return "|".join(sorted({line for line in lines if line.startswith(wanted)}))
    except OSError:
        return f"{platform.machine()}|{platform.processor()}"


def _compile(cxx: str, source: Path, target: Path, flags: tuple[str, ...]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [cxx, *flags, f"-I{jax.ffi.include_dir()}", f"-I{_SOURCE_DIR}", str(source), "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise KernelBuildError(
                f"building {source.name} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
                + proc.stderr[-4000:]
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def build(name: str) -> Path:
    """The shared library of kernel `name`, compiled now if this machine has none cached."""
    source = _SOURCE_DIR / f"{name}.cc"
    if not source.exists():
        raise KernelBuildError(f"no kernel source {source}")
    cxx = _compiler()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    errors, directory = [], cache_dir()
    headers = [h.read_text() for h in sorted(_SOURCE_DIR.glob("*.h"))]  # shared by the kernels
    identity = [source.read_text(), *headers, version, jaxlib.__version__, _cpu_signature()]
    for flags in (("-march=native", *_BASE_FLAGS), _BASE_FLAGS):
        key = hashlib.sha256("\0".join([*identity, " ".join(flags)]).encode()).hexdigest()[:16]
        target = directory / f"{name}-{key}.so"
        if target.exists():
            return target
        try:
            _compile(cxx, source, target, flags)
            return target
        except (KernelBuildError, OSError, subprocess.TimeoutExpired) as e:
            errors.append(str(e))
    raise KernelBuildError("\n\n".join(errors))


def load(name: str, targets: tuple[str, ...]) -> ctypes.CDLL:
    """Builds kernel `name` and registers each of its FFI handler symbols in `targets` with
    XLA:CPU as the custom-call target `jaxrl_frontier_<symbol>`. Once per process: a
    failure is remembered too, and raised again as the same `KernelBuildError`."""
    result = _load(name, targets)
    if isinstance(result, KernelBuildError):
        raise result
    return result


@functools.cache
def _load(name: str, targets: tuple[str, ...]) -> ctypes.CDLL | KernelBuildError:
    try:
        path = build(name)
        lib = ctypes.cdll.LoadLibrary(str(path))
        for symbol in targets:
            jax.ffi.register_ffi_target(
                f"jaxrl_frontier_{symbol}", jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu"
            )
    except KernelBuildError as e:
        return e
    except (OSError, AttributeError) as e:
        return KernelBuildError(f"loading kernel {name!r} failed: {e}")
    return lib


def load_error(name: str, targets: tuple[str, ...]) -> str | None:
    """`load(name, targets)`'s failure as a sentence for a fallback warning, or None."""
    try:
        load(name, targets)
    except KernelBuildError as e:
        return f"the kernel could not be built: {e}"
    return None
