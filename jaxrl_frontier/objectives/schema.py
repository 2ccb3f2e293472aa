"""The `config.objective` section: `ObjectiveSection`, the typed, hashable record the loss,
the advantages, the critic and the producers receive (`objective_of` builds it from a
mapping); every key and its default (`DEFAULTS`), its choices and ranges, the registries its
names select from, and its checks (unknown keys, registry names, an entry's keyword
arguments, the inputs the configured loss needs). The loss that reads it is losses.py.

Traced keys (`traced_keys`, `with_values`): the float coefficients and weight knobs a
schedule or a controller moves step by step without compiling the update again.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax

from jaxrl_frontier.core import records
from jaxrl_frontier.core.errors import ObjectiveConfigError
from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.objectives.advantages import ADVANTAGES
from jaxrl_frontier.objectives.aggregation import AGGREGATIONS
from jaxrl_frontier.objectives.distillation import DISTILL_LOSSES, KL_ESTIMATORS
from jaxrl_frontier.objectives.weights import WEIGHTS


@dataclasses.dataclass(frozen=True)
class ObjectiveSection:
    """`objective`: the loss's registry entries (weight, aggregation, distill, and the
    advantage `rl.credit` reads, validated here so one check covers the section), their
    keyword arguments (checked against the chosen entry's keyword defaults), and the
    coefficients of its terms. router_aux_coef / router_z_coef: a mixture-of-experts
    policy's router terms (models/moe.py): the load-balancing loss E sum_e f_e P_e (1 when
    balanced) and the router z-loss, each times its coefficient."""

    weight: str = records.key("ppo_clip", "the w(p) weight function (a WEIGHTS name)")
    weight_kwargs: dict = records.key({}, "the weight's keyword arguments")
    aggregation: str = records.key("token_mean", "how token terms become the loss (AGGREGATIONS)")
    aggregation_kwargs: dict = records.key({}, "the aggregation's keyword arguments")
    pg_coef: float = records.key(1.0, "the policy-gradient term's weight")
    kl_coef: float = records.key(0.0, "the KL-to-reference term's weight", low=0)
    kl_estimator: str = records.key("k3", "the KL estimator", choices=("k1", "k2", "k3"))
    kl_in_reward: bool = records.key(False, "the KL as a reward penalty, not a loss term")
    entropy_coef: float = records.key(0.0, "the entropy bonus's weight")
    router_aux_coef: float = records.key(0.0, "MoE: the load-balancing loss's weight", low=0)
    router_z_coef: float = records.key(0.0, "MoE: the router z-loss's weight", low=0)
    distill: str | None = records.key(None, "the distillation loss (DISTILL_LOSSES; None: off)")
    distill_coef: float = records.key(1.0, "the distillation term's weight")
    distill_kwargs: dict = records.key({}, "the distillation loss's keyword arguments")
    advantage: str = records.key("grpo", "the advantage estimator (an ADVANTAGES name)")
    advantage_kwargs: dict = records.key({}, "the advantage's keyword arguments")
    reward_weights: dict = records.key({}, "reward component -> weight ({}: correctness only)")

    def __post_init__(self):
        # Free-form blocks as plain dicts without None (None: the entry's own default, a
        # command-line placeholder left unset), so equal settings make equal records.
        for f in FREE_BLOCKS:
            value = records.plain(getattr(self, f) or {})
            object.__setattr__(self, f, {k: v for k, v in value.items() if v is not None})

    def __hash__(self):  # a static argument of the jitted advantages
        return hash(tuple(_frozen(getattr(self, f.name)) for f in dataclasses.fields(self)))


# The section's free-form blocks: an entry's keyword arguments, the reward weights.
FREE_BLOCKS = ("weight_kwargs", "aggregation_kwargs", "distill_kwargs", "advantage_kwargs",
               "reward_weights")  # fmt: skip


def _frozen(value: Any) -> Any:
    """A hashable copy of a value of the section (dicts and lists nested in a block)."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def objective_of(given: Any) -> ObjectiveSection:
    """The objective as its record: a record as it is; a mapping (a resolved
    `config.objective`'s keys, a notebook's plain dict) built into one, keys not given at
    their defaults. An undeclared key is an ObjectiveConfigError naming the allowed ones."""
    if isinstance(given, ObjectiveSection):
        return given
    for key in given:
        if key not in DEFAULTS:
            raise ObjectiveConfigError(
                f"config.objective: unknown key {key!r}; allowed keys: {', '.join(DEFAULTS)}"
            )
    return records.build(ObjectiveSection, given, "objective")


# `config.objective`: every key and its default, as `ObjectiveSection` declares them.
DEFAULTS: Mapping[str, Any] = records.defaults(ObjectiveSection)
CHOICES: dict[str, tuple] = records.choices("objective", ObjectiveSection)
RANGES: dict[str, tuple] = records.ranges("objective", ObjectiveSection)


# objective.<block> names an entry of a registry; objective.<block>_kwargs configures it.
REGISTRIES: Mapping[str, Registry] = {
    "weight": WEIGHTS,
    "advantage": ADVANTAGES,
    "aggregation": AGGREGATIONS,
    "distill": DISTILL_LOSSES,
}


def default_config():
    """A fresh `config.objective` as a ConfigDict with every key at its default (for
    notebooks and tests that build an objective by hand; a run's comes from its config)."""
    from ml_collections import config_dict  # the user's format, not read by the loss

    cfg = config_dict.ConfigDict({k: v for k, v in DEFAULTS.items() if v is not None})
    cfg.distill = config_dict.placeholder(str)  # None, but overridable from the command line
    return cfg


def entry_defaults(fn: Callable) -> dict[str, Any]:
    """The keyword defaults of a registry entry: {name: default} for each parameter of `fn`
    that has a default. These are the config keys its `*_kwargs` block accepts."""
    params = inspect.signature(fn).parameters.values()
    return {
        p.name: p.default
        for p in params
        if p.default is not inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def setting(cfg: Any, key: str) -> Any:
    """The value of `key` of an objective given as a record or a mapping (a `*_kwargs`
    block without None values, a key not given at its default)."""
    return getattr(objective_of(cfg), key)


def term_on(cfg: Any, key: str) -> bool:
    """Whether the term of coefficient `key` is in the loss: a number when non-zero; a
    traced value (`with_values`: a scheduled or controlled coefficient) always, since the
    run was built for its largest value and a value that moves must not change the program."""
    value = getattr(objective_of(cfg), key)
    return isinstance(value, jax.Array) or bool(value)


# The float keys of `config.objective` whose value may arrive traced (`with_values`), so
# that a schedule or a controller moves it without compiling again; besides these, every
# float knob of the weight functions (`objective.weight_kwargs.<knob>`, `traced_keys`).
TRACED_KEYS = (
    "pg_coef", "kl_coef", "entropy_coef", "distill_coef", "router_aux_coef", "router_z_coef"
)  # fmt: skip


def traced_keys() -> tuple[str, ...]:
    """Every key of the objective that may be a traced value: TRACED_KEYS and
    `weight_kwargs.<knob>` for each float keyword default of a registered weight."""
    knobs = {
        name
        for entry in WEIGHTS.names()
        for name, default in entry_defaults(WEIGHTS.get(entry)).items()
        if isinstance(default, float)
    }
    return TRACED_KEYS + tuple(f"weight_kwargs.{k}" for k in sorted(knobs))


def value_of(cfg: Any, key: str) -> Any:
    """The configured value of a key of `traced_keys()`: cfg['kl_coef'], or for
    'weight_kwargs.eps_high' the block's value, else the chosen weight's default (None when
    the chosen weight has no such knob)."""
    objective = objective_of(cfg)
    block, _, knob = key.partition(".")
    if not knob:
        return getattr(objective, block)
    entry = block.removesuffix("_kwargs")
    defaults = entry_defaults(REGISTRIES[entry].get(getattr(objective, entry)))
    return {**defaults, **getattr(objective, block)}.get(knob)


def with_values(cfg: Any, values: Mapping[str, Any]) -> ObjectiveSection:
    """The objective `cfg` with the keys of `values` replaced: `values` maps a key of
    `traced_keys()` ('kl_coef', 'weight_kwargs.eps_high') to its value this step (an f32
    scalar, traced inside the update). Every other key keeps its configured value."""
    objective = objective_of(cfg)
    changes: dict[str, Any] = {}
    for key, value in values.items():
        block, _, knob = key.partition(".")
        if knob:
            changes[block] = {**changes.get(block, getattr(objective, block)), knob: value}
        else:
            changes[block] = value
    return dataclasses.replace(objective, **changes)


def _check_kwargs(fn: Callable, name: str, cfg_key: str, kwargs: Mapping[str, Any]) -> None:
    allowed = list(entry_defaults(fn))
    for key in kwargs:
        if key not in allowed:
            raise ObjectiveConfigError(
                f"config.objective.{cfg_key}: unknown key {key!r} for {name!r}; "
                f"allowed keys: {', '.join(allowed) or '(none)'}"
            )


def required_fields(cfg: Any) -> dict[str, tuple[str, ...]]:
    """Which optional inputs the configured objective needs: {'what needs it': fields}."""
    objective = objective_of(cfg)
    need: dict[str, tuple[str, ...]] = {}
    weight = objective.weight
    need[f"weight {weight!r}"] = getattr(WEIGHTS.get(weight), "requires", ())
    if term_on(objective, "kl_coef") and not objective.kl_in_reward:
        need["kl_coef > 0"] = ("ref_logp",)
    if objective.distill:
        need[f"distill {objective.distill!r}"] = ("teacher_logits",)
    return need


def validate_objective_config(cfg: Any, available: Iterable[str] | None = None) -> None:
    """Check an objective (its record, or a `config.objective` as a mapping) before any
    tracing.

    Unknown top-level keys, unknown registry names (KeyError listing the known ones), kwargs
    an entry does not accept (naming the key and the allowed keys), and, when `available`
    (the batch keys / TokenStats fields at hand) is given, inputs the objective needs that
    are missing (naming the field and who needs it).
    """
    objective = objective_of(cfg)
    for cfg_key, registry in REGISTRIES.items():
        name = getattr(objective, cfg_key)
        if not name:  # distill None or '' (off)
            continue
        fn = registry.get(name)
        kw_key = f"{cfg_key}_kwargs"
        _check_kwargs(fn, name, kw_key, getattr(objective, kw_key))
    KL_ESTIMATORS.get(objective.kl_estimator)
    if available is not None:
        check_available(objective, set(available))


def check_available(cfg: Any, present: set[str]) -> None:
    for who, fields in required_fields(cfg).items():
        for field in fields:
            if field not in present:
                raise ObjectiveConfigError(
                    f"config.objective: {who} needs {field!r}, which is missing "
                    f"(present: {', '.join(sorted(present))})"
                )
