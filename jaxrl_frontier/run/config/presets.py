"""Shared starting points for the experiment files in `configs/`.

Each `configs/*.py` calls one of these and overrides what its method changes, so a method's
file reads as its difference from GRPO. `runlocal=True` shrinks everything so the same
file runs in seconds (tests run every config this way).
"""

from __future__ import annotations

import inspect
import os
import typing

import ml_collections
from ml_collections import config_dict

from jaxrl_frontier.run.config import base_config

# Zero-padded operands put each digit at a fixed position: a 2-layer model learns the
# carries several times faster than from variable-width operands.
ARITH_TASK = dict(max_digits=3, ops="+", prompt_template="{a:03d}{op}{b:03d}=")
# The runlocal variants' arithmetic: 1-digit addition, which a d=32 model half learns in
# 250 SFT steps (the warm start its RL variants begin from).
RUNLOCAL_ARITH_TASK = dict(max_digits=1, ops="+", prompt_template="{a}{op}{b}=")
# The calculator runlocal's word problems: numbers up to 2, so a few answers cover most
# problems (6 on 41%, 4 on 20%) and its warm start, which answers at once with one of the
# commonest, is right on about a quarter: groups disagree
RUNLOCAL_CALCULATOR_ENV = dict(max_number=2)
CALCULATOR_WARM_ANSWERS = (6, 4, 1, 2)
# Tiny SFT policies (scripts/make_warm_starts.py) the runlocal RL variants start from, so their
# groups disagree and a two-step run trains: task family -> directory under the repository.
WARM_STARTS_DIR = os.path.join("data", "warm_starts")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


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


def code(mode: str) -> ml_collections.ConfigDict:
    """The code problems (data/code_problems.jsonl, scored in the sandbox) with the same
    2-layer d=128 char model: prompts of up to 64 characters, completions of up to 40."""
    c = arithmetic(mode)
    c.task.name = "code_problems"
    c.task.kwargs = dict()
    c.data.update(prompt_batch=8, max_prompt_len=72)
    c.rollout.update(group_size=8, max_new_tokens=40)
    c.rewards.update(workers=4, cpu_seconds=2.0, wall_seconds=5.0)
    if mode == "rl":
        c.model.path = "runs/sft_code"
    return c


def sft_start(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The SFT recipe of an RL start: lr 3e-3, stop at the first eval with greedy pass@1
    >= 30%. The phase transition where the carries click comes at a different step with
    every float rounding; the start of RL should not."""
    c.optimizer.update(lr=3e-3, warmup_steps=50, schedule="constant")
    c.train.update(
        steps=1500,
        sft_batch=128,
        log_every=20,
        eval_every=20,
        checkpoint_every=100,
        stop_at_pass1=0.3,
    )
    c.eval.update(num_prompts=128, batch=128, pass_k=1)
    return c


def sft_teacher(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The SFT recipe of an OPD teacher: 4 layers, d=256, MLP 768, 8 heads (3.16M parameters,
    ~8x the 2-layer student), lr 1e-3 with a cosine decay (a larger model wants a smaller
    step than sft_start's 3e-3), until 90% greedy pass@1 on 256 held-out prompts (evaluated
    every 250 steps) or 4,000 steps of 128 demonstrations."""
    c.model.update(
        hidden_size=256, intermediate_size=768, num_layers=4, num_heads=8, num_kv_heads=4
    )
    c.optimizer.update(lr=1e-3, warmup_steps=100, schedule="cosine")
    c.train.update(
        steps=4000,
        sft_batch=128,
        log_every=50,
        eval_every=250,
        checkpoint_every=250,
        stop_at_pass1=0.9,
    )
    c.eval.update(num_prompts=256, batch=128, pass_k=1)
    return c


def column_addition(mode: str) -> ml_collections.ConfigDict:
    """The same model on 3-digit addition worked column by column (data/tasks/column_addition.py):
    completions of 32 tokens instead of 6, for claims about where along a completion a
    signal lands."""
    c = arithmetic(mode)
    c.task.name = "column_addition"
    c.task.kwargs = dict(digits=3)
    c.rollout.max_new_tokens = 32  # 3 blocks "x+y+c=ss," + a 4-digit sum + EOS
    if mode == "rl":
        c.model.path = "runs/sft_column_addition"
    return c


def arithmetic_opd(
    teacher_path: str = "runs/teacher_arith", task: str = "arithmetic"
) -> ml_collections.ConfigDict:
    """On-policy distillation on arithmetic: a teacher run's export scores the student's
    own samples; the per-token advantage is l_teacher - l_student (the `opd` estimator).
    `task`: "arithmetic" (6-token answers) or "column_addition" (32-token worked sums)."""
    c = {"arithmetic": arithmetic, "column_addition": column_addition}[task]("rl")
    c.teacher.update(init="checkpoint", path=teacher_path)
    c.objective.update(advantage="opd", weight="pg", aggregation="token_mean")
    c.objective.advantage_kwargs = dict(estimator="immediate")
    c.optimizer.update(lr=1e-4, warmup_steps=5)
    c.train.update(steps=200, minibatches=1, log_every=10, eval_every=50, checkpoint_every=50)
    return c


# A 3x3 frozen lake as the classic one (start top-left, goal bottom-right, holes by seed), one
# agent, moves as words (a uniformly random mover succeeds in 6.2% of 6-turn episodes, one
# that only moves right or down in 58%); the observation ends in "move:", the policy's turn
# follows (EOS ends it).
FROZENLAKE_ENV = dict(size=3, num_agents=1, hole_density=0.1, min_goal_distance=2, corners=True)
MOVE_WORDS = ("up", "down", "left", "right")


def frozenlake(mode: str) -> ml_collections.ConfigDict:
    """Multi-turn episodes of the grid world (data/envs/gridworld.py) with a 2-layer d=128 char
    model: 6 turns of at most 8 tokens; RL starts from the SFT warm start that clones a
    uniformly random mover (configs/sft_frozenlake.py)."""
    c = base_config()
    c.mode = mode
    c.env.update(
        name="gridworld",
        max_turns=6,
        turn_tokens=8,
        obs_tokens=56,
        observation_template="{observation}move:",
        demonstrations=MOVE_WORDS,
    )
    c.env.kwargs = dict(FROZENLAKE_ENV)
    c.data.update(prompt_batch=8, max_prompt_len=56)  # BOS + a board + its last line
    c.rollout.update(group_size=8, max_new_tokens=8, temperature=1.0)
    c.model.update(
        hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4, num_kv_heads=2,
        max_position_embeddings=512,
    )  # fmt: skip
    c.objective.reward_weights = {"return": 1.0}
    if mode == "rl":
        c.model.init = "checkpoint"
        c.model.path = "runs/sft_frozenlake"
    return c


def warm_start(c: ml_collections.ConfigDict) -> str | None:
    """The warm start (data/warm_starts/<name>) of an RL config's runlocal variant: its task
    family's tiny SFT policy, or None where there is none (the run starts from scratch)."""
    if c.mode != "rl":
        return None
    if c.env.name == "gridworld":
        name = "frozenlake"
    elif c.env.name == "calculator":
        name = "calculator"
    else:
        name = {
            "arithmetic": "arith1",
            "code_problems": "code",
            "countdown": "countdown",
            "jsonl_math": "math",
        }.get(c.task.name)
    path = name and os.path.join(REPO, WARM_STARTS_DIR, name)
    return path if path and os.path.isdir(path) else None


def shrink(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The `runlocal` variant: a tiny model (from its task's warm start in RL, so groups
    disagree and the update is not 0), a few steps, small eval, the stages from step 1 on."""
    if c.task.name == "arithmetic" and not c.env.name:
        c.task.kwargs = dict(RUNLOCAL_ARITH_TASK)
    if c.env.name == "calculator":
        c.env.kwargs = dict(c.env.kwargs, **RUNLOCAL_CALCULATOR_ENV)
    start = warm_start(c)
    c.model.init = "checkpoint" if start else "scratch"
    c.model.path = start or ""
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
    if c.get("stages"):  # stage i from step i + 1: a short run crosses the first boundary
        c.stages = tuple(dict(s, step=i + 1) for i, s in enumerate(c.stages))
    return c


_SCALARS = (bool, int, float, str)


def _knob_type(fn, name: str, default) -> type | None:
    """The scalar type of a keyword parameter (from its default, else its annotation, e.g.
    `int | None`); None for parameters that are not config knobs (arrays, sequences)."""
    if default is not None:
        return type(default) if isinstance(default, _SCALARS) else None
    annotation = inspect.signature(fn, eval_str=True).parameters[name].annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if len(args) == 1 and args[0] in _SCALARS else None


def registry_knobs(block: str) -> dict[str, type]:
    """Every config knob of the registry behind `objective.<block>`: {key: scalar type},
    over all its entries (the supplied-from-the-batch advantage arguments excluded)."""
    from jaxrl_frontier.objectives import advantages, losses
    from jaxrl_frontier.run.config import registry_entry

    registry = losses.REGISTRIES[block]
    knobs: dict[str, type] = {}
    for name in registry.names():
        fn = registry_entry(block, name)
        for key, default in losses.entry_defaults(fn).items():
            kind = _knob_type(fn, key, default)
            if kind is not None and key not in advantages.SUPPLIED_KWARGS:
                knobs.setdefault(key, kind)
    return knobs


def task_knobs() -> dict[str, type]:
    """Every config knob of every registered task: {key: scalar type} (`task.kwargs`)."""
    from jaxrl_frontier.data.tasks import TASKS
    from jaxrl_frontier.data.tasks.base import task_parameters

    knobs: dict[str, type] = {}
    for name in TASKS.names():
        own: dict[str, type] = {}
        for init, p in task_parameters(name):  # a subclass's parameter wins
            default = None if p.default is inspect.Parameter.empty else p.default
            kind = _knob_type(init, p.name, default)
            if kind is not None:
                own[p.name] = kind
        for key, kind in own.items():
            knobs.setdefault(key, kind)  # the first task's type where two tasks share a key
    return knobs


def with_defaults(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Spell out every hyperparameter of the chosen task / advantage / weight / aggregation /
    distillation loss, and record the choices in `task.as_written` and `objective.as_written`.

    Each kwargs block lists the chosen entry's knobs at their defaults (the file's values
    win) and every other knob of its registry as an unset placeholder, so a sweep can set
    any of them from the command line (`--config.objective.weight_kwargs.eps_high=0.28`, or
    `--config.objective.weight=dppo --config.objective.weight_kwargs.delta_low=0.1`);
    ml_collections cannot add a key that the file did not define. `config.resolve` drops the
    unset ones and, after a switch of entry, the old entry's (run/config/validate.py's docstring).
    """
    from jaxrl_frontier.data.tasks.base import task_defaults
    from jaxrl_frontier.objectives import losses
    from jaxrl_frontier.run.config import entry_defaults
    from jaxrl_frontier.run.config.schema import import_modules

    import_modules(c.modules)  # the user's entries and their knobs are spelled out too
    task_kwargs = {**task_defaults(c.task.name), **c.task.kwargs.to_dict()}
    c.task.as_written = ml_collections.ConfigDict({"name": c.task.name, "kwargs": task_kwargs})
    spelled = ml_collections.ConfigDict(task_kwargs)
    for key, kind in task_knobs().items():  # every task's knobs: a switch of task.name
        if key not in spelled:  # can set its own from the command line
            spelled[key] = config_dict.placeholder(kind)
    c.task.kwargs = spelled
    o = c.objective
    written: dict = {}
    for block in losses.REGISTRIES:
        kw_key = f"{block}_kwargs"
        given = {k: v for k, v in o[kw_key].to_dict().items() if v is not None}
        kwargs = {**entry_defaults(block, o[block]), **given}
        written[block], written[kw_key] = o[block], dict(kwargs)
        spelled = ml_collections.ConfigDict(kwargs)
        for key, kind in registry_knobs(block).items():
            if key not in spelled:
                spelled[key] = config_dict.placeholder(kind)
        o[kw_key] = spelled
    o.as_written = ml_collections.ConfigDict(written)
    return c


# reasoning-gym's basic_arithmetic, two terms, the answer asked in <answer> tags; the last
# number written is scored when there are none (small instruct models write no tags at first)
REAL_ARITHMETIC_TASK = dict(
    datasets="basic_arithmetic",
    answer_format="tags",
    fallback="last_number",
    max_completion_chars=512,
)


def pretrained_rl(model: str, max_digits: int, arg: str | None) -> ml_collections.ConfigDict:
    """GRPO on a pretrained checkpoint fetched by name (`models.pretrained`) on reasoning-gym
    arithmetic of two terms of 1 to `max_digits` digits, in the model's chat template; its
    `runlocal` is the same model at short lengths (2 steps of 16-token completions)."""
    c = arithmetic("rl")
    c.mesh.update(data=-1, fsdp=1, tensor=1)
    c.tokenizer.update(kind="hf", path=model)
    c.model.update(init="hf", path=model, dtype="float32")
    c.task.update(name="reasoning_gym", chat_template=True)
    digits = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=max_digits)
    c.task.kwargs = dict(REAL_ARITHMETIC_TASK, dataset_kwargs=dict(basic_arithmetic=digits))
    c.data.update(prompt_batch=4, max_prompt_len=128)
    c.rollout.update(group_size=8, max_new_tokens=96, temperature=1.0)
    c.objective.update(advantage="grpo", weight="ppo_clip", kl_coef=0.0)
    c.objective.weight_kwargs = dict(eps_low=0.2, eps_high=0.28)
    c.objective.reward_weights = dict(correctness=1.0, format=0.5)
    c.optimizer.update(warmup_steps=5, max_grad_norm=1.0)
    c.train.update(minibatches=1, log_every=1, checkpoint_every=10)
    c.eval.update(batch=128, pass_k=1)
    return c


def finish_pretrained(c: ml_collections.ConfigDict, arg: str | None) -> ml_collections.ConfigDict:
    """`finish`, then, for `runlocal`, the real model (and teacher) again (the shrink swaps
    in tiny ones) at short lengths: 2 steps, 16-token completions, a 4-prompt eval."""
    shape = dict(hidden_size=c.model.hidden_size, intermediate_size=c.model.intermediate_size)
    init, path = c.model.init, c.model.path
    teacher = dict(init=c.teacher.init, path=c.teacher.path)
    c = finish(c, arg)
    if arg == "runlocal":
        c.model.update(init=init, path=path, **shape)
        c.teacher.update(teacher)  # a pretrained teacher too (the shrink makes a random one)
        c.rollout.max_new_tokens = 16
        c.train.update(steps=2, log_every=1, eval_every=2, checkpoint_every=2, rollout_log_every=1)
        c.eval.update(num_prompts=4, batch=4, pass_k=1)
    return c


def finish(c: ml_collections.ConfigDict, arg: str | None) -> ml_collections.ConfigDict:
    """End of every get_config: the runlocal variant, then every knob spelled out."""
    if arg not in (None, "", "runlocal"):
        raise ValueError(f"get_config: unknown variant {arg!r}; allowed: runlocal")
    if arg == "runlocal":
        shrink(c)
    return with_defaults(c)
