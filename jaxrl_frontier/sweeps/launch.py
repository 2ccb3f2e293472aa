"""Runs of a sweep and their launchers: `local` (in turn, or N processes at once) and
`slurm` (a submitit array job, one run per task). Both call `run_one` on each run.

A run is `scripts/train.py --config=FILE[:ARG] --workdir=ROOT/NAME --config.KEY=VALUE ...`.
`run_one` writes three files into the workdir beside the trainer's own:
  sweep_run.json      the run's config file and overrides (written before it starts)
  sweep_attempts.jsonl one row per attempt: start, seconds, return code
  sweep_done.json     after a successful attempt: the trainer's last line (step, final
                      eval) and the wall time summed over attempts; its presence marks the
                      run finished, and a later sweep skips it
A population of runs (`--population N`, sweeps/populations.py) writes the first and the last
into each member's directory too.
A killed attempt leaves no sweep_done.json: the next sweep starts the same command, which
resumes from the workdir's newest checkpoint (docs/reliability.md).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from jaxrl_frontier.core.machine import machine_name
from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.sweeps import populations
from jaxrl_frontier.sweeps.spec import CONFIG_KEY, group_key, load_sweep, run_name, varying_keys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_SCRIPT = os.path.join(REPO, "scripts", "train.py")
RUN_FILE, ATTEMPTS_FILE, DONE_FILE, LOG_FILE = (
    "sweep_run.json",
    "sweep_attempts.jsonl",
    "sweep_done.json",
    "sweep.log",
)


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a sweep: experiment file, config overrides, workdir."""

    name: str
    config: str  # FILE.py[:ARG]
    overrides: tuple[tuple[str, object], ...]  # (key, value), the config key excluded
    workdir: str
    group: str = ""  # the name without the seed: what collect averages over
    members: tuple = ()  # a population's runs (sweeps/populations.py), one per member

    def train_args(self) -> list[str]:
        """The arguments of scripts/train.py (no program name)."""
        args = [f"--config={self.config}", f"--workdir={self.workdir}"]
        return args + [f"--config.{k}={_flag_value(v)}" for k, v in self.overrides]

    @property
    def done(self) -> bool:
        return os.path.exists(os.path.join(self.workdir, DONE_FILE))


def _flag_value(v) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def plan(sweep_file: str, config: str | None, root: str) -> list[Run]:
    """The runs of `sweep_file`: each override dict's config file (its `config` key, else
    `config`) and workdir root/<run_name of its overrides, config file included, showing
    the keys that vary over the sweep>."""
    runs = []
    sweep = load_sweep(sweep_file)
    full = []
    for overrides in sweep:
        file = overrides.get(CONFIG_KEY, config)
        if not file:
            raise ValueError(
                f"sweep file {sweep_file}: a run sets no '{CONFIG_KEY}' key and no --config "
                "was given"
            )
        # the file relative to the repository: the same name from any launch directory
        full.append({**overrides, CONFIG_KEY: os.path.relpath(abs_config(file), REPO)})
    shown = varying_keys(full)
    for overrides in full:
        rest = tuple((k, v) for k, v in overrides.items() if k != CONFIG_KEY)
        name = run_name(overrides, shown)
        runs.append(
            Run(
                name,
                os.path.join(REPO, overrides[CONFIG_KEY]),
                rest,
                os.path.join(os.path.abspath(root), name),
                group_key(overrides, shown),
            )
        )
    return runs


def abs_config(spec: str) -> str:
    """FILE[:ARG] with FILE absolute (as given from the current directory, else from the
    repository root), so a run does not depend on where it is launched from."""
    file, sep, arg = spec.partition(":")
    for base in (os.getcwd(), REPO):
        if os.path.isfile(os.path.join(base, file)):
            return os.path.abspath(os.path.join(base, file)) + sep + arg
    raise ValueError(f"config file {file!r} not found (from {os.getcwd()} or {REPO})")


def _append_jsonl(path: str, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def _attempt_seconds(workdir: str, key: str = "seconds") -> float:
    path = os.path.join(workdir, ATTEMPTS_FILE)
    if not os.path.exists(path):
        return 0.0
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return sum(r.get(key, 0.0) for r in rows)


def machine(cpus: list[int] | None = None) -> str:
    """The CPU model and the cores a run had: `cpus` when it was pinned, else every core
    this process may use (recorded with each finished run)."""
    return machine_name(cpus)


def _last_json_line(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if isinstance(row, dict):
                return row
    return {}


def run_one(run: Run, inprocess: bool = False, cpus: list[int] | None = None) -> dict:
    """Train `run` unless it finished before; returns {name, status, seconds, returncode}.

    status is "skipped" (sweep_done.json there), "done" or "failed". The trainer runs in a
    subprocess (its threads, memory and any crash stay there; pinned to `cpus` when given),
    or with inprocess=True in this process through the same entry point (tests: no second
    JAX start-up per run).
    """
    if run.done:
        return dict(name=run.name, status="skipped", seconds=0.0, returncode=0)
    os.makedirs(run.workdir, exist_ok=True)
    with open(os.path.join(run.workdir, RUN_FILE), "w") as f:
        meta = dict(name=run.name, group=run.group, config=run.config)
        json.dump(dict(meta, overrides=dict(run.overrides)), f)
    if run.members:  # a population: each member a run of the sweep's own
        populations.write_members(run, RUN_FILE)
    start = time.time()
    if inprocess:
        returncode, out, cpu = _train_inprocess(run)
    else:
        returncode, out, cpu = _train_subprocess(run, cpus)
    seconds = time.time() - start
    _append_jsonl(
        os.path.join(run.workdir, ATTEMPTS_FILE),
        dict(
            start=start, seconds=round(seconds, 2), cpu_seconds=round(cpu, 2), returncode=returncode
        ),
    )
    summary = _last_json_line(out) if returncode == 0 else {}
    # a run stopped by SIGTERM exits 0 with stopped=True: not finished, resumed next time
    status = "done" if returncode == 0 and summary and not summary.get("stopped") else "failed"
    if status == "done":
        done = dict(
            summary=summary,
            wall_seconds=round(_attempt_seconds(run.workdir), 2),
            cpu_seconds=round(_attempt_seconds(run.workdir, "cpu_seconds"), 2),
            machine=machine(cpus),
        )
        with open(os.path.join(run.workdir, DONE_FILE), "w") as f:
            json.dump(done, f)
        if run.members:
            populations.finish_members(run, out, done, DONE_FILE, ATTEMPTS_FILE)
    error = "" if status == "done" else (out.strip().splitlines() or ["(no output)"])[-1]
    return dict(name=run.name, status=status, seconds=seconds, returncode=returncode, error=error)


def _train_subprocess(run: Run, cpus: list[int] | None) -> tuple[int, str, float]:
    """(return code, stdout or the log's tail on failure, CPU seconds of the child)."""
    cmd = [sys.executable, TRAIN_SCRIPT, *run.train_args()]
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    log_path = os.path.join(run.workdir, LOG_FILE)
    with open(log_path, "a") as log, tempfile.TemporaryFile("w+") as out:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=log, preexec_fn=pin)
        try:
            _, status, usage = os.wait4(proc.pid, 0)  # this child's own CPU time
        except KeyboardInterrupt:  # Ctrl-C reached the trainer too: let it save and stop
            proc.wait()
            raise
        proc.returncode = returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        stdout = out.read()
        log.write(stdout)
    # the trainer's errors are one line on stderr: the log's last line names the key/file
    with open(log_path) as f:
        tail = f.read()[-4000:]
    return returncode, stdout if returncode == 0 else tail, usage.ru_utime + usage.ru_stime


def _train_inprocess(run: Run) -> tuple[int, str, float]:
    from jaxrl_frontier.run.cli import train_main

    cpu0 = _self_cpu()
    out = io.StringIO()
    cwd, argv = os.getcwd(), sys.argv
    try:
        os.chdir(REPO)  # config paths are relative to the repository, as for the CLI
        # ml_collections defines the --config.KEY override flags from sys.argv itself
        sys.argv = ["train.py", *run.train_args()]
        with contextlib.redirect_stdout(out):
            train_main(list(sys.argv))
        code = 0
    except SystemExit as e:  # the CLI's one-line errors
        code, out = (0 if e.code in (None, 0) else 1), io.StringIO(f"{out.getvalue()}\n{e}")
    finally:
        os.chdir(cwd)
        sys.argv = argv
    with open(os.path.join(run.workdir, LOG_FILE), "a") as log:
        log.write(out.getvalue())
    return code, out.getvalue(), _self_cpu() - cpu0


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ------------------------------------------------------------------ launchers

Say = Callable[[str], None]
LAUNCHERS = Registry("sweep launcher")


def _report(i: int, n: int, result: dict, say: Say) -> None:
    status = result["status"]
    if status == "skipped":
        say(f"[sweep] run {i}/{n} {result['name']}: skipped (finished before)")
    elif status == "done":
        say(f"[sweep] run {i}/{n} {result['name']}: done in {result['seconds']:.1f}s")
    else:
        say(
            f"[sweep] run {i}/{n} {result['name']}: FAILED (exit {result['returncode']}): "
            f"{result.get('error', '')}"
        )


def cpu_slots(parallel: int, cores_per_run: int) -> list[list[int] | None]:
    """The cores each of `parallel` workers is pinned to (None: unpinned, one worker).

    parallel=0 sizes the pool to the machine: one worker per `cores_per_run` cores.
    """
    cores = sorted(os.sched_getaffinity(0))
    if parallel == 0:
        parallel = max(1, len(cores) // cores_per_run)
    if parallel == 1:
        return [None]
    per = max(1, len(cores) // parallel)
    return [cores[(i * per) % len(cores) :][:per] for i in range(parallel)]


@LAUNCHERS.register("local")
def launch_local(
    runs: list[Run],
    say: Say = print,
    parallel: int = 1,
    cores_per_run: int = 2,
    inprocess: bool = False,
    **_,
) -> list[dict]:
    """Runs one after another (parallel=1), or on a pool of worker processes, each pinned to
    its own cores (parallel=N; 0: as many as the cores allow at `cores_per_run` each)."""
    n = len(runs)
    say(f"[sweep] {n} runs, {sum(r.done for r in runs)} finished before")
    slots = [None] if inprocess else cpu_slots(parallel, cores_per_run)
    results: list[dict] = [{}] * n
    if len(slots) == 1:
        for i, run in enumerate(runs):
            results[i] = run_one(run, inprocess=inprocess, cpus=slots[0])
            _report(i + 1, n, results[i], say)
        return results
    free = list(range(len(slots)))
    with concurrent.futures.ThreadPoolExecutor(len(slots)) as pool:
        pending = {}
        for i, run in enumerate(runs):
            if len(pending) == len(slots):
                finished, _ = concurrent.futures.wait(
                    pending, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for fut in finished:
                    j, slot = pending.pop(fut)
                    free.append(slot)
                    results[j] = fut.result()
                    _report(j + 1, n, results[j], say)
            slot = free.pop(0)
            pending[pool.submit(run_one, run, False, slots[slot])] = (i, slot)
        for fut in concurrent.futures.as_completed(list(pending)):
            j, _slot = pending[fut]
            results[j] = fut.result()
            _report(j + 1, n, results[j], say)
    return results


def slurm_executor(folder: str, cluster: str | None = None, **params):
    """A submitit AutoExecutor for array jobs: cluster None detects slurm, 'local' runs the
    tasks as local processes, 'debug' in this process. `params` go to update_parameters
    (timeout_min, slurm_partition, cpus_per_task, slurm_array_parallelism, ...)."""
    import submitit

    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    executor.update_parameters(**params)
    return executor


REQUEUES_FILE = "sweep_requeues.jsonl"


def requeue_decision(run: Run, max_requeues: int) -> tuple[bool, str]:
    """Whether a SLURM task of `run` stopped by a preemption or its time limit is requeued
    (it then resumes from its last checkpoint): not once the run is finished, nor once it was
    requeued `max_requeues` times (counted in REQUEUES_FILE in its workdir). (yes, why)."""
    if run.done:
        return False, f"{run.name}: finished; not requeued"
    path = os.path.join(run.workdir, REQUEUES_FILE)
    done = 0
    if os.path.exists(path):
        with open(path) as f:
            done = sum(1 for line in f if line.strip())
    if done >= max_requeues:
        return False, (
            f"{run.name}: requeued {done} times already (max_requeues={max_requeues}); "
            "not requeued: resume it with the same sweep command"
        )
    return True, f"{run.name}: requeue {done + 1} of {max_requeues}"


class RequeueingRunOne:
    """`run_one` as a submitit task that SLURM's preemption or time-limit signal requeues
    (submitit calls `checkpoint` with the task's arguments; a DelayedSubmission requeues it,
    None lets it end), within `max_requeues` per run."""

    def __init__(self, max_requeues: int = 3):
        self.max_requeues = max_requeues

    def __call__(self, run: Run, inprocess: bool = True) -> dict:
        return run_one(run, inprocess=inprocess)

    def checkpoint(self, run: Run, inprocess: bool = True):
        requeue, why = requeue_decision(run, self.max_requeues)
        print(f"[sweep] {why}", file=sys.stderr, flush=True)
        if not requeue:
            return None
        os.makedirs(run.workdir, exist_ok=True)
        _append_jsonl(os.path.join(run.workdir, REQUEUES_FILE), dict(time=time.time()))
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, run, inprocess)


@LAUNCHERS.register("slurm")
def launch_slurm(
    runs: list[Run],
    say: Say = print,
    folder: str = "",
    cluster: str | None = None,
    wait: bool = True,
    params: dict | None = None,
    max_requeues: int = 3,
    **_,
) -> list[dict]:
    """One array job over the runs not finished yet (one run per task, each through
    run_one, in the task's own process: one run per process already); waits for the tasks
    and reports each when wait=True. A task stopped by a preemption or its time limit saves
    a checkpoint (the trainer's SIGTERM handling) and is requeued, at most `max_requeues`
    times per run (`RequeueingRunOne`); past that the next sweep resumes it."""
    todo = [r for r in runs if not r.done]
    n = len(runs)
    say(f"[sweep] {n} runs, {n - len(todo)} finished before; {len(todo)} in one array job")
    results = {r.name: dict(name=r.name, status="skipped", seconds=0.0, returncode=0) for r in runs}
    if todo:
        executor = slurm_executor(folder, cluster, **(params or {}))
        task = RequeueingRunOne(max_requeues)
        jobs = executor.map_array(task, todo, [True] * len(todo))
        say(f"[sweep] submitted array job {jobs[0].job_id.split('_')[0]} ({len(jobs)} tasks)")
        if not wait:
            return [
                dict(name=r.name, status="submitted", job_id=j.job_id) for r, j in zip(todo, jobs)
            ]
        for run, job in zip(todo, jobs):
            try:
                results[run.name] = job.result()
            except Exception as e:  # the task itself died (time limit, node failure)
                results[run.name] = dict(
                    name=run.name, status="failed", seconds=0.0, returncode=-1, error=str(e)[-500:]
                )
    out = [results[r.name] for r in runs]
    for i, result in enumerate(out):
        _report(i + 1, n, result, say)
    return out
