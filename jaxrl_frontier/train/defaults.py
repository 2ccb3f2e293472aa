"""The config sections every run shares: `train` (the loop's schedule and stop rules) and `eval`."""

from __future__ import annotations

import dataclasses

import ml_collections
from ml_collections import config_dict

from jaxrl_frontier.train.writers import WANDB_MODES, MetricsOptions


def train_section() -> ml_collections.ConfigDict:
    """`train`: steps, passes over each batch, logging, eval, checkpoints, stop rules, export."""
    s = ml_collections.ConfigDict()
    s.steps = 100
    # the steps a schedule with steps=0 spans (schedules.*, train/schedules.py); 0: train.steps.
    # Set it to extend a run, or run a campaign's segments (which set it), on one curve.
    s.horizon = 0
    s.epochs = 1  # passes over each rollout batch (PPO epochs)
    s.minibatches = 1  # optimizer steps per epoch
    s.recompute_old_logp = False  # True: old log-probs from a trainer forward, not the sampler
    # log the train/rollout log-prob mismatch (rollout/logp_mismatch_*) at every step: free
    # with recompute_old_logp; otherwise one more policy forward a step (rl/diagnostics.py)
    s.measure_mismatch = False
    # RL: each group's prompt runs through the model once, not once per completion, in the
    # update and the reference/teacher log-probs (same values; the prompt's FLOPs / group
    # size). Minibatches are then drawn as whole groups. Off by itself when a microbatch
    # (rows / minibatches / grad_accum) is not whole groups that split evenly over the
    # batch devices (mesh data x fsdp).
    s.share_prompt_forward = True
    # RL: > 0 packs the update's rows (and the behaviour / reference / teacher log-prob
    # passes') without their padding, first-fit decreasing, into buffer rows of this many
    # tokens (at least the longest row; rl/learn/packing.py); 0: padded rows. Not with
    # share_prompt_forward (set it False), Dropout-GRPO, a critic or PACT.
    s.pack_tokens = 0
    # with pack_tokens: > 0 splits each minibatch into microbatches of about this many tokens
    # (whole packed rows; the summed gradient is the minibatch's) instead of
    # optimizer.grad_accum equal row counts; 0: optimizer.grad_accum
    s.microbatch_tokens = 0
    s.log_every = 10
    s.eval_every = 50
    s.checkpoint_every = 50
    s.keep_checkpoints = 2
    s.rollout_log_every = 50
    s.sft_batch = 64  # sequences per SFT step
    # > 0: finish once held-out greedy pass@1 reaches this (checked at each eval); e.g. an
    # SFT warm start that should hand RL a policy near 50%, whatever the learning curve.
    s.stop_at_pass1 = 0.0
    # this many updates in a row skipped for a non-finite loss / gradient stop the run with an
    # error and no export (a diverged run otherwise exits 0 with broken weights); 0: never
    s.max_skipped_updates = 10
    # a step (or the save, eval after it) running longer than this many seconds is a hang:
    # every thread's stack goes to <workdir>/hang-<process>.txt, the phase it was in is named,
    # and the process exits non-zero for a restart to take over (train/watchdog.py); 0: off
    s.hang_timeout_s = 0.0
    # keep the optimizer state (Adam's mu, nu) in pinned host memory between updates, on
    # backends with a separate host memory (TPU, GPU; not CPU): train_step.optimizer_memory_kind
    s.offload_optimizer = False

    # Reward scoring (data/rewards/scorer.py). scorer: auto (the task's choice) | in_process | sandboxed
    # (each completion run as a program in a locked-down subprocess: data/rewards/sandbox.py). A reward
    # that fails on every completion for max_failure_steps steps in a row stops the run (0:
    # never). The limits apply per completion in the sandbox.
    # the policy exported at the end: 'last', or 'best' (exported at each new best eval of
    # train.collapse.metric). collapse.stop: the rise-and-collapse early stop (rl/diagnostics.py)
    s.export = "last"
    s.collapse = dict(stop=False, metric="eval/pass@1_greedy", rise=0.05, drop=0.05, patience=2)
    return s


def metrics_section() -> ml_collections.ConfigDict:
    """`metrics`: where the logged scalars go (train/writers.py). writers: 'tensorboard'
    (event files), 'jsonl' (metrics.jsonl), 'console' (a line per log step on stdout), 'wandb'
    (Weights & Biases; `pip install 'jaxrl_frontier[wandb]'`). flush_secs: TensorBoard's flush
    interval. wandb: project; name ('': the run directory's name); entity ('': the API key's
    default); mode ('' = $WANDB_MODE, else online with $WANDB_API_KEY set, else offline: no
    network, `wandb sync` uploads later); dir ('': the run directory)."""
    defaults = dataclasses.asdict(MetricsOptions())  # one place for the defaults
    return ml_collections.ConfigDict(defaults)


def knob_section() -> ml_collections.ConfigDict:
    """`schedules` and `controllers` (each its own copy): one unset entry per key a run may
    move as it trains (run/knobs.py): the objective's coefficients and float weight knobs,
    the rollout's temperature, top_p and min_p. An entry is a spec: a string
    ('cosine(0.05, 0.005)', 'adaptive_kl(target=0.02)') or a dict with 'kind'
    (train/schedules.py, train/controllers.py)."""
    from jaxrl_frontier.objectives import losses
    from jaxrl_frontier.rl.defaults import TRACED_ROLLOUT_KEYS

    unset = lambda keys: ml_collections.ConfigDict(
        {k: config_dict.placeholder(object) for k in keys}
    )
    s = ml_collections.ConfigDict()
    keys = losses.traced_keys()
    s.objective = unset([k for k in keys if "." not in k])
    s.objective.weight_kwargs = unset([k.split(".", 1)[1] for k in keys if "." in k])
    s.rollout = unset(TRACED_ROLLOUT_KEYS)
    return s


# The allowed values of this layer's keys with a closed set of them (run/config.py checks).
CHOICES: dict[str, tuple] = {
    "train.export": ("last", "best"),
    "metrics.wandb.mode": WANDB_MODES,
}

# This layer's numeric keys: (low, high, low inclusive, high inclusive); None = open.
RANGES: dict[str, tuple] = {
    "train.steps": (0, None, False, None),
    "train.horizon": (0, None, True, None),
    "train.epochs": (0, None, False, None),
    "train.minibatches": (0, None, False, None),
    "train.log_every": (0, None, False, None),
    "train.eval_every": (0, None, False, None),
    "train.checkpoint_every": (0, None, False, None),
    "train.keep_checkpoints": (0, None, False, None),
    "train.rollout_log_every": (0, None, False, None),
    "train.sft_batch": (0, None, False, None),
    "train.stop_at_pass1": (0, 1, True, True),
    "train.max_skipped_updates": (0, None, True, None),
    "train.pack_tokens": (0, None, True, None),
    "train.microbatch_tokens": (0, None, True, None),
    "train.hang_timeout_s": (0, None, True, None),
    "metrics.flush_secs": (0, None, False, None),
}
