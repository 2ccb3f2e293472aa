"""A sweep's runs packed into populations (`scripts/sweep.py run --population N`).

Runs of one config file whose overrides differ only in the seed and in traced float keys
(`run.population_config.allowed_keys`: the objective's coefficients, the rollout's
temperature ...) share every compiled program, so up to N of them run as one population
job (run/population/driver.py): `population.vary.<key> = (each member's value)`. Runs that set no
seed, or whose group leaves a single run, are launched as before.

    ROOT/population-<first run's name>-x<n>/members/<i>/   member i: the sweep's run i
        sweep_run.json    its own name, group and overrides (what `collect` reads)
        sweep_done.json   after the population finished: its line of the trainer's output,
                          its 1/N share of the population's wall and CPU time

Members draw their own prompts (`population.same_prompts = False`: each run as it would
alone) unless `same_prompts` is asked for (common random numbers across the members).
"""

from __future__ import annotations

import dataclasses
import json
import os

from jaxrl_frontier.sweeps.spec import SEED_KEY

MEMBERS_DIR = "members"


def allowed_keys() -> set[str]:
    from jaxrl_frontier.run.population.section import allowed_keys as keys

    return set(keys())


def pack(runs: list, size: int, same_prompts: bool = False) -> list:
    """`runs` (launch.Run) with each group of runs that differ only in allowed keys cut into
    populations of at most `size` members (a group's order kept)."""
    if size < 2:
        return list(runs)
    allowed = allowed_keys()
    groups: dict[tuple, list] = {}
    for run in runs:
        given = dict(run.overrides)
        if SEED_KEY not in given:  # no seed axis: the run keeps its own process
            groups[("solo", run.name)] = [run]
            continue
        fixed = tuple(sorted((k, repr(v)) for k, v in given.items() if k not in allowed))
        varied = tuple(sorted(k for k in given if k in allowed))
        groups.setdefault((run.config, fixed, varied), []).append(run)
    out = []
    for group in groups.values():
        for start in range(0, len(group), size):
            chunk = group[start : start + size]
            out.append(chunk[0] if len(chunk) == 1 else population_run(chunk, same_prompts))
    return out


def population_run(chunk: list, same_prompts: bool):
    """One population Run of the runs in `chunk` (module docstring)."""
    allowed = allowed_keys()
    first = dict(chunk[0].overrides)
    fixed = [(k, v) for k, v in chunk[0].overrides if k not in allowed]
    vary = [
        (f"population.vary.{k}", tuple(dict(r.overrides)[k] for r in chunk))
        for k in sorted(k for k in first if k in allowed)
    ]
    overrides = (
        *fixed,
        ("population.size", len(chunk)),
        ("population.same_prompts", same_prompts),
        *vary,
    )
    name = f"population-{chunk[0].name}-x{len(chunk)}"
    workdir = os.path.join(os.path.dirname(chunk[0].workdir), name)
    return dataclasses.replace(
        chunk[0], name=name, overrides=overrides, workdir=workdir, group="", members=tuple(chunk)
    )


def member_dir(run, i: int) -> str:
    return os.path.join(run.workdir, MEMBERS_DIR, str(i))


def write_members(run, run_file: str) -> None:
    """Each member's sweep_run.json, under the population's workdir (before it starts)."""
    for i, member in enumerate(run.members):
        os.makedirs(member_dir(run, i), exist_ok=True)
        meta = dict(name=member.name, group=member.group, config=member.config)
        meta.update(overrides=dict(member.overrides), population=run.name)
        with open(os.path.join(member_dir(run, i), run_file), "w") as f:
            json.dump(meta, f)


def finish_members(run, out: str, done: dict, done_file: str, attempts_file: str) -> None:
    """Each member's sweep_done.json: its own line of the trainer's output (one JSON line
    per member, in member order), the machine, and its share (1/N) of the population's wall
    and CPU seconds (the population's own in `population_wall_seconds`); its attempts file
    one row of that share, so that `collect` sums a sweep's time once."""
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{") and '"values"' in x]
    n = len(run.members)
    share = {k: round(done[k] / n, 2) for k in ("wall_seconds", "cpu_seconds")}
    for i, summary in enumerate(lines[-n:]):
        member = dict(done, **share, summary=summary, population=run.name)
        member["population_wall_seconds"] = done["wall_seconds"]
        with open(os.path.join(member_dir(run, i), done_file), "w") as f:
            json.dump(member, f)
        with open(os.path.join(member_dir(run, i), attempts_file), "w") as f:
            row = dict(seconds=share["wall_seconds"], cpu_seconds=share["cpu_seconds"])
            f.write(json.dumps(dict(row, returncode=0, population=run.name)) + "\n")


def member_workdirs(root: str, run_file: str) -> list[str]:
    """The member directories of the populations under a sweep's `root` that hold
    `run_file`."""
    out = []
    for d in sorted(os.listdir(root)):
        members = os.path.join(root, d, MEMBERS_DIR)
        if os.path.isdir(members):
            for m in sorted(os.listdir(members), key=lambda s: (len(s), s)):
                if os.path.isfile(os.path.join(members, m, run_file)):
                    out.append(os.path.join(members, m))
    return out
