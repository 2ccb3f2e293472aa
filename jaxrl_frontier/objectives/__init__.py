"""Objectives: pure math, no state (docs/objectives.md): the advantage registry
(advantages.py), the w(p) weight registry (weights.py), aggregations (aggregation.py),
KL estimators and distillation losses (distillation.py), per-token statistics from logits
(logprobs.py), and the loss assembled from them (losses.py) with its config section (schema.py):
grad L = -(1/Z) sum_{b,t} m w A grad logp.

    from jaxrl_frontier.objectives import ADVANTAGES, WEIGHTS, TokenStats, loss_fn

Each registry has a public decorator for a user's own entry (`register_advantage`,
`register_weight`, `register_aggregation`, `register_distill`, `KL_ESTIMATORS.register`);
the module holding them is named in the config's `modules` key.
"""

from jaxrl_frontier.core.errors import ObjectiveConfigError
from jaxrl_frontier.objectives.advantages import (
    ADVANTAGES,
    advantage_level,
    register_advantage,
    sequence_to_tokens,
    step_scores,
    zero_variance_groups,
    zero_variance_mask,
)
from jaxrl_frontier.objectives.aggregation import AGGREGATIONS, register_aggregation
from jaxrl_frontier.objectives.distillation import (
    DISTILL_LOSSES,
    KL_ESTIMATORS,
    kl_reward_penalty,
    register_distill,
)
from jaxrl_frontier.objectives.logprobs import chunked_token_stats, token_entropy, token_logprobs
from jaxrl_frontier.objectives.losses import aggregation_denominator, loss_fn, objective_loss
from jaxrl_frontier.objectives.schema import (
    REGISTRIES,
    default_config,
    entry_defaults,
    validate_objective_config,
)
from jaxrl_frontier.objectives.stats import TokenStats
from jaxrl_frontier.objectives.weights import WEIGHTS, register_weight

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "DISTILL_LOSSES",
    "KL_ESTIMATORS",
    "REGISTRIES",
    "WEIGHTS",
    "ObjectiveConfigError",
    "TokenStats",
    "advantage_level",
    "aggregation_denominator",
    "chunked_token_stats",
    "default_config",
    "entry_defaults",
    "kl_reward_penalty",
    "loss_fn",
    "objective_loss",
    "register_advantage",
    "register_aggregation",
    "register_distill",
    "register_weight",
    "sequence_to_tokens",
    "step_scores",
    "token_entropy",
    "token_logprobs",
    "validate_objective_config",
    "zero_variance_groups",
    "zero_variance_mask",
]
