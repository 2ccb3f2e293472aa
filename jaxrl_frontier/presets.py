"""Shared starting points for the experiment files in `configs/`.

Each `configs/*.py` calls one of these and overrides what its method changes, so a method's
file reads as its difference from GRPO. `runlocal=True` shrinks everything so the same
file runs in seconds (tests run every config this way).
"""

from __future__ import annotations

import ml_collections

from jaxrl_frontier.config import base_config

ARITH_TASK = dict(max_digits=3, ops="+")


def arithmetic(mode: str, runlocal: bool = False) -> ml_collections.ConfigDict:
    """3-digit addition with a 2-layer d=128 char model (the README's main job)."""
    c = base_config()
    c.mode = mode
    c.task.name = "arithmetic"
    c.task.kwargs = dict(ARITH_TASK)
    c.data.update(prompt_batch=16, max_prompt_len=9)  # BOS + "123+456="
    c.rollout.update(group_size=8, max_new_tokens=6)  # up to 4 digits + EOS
    c.model.update(
        hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4, num_kv_heads=2
    )
    if mode == "rl":
        c.model.init = "checkpoint"
        c.model.path = "runs/sft_arith"
    if runlocal:
        shrink(c)
    return c


def shrink(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The `runlocal` variant: a tiny model from scratch, a few steps, small eval."""
    c.model.init = "scratch"
    c.model.path = ""
    c.model.update(hidden_size=32, intermediate_size=64)
    if c.teacher.init != "none":  # a random teacher of the same shape: exercises the OPD path
        c.teacher.init = "scratch"
        c.teacher.path = ""
    c.data.prompt_batch = 4
    c.rollout.group_size = 4
    c.train.update(
        steps=4, log_every=2, eval_every=2, checkpoint_every=2, rollout_log_every=2, sft_batch=16
    )
    c.eval.update(num_prompts=8, batch=8, pass_k=2)
    return c
