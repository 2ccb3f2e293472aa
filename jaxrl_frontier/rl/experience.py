"""`Experience`: the one record a rollout batch travels in, from the producer to the learner.

Every array is global (sharded over the mesh's batch axes; on several hosts each process
holds the rows its own prompts produced) and aligned with `tokens` as the objectives expect:
`x[b, t]` is about `tokens[b, t]` given `tokens[b, :t]`. Rows are prompt-major: rows
g*G .. g*G+G-1 are the G completions of prompt g, and a group never spans processes.

    tokens          int32 [B, T]   prompt (left-padded) | completion (right-padded)
    attention_mask  int32 [B, T]   1 on real tokens
    loss_mask       f32   [B, T]   completion AND sampled by the policy (not observations)
    old_logp        f32   [B, T]   behaviour log-probs (0 off the loss mask)
    ref_logp        f32   [B, T]   reference log-probs, or None
    teacher_logp    f32   [B, T]   teacher log-probs, or None
    advantages      f32   [B, T]   per token (a sequence advantage broadcast), 0 off the mask
    rewards         f32   [B, K]   reward vectors (the task's `reward_names` order)
    prompt_index    int32 [B]      dataset index of each row's prompt
    group_id        int32 [B]      global group (prompt) number within the batch
    policy_version  int32 [B]      version of the weights that sampled the row
    turn_index      int32 [B, T]   0 for single-turn rollouts; the turn of each token
    dropout_keys    uint32 [B, 2]  Dropout-GRPO row keys (the update rebuilds their masks), or None
    extras          {name: [B, T]} arrays filled by registered log-prob passes (e.g. sc_logp)

`results` (host, not a pytree leaf) holds one `PromptResult` per prompt this process owns, for
the `PromptSource`; `texts` the decoded completions of this process's rows.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax

from jaxrl_frontier.rl.sources.base import PromptResult

Array = jax.Array

# Fields the update reads (besides the optional ones present): see `Experience.update_batch`.
UPDATE_FIELDS = ("tokens", "attention_mask", "loss_mask", "old_logp", "advantages")
OPTIONAL_FIELDS = ("ref_logp", "teacher_logp", "dropout_keys")


@flax.struct.dataclass
class Experience:
    tokens: Array
    attention_mask: Array
    loss_mask: Array
    old_logp: Array
    advantages: Array
    rewards: Array
    prompt_index: Array
    group_id: Array
    policy_version: Array
    turn_index: Array
    ref_logp: Array | None = None
    teacher_logp: Array | None = None
    dropout_keys: Array | None = None
    extras: dict[str, Array] = flax.struct.field(default_factory=dict)
    results: tuple[PromptResult, ...] = flax.struct.field(pytree_node=False, default=())
    texts: tuple[str, ...] = flax.struct.field(pytree_node=False, default=())

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]

    def update_batch(self) -> dict[str, Array]:
        """The arrays the update reads: the required fields, the optional ones present, and
        the extras (a loss reads them by name, e.g. `sc_logp`)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in UPDATE_FIELDS}
        out.update({k: getattr(self, k) for k in OPTIONAL_FIELDS if getattr(self, k) is not None})
        out.update(self.extras)
        return out


def log_rollouts(logger, step: int, exp: Experience, mesh, prompt_of, reward_names, groups=2):
    """The first `groups` groups of this process's rows to `logger` (a RolloutLogger on
    process 0, None elsewhere); every process must call it (it joins a collective)."""
    import jax.numpy as jnp

    from jaxrl_frontier.core import sharding

    seq_adv = exp.advantages.sum(-1) / jnp.maximum(exp.loss_mask.sum(-1), 1)
    adv = sharding.local_rows(seq_adv, mesh)
    if logger is None:
        return
    g = len(exp.texts) // max(len(exp.results), 1)
    for i in range(min(len(exp.texts), groups * g)):
        res = exp.results[i // g]
        logger.write(
            step=step,
            prompt=prompt_of(res.example),
            completion=exp.texts[i],
            rewards=dict(zip(reward_names, map(float, res.rewards[i % g]))),
            advantage=float(adv[i]),
        )
