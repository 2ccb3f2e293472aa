"""The `population` section: N runs of one config in one job, differing in their seed and in
traced float keys (run/population/driver.py runs them).

    population.size = N            members; alone, member i runs `seed + i`
    population.vary.<key> = (v_0, ..., v_{N-1})    member i's value of <key>
    population.grid.<key> = (a, b, ...)            the product of the grid's keys' values
                                                   (the seed outermost, the rest in order)
    population.same_prompts = True                 every member draws the same prompts
    population.pbt.every = K                       population-based training (run/population/pbt.py)
    population.lora = True                         N LoRA adapters on one frozen base: the
                                                   batched update and sampling below

What may vary is what compiles nothing new: the seed, the float keys the jitted programs
take as arguments (the objective's coefficients and weight knobs, the rollout's temperature,
top_p and min_p: `schedules.*`) and the peak learning rate, then a value of the optimizer
state (`optimizer.lr_in_state`). Member i's config is an ordinary run's config: the launched
one with `seed` (and with `same_prompts`, `data.seed` = the launched seed) set, each varied
key as a constant schedule (`schedules.<key> = v_i`) and a varied `optimizer.lr` with
`optimizer.lr_in_state`, so that the solo run of a member's `config.json` trains what the
member trains.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import itertools
from typing import Any

import ml_collections
from ml_collections import config_dict

from jaxrl_frontier.core import records
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.run.knobs import knob_section
from jaxrl_frontier.run.population.batched_update import check_member_blocks
from jaxrl_frontier.run.population.pbt import PBTSection

SEED = "seed"
LR = "optimizer.lr"  # a value of the optimizer state for every member (`optimizer.lr_in_state`)


@dataclasses.dataclass(frozen=True)
class PopulationSection:
    """`population`'s own keys (module docstring). Beside them `population_section` generates
    `vary` and `grid`: one unset entry per key a member may vary."""

    size: int = records.key(
        0, "members (0: one run, no population); alone, member i runs seed + i", low=0
    )
    same_prompts: bool = records.key(True, "every member draws the same prompts")
    batched_update: bool = records.key(
        False, "one vmapped update over the members' stacked states (batched_update.py)"
    )
    batched_sampling: bool = records.key(
        False, "one vmapped rollout program over the members' weights (the plain sampler)"
    )
    lora: bool = records.key(
        False, "N LoRA adapter sets on one frozen base, every member's rows in one forward"
    )
    pbt: PBTSection = records.section(PBTSection, "population-based training (pbt.py)")


def population_section() -> ml_collections.ConfigDict:
    """`population`: the keys `PopulationSection` declares, and `vary` and `grid`."""
    # (imported here: run.config's schema imports this module for `PopulationSection`, so a
    # module-level import of run.config would be a cycle when this module is imported first)
    from jaxrl_frontier.run.config.record_dicts import section

    s = section(PopulationSection)
    s.vary = _keys_section()
    s.grid = _keys_section()
    return s


def _keys_section() -> ml_collections.ConfigDict:
    """One unset entry per key a member may vary: the seed, every traced float key and the
    peak learning rate."""
    s = knob_section()
    s.seed = config_dict.placeholder(object)
    s.optimizer = ml_collections.ConfigDict({"lr": config_dict.placeholder(object)})
    return s


def _entries(section) -> dict[str, tuple]:
    """{dotted key: values} of the entries set; a string value (from the command line) is
    read as a Python literal."""
    from jaxrl_frontier.run.knobs import set_entries

    out = {}
    for key, value in set_entries(section).items():
        if isinstance(value, str):
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                raise ConfigError(
                    f"config key 'population.{key}' = {value!r}: give a tuple of values, "
                    "e.g. '(0.01, 0.05)'"
                ) from None
        if not isinstance(value, (list, tuple)) or not value:
            raise ConfigError(
                f"config key 'population.{key}' = {value!r}: give a non-empty tuple of values"
            )
        out[key] = tuple(value)
    return out


def allowed_keys() -> tuple[str, ...]:
    """The keys a member may vary: the seed and the traced float keys."""
    from jaxrl_frontier.run.knobs import set_entries

    every = {k: 0 for k in set_entries(_filled(knob_section()))}
    return (SEED, LR, *sorted(every))


def _filled(section: ml_collections.ConfigDict) -> dict:
    """The section as a dict with every unset entry set to 0 (to list its keys)."""
    tree = section.to_dict()

    def fill(node):
        return {k: fill(v) if isinstance(v, dict) else 0 for k, v in node.items()}

    return fill(tree)


def member_values(c) -> list[dict[str, Any]]:
    """Each member's varied values ({key: value}, the seed always among them), in member
    order; [] when the config has no population. ConfigError naming the key for a key that
    may not vary, a count that disagrees with `population.size`, or a run the population
    does not run yet."""
    p = c.get("population")
    if p is None:
        return []
    vary, grid = _entries(p.vary), _entries(p.grid)
    if not p.size and not vary and not grid:
        return []
    allowed = allowed_keys()
    for where, entries in (("vary", vary), ("grid", grid)):
        for key in entries:
            if key not in allowed:
                raise ConfigError(
                    f"config key 'population.{where}.{key}': {key!r} changes the programs' "
                    "shapes or structure, so members cannot share them; a population varies "
                    f"the seed and the traced float keys ({', '.join(allowed)}). Use stages "
                    "or separate runs (scripts/sweep.py) for it"
                )
    both = sorted(set(vary) & set(grid))
    if both:
        raise ConfigError(f"config key 'population.vary.{both[0]}' is also in population.grid")
    grid = dict(sorted(grid.items(), key=lambda kv: allowed.index(kv[0])))  # the seed outermost
    combos = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    size = int(p.size) or (len(combos) if grid else len(next(iter(vary.values()))))
    if grid and len(combos) != size:
        raise ConfigError(
            f"config key 'population.size' = {p.size}: population.grid expands to "
            f"{len(combos)} members; set size to {len(combos)} or 0"
        )
    for key, values in vary.items():
        if len(values) != size:
            raise ConfigError(
                f"config key 'population.vary.{key}' has {len(values)} values for "
                f"{size} members (population.size): give one per member"
            )
    if size < 2:
        raise ConfigError(f"config key 'population.size' = {size}: a population has >= 2 members")
    members = []
    for i in range(size):
        values = {SEED: int(c.seed) + i, **(combos[i] if grid else {})}
        values.update({k: v[i] for k, v in vary.items()})
        members.append(values)
    _check_runs(c, members)
    return members


def _check_runs(c, members: list[dict[str, Any]]) -> None:
    """The runs a population does not run yet, each refused naming its key."""
    from jaxrl_frontier.run.knobs import set_entries

    moving = {**set_entries(c.get("schedules")), **set_entries(c.get("controllers"))}
    for key in members[0]:
        if key in moving:
            raise ConfigError(
                f"config key 'population.vary.{key}': {key} is scheduled or controlled "
                "already; a member's value is a constant schedule"
            )
    if any(m.get("objective.kl_coef", 1.0) <= 0 for m in members):
        raise ConfigError(
            "config key 'population.vary.objective.kl_coef': every member's value must be > 0 "
            "(the members share the loaded reference model; compare against a small value)"
        )
    # what the members' parts lack of a population, as they declare it (run/config/parts.py;
    # imported here, as in population_section)
    from jaxrl_frontier.run.config import parts

    parts.check_capabilities(c, procs=1, only=("population",))
    if c.population.get("lora"):
        _check_lora(c)
        _check_batched_sampling(c, "population.lora")
    elif c.population.get("batched_sampling"):
        _check_batched_sampling(c, "population.batched_sampling")
    _check_member_mesh(c, len(members))


def batched(c) -> tuple[bool, bool]:
    """(one update of every member, one rollout program of every member): the
    `batched_update` and `batched_sampling` keys, both on with `population.lora`."""
    p = c.population
    lora = bool(p.get("lora"))
    return bool(p.batched_update) or lora, bool(p.batched_sampling) or lora


def _check_member_mesh(c, size: int) -> None:
    """`mesh.population = P > 1` splits the members' one vmapped update over P blocks of
    devices: only `population.batched_update` runs one, and each block takes N / P members."""
    p = int(c.mesh.get("population", 1))
    if p == 1:
        return
    if not batched(c)[0]:
        raise ConfigError(
            f"config key 'mesh.population' = {p} splits the members' batched update over "
            "devices: set population.batched_update = True, or mesh.population = 1"
        )
    check_member_blocks(p, size)


def _check_lora(c) -> None:
    """`population.lora` trains adapters on one base read from a file: LoRA on, a policy
    that is not `scratch` (a random init depends on each member's seed, so there would be
    no one base to share). It turns `batched_update` and `batched_sampling` on."""
    refusals = {
        "model.lora.rank": (
            not c.model.lora.rank,
            f"{c.model.lora.rank}: set a rank > 0 (the members train LoRA adapters)",
        ),
        "model.init": (
            c.model.init == "scratch",
            "'scratch': the members' base is one set of weights read from a file "
            "(model.init = 'checkpoint' or 'hf', with model.path)",
        ),
    }
    for key, (refused, why) in refusals.items():
        if refused:
            raise ConfigError(f"config key {key!r} = {why} (population.lora = True)")


def _check_batched_sampling(c, why: str) -> None:
    """`population.batched_sampling` vmaps the plain sampler's prefill and decode: the
    samplers of their own loops and records are refused, naming the key."""
    spec = c.rollout.get("speculative") or {}
    refusals = {
        "rollout.continuous_slots": bool(c.rollout.get("continuous_slots")),
        "rollout.speculative.draft": spec.get("draft") is not None,
        "model.moe.routing_replay": c.model.moe.routing_replay == "rollout",
    }
    for key, refused in refusals.items():
        if refused:
            raise ConfigError(
                f"config key {why!r} batches the plain sampler only: "
                f"unset {key!r} or set {why} = False"
            )


def check_solo_mesh(c) -> None:
    """A run with no population: `mesh.population` 1 (an axis of no members would only run
    every program P times over)."""
    p = int(c.mesh.get("population", 1))
    if p != 1:
        raise ConfigError(
            f"config key 'mesh.population' = {p} splits a population's members over devices; "
            "this config sets no population (population.size): set mesh.population = 1"
        )


def member_config(c, values: dict[str, Any]) -> ml_collections.ConfigDict:
    """Member config: the launched config `c` with the member's `values` (module docstring),
    as an ordinary run's config (no population section set)."""
    m = copy.deepcopy(c)
    same_prompts = bool(c.population.same_prompts)
    m.population = population_section()
    m.seed = int(values[SEED])
    if same_prompts and m.data.get("seed") is None:
        m.data.seed = int(c.seed)
    if LR in values:
        m.optimizer.lr, m.optimizer.lr_in_state = float(values[LR]), True
    for key, value in values.items():
        if key in (SEED, LR):
            continue
        section, *path = key.split(".")
        node = m.schedules[section]
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = float(value)
    return m
