"""Shared starting points for the experiment files in `configs/`.

Each `configs/*.py` calls one of these and overrides what its method changes, so a method's
file reads as its difference from GRPO. `runlocal=True` shrinks everything so the same
file runs in seconds (tests run every config this way).
"""

from __future__ import annotations

import inspect

import ml_collections

from jaxrl_frontier.config import base_config

# Zero-padded operands put each digit at a fixed position: a 2-layer model learns the
# carries several times faster than from variable-width operands.
ARITH_TASK = dict(max_digits=3, ops="+", prompt_template="{a:03d}{op}{b:03d}=")


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


def arithmetic_opd(teacher_path: str = "runs/teacher_arith") -> ml_collections.ConfigDict:
    """On-policy distillation on arithmetic: a teacher run's export scores the student's
    own samples; the per-token advantage is l_teacher - l_student (the `opd` estimator)."""
    c = arithmetic("rl")
    c.teacher.update(init="checkpoint", path=teacher_path)
    c.objective.update(advantage="opd", weight="pg", aggregation="token_mean")
    c.objective.advantage_kwargs = dict(estimator="immediate")
    c.optimizer.update(lr=1e-4, warmup_steps=5)
    c.train.update(steps=200, minibatches=1, log_every=10, eval_every=50, checkpoint_every=50)
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
    c.optimizer.grad_accum = 1
    c.train.minibatches = min(c.train.minibatches, 2)  # 16 rollouts / 2 = 8 (8 fake devices)
    c.train.update(
        steps=4, log_every=2, eval_every=2, checkpoint_every=2, rollout_log_every=2, sft_batch=16
    )
    c.eval.update(num_prompts=8, batch=8, pass_k=2)
    return c


def _keyword_defaults(fn, skip: int = 0) -> dict:
    """Keyword parameters of `fn` with non-None defaults (after `skip` positionals)."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    return {
        p.name: p.default
        for p in params
        if p.default is not inspect.Parameter.empty
        and p.default is not None
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def _task_defaults(name: str) -> dict:
    from jaxrl_frontier.tasks import TASKS

    out: dict = {}
    for klass in reversed(TASKS.get(name).__mro__):  # subclass defaults win
        if "__init__" in vars(klass):
            out.update(_keyword_defaults(klass.__init__, skip=1))
    return out


def with_defaults(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Spell out every hyperparameter of the chosen task / advantage / weight / aggregation.

    Free-form kwargs blocks then list every knob with its default, so a sweep can override
    any of them from the command line (`--config.objective.weight_kwargs.eps_high=0.28`);
    ml_collections cannot add a key that the file did not define.
    """
    from jaxrl_frontier.objectives import advantages, losses, weights

    def fill(block: ml_collections.ConfigDict, defaults: dict) -> ml_collections.ConfigDict:
        merged = dict(defaults)
        merged.update(block.to_dict())
        return ml_collections.ConfigDict(merged)

    o = c.objective
    c.task.kwargs = fill(c.task.kwargs, _task_defaults(c.task.name))
    o.weight_kwargs = fill(o.weight_kwargs, _keyword_defaults(weights.WEIGHTS.get(o.weight), 2))
    o.aggregation_kwargs = fill(
        o.aggregation_kwargs, _keyword_defaults(losses.AGGREGATIONS.get(o.aggregation), 2)
    )
    o.advantage_kwargs = fill(
        o.advantage_kwargs, _keyword_defaults(advantages.ADVANTAGES.get(o.advantage), 1)
    )
    return c


def finish(c: ml_collections.ConfigDict, arg: str | None) -> ml_collections.ConfigDict:
    """End of every get_config: the runlocal variant, then every knob spelled out."""
    if arg not in (None, "", "runlocal"):
        raise ValueError(f"get_config: unknown variant {arg!r}; allowed: runlocal")
    if arg == "runlocal":
        shrink(c)
    return with_defaults(c)
