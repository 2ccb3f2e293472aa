"""What a part of a run supports, declared as data on its class (`capabilities = ...`).

A producer, a prompt source, a rollout editor, a sampler and the loop's rollouts-ahead
scheduler each state the run features they cannot serve and why; `run/config/parts.py` composes a
run's parts from its config (registry lookups, no instances) and raises one `ConfigError`
naming each key whose part lacks what the run needs. A new mode is one declaration per part.
"""

from __future__ import annotations

import dataclasses

# The features a run may need of its parts.
FEATURES = {
    "partial_rows": "the next batch's rows begun in this step's decode (rollout.partial_budget)",
    "process_local": "rollouts in a background thread that talks to no other process "
    "(rollout.max_staleness on several processes)",
    "free_running": "a producer timed by itself beside the main loop (rollout.free_running_queue)",
    "keeps_rows_in_flight": "batches produced ahead saved whole with a checkpoint",
    "multi_process": "several processes",
    "stages": "config.stages switching keys at chosen steps",
    "environment": "episodes of a multi-turn environment (env.name)",
    "population": "members trained side by side in one process (population.*)",
    "packed_rows": "the update's rows packed without their padding (train.pack_tokens)",
    "sequence_axis": "each row's positions split over mesh.sequence (context parallelism)",
    "several_teachers": "each row scored by the teacher its example's tag names (teacher.by_tag)",
    "teacher_tokenizer": "a teacher reading the completion in its own tokens (teacher.tokenizer)",
    # asked of the sampler alone, where it is built (sampling/factory.py)
    "dropout_masks": "Dropout-GRPO's per-row MLP masks (rollout.dropout_rate)",
    "speculative_draft": "a draft's tokens verified by the policy (rollout.speculative.draft)",
    "routing_record": "each token's experts recorded as it is sampled (routing replay)",
}


def refusal(subject: str, rows) -> str:
    """The one-line refusal of the key `subject` ("'data.source' = 'dynamic'") by each row
    ("key (why)") in its way."""
    return f"config key {subject} does not go with: " + "; ".join(rows)


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """The features a part lacks, each with why (every other feature in FEATURES it supports).

    >>> Capabilities.all_but(partial_rows="it draws more prompts within a step").supports(
    ...     "partial_rows")
    False
    """

    lacks: tuple[tuple[str, str], ...] = ()

    @classmethod
    def all_but(cls, **why_not: str) -> Capabilities:
        unknown = set(why_not) - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown features {sorted(unknown)}; known: {', '.join(FEATURES)}")
        return cls(tuple(sorted(why_not.items())))

    def supports(self, feature: str) -> bool:
        if feature not in FEATURES:
            raise ValueError(f"unknown feature {feature!r}; known: {', '.join(FEATURES)}")
        return feature not in dict(self.lacks)

    def why_not(self, feature: str) -> str:
        """Why this part lacks `feature` ('' when it supports it)."""
        return dict(self.lacks).get(feature, "")


ALL = Capabilities()  # a part that supports every feature
