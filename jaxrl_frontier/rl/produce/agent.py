"""The environment RolloutProducer: G episodes per environment seed in, an `Experience` out.

    examples (P seeds)  -> EpisodeBatch of P * G episodes (a group shares its seed, so its
                           episodes start from the same state)
    first observations  -> TurnSession.start (each prompt prefilled once for its G rows)
    until every episode is done or a budget:
        TurnSession.turn (caps: env.turn_tokens, or the episode's remaining token budget)
        -> decoded actions -> EpisodeBatch.step -> observation ids -> TurnSession.append
    episodes            -> `envs.trajectory.pack`: prompt | action 0 | observation 1 | ...
                           loss_mask 1 on sampled action tokens only, turn_index per token,
                           old_logp the sampled tokens' behaviour log-probs
    rewards [B, 2]      -> (episode return, success); per-turn rewards kept as
                           extras['turn_rewards'] (each turn's reward on its last token)
    advantages          -> env.credit: 'episode' runs the configured objective.advantage on
                           the episode returns (a group baseline: GRPO, RLOO, ... as for any
                           task); 'gigpo' and '3spo' give per-turn advantages
                           (`rl.step_credit`) on each turn's action tokens

It returns what the single-turn `RolloutProducer` returns, so the Learner, every weight,
aggregation and log-prob pass work unchanged; the completion width is fixed by the config
(`completion_width`), so the update compiles once. One process (the episodes are stepped on
the host that samples them).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.core import sharding
from jaxrl_frontier.core.capabilities import Capabilities
from jaxrl_frontier.data.envs.base import env_from_config
from jaxrl_frontier.data.envs.batch import EpisodeBatch
from jaxrl_frontier.data.envs.task import ENV_REWARD_NAMES, EnvTask, section_get
from jaxrl_frontier.data.envs.trajectory import pack
from jaxrl_frontier.models.text import encode_prompts
from jaxrl_frontier.objectives.schema import ObjectiveSection, objective_of
from jaxrl_frontier.rl.experience import Experience
from jaxrl_frontier.rl.methods import step_credit
from jaxrl_frontier.rl.methods.critic import turn_rewards_to_tokens
from jaxrl_frontier.rl.produce.advantages_and_metrics import (
    advantages_and_metrics,
    prompt_results,
)
from jaxrl_frontier.rl.produce.passes import run_passes
from jaxrl_frontier.sampling import SamplingParams
from jaxrl_frontier.sampling.turns import TurnSession


def completion_width(env) -> int:
    """C, the episode part of every row: max_turns actions of turn_tokens and the
    observations between them, or the token budget when that is smaller."""
    e = lambda k: int(section_get(env, k))
    width = e("max_turns") * e("turn_tokens") + (e("max_turns") - 1) * e("obs_tokens")
    return min(width, e("max_tokens")) if e("max_tokens") else width


def stop_ids(tokenizer, stops: Sequence[str], task=None) -> tuple[int, ...]:
    """The turn's end tokens: EOS, each `env.stop` string (one token each), and with a chat
    template (`task.chat`) the token that ends an assistant turn."""
    ids = [tokenizer.eos_id]
    if task is not None and task.chat is not None:
        ids += task.chat.stop_token_ids(tokenizer)
    for s in stops:
        enc = tokenizer.encode(s)
        if len(enc) != 1:
            raise ValueError(f"config key 'env.stop': {s!r} is {len(enc)} tokens, not one")
        ids.append(enc[0])
    return tuple(dict.fromkeys(ids))


def encode_observation(tokenizer, text: str) -> list[int]:
    """An observation's ids; a character the tokenizer lacks becomes its unknown token
    (an environment's error message must not end the run)."""
    try:
        return tokenizer.encode(text)
    except ValueError:
        return tokenizer.encode(text, errors="replace")


@dataclasses.dataclass
class Played:
    """A batch of finished episodes and their tokens (host).

    batch: the EpisodeBatch; prompts int32 [R, Tp] / prompt_mask (row r's prompt);
    actions[r][k]: turn k's sampled ids (stop token included); logps[r][k] their log-probs;
    observations[r][k]: the ids appended after action k (one fewer than actions, or equal).
    """

    batch: EpisodeBatch
    prompts: np.ndarray
    prompt_mask: np.ndarray
    actions: list
    logps: list
    observations: list


def play(session: TurnSession, task: EnvTask, tokenizer, seeds, key, *, env) -> Played:
    """Play one episode per row: seeds [P] (G rows each, `session.params.n`), to the end or
    a budget (module docstring)."""
    g = session.plan.n
    obs_ids = lambda text: encode_observation(tokenizer, task.observation_text(text))
    envs = [env_from_config(env) for _ in range(len(seeds) * g)]
    batch = EpisodeBatch(
        envs,
        max_turns=int(env.max_turns),
        max_tokens=int(env.max_tokens),
        count_tokens=lambda text: len(obs_ids(text)),
    )
    row_seeds = np.repeat(np.asarray(seeds, np.int64), g)
    first = batch.reset(row_seeds.tolist(), groups=np.repeat(np.arange(len(seeds)), g).tolist())
    texts = [task.first_text(first[i * g]) for i in range(len(seeds))]
    tok, mask = encode_prompts(tokenizer, texts, int(section_get(env, "max_prompt_len")))
    rows = session.start(tok, mask, key)
    ptok, pmask = (np.repeat(x[: len(seeds)], g, axis=0) for x in session.prompts)
    actions, logps, observations = ([[] for _ in range(rows)] for _ in range(3))
    stops = set(np.asarray(session.knobs.stop_ids).tolist()) - {-1}
    for _ in range(batch.max_turns):
        live = batch.live
        if not live.any():
            break
        cap = lambda i: min(session.turn_tokens, batch.remaining_tokens(i) or session.turn_tokens)
        caps = [cap(i) if live[i] else 0 for i in range(rows)]  # live rows: remaining > 0
        tokens, logp, lengths = session.turn(caps)
        texts = []
        for i in range(rows):
            if not live[i]:
                texts.append(None)
                continue
            ids = tokens[i, : lengths[i]].tolist()
            actions[i].append(ids)
            logps[i].append(logp[i, : lengths[i]].tolist())
            body = ids[:-1] if ids and ids[-1] in stops else ids
            texts.append(tokenizer.decode(body, skip_special=True))
        out = batch.step(
            texts, action_tokens=[int(n) if live[i] else None for i, n in enumerate(lengths)]
        )
        appended = [None] * rows
        for i, res in enumerate(out):
            if res is None or res[2]:
                continue
            ids = obs_ids(res[0])
            if len(ids) > session.obs_tokens:  # no room in the context: cut, as a budget
                ep = batch.episodes[i]
                ep.done, ep.cut = True, "tokens"
                ep.infos[-1]["cut"] = "tokens"
                continue
            appended[i] = ids
            observations[i].append(ids)
        if any(appended) and batch.live.any() and session.turns < session.max_turns:
            session.append(appended)
    return Played(batch, ptok, pmask, actions, logps, observations)


def episode_metrics(batch: EpisodeBatch) -> dict[str, float]:
    """Host metrics of a finished batch: success, return, turns, cut fractions, invalid
    actions."""
    eps = batch.episodes
    steps = [info for ep in eps for info in ep.infos]
    cut = [ep.cut for ep in eps]
    return {
        "env/success_rate": float(np.mean(batch.successes())),
        "env/return": float(np.mean(batch.returns())),
        "env/turns": float(np.mean([ep.turns for ep in eps])),
        "env/cut": float(np.mean(batch.cut())),
        "env/cut_turns": float(np.mean([c == "turns" for c in cut])),
        "env/cut_tokens": float(np.mean([c == "tokens" for c in cut])),
        "env/invalid_actions": float(np.mean([bool(s.get("invalid")) for s in steps] or [0.0])),
        "env/episode_tokens": float(np.mean([ep.tokens for ep in eps])),
    }


def transcript(ep) -> str:
    """An episode after its first observation, as text: each action, then the observation
    that followed it (the last one, after the end, left out)."""
    last = len(ep.actions) - 1
    return "".join(
        a + (ep.observations[k + 1] if k < last else "") for k, a in enumerate(ep.actions)
    )


class AgentRolloutProducer:
    """Plays, packs and annotates one batch of environment seeds (module docstring).

    Args:
      sampler: the run's `Sampler`; task: the `EnvTask`; env: the `env` config block (with
      `max_prompt_len` added: `data.max_prompt_len`); sampling: the rollout's settings (n =
      G; the turn cap and the stop tokens come from env); objective: the objective section;
      passes: `LogprobPass`es (behaviour, reference) over the packed rows.
    """

    local = False  # samples on the run's mesh (process-local rollouts: not a capability)
    _EPISODES = "episodes: the agent producer"
    capabilities = Capabilities.all_but(
        partial_rows=_EPISODES,
        process_local=_EPISODES,
        free_running=_EPISODES,
        keeps_rows_in_flight=_EPISODES,
        multi_process="environment rollouts run in one process",
        population="environment runs are not run as a population yet",
        several_teachers="episodes carry no tag",
        teacher_tokenizer="its rows are episodes of several turns",
    )

    def __init__(
        self,
        sampler,
        tokenizer,
        task: EnvTask,
        *,
        mesh,
        env,
        sampling: SamplingParams,
        objective: ObjectiveSection,
        passes=(),
    ):
        if jax.process_count() > 1:
            raise ValueError("environment rollouts run in one process (env.name with several)")
        self.sampler, self.tokenizer, self.task, self.mesh, self.env = (
            sampler,
            tokenizer,
            task,
            mesh,
            env,
        )
        self.params = dataclasses.replace(
            sampling,
            max_new_tokens=int(env.turn_tokens),
            stop_ids=stop_ids(tokenizer, tuple(env.stop), task),
        )
        self.session = TurnSession(
            sampler, self.params, obs_tokens=int(env.obs_tokens), max_turns=int(env.max_turns)
        )
        objective = objective_of(objective)
        self.objective = dataclasses.replace(
            objective, reward_weights=objective.reward_weights or {"return": 1.0}
        )
        self.passes = tuple(passes)
        self.reward_names = ENV_REWARD_NAMES
        self.completion_len = completion_width(env)
        self.credit = str(env.credit)

    def produce(
        self, examples, weights: dict[str, Any], key, *, version: int = 0, source=None
    ) -> tuple[Experience, dict[str, Any]]:
        """One batch of episodes: (Experience, info), as `RolloutProducer.produce`."""
        g = self.params.n
        t0 = time.perf_counter()
        self.sampler.update_weights(weights["policy"], version)
        played = play(
            self.session, self.task, self.tokenizer, [e["seed"] for e in examples], key,
            env=self.env,
        )  # fmt: skip
        t_rollout = time.perf_counter() - t0
        batch = played.batch
        host = self._pack(played, examples, version)
        exp = Experience(**sharding.shard_local_batch(host, self.mesh))
        exp, pass_metrics = run_passes(self.passes, weights, exp)
        adv, r_b, metrics = advantages_and_metrics(exp, self.objective, self.reward_names, g)
        metrics.update(pass_metrics)
        if self.credit != "episode":
            adv = self._step_advantages(batch, exp, source and source.state_scores)
        source_metrics = source.metrics() if source is not None else {}  # 3SPO's
        host_metrics = {**episode_metrics(batch), **source_metrics}
        metrics = {**metrics, **{k: jnp.float32(v) for k, v in host_metrics.items()}}
        exp = exp.replace(advantages=adv)
        texts = tuple(transcript(ep) for ep in batch.episodes)
        states = tuple(tuple(ep.states) for ep in batch.episodes)
        results = prompt_results(
            examples,
            host["rewards"],
            np.asarray(r_b),
            host["loss_mask"].sum(1),
            texts,
            self.reward_names,
            states,
        )
        info = dict(
            metrics=metrics,
            n_failed=0.0,
            rollout_seconds=t_rollout,
            policy_version=version,
            results=results,
            texts=texts,
        )
        return exp, info

    def _pack(self, played: Played, examples, version: int) -> dict[str, np.ndarray]:
        g, batch = self.params.n, played.batch
        rows = len(batch.episodes)
        prompts = [p[m == 1] for p, m in zip(played.prompts, played.prompt_mask)]
        tp = played.prompts.shape[1]
        packed = pack(
            prompts,
            list(zip(played.actions, played.observations)),
            self.sampler.pad_id,
            prompt_width=tp,
            completion_width=self.completion_len,
        )
        old_logp = np.zeros_like(packed["loss_mask"])
        for r in range(rows):
            values = [x for turn in played.logps[r] for x in turn]
            old_logp[r, packed["loss_mask"][r] == 1] = values
        turn_rewards = batch.turn_rewards()
        per_token = turn_rewards_to_tokens(
            jnp.asarray(turn_rewards),
            jnp.asarray(packed["turn_index"]),
            jnp.asarray(packed["loss_mask"]),
        )
        rewards = np.stack([batch.returns(), batch.successes().astype(np.float32)], axis=1)
        host = dict(
            tokens=packed["tokens"],
            attention_mask=packed["attention_mask"],
            loss_mask=packed["loss_mask"],
            old_logp=old_logp.astype(np.float32),
            advantages=np.zeros_like(packed["loss_mask"]),
            rewards=rewards.astype(np.float32),
            prompt_index=np.repeat([int(e["index"]) for e in examples], g).astype(np.int32),
            group_id=(np.arange(rows) // g).astype(np.int32),
            policy_version=np.full((rows,), version, np.int32),
            turn_index=packed["turn_index"],
        )
        host["extras"] = {"turn_rewards": np.asarray(per_token, np.float32)}
        return host

    def _step_advantages(self, batch: EpisodeBatch, exp: Experience, scores):
        """Per-turn advantages (GiGPO, or 3SPO on GiGPO's episode term) on each turn's
        action tokens, [B, T]. scores: 3SPO's state history (the 'sspo' prompt source's,
        updated when it observes this batch)."""
        e = self.env
        steps = step_credit.Steps.from_episodes(batch.episodes)
        gi = step_credit.gigpo_advantages(
            steps, gamma=float(e.gamma), step_weight=float(e.step_weight), scale=str(e.scale)
        )
        per_step = gi["advantage"]
        if self.credit == "3spo":  # state-score step rewards compared at anchors
            if scores is None:
                raise ValueError("env.credit='3spo' reads the state history of data.source='sspo'")
            a_s = scores.advantages(steps, scale=str(e.scale))
            per_step = gi["episode"] + float(e.step_weight) * a_s
        values = np.zeros((len(batch.episodes), batch.max_turns), np.float32)
        values[steps.episode, steps.turn] = per_step
        return step_credit.steps_to_tokens(jnp.asarray(values), exp.turn_index, exp.loss_mask)


def env_producer(env, sampler, tokenizer, task, *, mesh, sampling, objective, passes):
    """The producer of an environment run (`env.name` set; env: the `env` section with
    `max_prompt_len`): `run/rl_build.py` selects it."""
    return AgentRolloutProducer(
        sampler,
        tokenizer,
        task,
        mesh=mesh,
        env=env,
        sampling=sampling,
        objective=objective,
        passes=passes,
    )
