"""The `rollout` config section: sampling, the rollout mesh, staleness, continuous batching,
partial and speculative rollouts, editors and shaping. Declared here, the lowest layer that
reads it (`factory.make_sampler`); the RL step's parts read their keys from the same record."""

from __future__ import annotations

import dataclasses

from jaxrl_frontier.core import records
from jaxrl_frontier.core.records import key, section

# The rollout keys the sampler takes as traced values (`sampling.Knobs`): a schedule or a
# controller may move them during a run without compiling again (run/knobs.py).
TRACED_ROLLOUT_KEYS = ("temperature", "top_p", "min_p")


@dataclasses.dataclass(frozen=True)
class RolloutMeshSection:
    """`rollout.mesh`: the rollout mesh's axes (with rollout.devices > 0; -1: the rest)."""

    data: int = key(-1, "data-parallel devices")
    fsdp: int = key(1, "devices the weights are split over")
    tensor: int = key(1, "devices each matmul is split over")


# `rollout.speculative.draft`: the checkpoint's multi-token-prediction module drafts
MTP_DRAFT = "mtp"


@dataclasses.dataclass(frozen=True)
class SpeculativeSection:
    """`rollout.speculative`: speculative rollouts (sampling/speculative.py, one device): a
    draft (the policy's first `draft` layers, or with 'mtp' the policy checkpoint's
    multi-token-prediction module) proposes k tokens a round, the policy verifies them in
    one forward and rejection sampling keeps its distribution exactly."""

    draft: int | str | None = key(
        None, "N: the policy's first N layers; 'mtp': its checkpoint's MTP module; None: off"
    )
    k: int = key(4, "tokens proposed a round", low=0, low_open=True)

    def __post_init__(self):
        d = self.draft
        if not (d is None or d == MTP_DRAFT or (type(d) is int and d >= 1)):
            raise ValueError(
                f"config key 'rollout.speculative.draft' = {d!r}; allowed: None (off), a "
                f"number of the policy's layers >= 1, or {MTP_DRAFT!r}"
            )


@dataclasses.dataclass(frozen=True)
class RolloutSection:
    """`rollout`. devices: 0 = rollouts on the training mesh; N > 0 = the last N devices (N /
    P per process) form a rollout mesh of shape rollout.mesh, and the weights are resharded
    to it after each update (docs/scaling.md). max_staleness > 0: batch k+1 is sampled (by
    the previous weights) while the learner updates on batch k; a batch more than this many
    policy versions behind the learner is dropped. free_running_queue, with max_staleness:
    0 = the fixed schedule (the batch started at step t is taken at step t + j, lag <= k
    whatever the speeds, reproducible); Q > 0 = a free-running producer timed by itself
    keeps up to Q batches queued, each by the newest weights, so a slow learner leaves stale
    batches (lag > k), which `stale_batches` drops or resamples (not reproducible bit for
    bit: rl/ahead.py). decode_phases: the decode in this many phases, each with a cache just
    large enough for its steps, so a step attends to the filled cache, not the rollout's
    capacity (sampling/sampler.py decode_windows); each phase is one more trace of the
    decode step. continuous_slots (sampling/continuous.py): the decode runs this many rows
    at a time and a row that stops hands its slot to the next pending row at once; on a mesh
    each device runs its own rows with slots / devices of them; 0: off. partial_budget
    (sampling/partial.py; with continuous_slots > 0): while a step's batch decodes, the next
    batch's rows start in the idle slots, each up to this many tokens, and continue in the
    next step with the newer weights; each token keeps the version and behaviour log-prob it
    was sampled with; 0: off. Editors and shaping (rl/produce/editors.py): editor names in
    editing.EDITORS, e.g. ('dre',); DAPO's masking of completions cut off by the budget and
    its soft overlong penalty over the last overlong_cache tokens of max_new_tokens (0:
    off); DRE's bonus. ignore_eos: no completion stops at a stop token (as vLLM's
    `ignore_eos`): each is max_new_tokens long, so a benchmark's sides do the same work
    (benchmarks/rl.py `--completions full`); a training run keeps it off. dtype: the
    sampler computes in it (rollouts and evaluation), its KV cache too unless cache_dtype
    says otherwise; 'bfloat16' with model.dtype 'float32' samples from the weights rounded
    to bf16 while the learner stays in f32, the gap the learner's log-probs see (its cost
    in mismatch: docs/performance.md; `objective.weight = 'tis'` corrects it)."""

    group_size: int = key(8, "G completions per prompt", low=0, low_open=True)
    max_new_tokens: int = key(8, "a completion's tokens, at most", low=0, low_open=True)
    ignore_eos: bool = key(
        False, "run every completion to max_new_tokens, past EOS and the turn's end token"
    )
    # > 0 (greedy decoding is its own flag)
    temperature: float = key(1.0, "the sampling temperature", low=0, low_open=True)
    top_k: int = key(0, "keep the k likeliest tokens (0: off)", low=0)
    top_p: float = key(1.0, "nucleus sampling's mass", low=0, high=1, low_open=True)
    min_p: float = key(
        0.0, "drop tokens below min_p x the likeliest's", low=0, high=1, high_open=True
    )
    dropout_rate: float = key(
        0.0, "Dropout-GRPO: a rollout's fixed MLP dropout", low=0, high=1, high_open=True
    )
    devices: int = key(0, "devices of the rollout mesh (0: the training mesh)")
    mesh: RolloutMeshSection = section(RolloutMeshSection, "the rollout mesh's axes")
    max_staleness: int = key(0, "policy versions a batch may lag (0: on-policy)")
    free_running_queue: int = key(0, "batches a free-running producer keeps queued", low=0)
    stale_batches: str = key(
        "drop", "a batch past the bound: drop | resample", choices=("drop", "resample")
    )
    cache_dtype: str | None = key(
        None,
        "the KV cache's dtype (None: the compute dtype)",
        choices=(None, "float32", "bfloat16"),
    )
    dtype: str | None = key(
        None,
        "the sampler's compute dtype, its weights cast once a rollout (None: model.dtype)",
        choices=(None, "float32", "bfloat16"),
    )
    decode_phases: int = key(4, "phases of the decode, each its own cache size", low=1)
    continuous_slots: int = key(0, "continuous batching's rows at a time (0: off)", low=0)
    partial_budget: int = key(0, "partial rollouts' tokens a row a step (0: off)", low=0)
    speculative: SpeculativeSection = section(SpeculativeSection, "speculative rollouts")
    editors: tuple = key((), "rollout editors (editing.EDITORS names)")
    mask_truncated: bool = key(False, "DAPO: mask completions cut off by the budget")
    overlong_cache: int = key(0, "DAPO: the soft overlong penalty's tokens (0: off)")
    dre_bonus: float = key(0.1, "DRE's bonus")
    sc_vocab_chunk: int = key(
        2048, "SC-GRPO: vocabulary entries per chunk of its KL sum", low=0, low_open=True
    )

    def __post_init__(self):
        records.check(self, "rollout")
