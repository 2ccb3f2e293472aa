"""The run's roles in one record: the policy (trained), its frozen reference, the teacher,
and the samplers, each with the mesh it lives on (`build_roles`).

    policy     the module the train state's params belong to (`graphdef`); with LoRA the
               state holds the adapters and `base_params` the frozen weights
    reference  `ref_params`: a frozen copy of the starting weights (None: no KL to it)
    teacher    a module of its own (`teacher`, `teacher_params`), or None; with several
               (`teacher.by_tag`) the others in `tagged_teachers`, `teacher_tags` {tag: index}
    reward model  a sequence classifier with its tokenizer (`reward_model`), or None
    judge      a causal LM scoring completions with its tokenizer (`judge`), or None
    samplers   `sampler`: the evaluation's and, unless rollouts are process-local or keep
               rows in flight, the rollouts' too; `rollout_sampler`: the training rollouts'
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections
from flax import nnx
from jax.sharding import Mesh

from jaxrl_frontier.core import sharding
from jaxrl_frontier.data.rewards.judge import JudgeRole
from jaxrl_frontier.data.rewards.reward_model import RewardModelRole
from jaxrl_frontier.models import hf, lora
from jaxrl_frontier.rl.learn.learner import reshard_to
from jaxrl_frontier.run.build import (
    attach_lora,
    build_judge,
    build_meshes,
    build_model,
    build_mtp_draft,
    build_reward_model,
    build_tagged_teachers,
    build_teacher,
    teacher_tokenizer,
)
from jaxrl_frontier.run.config import sections
from jaxrl_frontier.sampling import Sampler, make_sampler


@dataclasses.dataclass
class Roles:
    """The models of a run and where they live (see the module docstring)."""

    mesh: Mesh
    rollout_mesh: Mesh
    tokenizer: Any
    policy: nnx.Module
    graphdef: Any
    base_params: Any
    ref_params: Any
    teacher: nnx.Module | None
    teacher_params: Any
    sampler: Sampler
    rollout_sampler: Sampler
    reward_model: RewardModelRole | None = None
    judge: JudgeRole | None = None
    tagged_teachers: tuple = ()
    teacher_tags: dict = dataclasses.field(default_factory=dict)
    teacher_tokenizer: Any = None  # its own (`teacher.tokenizer = 'own'`), else None
    # the checkpoint's multi-token-prediction module (`rollout.speculative.draft = 'mtp'`)
    mtp: nnx.Module | None = None

    @property
    def teacher_weights(self):
        """The teacher role's weights: its params, or with several teachers a tuple of
        theirs (the one at `teacher.path` first, then `tagged_teachers`)."""
        if not self.tagged_teachers:
            return self.teacher_params
        return (self.teacher_params, *(nnx.state(t) for t in self.tagged_teachers))

    def sharing(self, other: Roles, c: ml_collections.ConfigDict) -> Roles:
        """These roles of config `c` with `other`'s samplers (their compiled programs; the
        weights are arguments): a population's members sample with one set of programs. The
        frozen weights that do not depend on the seed (the policy and the teacher from a
        file, not `scratch`) are `other`'s too, held once: LoRA's base, the reference, the
        teacher."""
        frozen, teacher = c.model.init != "scratch", c.teacher.init != "scratch"
        shared = dict(sampler=other.sampler, rollout_sampler=other.rollout_sampler)
        if frozen and (self.base_params is None) == (other.base_params is None):
            shared.update(base_params=other.base_params)
            if (self.ref_params is None) == (other.ref_params is None):
                shared.update(ref_params=other.ref_params)
        if teacher:
            shared.update(teacher=other.teacher, teacher_params=other.teacher_params)
            shared.update(tagged_teachers=other.tagged_teachers)
            shared.update(teacher_tokenizer=other.teacher_tokenizer)
        if c.reward_model.init == "hf":
            shared.update(reward_model=other.reward_model)
        if c.judge.init == "hf":
            shared.update(judge=other.judge)
        return dataclasses.replace(self, **shared)

    def full_params(self, params):
        """The policy's whole weights from the train state's `params` (LoRA: the frozen base
        with the adapters)."""
        return params if self.base_params is None else lora.combine(self.base_params, params)

    def export(self, params, path: str, *, write: bool) -> None:
        """The policy with `params` in Hugging Face format, and the tokenizer, in `path`
        (LoRA adapters merged: W + (alpha / r) A B). Every process joins the host copy;
        those with `write` write."""
        nnx.update(self.policy, sharding.host_copy(params))
        if write:
            merged = self.policy if self.base_params is None else lora.merged(self.policy)
            hf.save(merged, path, mtp=self.mtp)  # the module kept for the next run
            self.tokenizer.save(path)


def build_roles(
    c: ml_collections.ConfigDict, tokenizer, kl_coef: float, k_model, k_teacher
) -> tuple[Roles, Any]:
    """(Roles, the policy's trained params) of config `c`; `kl_coef`: the largest KL
    coefficient the run can reach (a reference is loaded when it is above 0); `k_model`,
    `k_teacher`: the random initialisations' keys."""
    mesh, rollout_mesh = build_meshes(c)  # the same mesh unless rollout.devices
    policy = build_model(c.model.init, c.model.path, c, tokenizer, mesh, k_model, c.model.dtype)
    policy = attach_lora(policy, c, mesh, k_model)
    graphdef, params, base, ref = lora.trained_and_frozen(
        policy, with_reference=c.mode == "rl" and kl_coef > 0
    )
    teacher = build_teacher(c, tokenizer, mesh, k_teacher, policy.cfg)
    tagged, tags = build_tagged_teachers(c, tokenizer, mesh, k_teacher, policy.cfg)
    k_reward = jax.random.fold_in(k_teacher, 0x5C0E)  # its own stream: the others unchanged
    reward_model = build_reward_model(c, tokenizer, mesh, k_reward, policy.cfg)
    judge = build_judge(c, tokenizer, mesh, jax.random.fold_in(k_reward, 1), policy.cfg)
    mtp = build_mtp_draft(c, rollout_mesh)
    make = lambda on, partial=False: _sampler(
        c, (policy, mtp), graphdef, mesh, on, tokenizer, partial
    )  # noqa: E731
    eval_mesh = rollout_mesh
    if jax.process_count() > 1 and sharding.is_process_local(rollout_mesh):
        eval_mesh = mesh  # the eval's prompts span every host: the global mesh
    sampler = make(eval_mesh)
    # the training rollouts' own sampler: partial rollouts hold rows in flight in it, and
    # asynchronous rollouts on several processes sample on each process's own devices
    partial = c.mode == "rl" and c.rollout.partial_budget > 0
    local = jax.process_count() > 1 and sharding.is_process_local(rollout_mesh)
    rollout_sampler = make(rollout_mesh, partial) if partial or local else sampler
    roles = Roles(
        mesh=mesh,
        rollout_mesh=rollout_mesh,
        tokenizer=tokenizer,
        policy=policy,
        graphdef=graphdef,
        base_params=base,
        ref_params=ref,
        teacher=teacher,
        teacher_params=None if teacher is None else nnx.state(teacher),
        sampler=sampler,
        rollout_sampler=rollout_sampler,
        reward_model=reward_model,
        judge=judge,
        tagged_teachers=tagged,
        teacher_tags=tags,
        teacher_tokenizer=teacher_tokenizer(c),
        mtp=mtp,
    )
    return roles, params


def _sampler(c, models, graphdef, train_mesh, mesh, tokenizer, partial: bool) -> Sampler:
    """The sampler `rollout.*` asks for, over the policy placed on `mesh` (models: the
    policy, the checkpoint's MTP module or None)."""
    policy, mtp = models
    if mesh is not train_mesh:
        policy = nnx.merge(graphdef, reshard_to(mesh)(nnx.state(policy)))
    rollout = sections.rollout_section(c)
    if jax.process_count() > 1 and sharding.is_process_local(mesh):
        # a process's share of the continuous slots, with its share of the rows
        slots = rollout.continuous_slots // jax.process_count()
        rollout = dataclasses.replace(rollout, continuous_slots=slots)
    return make_sampler(  # rollout.speculative: a SpeculativeSampler
        policy,
        rollout,
        pad_id=tokenizer.pad_id,
        mesh=mesh,
        partial=partial,
        record_routing=c.model.moe.routing_replay == "rollout",  # MoE routing replay (R3)
        mtp=mtp,
    )
