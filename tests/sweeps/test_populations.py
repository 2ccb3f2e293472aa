"""A sweep's runs packed into populations (sweeps/populations.py): which runs share a
population, the population run's overrides and directories, and each member's records after
the population finished."""

import json
import os

from jaxrl_frontier.sweeps import populations
from jaxrl_frontier.sweeps.launch import Run


def run(name, root, **overrides):
    return Run(name, "configs/x.py", tuple(overrides.items()), os.path.join(root, name), "g")


def test_runs_differing_in_allowed_keys_share_a_population(tmp_path):
    root = str(tmp_path)
    solo = [
        run("a", root, **{"optimizer.lr": 0.1, "train.steps": 5, "seed": 0}),
        run("b", root, **{"optimizer.lr": 0.2, "train.steps": 5, "seed": 1}),
        run("c", root, **{"optimizer.lr": 0.1, "train.steps": 9, "seed": 0}),  # another group
        run("d", root, **{"optimizer.lr": 0.3, "train.steps": 5, "seed": 2}),
        run("e", root, **{"optimizer.lr": 0.1, "train.steps": 5}),  # no seed: alone
    ]
    assert populations.pack(solo, 1) == solo
    pop, c, e = populations.pack(solo, 4)
    assert (c, e) == (solo[2], solo[4])
    assert pop.name == "population-a-x3" and pop.workdir == os.path.join(root, pop.name)
    assert pop.members == (solo[0], solo[1], solo[3]) and pop.group == ""
    assert pop.overrides == (
        ("train.steps", 5),
        ("population.size", 3),
        ("population.same_prompts", False),
        ("population.vary.optimizer.lr", (0.1, 0.2, 0.3)),
        ("population.vary.seed", (0, 1, 2)),
    )
    first, rest = populations.pack(solo[:2] + solo[3:4], 2, same_prompts=True)
    assert dict(first.overrides)["population.same_prompts"] is True
    assert len(first.members) == 2 and rest is solo[3]  # a chunk of one runs alone


def test_members_get_their_records_and_a_share_of_the_time(tmp_path):
    root = str(tmp_path)
    solo = [run(n, root, **{"seed": s}) for n, s in (("a", 0), ("b", 1))]
    (pop,) = populations.pack(solo, 2)
    populations.write_members(pop, "run.json")
    meta = json.load(open(os.path.join(populations.member_dir(pop, 1), "run.json")))
    assert meta == dict(
        name="b", group="g", config="configs/x.py", overrides={"seed": 1}, population=pop.name
    )
    out = 'log line\n{"values": 1, "step": 3}\n{"values": 2, "step": 3}\n'
    done = dict(wall_seconds=10.0, cpu_seconds=3.0, machine="m")
    populations.finish_members(pop, out, done, "done.json", "attempts.jsonl")
    d1 = json.load(open(os.path.join(populations.member_dir(pop, 1), "done.json")))
    assert d1["summary"] == {"values": 2, "step": 3}
    assert (d1["wall_seconds"], d1["cpu_seconds"], d1["population_wall_seconds"]) == (
        5.0,
        1.5,
        10.0,
    )
    with open(os.path.join(populations.member_dir(pop, 0), "attempts.jsonl")) as f:
        (row,) = [json.loads(line) for line in f]
    assert (row["seconds"], row["cpu_seconds"], row["returncode"]) == (5.0, 1.5, 0)
    assert populations.member_workdirs(root, "run.json") == [
        populations.member_dir(pop, 0),
        populations.member_dir(pop, 1),
    ]
