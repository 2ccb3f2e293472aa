"""The config sections of the RL step: rollouts, the critic and PACT. (`data`, the prompt
batch and its source, is the data layer's: data/defaults.py; `optimizer` is the learner's:
rl/learn/defaults.py; `objective` is the objectives package's: `objectives.default_config`.)"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict


def rollout_section() -> ml_collections.ConfigDict:
    """`rollout`: sampling, role meshes, staleness, speculative rollouts, editors and shaping."""
    s = ml_collections.ConfigDict()
    s.group_size = 8  # G completions per prompt
    s.max_new_tokens = 8
    s.temperature = 1.0
    s.top_k = 0
    s.top_p = 1.0
    s.min_p = 0.0
    s.dropout_rate = 0.0  # Dropout-GRPO: per-rollout fixed MLP dropout mask
    # Roles on devices: 0 = rollouts on the training mesh; N > 0 = the last N devices (N / P
    # per process) form a rollout mesh of shape rollout.mesh, and the weights are resharded
    # to it after each update (docs/scaling.md)
    s.devices = 0
    s.mesh = dict(data=-1, fsdp=1, tensor=1)
    # > 0: batch k+1 is sampled (by the previous weights) while the learner updates on batch
    # k; a batch more than this many policy versions behind the learner is dropped
    s.max_staleness = 0
    # with max_staleness: 0 = the fixed schedule (the batch started at step t is taken at
    # step t + j, lag <= k whatever the speeds, reproducible); Q > 0 = a free-running
    # producer timed by itself keeps up to Q batches queued, each by the newest weights, so
    # a slow learner leaves stale batches (lag > k), which `stale_batches` drops or
    # resamples (not reproducible bit for bit: rl/ahead.py)
    s.free_running_queue = 0
    s.stale_batches = "drop"  # a batch past the bound: 'drop' | 'resample' (its prompts anew)
    # KV cache dtype: None (the compute dtype) | float32 | bfloat16
    s.cache_dtype = config_dict.placeholder(str)
    # the decode in this many phases, each with a cache just large enough for its steps, so
    # a step attends to the filled cache, not the rollout's capacity (sampling/sampler.py
    # decode_windows); each phase is one more trace of the decode step (compile time)
    s.decode_phases = 4
    # continuous batching (sampling/continuous.py): the decode runs this many rows at a time
    # and a row that stops hands its slot to the next pending row at once; on a mesh each
    # device runs its own rows with slots / devices of them; 0: off (every row of the batch
    # decodes together until the longest ends)
    s.continuous_slots = 0
    # partial rollouts (sampling/partial.py; with continuous_slots > 0): while a step's batch
    # decodes, the next batch's rows start in the idle slots, each up to this many tokens,
    # and continue in the next step with the newer weights; each token keeps the version
    # and behaviour log-prob it was sampled with; 0: off
    s.partial_budget = 0
    # speculative rollouts (sampling/speculative.py, one device): the policy's first `draft`
    # layers propose k tokens a round, the policy verifies them in one forward and rejection
    # sampling keeps its distribution exactly; draft None: off (the plain sampler)
    s.speculative = dict(draft=config_dict.placeholder(int), k=4)
    # rollout editors and reward shaping (rl/produce/editors.py): editor names in editing.EDITORS, e.g.
    # ('dre',); DAPO's masking of completions cut off by the budget and its soft overlong
    # penalty over the last overlong_cache tokens of max_new_tokens (0: off); DRE's bonus
    s.editors = ()
    s.mask_truncated = False
    s.overlong_cache = 0
    s.dre_bonus = 0.1
    # SC-GRPO's self-conditioned pass: vocabulary entries per chunk of its KL sum
    s.sc_vocab_chunk = 2048
    return s


def critic_section() -> ml_collections.ConfigDict:
    """`critic`: PPO's learned critic (none by default)."""
    # PPO's learned critic (rl/methods/ppo.py, rl/methods/critic.py): kind none | head (a value head on the
    # policy's final hidden states) | model (a small separate transformer); it goes with
    # objective.advantage = 'gae': per-token GAE on its values over the policy tokens, a
    # clipped value loss (value_clip; 0: unclipped) weighted by value_coef, its own Adam
    # (lr; None: optimizer.lr). whiten: advantages scaled to zero mean, unit variance over
    # the batch's policy tokens. stop_gradient: the head's value loss leaves the policy's
    # trunk alone. hidden_size / num_layers: the separate model's size.
    s = ml_collections.ConfigDict(
        dict(kind="none", gamma=1.0, lam=0.95, value_clip=0.2, value_coef=0.5)
    )
    s.lr = config_dict.placeholder(float)
    s.update(whiten=True, stop_gradient=False, hidden_size=64, num_layers=2)
    return s


def pact_section() -> ml_collections.ConfigDict:
    """`pact`: PACT's expert traces in the update (off by default)."""
    # PACT (rl/methods/pact.py): rollouts stay prompt-only; each prompt's expert trace (a
    # pact.TRACE_SOURCES name: 'calculator', 'answer') enters the update as a context after
    # the prompt, scoring the rollout (trace_coef x the trace-conditioned surrogate), and as
    # SFT targets (component weights; sft_coef annealed to 0 over anneal_steps by schedule)
    s = ml_collections.ConfigDict(
        dict(enabled=False, source="calculator", context="expert solution: {trace}\n")
    )
    s.update(trace_coef=0.5, sft_coef=0.2, anneal_steps=200, schedule="linear")
    s.weights = dict(reasoning=0.5, tool_call=1.0, answer=1.0)
    s.update(context_len=96, trace_len=64)
    return s


# The rollout keys the sampler takes as traced values (`sampling.Knobs`): a schedule or a
# controller may move them during a run without compiling again (run/knobs.py).
TRACED_ROLLOUT_KEYS = ("temperature", "top_p", "min_p")


# The allowed values of this layer's keys with a closed set of them (run/config.py checks).
CHOICES: dict[str, tuple] = {
    "pact.schedule": ("linear", "cosine", "constant"),
    "rollout.cache_dtype": (None, "float32", "bfloat16"),
    "critic.kind": ("none", "head", "model"),
    "rollout.stale_batches": ("drop", "resample"),
}

# This layer's numeric keys: (low, high, low inclusive, high inclusive); None = open.
RANGES: dict[str, tuple] = {
    "rollout.group_size": (0, None, False, None),
    "rollout.max_new_tokens": (0, None, False, None),
    "rollout.temperature": (0, None, False, None),  # > 0 (greedy decoding is its own flag)
    "rollout.top_k": (0, None, True, None),  # 0: off
    "rollout.top_p": (0, 1, False, True),
    "rollout.min_p": (0, 1, True, False),
    "rollout.dropout_rate": (0, 1, True, False),
    "rollout.decode_phases": (1, None, True, None),
    "rollout.continuous_slots": (0, None, True, None),
    "rollout.partial_budget": (0, None, True, None),
    "rollout.free_running_queue": (0, None, True, None),
    "rollout.speculative.k": (0, None, False, None),
    "rollout.sc_vocab_chunk": (0, None, False, None),
    "critic.gamma": (0, 1, True, True),
    "critic.lam": (0, 1, True, True),
    "critic.value_clip": (0, None, True, None),  # 0: the unclipped value loss
    "critic.value_coef": (0, None, False, None),
    "critic.hidden_size": (0, None, False, None),
    "critic.num_layers": (0, None, False, None),
}
