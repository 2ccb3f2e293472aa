"""Objectives: advantages, the w(p) weight registry and the loss (docs/objectives.md):
grad L = -(1/Z) sum_{b,t} m w A grad logp.

    from jaxrl_frontier.objectives import ADVANTAGES, WEIGHTS, TokenStats, loss_fn
"""

from jaxrl_frontier.objectives.advantages import (
    ADVANTAGES,
    advantage_level,
    sequence_to_tokens,
    step_scores,
    zero_variance_groups,
    zero_variance_mask,
)
from jaxrl_frontier.objectives.losses import (
    AGGREGATIONS,
    DISTILL_LOSSES,
    KL_ESTIMATORS,
    ObjectiveConfigError,
    aggregation_denominator,
    chunked_token_stats,
    default_config,
    entry_defaults,
    kl_reward_penalty,
    loss_fn,
    objective_loss,
    token_entropy,
    token_logprobs,
    validate_objective_config,
)
from jaxrl_frontier.objectives.stats import TokenStats
from jaxrl_frontier.objectives.weights import WEIGHTS, register_weight

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "DISTILL_LOSSES",
    "KL_ESTIMATORS",
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
    "register_weight",
    "sequence_to_tokens",
    "step_scores",
    "token_entropy",
    "token_logprobs",
    "validate_objective_config",
    "zero_variance_groups",
    "zero_variance_mask",
]
