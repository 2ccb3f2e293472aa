"""The Learner: owns the train state and the jitted, donated RL update.

    learner.update(experience, key) -> [metrics per optimizer step]
        epochs x minibatches over a fresh permutation of the rows each epoch (whole groups
        when each group's prompt runs once); each minibatch is `grad_accum` microbatches
        whose gradient is exactly the minibatch's (the aggregation's denominator is the
        minibatch's, see `train_step`).
    learner.rollout_params() -> the policy weights for the sampler, through one resharding
        function (the identity when rollouts run on the training mesh).

Routing replay of an MoE policy (`model.moe.routing_replay`): with 'rollout' (R3) the
Experience carries the sampler's experts (`routing`) and every update forward replays them;
with 'first_update' (R2) the step's rows are routed once at the step's starting weights
(`forward.make_routing_fn`, the router's choice in the first training forward) and every
minibatch of every epoch replays that routing (not computed when the step runs one update).

Schedules and controllers (`run/knobs.py`) move objective keys during the run: their values
ride beside the frozen weights as `frozen['knobs']` ({key: f32 []}, `Learner.set_knobs` before
each step), arguments of the one compiled update, read by the loss through
`losses.with_values`.

With LoRA (`base` given: `models/lora.py`) the train state holds the adapters only; the frozen base
weights ride beside them as `frozen['base']` (an argument of the update, never donated or
differentiated), every forward runs `lora.combine(base, adapters)`, and only the adapters
move to the rollout mesh at each step (the base is resharded there once).

The loss it differentiates is `rl.learn.loss.rl_loss`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.models import lora, moe
from jaxrl_frontier.objectives import losses
from jaxrl_frontier.rl.experience import Experience
from jaxrl_frontier.rl.learn import packing
from jaxrl_frontier.rl.learn.forward import (
    make_routing_fn,
)
from jaxrl_frontier.rl.learn.loss import rl_loss, with_base
from jaxrl_frontier.rl.learn.train_step import TrainState, make_update_fn, microbatch_grads

sg = jax.lax.stop_gradient
PACK_MAPS = ("src", "seg", "pos", "start")  # a packed minibatch's maps (`packing.plan_packing`)


def update_layout(
    *,
    rows: int,
    group_size: int,
    completion_len: int,
    mesh,
    share_prompt: bool,
    dropout_rate: float = 0.0,
    routed: bool = False,
) -> dict[str, int]:
    """How `rows` rows of an RL batch may run: only the last `completion_len` positions are
    scored, and with `share_prompt` each group's prompt runs once when `rows` holds whole
    groups that split evenly over the mesh's batch devices (otherwise the packed prompt and
    completion rows would be resharded in every layer), no row has its own dropout mask and
    the mesh has no sequence axis (context parallelism splits the per-row forward's rows).
    Keyword arguments of `forward.make_logp_fn` and `rl_loss`."""
    groups, rem = divmod(rows, group_size)
    share = share_prompt and group_size > 1 and not rem and dropout_rate == 0.0
    share = share and not routed  # an MoE's router statistics come from the per-row forward
    share = share and groups % sharding.batch_size_multiple(mesh) == 0
    # a sequence axis splits every row's positions; the packed prompt rows would not split
    share = share and sharding.sequence_size(mesh) == 1
    return dict(group_size=group_size if share else 1, completion_len=completion_len)


def reshard_to(mesh):
    """params -> the same params laid out on `mesh` by their logical axes (`jax.device_put`
    to the target shardings: one transfer per array, from the training to the rollout mesh).
    On several processes, to a mesh of this process's own devices (`is_process_local`: the
    rollout mesh of asynchronous rollouts), every process gathers the whole params on
    device (`sharding.gather_to_local_mesh`): an all-gather, so every process must call it
    at the same point of the run."""

    def reshard(params):
        if jax.process_count() > 1 and sharding.is_process_local(mesh):
            return sharding.gather_to_local_mesh(params, mesh)
        return jax.device_put(params, sharding.state_shardings(params, mesh))

    return reshard


def minibatch_order(key, rows: int, update_groups: int) -> np.ndarray:
    """A random order of the step's rows; whole groups stay together (and in order) when
    the update runs each group's prompt once."""
    perm = np.asarray(jax.random.permutation(key, rows // update_groups))
    return (perm[:, None] * update_groups + np.arange(update_groups)).reshape(-1)


@dataclasses.dataclass(frozen=True)
class LearnerOptions:
    """What one RL update does, fixed for the run.

    objective: the objective's record (`objectives.schema`).  rows: B, the rows of a step's
    Experience; group_size: G; completion_len: Tn.  epochs x minibatches passes over the rows
    (`train.epochs`, `train.minibatches`), each minibatch in `grad_accum` microbatches
    (`optimizer.grad_accum`).  share_prompt: one prompt forward per group
    (`train.share_prompt_forward`).  dropout_rate: Dropout-GRPO's MLP dropout
    (`rollout.dropout_rate`; the update rebuilds the sampler's masks).  knobs: the objective
    keys whose values arrive with each update as traced f32 scalars (`losses.traced_keys`:
    'kl_coef', 'weight_kwargs.eps_high'; set by `Learner.set_knobs`), moved by schedules
    and controllers without compiling again.  pack_tokens, microbatch_tokens: packed rows
    of that many slots, microbatches of about that many tokens (`rl.learn.packing`).
    routing_replay: an MoE policy's routing replay, 'none', 'rollout' (R3: the Experience's
    `routing`) or 'first_update' (R2: the step's first routing replayed by its later
    minibatches and epochs; see the module docstring). bias_update_rate: u > 0 moves a
    DeepSeek-V3 router's balancing bias after each optimizer step (`model.moe.
    bias_update_rate`, `train_step.balanced`).
    """

    objective: losses.ObjectiveSection
    rows: int
    group_size: int
    completion_len: int
    epochs: int = 1
    minibatches: int = 1
    grad_accum: int = 1
    share_prompt: bool = True
    dropout_rate: float = 0.0
    knobs: tuple[str, ...] = ()
    pack_tokens: int = 0  # `train.pack_tokens`: > 0, the update runs on packed rows
    microbatch_tokens: int = 0  # `train.microbatch_tokens`: token-budget microbatches
    routing_replay: str = "none"  # `model.moe.routing_replay` (`moe.ROUTING_REPLAY`)
    bias_update_rate: float = 0.0  # `model.moe.bias_update_rate` (0: the bias stays)


class Learner:
    """Owns the train state; `update(experience, key)` runs epochs x minibatches.

    loss_transforms: functions loss_of -> loss_of applied in order to the objective's loss
    (PACT's expert-trace term, `rl.methods.pact.loss_transform`); with `base` (LoRA: the
    frozen weights, while state.params holds the adapters) the loss reads base + adapters.
    critic: PPO's learned critic (`rl.methods.ppo`): GAE before, the value loss in the update.
    """

    def __init__(
        self,
        graphdef,
        tx,
        state: TrainState,
        options: LearnerOptions,
        *,
        mesh,
        model_cfg=None,
        teacher: tuple[Any, Any] | None = None,
        reshard: Callable[[Any], Any] | None = None,
        base=None,
        critic=None,
        loss_transforms: Sequence[Callable[[Callable], Callable]] = (),
        log: Callable[[str], None] = print,
    ):
        o = options
        objective, rows = losses.objective_of(o.objective), o.rows
        epochs, minibatches, grad_accum = o.epochs, o.minibatches, o.grad_accum
        self.options = options
        self.state = state
        self.critic = critic
        self.base = base
        self.mesh = mesh
        self.epochs, self.minibatches = epochs, minibatches
        self.rows = rows
        self.minibatch_rows = rows // minibatches
        self.pack, layout = self._layout(o, mesh, model_cfg, log)
        self.update_groups = layout["group_size"]
        self.teacher = teacher
        uses_teacher = teacher is not None and bool(objective.distill)
        self.frozen = {"teacher": teacher[1]} if uses_teacher else None
        loss_of = rl_loss(
            graphdef,
            objective,
            **layout,
            dropout_rate=o.dropout_rate,
            model_cfg=model_cfg,
            teacher_graphdef=teacher[0] if uses_teacher else None,
            capture_hidden=critic is not None and critic.reads_hidden,
        )
        if o.knobs:  # replicated f32 scalars, an argument of the update (never a constant)
            self._knob_sharding = sharding.replicated(mesh)
            self.frozen = {**(self.frozen or {}), "knobs": None}
            self.set_knobs({k: losses.value_of(objective, k) for k in o.knobs})
        transforms = list(loss_transforms)  # terms beside the objective's, on full params
        if base is not None:
            self.frozen = {**(self.frozen or {}), "base": base}
            transforms.append(with_base)
        self._loss_of = functools.reduce(lambda f, transform: transform(f), transforms, loss_of)
        self._graphdef, self._tx, self._grad_accum = graphdef, tx, grad_accum
        self._objective = objective
        self._programs: dict[tuple[str, ...], tuple[Callable, Callable]] = {}
        self._reshard = reshard or (lambda params: params)
        self.reshard_seconds = 0.0
        self._rollout_base = None  # LoRA: the base on the rollout mesh, placed once
        self._route = self._first_update_routing(o, graphdef, model_cfg)

    def _layout(self, o: LearnerOptions, mesh, model_cfg, log) -> tuple[Any, dict[str, int]]:
        """(the packed rows' spec or None, `update_layout` of a microbatch's rows): packed rows
        run without the shared prompt, and an MoE policy neither packed nor shared."""
        micro_rows = self.minibatch_rows // o.grad_accum
        pack = packing.pack_spec(o.pack_tokens, grad_accum=o.grad_accum,
                                 microbatch_tokens=o.microbatch_tokens,
                                 multiple=sharding.batch_size_multiple(mesh))  # fmt: skip
        share_prompt = o.share_prompt and pack is None  # packed rows: no shared prompt
        routed = bool(model_cfg is not None and model_cfg.num_experts)
        if routed and pack is not None:
            raise ConfigError(
                "config key 'train.pack_tokens' > 0 packs the update's rows, which an MoE "
                "policy's router statistics and replayed routing do not follow yet: set it to 0"
            )
        layout = update_layout(
            rows=micro_rows,
            group_size=o.group_size,
            completion_len=o.completion_len,
            mesh=mesh,
            share_prompt=share_prompt,
            dropout_rate=o.dropout_rate,
            routed=routed,
        )
        quiet = o.dropout_rate or routed  # sharing is off for these by design, not the rows
        if share_prompt and layout["group_size"] == 1 and o.group_size > 1 and not quiet:
            log(
                f"[rl] train.share_prompt_forward is off for the update: a microbatch of "
                f"{micro_rows} rows is not whole groups of {o.group_size} that split evenly "
                f"over the {sharding.batch_size_multiple(mesh)} batch devices"
            )
        return pack, layout

    def share_programs(self, other: Learner) -> None:
        """Run `other`'s compiled (select, update) programs from now on: a learner of the
        same structure (objective, shapes, optimizer; only traced values and the state
        differ), so that a population's members compile once (run/population/driver.py)."""
        self._programs = other._programs

    def _first_update_routing(self, o: LearnerOptions, graphdef, model_cfg):
        """R2's routing program (`forward.make_routing_fn`, in the update's microbatches), or
        None: another replay mode, or one update a step (its forward is the first)."""
        moe.check_routing_replay(o.routing_replay, model_cfg.num_experts if model_cfg else 0)
        scoring = model_cfg.router_scoring if model_cfg and model_cfg.num_experts else ""
        moe.check_bias_update(o.bias_update_rate, scoring, lora=self.base is not None)
        if o.routing_replay != "first_update" or o.epochs * o.minibatches == 1:
            return None
        chunks = o.minibatches * o.grad_accum
        return make_routing_fn(graphdef, chunks=chunks, mesh=self.mesh)

    def first_routing(self, batch: dict) -> jax.Array | None:
        """R2's record of `batch`'s rows at the current weights (int16 [B, T, L, k]), or
        None when the run does not replay the first update's routing."""
        return None if self._route is None else self._route(self.policy_params(), batch)

    def built_programs(self) -> list[tuple[Callable, Callable]]:
        """The (select, update) pairs built so far, one per batch key set (`programs`)."""
        return list(self._programs.values())

    def update_program(self, keys: Sequence[str], members: dict | None = None) -> Callable:
        """The jitted update (`train_step.make_update_fn`, or the critic's) for a batch with
        these keys, with the minibatch's aggregation denominator; `members`: vmapped over a
        population's stacked states (`run.population.batched_update`)."""
        batch_sh = {k: sharding.batch_sharding(self.mesh, 2) for k in keys}
        update_sh = batch_sh
        if self.pack is not None:  # the packing maps: small, replicated
            repl = sharding.replicated(self.mesh)
            update_sh = {**batch_sh, "pack": {k: repl for k in PACK_MAPS}}
        frozen_sh = None
        if self.frozen is not None:
            frozen_sh = jax.tree.map(lambda x: x.sharding, self.frozen)
        objective = self._objective
        if self.critic is None:
            make = functools.partial(make_update_fn, self._graphdef)
        else:  # the critic trained alongside the policy
            make = self.critic.make_update
        extra = {} if members is None else {"members": members}
        if self.options.bias_update_rate:
            extra["bias_update_rate"] = self.options.bias_update_rate
        return make(
            self._tx,
            self._loss_of,
            self._grad_accum,
            jax.tree.map(lambda x: x.sharding, self.state),
            update_sh,
            denominator_fn=lambda b: losses.aggregation_denominator(objective, b["loss_mask"]),
            frozen_sharding=frozen_sh,
            **extra,
        )

    def programs(self, keys: Sequence[str]) -> tuple[Callable, Callable]:
        """(select, update) jitted for a batch with these keys (built once per key set).

        select(batch, idx) gathers a minibatch onto the batch axes; update is
        `train_step.make_update_fn`'s, with the minibatch's aggregation denominator."""
        keys = tuple(sorted(keys))
        if keys not in self._programs:
            batch_sh = {k: sharding.batch_sharding(self.mesh, 2) for k in keys}
            update = self.update_program(keys)
            select = jax.jit(
                lambda batch, idx: jax.tree.map(lambda x: x[idx], batch), out_shardings=batch_sh
            )
            self._programs[keys] = (select, update)
        return self._programs[keys]

    def gradient(self, experience: Experience):
        """(loss, grads, metrics) of one minibatch holding every row in order, as the update
        computes them (microbatches, the minibatch's denominator); for tests and probes."""
        batch = experience.update_batch()
        if self.pack is not None:
            batch["pack"] = self.place_pack(packing.host_mask(batch["attention_mask"]))[0]
        den = losses.aggregation_denominator(self._objective, batch["loss_mask"])
        return microbatch_grads(
            self._loss_of, self.state.params, batch, self._grad_accum, self.frozen, den
        )

    def place_pack(self, mask: np.ndarray) -> tuple[dict, dict]:
        """(maps on the mesh, replicated; their stats) packing the rows of `mask` [B, T]."""
        maps, stats = packing.plan_packing(mask, self.pack)
        return jax.device_put(maps, sharding.replicated(self.mesh)), stats

    def set_knobs(self, values: dict[str, float]) -> None:
        """This step's values of `options.knobs` (every one, by objective key), placed as
        replicated f32 scalars: the next updates and `gradient` read them."""
        names = self.options.knobs
        if set(values) != set(names):
            raise ValueError(f"Learner.set_knobs: got {sorted(values)}, the run traces {names}")
        host = {k: np.float32(values[k]) for k in names}
        self.frozen = {**self.frozen, "knobs": jax.device_put(host, self._knob_sharding)}

    @property
    def version(self) -> int:
        """The policy version: completed RL steps."""
        return int(self.state.step)

    @property
    def objective(self):
        """The objective section the update's loss reads (at a moving key's largest value)."""
        return self._objective

    @property
    def rollout_base(self):
        """LoRA: the frozen base placed on the rollout mesh once (None before the first
        `rollout_params`, and without LoRA)."""
        return self._rollout_base

    def rollout_params(self, copy: bool = False):
        """The policy weights for the sampler, through the one resharding function between
        the training and the rollout mesh (the identity when they are one). copy: a fresh
        copy even then (a rollout running while the update donates the state)."""
        t0 = time.perf_counter()
        params = self._reshard(self.state.params)
        if copy and params is self.state.params:
            params = jax.tree.map(jnp.copy, params)
        if self.base is not None:  # only the adapters move at each step
            if self._rollout_base is None:
                self._rollout_base = self._reshard(self.base)
            params = lora.combine(self._rollout_base, params)
        self.reshard_seconds = time.perf_counter() - t0
        return params

    def policy_params(self):
        """The policy's full parameters on the training mesh (base + adapters with LoRA)."""
        if self.base is None:
            return self.state.params
        return lora.combine(self.base, self.state.params)

    def update(self, experience: Experience, next_key: Callable[[], jax.Array]) -> list[dict]:
        """Epochs x minibatches of updates on one Experience; metrics of each (on device).

        next_key() draws a key from the run's RNG stream (one per epoch's permutation).
        """
        rollout_metrics = {}
        if self.critic is not None:  # GAE on the critic's values replaces the advantages
            experience, rollout_metrics = self.critic.prepare(
                self.state, experience, self.policy_params()
            )
        batch = experience.update_batch()
        if self._route is not None:  # R2: the step's routing at its starting weights
            batch["routing"] = self.first_routing(batch)
        select, update = self.programs(batch)
        mask = None if self.pack is None else packing.host_mask(batch["attention_mask"])
        metrics = []
        for _ in range(self.epochs):
            order = minibatch_order(next_key(), self.rows, self.update_groups)
            for j in range(self.minibatches):
                idx = order[j * self.minibatch_rows : (j + 1) * self.minibatch_rows]
                mb = select(batch, idx)  # host indices: the same on every process
                pack_stats = {}
                if self.pack is not None:  # this minibatch's rows packed (host), then placed
                    mb["pack"], pack_stats = self.place_pack(mask[idx])
                if self.frozen is None:
                    self.state, m = update(self.state, mb)
                else:
                    self.state, m = update(self.state, mb, self.frozen)
                metrics.append({**m, **pack_stats, **rollout_metrics})
        self.state = self.state.replace(step=self.state.step + 1)
        return metrics
