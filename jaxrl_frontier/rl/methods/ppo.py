"""PPO with a learned critic: values and GAE before each update, the value loss inside it.

    critic = build_critic(options, policy, mesh=..., reward_names=..., objective=..., layout=...)
    state = state.replace(critic=critic.init_state())      # {'params', 'opt_state'}
    Learner(..., critic=critic)

`Critic.prepare(state, experience, policy_params)` runs once per RL step, before the epochs:
the critic's values V [B, T] of the rollout (`rl.critic`: `values[b, t]` is V of the state
token t is sampled in), the per-token rewards, and GAE over the policy tokens (Schulman et
al. 2016), optionally whitened over the batch's policy tokens; the advantages replace the
Experience's and `old_values`, `returns` ride in its extras into the update. It reads only
Experience fields (tokens, attention_mask, loss_mask, rewards, old / ref log-probs), so a
single-turn and a multi-turn producer are handled alike. Rewards on tokens:

    r[b, t] = extras['turn_rewards'][b, t]           when the producer gives them (each turn's
                                                      reward on its last policy token, as the
                                                      environment producer rl/produce/agent.py
                                                      does: `critic.turn_rewards_to_tokens`)
            = (sum_k w_k rewards[b, k]) on the row's last policy token, 0 elsewhere  (else)
            - beta * k(old_logp - ref_logp)[b, t]     with objective.kl_in_reward

`Critic.make_update` is the Learner's update with the critic trained alongside: one gradient
of

    L = L_policy + value_coef * L_V(V, V_old, R)     (clipped value loss, `critic.value_loss`)

over {policy params, critic params}; the policy's optimizer steps the policy and the critic's
own Adam (`critic.lr`) the critic. `head` reads the policy's final hidden states from the
policy loss's own forward (no second forward; with `critic.stop_gradient` the value loss
leaves the trunk alone); `model` runs its own small transformer. Each microbatch's value
loss is normalised by the minibatch's policy-token count, so gradient accumulation is exact
for it too. The update's `grad_norm` is over both parts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxrl_frontier.core import records, sharding
from jaxrl_frontier.core.records import key
from jaxrl_frontier.objectives import distillation
from jaxrl_frontier.objectives.schema import ObjectiveSection
from jaxrl_frontier.objectives.stats import TokenStats
from jaxrl_frontier.rl.credit import reward_weight_vector
from jaxrl_frontier.rl.experience import Experience
from jaxrl_frontier.rl.learn.forward import apply_hidden
from jaxrl_frontier.rl.learn.optimizer import OptimizerSection, build_optimizer
from jaxrl_frontier.rl.learn.train_step import TrainState, init_opt_state, make_update_fn
from jaxrl_frontier.rl.methods import critic as critic_lib

Array = jax.Array


def last_token_rewards(seq_reward: Array, mask: Array) -> Array:
    """seq_reward [B] on each row's last policy token, 0 elsewhere: [B, T] (f32)."""
    m = mask > 0
    T = m.shape[1]
    last = T - 1 - jnp.argmax(m[:, ::-1], axis=1)  # a row with no policy token gets nothing
    on_last = (jnp.arange(T)[None, :] == last[:, None]) & m
    return jnp.where(on_last, seq_reward[:, None].astype(jnp.float32), 0.0)


def whiten(adv: Array, mask: Array, eps: float = 1e-8) -> Array:
    """(A - mean) / std over the masked tokens of the whole batch, 0 off the mask."""
    m = mask.astype(jnp.float32)
    n = jnp.maximum(m.sum(), 1.0)
    mu = jnp.sum(m * adv) / n
    var = jnp.sum(m * jnp.square(adv - mu)) / n
    return (adv - mu) * jax.lax.rsqrt(var + eps) * m


def joint_tx(policy_tx, critic_tx) -> optax.GradientTransformation:
    """One optax transformation over {'policy': ..., 'critic': ...}: each part its own."""

    def init(params):
        return {
            "policy": policy_tx.init(params["policy"]),
            "critic": critic_tx.init(params["critic"]),
        }

    def update(grads, state, params=None):
        part = lambda k: None if params is None else params[k]
        up_p, s_p = policy_tx.update(grads["policy"], state["policy"], part("policy"))
        up_c, s_c = critic_tx.update(grads["critic"], state["critic"], part("critic"))
        return {"policy": up_p, "critic": up_c}, {"policy": s_p, "critic": s_c}

    return optax.GradientTransformation(init, update)


def joint_view(state: TrainState) -> TrainState:
    """The state with {policy, critic} params and optimizer states side by side (works on a
    tree of shardings too): what `make_update_fn` differentiates and steps."""
    return TrainState(
        params={"policy": state.params, "critic": state.critic["params"]},
        opt_state={"policy": state.opt_state, "critic": state.critic["opt_state"]},
        step=state.step,
        rng=state.rng,
        skipped=state.skipped,
    )


def from_joint_view(view: TrainState) -> TrainState:
    return TrainState(
        params=view.params["policy"],
        opt_state=view.opt_state["policy"],
        step=view.step,
        rng=view.rng,
        skipped=view.skipped,
        critic={"params": view.params["critic"], "opt_state": view.opt_state["critic"]},
    )


@dataclasses.dataclass(frozen=True)
class GAEOptions:
    """The critic's returns and loss (`critic.*`): GAE's gamma and lambda, the value clip
    (None: unclipped) and its coefficient in the joint loss, whitening of the advantages, and
    the KL penalty folded into the token rewards (`objective.kl_in_reward`)."""

    gamma: float = 1.0
    lam: float = 0.95
    value_clip: float | None = 0.2
    value_coef: float = 0.5
    whiten: bool = True
    kl_coef_in_reward: float = 0.0
    kl_estimator: str = "k1"


class Critic:
    """A learned value function for PPO (module docstring): builds its state, annotates an
    Experience with GAE advantages, and makes the joint update."""

    def __init__(
        self,
        module: nnx.Module,
        *,
        kind: str,
        tx: optax.GradientTransformation,
        mesh,
        policy_graphdef,
        layout: dict,
        reward_weights: Array,
        options: GAEOptions = GAEOptions(),
    ):
        o = options
        gamma, lam, value_clip, value_coef = o.gamma, o.lam, o.value_clip, o.value_coef
        whiten, kl_coef_in_reward, kl_estimator = o.whiten, o.kl_coef_in_reward, o.kl_estimator
        self.kind, self.tx, self.mesh = kind, tx, mesh
        self.graphdef, params = nnx.split(module)
        self._params = jax.device_put(params, sharding.state_shardings(params, mesh))
        self.reads_hidden = kind == "head"  # the policy's hidden states
        self.gamma, self.lam, self.value_clip, self.value_coef = gamma, lam, value_clip, value_coef
        self.whiten = whiten
        self.beta, self.kl_estimator = kl_coef_in_reward, kl_estimator
        self.w_k = reward_weights
        self._policy_hidden = apply_hidden(policy_graphdef, **layout)
        self._annotate = {}  # jitted per batch key set

    def init_state(self) -> dict:
        """{'params', 'opt_state'} for `TrainState.critic`."""
        return {
            "params": self._params,
            "opt_state": init_opt_state(self.tx, self._params, self.mesh),
        }

    # ------------------------------------------------------------------ values, GAE

    def values(self, critic_params, tokens: Array, attention_mask: Array, hidden=None) -> Array:
        """V [B, T] aligned with the tokens (`rl.critic`)."""
        return nnx.merge(self.graphdef, critic_params).values(tokens, attention_mask, hidden)

    def token_rewards(self, batch: dict) -> Array:
        """The per-token rewards [B, T] GAE reads (module docstring)."""
        mask = batch["loss_mask"].astype(jnp.float32)
        if "turn_rewards" in batch:
            r = batch["turn_rewards"].astype(jnp.float32) * mask
        else:
            r = last_token_rewards(batch["rewards"].astype(jnp.float32) @ self.w_k, mask)
        if self.beta:
            old = batch["old_logp"]
            stats = TokenStats(logp=old, old_logp=old, ref_logp=batch["ref_logp"], mask=mask)
            r = r + distillation.kl_reward_penalty(stats, self.beta, self.kl_estimator)
        return r

    def annotate(self, policy_params, critic_params, batch: dict):
        """(advantages, returns, old values [B, T], value metrics) of a rollout batch.
        Jittable."""
        tokens, am = batch["tokens"], batch["attention_mask"]
        mask = batch["loss_mask"].astype(jnp.float32)
        hidden = self._policy_hidden(policy_params, tokens, am)[0] if self.reads_hidden else None
        values = self.values(critic_params, tokens, am, hidden) * mask
        adv, ret = critic_lib.gae(self.token_rewards(batch), values, mask, self.gamma, self.lam)
        if self.whiten:
            adv = whiten(adv, mask)
        return adv, ret, values, critic_lib.value_metrics(values, ret, mask)

    def prepare(self, state: TrainState, exp: Experience, policy_params) -> tuple[Experience, dict]:
        """The Experience with GAE advantages and `old_values`, `returns` in its extras, and
        the rollout's value metrics (value/mean, value/return_mean, value/explained_variance).
        """
        batch = dict(tokens=exp.tokens, attention_mask=exp.attention_mask)
        batch.update(loss_mask=exp.loss_mask, rewards=exp.rewards, old_logp=exp.old_logp)
        if self.beta:
            batch["ref_logp"] = exp.ref_logp
        if "turn_rewards" in exp.extras:
            batch["turn_rewards"] = exp.extras["turn_rewards"]
        key = tuple(sorted(batch))
        if key not in self._annotate:
            rows = sharding.batch_sharding(self.mesh, 2)
            self._annotate[key] = jax.jit(self.annotate, out_shardings=(rows, rows, rows, None))
        adv, ret, values, metrics = self._annotate[key](
            policy_params, state.critic["params"], batch
        )
        extras = {**exp.extras, "old_values": values, "returns": ret}
        return exp.replace(advantages=adv, extras=extras), metrics

    # ------------------------------------------------------------------ the update

    def joint_loss(self, loss_of):
        """loss_of(policy params, ...) -> the loss over {'policy', 'critic'} params."""

        def loss(joint, batch, denominator=None, frozen=None):
            batch = dict(batch)
            old_v, ret = batch.pop("old_values"), batch.pop("returns")
            batch.pop("turn_rewards", None)
            den = denominator or {}
            kw = {} if frozen is None else {"frozen": frozen}
            total, metrics = loss_of(joint["policy"], batch, denominator=den.get("policy"), **kw)
            metrics = dict(metrics)
            hidden = metrics.pop("hidden", None)
            if self.reads_hidden and hidden is None:
                raise ValueError(
                    "critic.kind = 'head' reads the policy loss's hidden states, which this "
                    "objective does not compute (a distillation loss on full logits?): use "
                    "critic.kind = 'model'"
                )
            m = batch["loss_mask"].astype(jnp.float32)
            values = self.values(joint["critic"], batch["tokens"], batch["attention_mask"], hidden)
            v_loss, v_metrics = critic_lib.value_loss(values, old_v, ret, m, self.value_clip)
            # this microbatch's share of the minibatch's token mean (exact accumulation)
            share = v_loss
            if "value" in den:
                share = v_loss * jnp.maximum(m.sum(), 1.0) / den["value"]
            metrics.update({"value/loss": v_loss, **v_metrics})
            return total + self.value_coef * share, metrics

        return loss

    def make_update(
        self,
        policy_tx,
        loss_of,
        grad_accum: int,
        state_sharding,
        batch_sharding_tree,
        *,
        denominator_fn,
        frozen_sharding=None,
        bias_update_rate: float = 0.0,
    ):
        """Jitted `update(state, batch[, frozen]) -> (state, metrics)`, as
        `train_step.make_update_fn`'s, with the critic trained alongside (donates the state;
        bias_update_rate: an MoE policy's balancing step, `train_step.balanced`)."""

        def denominators(batch):
            den = {"value": jnp.maximum(batch["loss_mask"].astype(jnp.float32).sum(), 1.0)}
            if denominator_fn is not None:
                den["policy"] = denominator_fn(batch)
            return den

        inner = make_update_fn(
            None,
            joint_tx(policy_tx, self.tx),
            self.joint_loss(loss_of),
            grad_accum,
            joint_view(state_sharding),
            batch_sharding_tree,
            denominator_fn=denominators,
            frozen_sharding=frozen_sharding,
            bias_update_rate=bias_update_rate,
        )

        def update(state, batch, *frozen):
            view, metrics = inner(joint_view(state), batch, *frozen)
            return from_joint_view(view), metrics

        in_sh = (state_sharding, batch_sharding_tree)
        in_sh += () if frozen_sharding is None else (frozen_sharding,)
        return jax.jit(
            update, in_shardings=in_sh, out_shardings=(state_sharding, None), donate_argnums=(0,)
        )


@dataclasses.dataclass(frozen=True)
class CriticSection:
    """`critic`: PPO's learned critic (none by default; rl/methods/critic.py). kind: none |
    head (a value head on the policy's final hidden states) | model (a small separate
    transformer); it goes with objective.advantage = 'gae': per-token GAE on its values over
    the policy tokens, a clipped value loss (value_clip; 0: unclipped) weighted by
    value_coef, its own Adam (lr; None: optimizer.lr). whiten: advantages scaled to zero
    mean, unit variance over the batch's policy tokens. stop_gradient: the head's value loss
    leaves the policy's trunk alone. hidden_size / num_layers: the separate model's size."""

    kind: str = key("none", "none | head | model", choices=("none", "head", "model"))
    gamma: float = key(1.0, "GAE's discount", low=0, high=1)
    lam: float = key(0.95, "GAE's lambda", low=0, high=1)
    value_clip: float = key(0.2, "the value loss's clip (0: unclipped)", low=0)
    value_coef: float = key(0.5, "the value loss's weight", low=0, low_open=True)
    lr: float | None = key(None, "the critic's Adam lr (None: optimizer.lr)")
    whiten: bool = key(True, "advantages to zero mean, unit variance")
    stop_gradient: bool = key(False, "the head's value loss leaves the trunk alone")
    hidden_size: int = key(64, "the separate model's width", low=0, low_open=True)
    num_layers: int = key(2, "the separate model's layers", low=0, low_open=True)

    def __post_init__(self):
        records.check(self, "critic")


@dataclasses.dataclass(frozen=True)
class CriticOptions(CriticSection):
    """The `critic` section as PPO's critic is built from it, with the run's seed (the
    critic's own stream) and its optimizer: the `optimizer` section with `lr` at `critic.lr`
    (None: optimizer.lr)."""

    seed: int = 0
    optimizer: OptimizerSection = dataclasses.field(default_factory=OptimizerSection)


def critic_optimizer(options: CriticOptions) -> optax.GradientTransformation:
    """The critic's Adam: its optimizer settings (the policy's at `critic.lr`), constant, no
    weight decay."""
    opt = dataclasses.replace(
        options.optimizer, schedule="constant", warmup_steps=0, weight_decay=0.0
    )
    return build_optimizer(opt, 1)


def build_critic(
    options: CriticOptions, policy, *, mesh, reward_names, objective: ObjectiveSection, layout: dict
) -> Critic | None:
    """The run's critic from its `CriticOptions` (None when critic.kind = 'none')."""
    cc = options
    if cc.kind == "none":
        return None
    kwargs: dict[str, Any] = {}
    if cc.kind == "head":
        kwargs["stop_gradient"] = cc.stop_gradient
    elif cc.kind == "model":
        kwargs.update(hidden_size=cc.hidden_size, num_layers=cc.num_layers)
    # its own stream: the policy's initialisation is the same with and without a critic
    key = jax.random.fold_in(jax.random.key(options.seed), 0xC417)
    module = critic_lib.make_critic(
        cc.kind, policy.cfg, rngs=nnx.Rngs(params=jax.random.key_data(key)), **kwargs
    )
    beta = float(objective.kl_coef) if objective.kl_in_reward else 0.0
    return Critic(
        module,
        kind=cc.kind,
        tx=critic_optimizer(options),
        mesh=mesh,
        policy_graphdef=nnx.graphdef(policy),
        layout=layout,
        reward_weights=reward_weight_vector(objective.reward_weights, reward_names),
        options=GAEOptions(
            gamma=cc.gamma,
            lam=cc.lam,
            value_clip=cc.value_clip or None,
            value_coef=cc.value_coef,
            whiten=cc.whiten,
            kl_coef_in_reward=beta,
            kl_estimator=objective.kl_estimator,
        ),
    )
