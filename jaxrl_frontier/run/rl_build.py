"""The RL stages from a config: the log-prob passes, the Learner and the RolloutProducer.

The trainer hands over what it already built (mesh, tokenizer, task, models, optimizer,
sampler); this module reads the config keys that choose and size each stage.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
from flax import nnx

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.data.rewards.scorer import make_scorer
from jaxrl_frontier.data.rewards.shaping import effective_reward_weights
from jaxrl_frontier.data.tasks import chat
from jaxrl_frontier.models.linear_attention import GatedDeltaNet
from jaxrl_frontier.models.moe import MoE
from jaxrl_frontier.objectives import losses
from jaxrl_frontier.objectives.schema import ObjectiveSection
from jaxrl_frontier.rl.learn import packing
from jaxrl_frontier.rl.learn.forward import apply_hidden, make_logp_fn
from jaxrl_frontier.rl.learn.learner import Learner, LearnerOptions, reshard_to, update_layout
from jaxrl_frontier.rl.learn.loss import dropout_masks
from jaxrl_frontier.rl.methods import pact
from jaxrl_frontier.rl.methods.ppo import build_critic
from jaxrl_frontier.rl.produce import agent as agent_rollout
from jaxrl_frontier.rl.produce import cross_tokenizer  # noqa: F401 (registers its pass)
from jaxrl_frontier.rl.produce.editors import build_editors
from jaxrl_frontier.rl.produce.passes import PASSES
from jaxrl_frontier.rl.produce.producer import RolloutProducer, TeacherLinks
from jaxrl_frontier.rl.sources import SOURCES
from jaxrl_frontier.rl.sources.teacher_answers import TeacherAnswers
from jaxrl_frontier.rl.sources.utils import prompt_text
from jaxrl_frontier.run.config import sections
from jaxrl_frontier.sampling import SamplingParams
from jaxrl_frontier.sampling.records import DEFAULT_PROMPT_BUCKETS


def rollout_sampling(config, tokenizer) -> SamplingParams:
    """The training rollouts' sampling settings (`rollout.*`); `rollout.ignore_eos`: no stop
    ids, every completion max_new_tokens long."""
    r = config.rollout
    stops = () if r.ignore_eos else chat.stop_ids(sections.task_options(config), tokenizer)
    return SamplingParams(
        temperature=r.temperature,
        top_k=r.top_k,
        top_p=r.top_p,
        min_p=r.min_p,
        n=r.group_size,
        max_new_tokens=r.max_new_tokens,
        eos_ids=stops,
        dropout_rate=r.dropout_rate,
    )


@dataclasses.dataclass(frozen=True)
class RunParts:
    """What the trainer has built before the RL stages: the meshes (the rollout mesh, when
    the sampler has devices of its own), the tokenizer and task, the policy module and, with
    LoRA, its frozen `base` weights (the train state then holds the adapters), the teacher
    module, whether a frozen reference exists, the sampler and the reward scorer (None: the
    one `rewards.scorer` selects), the learned reward terms' scorers (reward shapers); knobs: the `KnobPlan` of the keys that move during the run
    (None: none)."""

    mesh: Any
    tokenizer: Any
    task: Any
    policy: Any
    sampler: Any
    reference: bool = False
    teacher: Any = None
    scorer: Any = None
    rollout_mesh: Any = None
    base: Any = None
    knobs: Any = None  # the run's KnobPlan (run/knobs.py): keys that move as it trains
    learned: tuple = ()  # the learned reward terms' scorers (a reward model's, a judge's)
    tagged_teachers: tuple = ()  # several teachers: the others than `teacher` (teacher.by_tag)
    teacher_index_of: Any = None  # and an example's teacher (rl/produce/producer.TeacherLinks)
    teacher_tokenizer: Any = None  # the teacher's own tokenizer (rl/produce/cross_tokenizer.py)


def checked_objective(config, parts: RunParts) -> tuple[ObjectiveSection, list, list, bool]:
    """(objective, rollout editors, reward shapers, whether it reads the self-conditioned
    pass) of an RL config, the objective checked against the fields the run provides (a
    reference when `parts.reference`, a teacher's log-probs when `parts.teacher`): a
    ConfigError before anything is traced. The trainer checks each stage's config so too."""
    c = config
    objective = sections.objective_section(c.objective)
    if parts.knobs:  # a moving key at its largest value: the structure every value runs in
        objective = parts.knobs.structural(objective)
    editors, shapers = build_editors(
        sections.editor_options(c), task=parts.task, tokenizer=parts.tokenizer
    )
    shapers += list(parts.learned)  # after the rollout's own, in LEARNED_REWARDS order
    shaped = [n for s in shapers for n in s.reward_names]
    objective = dataclasses.replace(
        objective, reward_weights=effective_reward_weights(objective.reward_weights, shaped)
    )
    if c.train.collapse.stop and c.train.export != "best":
        raise ConfigError(
            "config key 'train.collapse.stop' rolls the peak forward through the export: "
            "set train.export = 'best'"
        )
    available = {"logp", "old_logp", "mask"}
    available |= {"ref_logp"} if parts.reference else set()
    available |= {"teacher_logp", "teacher_logits"} if parts.teacher is not None else set()
    needed = {f for fields in losses.required_fields(objective).values() for f in fields}
    self_conditioned = bool({"sc_logp", "sc_kl"} & needed)
    available |= {"sc_logp", "sc_kl"} if self_conditioned else set()
    losses.validate_objective_config(objective, available=available)
    return objective, editors, shapers, self_conditioned


def check_sequence_axis(
    config, *, completion_len: int, mesh, experts: int, linear: bool = False
) -> None:
    """ConfigError where the mesh's sequence axis (`mesh.sequence`, context parallelism)
    cannot split the update's rows: their length not a multiple of it (packed rows:
    `train.pack_tokens`; padded rows: a prompt bucket of the sampler (`DEFAULT_PROMPT_BUCKETS`), plus
    the completion's `completion_len`), or a policy whose MLP or mixer lacks the
    `sequence_axis` feature (a mixture of experts: `moe.MoE.capabilities`; linear-attention
    layers, `linear`: `linear_attention.GatedDeltaNet.capabilities`)."""
    s = sharding.sequence_size(mesh)
    if s == 1:
        return
    key = f"config key 'mesh.sequence' = {s}"
    packed = config.train.pack_tokens
    if packed and packed % s:
        raise ConfigError(
            f"{key} must divide the update's rows: train.pack_tokens = {packed}; make it a "
            f"multiple of {s}"
        )
    buckets = math.gcd(*DEFAULT_PROMPT_BUCKETS)  # every prompt bucket is a multiple of this
    if not packed and (buckets % s or completion_len % s):
        raise ConfigError(
            f"{key} must divide the update's rows: a prompt bucket (multiples of {buckets}) "
            f"plus the completion's {completion_len} (rollout.max_new_tokens, or an "
            f"episode's width); use a power of two <= {buckets} dividing {completion_len}"
        )
    if experts and not MoE.capabilities.supports("sequence_axis"):
        why = MoE.capabilities.why_not("sequence_axis")
        raise ConfigError(
            f"{key} does not run with a mixture-of-experts policy (model.num_experts = "
            f"{experts}: {why}); set mesh.sequence = 1"
        )
    if linear and not GatedDeltaNet.capabilities.supports("sequence_axis"):
        why = GatedDeltaNet.capabilities.why_not("sequence_axis")
        raise ConfigError(
            f"{key} does not run with a hybrid policy (linear-attention layers, Qwen3.5: "
            f"{why}); set mesh.sequence = 1"
        )


def packed_rows(config, *, row_len: int, mesh) -> packing.PackSpec | None:
    """The log-prob passes' `PackSpec` (`train.pack_tokens`; None: padded rows), after the
    config error for buffer rows shorter than a row (what packed rows do not run with is
    refused with the config: run/config/parts.py)."""
    c = config
    packing.check_packing(c.train.pack_tokens, row_len=row_len)
    return packing.pack_spec(c.train.pack_tokens, multiple=sharding.batch_size_multiple(mesh))


def build_rl_stages(
    config, parts: RunParts, *, tx, state, log=print
) -> tuple[Learner, RolloutProducer, Any]:
    """(Learner, RolloutProducer, the policy's jitted log-prob forward) for an RL run.

    The objective is checked against what the run provides (a reference when
    `parts.reference`, a teacher when given) before anything is traced.
    """
    c = config
    objective, editors, shapers, self_conditioned = checked_objective(c, parts)
    g, tn = c.rollout.group_size, c.rollout.max_new_tokens
    if c.env.name:  # an environment run: the completion is the episode after its prompt
        tn = agent_rollout.completion_width(c.env)
    layout = update_layout(
        rows=c.data.prompt_batch * g,
        group_size=g,
        completion_len=tn,
        mesh=parts.mesh,
        share_prompt=c.train.share_prompt_forward,
        dropout_rate=c.rollout.dropout_rate,
    )
    policy_cfg = parts.policy.cfg
    check_sequence_axis(
        c, completion_len=tn, mesh=parts.mesh, experts=policy_cfg.num_experts,
        linear=any(policy_cfg.linear_layers),
    )  # fmt: skip
    pack = packed_rows(c, row_len=c.data.max_prompt_len + tn, mesh=parts.mesh)
    graphdef = nnx.graphdef(parts.policy)
    logp_fn = make_logp_fn(graphdef, **layout, pack=pack)
    edited = any(e.changes_tokens for e in editors)  # DRE: behaviour log-probs recomputed
    names, context = _pass_context(c, parts, graphdef, logp_fn, edited, self_conditioned, tn)
    teacher_pair = None
    if parts.teacher is not None:
        teacher_pair = (nnx.graphdef(parts.teacher), nnx.state(parts.teacher))
        context["teacher_logp_fn"] = make_logp_fn(teacher_pair[0], **layout, pack=pack)
        if parts.teacher_tokenizer is not None:  # its own tokens: the completion re-tokenized
            context.update(_cross_tokenizer_context(c, parts, teacher_pair[0], tn))
        if parts.tagged_teachers:  # one log-prob forward per teacher, each row its own's
            more = [
                make_logp_fn(nnx.graphdef(t), **layout, pack=pack) for t in parts.tagged_teachers
            ]
            context["teacher_logp_fn"] = (context["teacher_logp_fn"], *more)
            teacher_pair = several_teachers(parts.teacher, parts.tagged_teachers)
        names.append("teacher" if parts.teacher_tokenizer is None else "cross_tokenizer_teacher")
    learner = _learner(c, parts, graphdef, objective, layout, teacher_pair, tx=tx, state=state,
                       completion_len=tn, log=log)  # fmt: skip
    passes = [PASSES.get(name)(**context) for name in names]
    producer = _producer(c, parts, objective, passes, editors, shapers)
    return learner, producer, logp_fn


def several_teachers(teacher, tagged: tuple) -> tuple[tuple, tuple]:
    """The update's teachers (`teacher.by_tag`, one vocabulary): (their graphdefs, their
    weights), the teacher at `teacher.path` first, then `tagged` in the order of the rows'
    `teacher_index`; a full-vocabulary loss runs each on every row (rl/learn/loss.py)."""
    teachers = (teacher, *tagged)
    return tuple(nnx.graphdef(t) for t in teachers), tuple(nnx.state(t) for t in teachers)


def _cross_tokenizer_context(c, parts: RunParts, teacher_graphdef, completion_len: int) -> dict:
    """The cross-tokenizer teacher pass's context: the teacher's rows [prompt | completion]
    at the prompt budget and `teacher.token_ratio` x the completion budget."""
    budget = max(1, int(round(c.teacher.token_ratio * completion_len)))
    return dict(
        teacher_logp_fn=make_logp_fn(teacher_graphdef, completion_len=budget),
        student_tokenizer=parts.tokenizer,
        teacher_tokenizer=parts.teacher_tokenizer,
        completion_len=completion_len,
        prompt_len=c.data.max_prompt_len,
        teacher_budget=budget,
    )


def _pass_context(c, parts: RunParts, graphdef, logp_fn, edited: bool, self_conditioned, tn):
    """(the log-prob passes' names, the context they are built from): the behaviour pass
    when `train.recompute_old_logp` or an editor changed tokens, the mismatch probe, the
    reference, the self-conditioned pass; the teacher's is added by the caller."""
    rate = c.rollout.dropout_rate
    masks = jax.jit(lambda keys: dropout_masks(parts.policy.cfg, rate, keys)) if rate > 0 else None
    context: dict[str, Any] = dict(policy_logp_fn=logp_fn, mlp_masks=masks)
    context["replay_routing"] = c.model.moe.routing_replay == "rollout"  # R3 in the passes
    recompute = c.train.recompute_old_logp or edited
    names = ["behaviour"] if recompute else []
    # the train/rollout mismatch: free beside a recompute, a probe forward otherwise; not
    # measured on tokens an editor changed (the sampler's log-probs are of others)
    context["measure_mismatch"] = not edited and (recompute or c.train.measure_mismatch)
    names += ["mismatch_probe"] if context["measure_mismatch"] and not recompute else []
    names += ["reference"] if parts.reference else []
    if self_conditioned:  # [prompt | solution | completion]: only the completion scored
        context.update(
            scored_logp_fn=make_logp_fn(graphdef, completion_len=tn),
            hidden_fn=apply_hidden(graphdef),  # both forwards' hidden states: the full KL
            vocab_chunk=c.rollout.sc_vocab_chunk,
            group_size=c.rollout.group_size,
            completion_len=tn,
            correct_column=list(parts.task.reward_names).index("correctness"),
        )
        names.append("self_conditioned")
    return names, context


def _learner(
    c, parts: RunParts, graphdef, objective, layout, teacher_pair, *, tx, state, completion_len, log
) -> Learner:
    """The Learner of config `c` (with PPO's critic and PACT's loss term when configured)."""
    plan = parts.knobs
    # PPO's learned critic (critic.kind; None: none), trained and checkpointed with the policy
    critic = build_critic(
        sections.critic_options(c),
        parts.policy,
        mesh=parts.mesh,
        reward_names=parts.task.reward_names,
        objective=objective,
        layout=layout,
    )
    if critic is not None:
        state = state.replace(critic=critic.init_state())
    options = LearnerOptions(
        objective=objective,
        rows=c.data.prompt_batch * c.rollout.group_size,
        group_size=c.rollout.group_size,
        completion_len=completion_len,
        epochs=c.train.epochs,
        minibatches=c.train.minibatches,
        grad_accum=c.optimizer.grad_accum,
        share_prompt=c.train.share_prompt_forward,
        dropout_rate=c.rollout.dropout_rate,
        knobs=plan.objective_keys if plan else (),
        pack_tokens=c.train.pack_tokens,
        microbatch_tokens=c.train.microbatch_tokens,
        routing_replay=c.model.moe.routing_replay,
        bias_update_rate=float(c.model.moe.bias_update_rate),
    )
    pact_term = pact.loss_transform(sections.pact_options(c), graphdef)
    rollout_mesh, mesh = parts.rollout_mesh, parts.mesh
    return Learner(
        graphdef,
        tx,
        state,
        options,
        mesh=mesh,
        model_cfg=parts.policy.cfg,
        teacher=teacher_pair,
        reshard=None if rollout_mesh in (None, mesh) else reshard_to(rollout_mesh),
        base=parts.base,
        critic=critic,
        loss_transforms=[pact_term] if pact_term is not None else [],
        log=log,
    )


def _producer(c, parts: RunParts, objective, passes, editors, shapers):
    """The RolloutProducer of config `c` (episodes of an environment, or sampled rows;
    wrapped for PACT when configured)."""
    mesh, tokenizer, task = parts.mesh, parts.tokenizer, parts.task
    scorer = parts.scorer or make_scorer(sections.reward_options(c), task)
    teacher_answers = None
    if parts.teacher is not None and SOURCES.part(c.data.source).wants_teacher_answers:
        teacher_answers = TeacherAnswers(
            parts.teacher,
            tokenizer,
            task,
            scorer,
            max_prompt_len=c.data.max_prompt_len,
            max_new_tokens=c.rollout.max_new_tokens,
            mesh=mesh,
        )
    wrap = lambda producer, env, task: pact.wrap_producer(  # noqa: E731
        producer, sections.pact_options(c), tokenizer, mesh=mesh, env=env, task=task
    )
    sampling = rollout_sampling(c, tokenizer)
    if c.env.name:  # episodes of an environment (rl/produce/agent.py)
        producer = agent_rollout.env_producer(
            sections.env_options(c), parts.sampler, tokenizer, task, mesh=mesh,
            sampling=sampling, objective=objective, passes=passes,
        )  # fmt: skip
        return wrap(producer, sections.env_options(c), task)
    producer = RolloutProducer(
        parts.sampler,
        tokenizer,
        scorer,
        mesh=mesh,
        sampling=sampling,
        max_prompt_len=c.data.max_prompt_len,
        objective=objective,
        prompt_of=lambda example: prompt_text(task, example),
        passes=passes,
        editors=editors,
        shapers=shapers,
        teachers=TeacherLinks(teacher_answers, parts.teacher_index_of),
    )
    return wrap(producer, None, None)
