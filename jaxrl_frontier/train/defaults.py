"""The `train` config section: the loop's schedule, passes over each batch, logging, eval,
checkpoints, stop rules and export. (`eval` is `evaluation.EvalSection`, `metrics` is
`writers.MetricsOptions`, `train.collapse` is `collapse.CollapseSection`.)"""

from __future__ import annotations

import dataclasses

from jaxrl_frontier.core import records
from jaxrl_frontier.core.records import key, section
from jaxrl_frontier.train.collapse import CollapseSection


@dataclasses.dataclass(frozen=True)
class TrainSection:
    """`train`. horizon: the steps a schedule with steps=0 spans (schedules.*,
    train/schedules.py); set it to extend a run, or run a campaign's segments (which set it),
    on one curve. measure_mismatch: log the train/rollout log-prob mismatch
    (rollout/logp_mismatch_*) at every step: free with recompute_old_logp, otherwise one more
    policy forward a step (rl/diagnostics.py). share_prompt_forward (RL): each group's prompt
    runs through the model once, not once per completion, in the update and the
    reference/teacher log-probs (same values; the prompt's FLOPs / group size); minibatches
    are then whole groups; off by itself when a microbatch (rows / minibatches / grad_accum)
    is not whole groups that split evenly over the batch devices (mesh data x fsdp).
    pack_tokens (RL): > 0 packs the update's rows (and the behaviour / reference / teacher
    log-prob passes') without their padding, first-fit decreasing, into buffer rows of this
    many tokens (at least the longest row; rl/learn/packing.py); 0: padded rows; not with
    share_prompt_forward, Dropout-GRPO, a critic or PACT. microbatch_tokens, with
    pack_tokens: > 0 splits each minibatch into microbatches of about this many tokens
    (whole packed rows; the summed gradient is the minibatch's) instead of
    optimizer.grad_accum equal row counts. stop_at_pass1 > 0: finish once held-out greedy
    pass@1 reaches it (checked at each eval), e.g. an SFT warm start that should hand RL a
    policy near 50%. max_skipped_updates: that many updates in a row skipped for a
    non-finite loss / gradient stop the run with an error and no export (a diverged run
    otherwise exits 0 with broken weights). hang_timeout_s: a step (or the save, eval after
    it) running longer is a hang: every thread's stack goes to <workdir>/hang-<process>.txt,
    the phase it was in is named, and the process exits non-zero for a restart to take over
    (train/watchdog.py). offload_optimizer: the optimizer state (Adam's mu, nu) in pinned
    host memory between updates, on backends with a separate host memory (TPU, GPU; not
    CPU): train_step.optimizer_memory_kind. export: the policy exported at the end, 'last'
    or 'best' (at each new best eval of train.collapse.metric)."""

    steps: int = key(100, "RL or SFT steps", low=0, low_open=True)
    horizon: int = key(0, "the steps a schedule spans (0: steps)", low=0)
    epochs: int = key(1, "passes over each rollout batch (PPO epochs)", low=0, low_open=True)
    minibatches: int = key(1, "optimizer steps per epoch", low=0, low_open=True)
    recompute_old_logp: bool = key(False, "old log-probs from a trainer forward, not the sampler")
    measure_mismatch: bool = key(False, "log the train/rollout log-prob mismatch every step")
    share_prompt_forward: bool = key(True, "a group's prompt through the model once")
    pack_tokens: int = key(0, "packed buffer rows' tokens (0: padded rows)", low=0)
    microbatch_tokens: int = key(0, "packed microbatches' tokens (0: grad_accum)", low=0)
    log_every: int = key(10, "steps between metric lines", low=0, low_open=True)
    eval_every: int = key(50, "steps between evals", low=0, low_open=True)
    checkpoint_every: int = key(50, "steps between checkpoints", low=0, low_open=True)
    keep_checkpoints: int = key(2, "checkpoints kept", low=0, low_open=True)
    rollout_log_every: int = key(50, "steps between logged rollouts", low=0, low_open=True)
    sft_batch: int = key(64, "sequences per SFT step", low=0, low_open=True)
    stop_at_pass1: float = key(0.0, "finish at this held-out pass@1 (0: never)", low=0, high=1)
    max_skipped_updates: int = key(10, "skipped updates in a row that stop a run (0: never)", low=0)
    hang_timeout_s: float = key(0.0, "seconds a step may take before it is a hang (0: off)", low=0)
    offload_optimizer: bool = key(False, "the optimizer state in pinned host memory")
    export: str = key("last", "the policy exported: last | best", choices=("last", "best"))
    collapse: CollapseSection = section(CollapseSection, "the rise-and-collapse early stop")

    def __post_init__(self):
        records.check(self, "train")
