"""Running model-written programs: each in a fresh, locked-down subprocess, never in the
trainer's process.

`Sandbox.run(source) -> SandboxResult` starts

    unshare --net --pid --fork --kill-child --mount --ipc --uts   (+ --user when not root)
      python -I -S -c RUNNER          the trusted runner, pid 1 of the new PID namespace
        fork -> python -I -S main.py  the program, under rlimits, with an empty environment

The runner, before any model-written code runs:
  * gives the program a new root: a size-capped tmpfs holding read-only binds of the Python
    installation and the system libraries, `/dev/null`, and a writable `/sandbox` (its fresh
    working directory); the host's files (the workdir, home directories, secrets) are not
    there (pivot_root, old root detached);
  * runs it as an unprivileged uid (when started as root; 61000 + the worker's slot, so
    RLIMIT_NPROC counts each worker's processes apart) or with no_new_privs inside a user
    namespace;
  * sets RLIMIT_CPU, RLIMIT_AS (memory), RLIMIT_FSIZE, RLIMIT_NPROC (fork bombs),
    RLIMIT_NOFILE and no core files; reads the program's output through a pipe, at most
    `output_bytes` (more kills it), and kills it at `wall_s`.
The network namespace has no interfaces up (no network); the PID namespace hides and
protects every outside process (the trainer cannot be signalled) and ends every process
the program forked when the runner exits. The trainer side kills the whole process group
at wall_s + 2 s in case the runner itself hangs.

Without `unshare` (or namespaces disabled: containers without user namespaces) the program
runs with the same rlimits, an empty environment and a fresh directory, plus a Python
preamble that refuses sockets and file opens outside that directory. That fallback is a
guard rail, not a boundary (native code or ctypes can undo it): `isolation` says which mode
is in use, and the scorer logs it once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# x86_64 and aarch64 pivot_root syscall numbers (the runner calls it through libc.syscall)
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per program: CPU seconds, wall seconds, address space (MB), captured output bytes,
    processes (RLIMIT_NPROC), open files."""

    cpu_s: float = 2.0
    wall_s: float = 5.0
    memory_mb: int = 512
    output_bytes: int = 65536
    processes: int = 16
    open_files: int = 64


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """status: ok (exit 0) | error (non-zero exit) | killed (signal: CPU, memory, ...) |
    timeout (wall time) | output_limit | sandbox_error (the runner failed: not the program's
    doing). output: the program's stdout and stderr, at most Limits.output_bytes."""

    status: str
    returncode: int | None
    output: str
    seconds: float


# The trusted runner (run with `python -I -S -c`): sets up the jail, forks the program,
# relays at most output_bytes of its output and reports {"status", "returncode"} first.
RUNNER = r"""
import ctypes, json, os, resource, select, signal, sys, time
cfg = json.loads(sys.argv[1])
source = sys.stdin.buffer.read()
libc = ctypes.CDLL(None, use_errno=True)

def check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, what + ": " + os.strerror(err))

def mount(src, dst, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    check(libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)), "mount " + dst)

RDONLY, NOSUID, NODEV, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
workdir = cfg["workdir"]
if cfg["jail"]:
    root = cfg["root"]
    mount(None, "/", None, REC | PRIVATE)  # nothing below propagates to the host
    mount("sandbox", root, "tmpfs", NOSUID | NODEV, "size=%dk,mode=755" % cfg["tmpfs_kb"])
    for path in cfg["ro_binds"]:
        if not os.path.exists(path):
            continue
        dst = root + path
        if os.path.isdir(path):
            os.makedirs(dst, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            open(dst, "a").close()
        mount(path, dst, None, BIND | REC)
        mount(None, dst, None, BIND | REMOUNT | RDONLY | NOSUID | REC)
    os.makedirs(root + "/sandbox")
    os.chmod(root + "/sandbox", 0o777)
    os.makedirs(root + "/.old")
    check(libc.syscall(cfg["pivot_root"], root.encode(), (root + "/.old").encode()), "pivot_root")
    os.chdir("/")
    check(libc.umount2(b"/.old", 2), "umount old root")  # MNT_DETACH
    os.rmdir("/.old")
    workdir = "/sandbox"
os.chdir(workdir)
with open("main.py", "wb") as f:
    f.write(source)
os.chmod("main.py", 0o644)

r, w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        os.dup2(w, 1); os.dup2(w, 2); os.close(r); os.close(w)
        fd = os.open("/dev/null", os.O_RDONLY); os.dup2(fd, 0); os.close(fd)
        if cfg["uid"] is not None:
            os.setgroups([]); os.setgid(cfg["uid"]); os.setuid(cfg["uid"])
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        cpu = max(1, int(cfg["cpu_s"] + 0.999))
        mem = cfg["memory_mb"] * 2**20
        for res, val in ((resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, (mem, mem)),
                         (resource.RLIMIT_FSIZE, (cfg["output_bytes"],) * 2),
                         (resource.RLIMIT_NPROC, (cfg["processes"],) * 2),
                         (resource.RLIMIT_NOFILE, (cfg["open_files"],) * 2),
                         (resource.RLIMIT_CORE, (0, 0))):
            resource.setrlimit(res, val)
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8"}
        os.execve(cfg["python"], [cfg["python"], "-I", "-S", "main.py"], env)
    finally:
        os._exit(127)
os.close(w)
out, status, code = b"", "ok", None
deadline = time.monotonic() + cfg["wall_s"]
os.set_blocking(r, False)
while True:
    done, wstatus = os.waitpid(pid, os.WNOHANG)
    ready, _, _ = select.select([r], [], [], 0.02)
    if ready:
        try:
            chunk = os.read(r, 65536)
        except BlockingIOError:
            chunk = b""
        out += chunk
        if len(out) > cfg["output_bytes"]:
            status, out = "output_limit", out[: cfg["output_bytes"]]
    if done or status != "ok" or time.monotonic() > deadline:
        if not done:
            status = status if status != "ok" else "timeout"
            os.kill(pid, signal.SIGKILL)
            _, wstatus = os.waitpid(pid, 0)
        break
if status == "ok":
    if os.WIFSIGNALED(wstatus):
        status, code = "killed", -os.WTERMSIG(wstatus)
    else:
        code = os.WEXITSTATUS(wstatus)
        status = "ok" if code == 0 else "error"
sys.stdout.buffer.write(json.dumps({"status": status, "returncode": code}).encode() + b"\n" + out)
sys.stdout.flush()
os._exit(0)  # pid 1 exits: the kernel kills whatever the program left behind
"""

# Prepended to the program when no namespaces are available (a guard rail, see above).
FALLBACK_PREAMBLE = r"""
def _jaxrl_guard():
    import os, socket, sys
    home = os.getcwd()
    def refuse(*a, **k):
        raise PermissionError("network access is disabled in the sandbox")
    socket.socket = refuse
    socket.create_connection = refuse
    def hook(event, args):
        if event == "open" and isinstance(args[0], (str, bytes)):
            path = os.path.abspath(os.fsdecode(args[0]))
            if not path.startswith(home + os.sep) and not path.startswith(sys.base_prefix):
                raise PermissionError("file access outside the sandbox directory: " + path)
        if event in ("socket.__new__", "ctypes.dlopen", "os.fork", "os.kill", "os.killpg"):
            raise PermissionError(event + " is disabled in the sandbox")
    sys.addaudithook(hook)
_jaxrl_guard()
del _jaxrl_guard
"""


def _probe(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class Sandbox:
    """Runs Python sources under `limits` (see the module docstring). Thread-safe: each
    `run` has its own process and directory; `slot` picks the uid when run as root."""

    def __init__(self, limits: Limits = Limits()):
        self.limits = limits
        self.python = os.path.realpath(
            os.path.join(sys.base_prefix, "bin", os.path.basename(sys.executable))
        )
        if not os.path.exists(self.python):
            self.python = os.path.realpath(sys.executable)
        self.is_root = os.geteuid() == 0
        unshare = shutil.which("unshare")
        ns = ["--net", "--pid", "--fork", "--kill-child", "--mount", "--ipc", "--uts"]
        if not self.is_root:
            ns = ["--user", "--map-root-user", *ns]
        self.prefix = [unshare, *ns] if unshare else []
        machine = os.uname().machine
        if not self.prefix or machine not in _PIVOT_ROOT or not _probe([*self.prefix, "true"]):
            self.prefix = []
        self.isolation = "namespaces" if self.prefix else "rlimits+preamble"

    def run(self, source: str, slot: int = 0) -> SandboxResult:
        lim = self.limits
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="jaxrl-sandbox-") as tmp:
            root = os.path.join(tmp, "root")
            os.mkdir(root)
            jail = bool(self.prefix)
            cfg = dict(
                jail=jail,
                root=root,
                workdir=tmp,
                tmpfs_kb=max(1024, 4 * lim.output_bytes // 1024),
                ro_binds=self._ro_binds(),
                pivot_root=_PIVOT_ROOT.get(os.uname().machine, -1),
                uid=(61000 + slot) if (jail and self.is_root) else None,
                python=self.python,
                cpu_s=lim.cpu_s,
                wall_s=lim.wall_s,
                memory_mb=lim.memory_mb,
                output_bytes=lim.output_bytes,
                processes=lim.processes,
                open_files=lim.open_files,
            )
            if not jail:
                source = FALLBACK_PREAMBLE + source
            cmd = [*self.prefix, self.python, "-I", "-S", "-c", RUNNER, json.dumps(cfg)]
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=tmp,
                env={},  # no inherited variables or secrets
                start_new_session=True,  # one process group to kill
            )
            try:
                out, err = proc.communicate(source.encode(), timeout=lim.wall_s + 2)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                out, err = proc.communicate()
                return SandboxResult("timeout", None, "", time.monotonic() - t0)
            finally:
                _kill_group(proc)
        seconds = time.monotonic() - t0
        header, _, body = out.partition(b"\n")
        try:
            info = json.loads(header)
        except ValueError:
            tail = err.decode("utf-8", "replace")[-500:]
            return SandboxResult("sandbox_error", proc.returncode, tail, seconds)
        text = body[: lim.output_bytes].decode("utf-8", "replace")
        return SandboxResult(info["status"], info["returncode"], text, seconds)

    def _ro_binds(self) -> list[str]:
        prefixes = {
            os.path.realpath(sys.base_prefix),
            os.path.dirname(os.path.dirname(self.python)),
        }
        system = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/etc/ld.so.cache", "/dev/null"]
        return sorted(prefixes) + system


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
