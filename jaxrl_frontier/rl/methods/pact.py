"""PACT: privileged trace co-training ("PACT: Privileged Trace Co-Training for Multi-Turn
Tool-Use Agents", Du et al., 2026).

Rollouts stay prompt-only. An expert trace tau* of each prompt x (its reasoning, tool calls,
the observations they got, the answer) enters only the update, through two signals beside
the configured objective, which stays the prompt-only anchor:

    L = L_obj(theta; x, o)                                             prompt-only anchor
      + lambda_tc * L_tc,   L_tc  = -sum_bt m_bt A_bt exp(l_bt - sg(l_bt)) / sum_bt m_bt
      + beta(k)   * L_sft,  L_sft = -sum_bt w_bt log pi_theta(tau*_t | x, tau*_<t) / sum_bt [w_bt > 0]

    l_bt     log pi_theta(o_t | x, c(tau*), o_<t): the rollout's own tokens o scored with the
             trace written after the prompt as a training-only context c(tau*)
             (`pact.context`); m the rollout's loss mask (sampled tokens), A its advantages
    w_bt     the trace token's component weight (`pact.weights`: reasoning, tool_call,
             answer; observations and padding 0)
    beta(k)  beta_0 * s(min(k / K, 1)) at RL step k (`pact.sft_coef`, `pact.anneal_steps`):
             s = 1 - u (linear), (1 + cos(pi u)) / 2 (cosine), 1 (constant)

L_tc's value is 0 with gradient sum m A grad(l) / sum m: REINFORCE under the trace context,
the rollout's advantages unchanged. The sums run over the microbatch (exact with
`optimizer.grad_accum = 1`). An expert trace comes from a registered source
(`TRACE_SOURCES`, `pact.source`): a list of turns, each a list of (component, text)
segments, with the observation text the environment answered after each turn but the last.
The turn's stop token ends every turn, as in the rollouts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_frontier.core import records
from jaxrl_frontier.core.capabilities import Capabilities
from jaxrl_frontier.core.records import key, section
from jaxrl_frontier.core.registry import Registry

sg = jax.lax.stop_gradient

COMPONENTS = ("reasoning", "tool_call", "answer")
SCHEDULES: dict[str, Callable[[float], float]] = {
    "linear": lambda u: 1.0 - u,
    "cosine": lambda u: 0.5 * (1.0 + math.cos(math.pi * u)),
    "constant": lambda u: 1.0,
}
# the batch fields the update reads (built on the host by `pact_fields`)
FIELDS = ("pact_tokens", "pact_mask", "pact_loss_mask", "pact_adv", "sft_tokens", "sft_mask")
FIELDS += ("sft_weight", "pact_beta")


@dataclasses.dataclass(frozen=True)
class Turn:
    """One expert turn: (component, text) segments, then the observation it got ('' for the
    last turn)."""

    segments: tuple[tuple[str, str], ...]
    observation: str = ""

    @property
    def text(self) -> str:
        return "".join(t for _, t in self.segments)


ExpertTrace = Sequence[Turn]
TRACE_SOURCES: Registry = Registry("pact trace source", key="pact.source")


def anneal(step: int, beta0: float, steps: int, schedule: str = "linear") -> float:
    """beta(k) = beta0 * s(min(k / K, 1)) (module docstring); K = 0: constant beta0."""
    if schedule not in SCHEDULES:
        raise ValueError(f"pact.schedule = {schedule!r}; allowed: {sorted(SCHEDULES)}")
    u = 1.0 if steps <= 0 and schedule != "constant" else min(step / max(steps, 1), 1.0)
    return float(beta0) * SCHEDULES["constant" if steps <= 0 else schedule](u)


def trace_surrogate(logp_bt, adv_bt, mask_bt):
    """L_tc = -sum m A exp(l - sg l) / sum m over [B, T] arrays: value 0, gradient
    -sum m A grad l / sum m."""
    ratio = jnp.exp(logp_bt - sg(logp_bt))
    return -jnp.sum(mask_bt * adv_bt * ratio) / jnp.maximum(jnp.sum(mask_bt), 1.0)


def component_sft(logp_bt, weight_bt):
    """L_sft = -sum w log p / sum [w > 0] over [B, T] arrays."""
    count = jnp.sum((weight_bt > 0).astype(logp_bt.dtype))
    return -jnp.sum(weight_bt * logp_bt) / jnp.maximum(count, 1.0)


# ------------------------------------------------------------------ host side


def trace_ids(tokenizer, trace: ExpertTrace, weights: dict[str, float], stop_id: int, obs_text):
    """(ids, per-token weights) of a trace: each turn's segments, its stop token (weighted as
    the turn's last segment), then its observation (`obs_text(text)`, weight 0)."""
    ids: list[int] = []
    w: list[float] = []
    for turn in trace:
        last = 0.0
        for component, text in turn.segments:
            if component not in weights:
                raise ValueError(f"pact: trace component {component!r}; allowed: {sorted(weights)}")
            piece = tokenizer.encode(text)
            ids += piece
            w += [float(weights[component])] * len(piece)
            last = float(weights[component])
        ids.append(int(stop_id))
        w.append(last)
        if turn.observation:
            piece = tokenizer.encode(obs_text(turn.observation))
            ids += piece
            w += [0.0] * len(piece)
    return ids, w


def _left_pad(rows: Sequence[Sequence[int]], width: int, pad_id: int):
    tok = np.full((len(rows), width), pad_id, np.int32)
    mask = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        if r:
            tok[i, width - len(r) :], mask[i, width - len(r) :] = r, 1
    return tok, mask


def _right_pad(rows, width: int, fill, dtype):
    out = np.full((len(rows), width), fill, dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r[:width]
    return out


def prompt_width(loss_mask: np.ndarray) -> int:
    """The first completion column of [prompt (left-padded) | completion] rows [B, T]."""
    cols = np.flatnonzero(np.asarray(loss_mask).any(axis=0))
    return int(cols[0]) if cols.size else loss_mask.shape[1]


def pact_fields(
    tokenizer,
    rows: dict[str, np.ndarray],
    *,
    traces: Sequence[ExpertTrace],
    context: str,
    weights: dict[str, float],
    stop_id: int,
    beta: float,
    context_len: int,
    trace_len: int,
    obs_text: Callable[[str], str] = lambda s: s,
) -> dict[str, np.ndarray]:
    """The update's PACT arrays for B rows (one trace per row) [host numpy], from `rows`:
    this process's tokens, attention_mask, loss_mask and advantages [B, T].

    pact_tokens / pact_mask / pact_loss_mask / pact_adv  [B, Tp + Tc + Tn]: each row as
        prompt | c(tau*) (left-padded to Tc = context_len) | completion; loss mask and
        advantages on the completion's columns only
    sft_tokens / sft_mask / sft_weight  [B, Tp + Ts]: prompt | the trace's ids
        (right-padded to Ts = trace_len), component weights on the trace's tokens
    pact_beta [B, 1]: beta(k) (the same in every row)

    A context or trace longer than its width is an error naming the key."""
    tokens, attention_mask = rows["tokens"], rows["attention_mask"]
    loss_mask, advantages = rows["loss_mask"], rows["advantages"]
    tokens, attention_mask = np.asarray(tokens), np.asarray(attention_mask)
    loss_mask, advantages = np.asarray(loss_mask), np.asarray(advantages)
    b = tokens.shape[0]
    if len(traces) != b:
        raise ValueError(f"pact: {len(traces)} traces for {b} rows")
    tp = prompt_width(loss_mask)
    ctx_rows, trace_rows, weight_rows = [], [], []
    for trace in traces:
        text = context.format(trace="".join(t.text + t.observation for t in trace))
        ctx = tokenizer.encode(text)
        if len(ctx) > context_len:
            raise ValueError(
                f"pact: a trace context is {len(ctx)} tokens, more than config key "
                f"'pact.context_len' = {context_len}"
            )
        ids, w = trace_ids(tokenizer, trace, weights, stop_id, obs_text)
        if len(ids) > trace_len:
            raise ValueError(
                f"pact: an expert trace is {len(ids)} tokens, more than config key "
                f"'pact.trace_len' = {trace_len}"
            )
        ctx_rows.append(ctx), trace_rows.append(ids), weight_rows.append(w)
    ctx_tok, ctx_mask = _left_pad(ctx_rows, context_len, tokenizer.pad_id)
    zeros = np.zeros((b, tp + context_len), np.float32)
    prompt_tok, prompt_mask = tokens[:, :tp], attention_mask[:, :tp]
    trace_tok = _right_pad(trace_rows, trace_len, tokenizer.pad_id, np.int32)
    trace_mask = _right_pad([[1] * len(r) for r in trace_rows], trace_len, 0, np.int32)
    trace_w = _right_pad(weight_rows, trace_len, 0.0, np.float32)
    return {
        "pact_tokens": np.concatenate([prompt_tok, ctx_tok, tokens[:, tp:]], 1).astype(np.int32),
        "pact_mask": np.concatenate([prompt_mask, ctx_mask, attention_mask[:, tp:]], 1).astype(
            np.int32
        ),
        "pact_loss_mask": np.concatenate([zeros, loss_mask[:, tp:]], 1).astype(np.float32),
        "pact_adv": np.concatenate([zeros, advantages[:, tp:]], 1).astype(np.float32),
        "sft_tokens": np.concatenate([prompt_tok, trace_tok], 1).astype(np.int32),
        "sft_mask": np.concatenate([prompt_mask, trace_mask], 1).astype(np.int32),
        "sft_weight": np.concatenate([np.zeros((b, tp), np.float32), trace_w], 1),
        "pact_beta": np.full((b, 1), beta, np.float32),
    }


# ------------------------------------------------------------------ the update


def with_pact(loss_of, logp_fn, trace_coef: float):
    """`loss_of` (the prompt-only anchor) plus lambda_tc L_tc and beta L_sft (module
    docstring) when the batch holds the PACT fields; logp_fn(params, tokens, mask) -> [B, T]
    log-probs aligned with tokens (e.g. `forward.make_logp_fn`)."""

    def pact_loss(params, batch, denominator=None, frozen=None):
        extra = {k: batch[k] for k in FIELDS if k in batch}
        rest = {k: v for k, v in batch.items() if k not in FIELDS}
        loss, metrics = loss_of(params, rest, denominator=denominator, frozen=frozen)
        if len(extra) != len(FIELDS):
            return loss, metrics
        logp_tc = logp_fn(params, extra["pact_tokens"], extra["pact_mask"])
        l_tc = trace_surrogate(logp_tc, extra["pact_adv"], extra["pact_loss_mask"])
        logp_sft = logp_fn(params, extra["sft_tokens"], extra["sft_mask"])
        l_sft = component_sft(logp_sft, extra["sft_weight"])
        beta = jnp.mean(extra["pact_beta"])
        m = extra["pact_loss_mask"]
        tc = extra["pact_tokens"].shape[1] - batch["tokens"].shape[1]  # the context width
        # how much likelier the trace context makes the rollout's tokens (per token)
        gap = jnp.sum(m * (sg(logp_tc) - _shift_right(batch["old_logp"], tc))) / jnp.maximum(
            jnp.sum(m), 1.0
        )
        metrics = {
            **metrics,
            "pact/trace_loss": l_tc,
            "pact/sft_nll": l_sft,
            "pact/beta": beta,
            "pact/trace_logp_gain": gap,
        }
        return loss + trace_coef * l_tc + beta * l_sft, metrics

    return pact_loss


def _shift_right(x_bt, columns: int):
    """[B, T] -> [B, T + columns], zeros first: a rollout array that is 0 on the prompt
    (old_logp) lands on the completion columns of the [prompt | context | completion] rows."""
    return jnp.pad(x_bt, ((0, 0), (columns, 0)))


@dataclasses.dataclass(frozen=True)
class PactWeights:
    """`pact.weights`: the SFT targets' weight of each trace component (`COMPONENTS`)."""

    reasoning: float = key(0.5, "the trace's reasoning text")
    tool_call: float = key(1.0, "the trace's tool calls")
    answer: float = key(1.0, "the trace's answer")


@dataclasses.dataclass(frozen=True)
class PactOptions:
    """The `pact` section (module docstring): rollouts stay prompt-only; each prompt's expert
    trace (a `TRACE_SOURCES` name) enters the update as a context after the prompt, scoring
    the rollout (trace_coef x the trace-conditioned surrogate), and as SFT targets (component
    `weights`; sft_coef annealed to 0 over anneal_steps by `schedule`)."""

    enabled: bool = key(False, "PACT's expert traces in the update")
    source: str = key("calculator", "the trace source (a TRACE_SOURCES name)")
    context: str = key("expert solution: {trace}\n", "how the trace is written after the prompt")
    trace_coef: float = key(0.5, "the trace-conditioned surrogate's weight")
    sft_coef: float = key(0.2, "the SFT targets' starting weight")
    anneal_steps: int = key(200, "steps sft_coef anneals to 0 over")
    schedule: str = key("linear", "sft_coef's annealing", choices=("linear", "cosine", "constant"))
    weights: PactWeights = section(PactWeights, "the SFT targets' component weights")
    context_len: int = key(96, "the context's tokens, at most")
    trace_len: int = key(64, "the trace's tokens, at most")

    def __post_init__(self):
        records.check(self, "pact")

    @property
    def component_weights(self) -> dict[str, float]:
        """{component: weight}, in `COMPONENTS` order."""
        return {c: float(getattr(self.weights, c)) for c in COMPONENTS}


# ------------------------------------------------------------------ trace sources


@TRACE_SOURCES.register("calculator")
def calculator_trace(example, env=None) -> list[Turn]:
    """The calculator environment's expert: call the tool on the problem's expression, then
    answer with the result (`envs.calculator`; the example's `seed` picks the problem)."""
    from jaxrl_frontier.data.envs import calculator

    env = env or calculator.CalculatorEnv()
    problem = calculator.make_problem(int(example["seed"]), env.max_number)
    s, answer = env.syntax, str(problem["answer"])
    call = f"{s.call_open}{problem['expression']}{s.call_close}"
    return [
        Turn(
            (("reasoning", "compute "), ("tool_call", call)),
            f"{s.result_open}{answer}{s.result_close}\n",
        ),
        Turn((("answer", f"{s.answer_open}{answer}{s.answer_close}"),)),
    ]


@TRACE_SOURCES.register("answer")
def answer_trace(example, env=None) -> list[Turn]:
    """A single-turn task's reference answer (`example['answer']`) as the whole trace."""
    return [Turn((("answer", str(example["answer"])),))]


# ------------------------------------------------------------------ the producer


class PactProducer:
    """A RolloutProducer whose Experience also carries the PACT fields (`pact_fields`) of
    its rows, built on the host from each prompt's expert trace; everything else is the
    wrapped producer's. The rollouts themselves never see a trace. `stops`: the `env.stop`
    strings of an environment run (a turn ends as the rollouts' turns do: at the first of
    them, else EOS)."""

    local = False  # samples on the run's mesh (process-local rollouts: not a capability)
    _WRAPS = "its producer wraps the rollouts"
    capabilities = Capabilities.all_but(
        partial_rows=_WRAPS,
        process_local=_WRAPS,
        free_running=_WRAPS,
        keeps_rows_in_flight=_WRAPS,
        packed_rows="its expert traces run on padded rows",
    )

    def __init__(
        self, producer, options: PactOptions, tokenizer, *, mesh, obs_text=lambda s: s, env=None,
        stops=(),
    ):  # fmt: skip
        p = options
        self.producer, self.tokenizer, self.mesh = producer, tokenizer, mesh
        self.trace = TRACE_SOURCES.get(p.source)
        self.cfg, self.obs_text, self.env = p, obs_text, env
        self.weights = p.component_weights
        stops = tuple(stops) if env is not None else ()
        self.stop_id = int(tokenizer.encode(stops[0])[0]) if stops else int(tokenizer.eos_id)

    def produce(self, examples, weights, key, *, version: int = 0, source=None, **options):
        from jaxrl_frontier.core import sharding

        exp, info = self.producer.produce(
            examples, weights, key, version=version, source=source, **options
        )
        local = lambda x: sharding.local_rows(x, self.mesh)
        results = info["results"]
        g = exp.num_rows // max(len(results), 1) // max(jax.process_count(), 1)
        traces = [self.trace(r.example, self.env) for r in results for _ in range(g)]
        p = self.cfg
        beta = anneal(version, p.sft_coef, p.anneal_steps, p.schedule)
        host = pact_fields(
            self.tokenizer,
            {
                "tokens": local(exp.tokens),
                "attention_mask": local(exp.attention_mask),
                "loss_mask": local(exp.loss_mask),
                "advantages": local(exp.advantages),
            },
            traces=traces,
            context=p.context,
            weights=self.weights,
            stop_id=self.stop_id,
            beta=beta,
            context_len=p.context_len,
            trace_len=p.trace_len,
            obs_text=self.obs_text,
        )
        fields = sharding.shard_local_batch(host, self.mesh)
        return exp.replace(extras={**exp.extras, **fields}), info

    def __getattr__(self, name):  # the wrapped producer's attributes (sampler, ...)
        return getattr(self.producer, name)


def loss_transform(options: PactOptions | None, graphdef):
    """The Learner's loss transform: `with_pact` over the policy's full-row log-probs, or
    None when PACT is off (options None)."""
    if options is None:
        return None
    from jaxrl_frontier.rl.learn.forward import make_logp_fn

    logp_fn = make_logp_fn(graphdef)
    return lambda loss_of: with_pact(loss_of, logp_fn, float(options.trace_coef))


def wrap_producer(producer, options: PactOptions | None, tokenizer, *, mesh, env=None, task=None):
    """`PactProducer` around the run's producer when PACT is on (options not None; for an
    environment run, `env` its section, the observations are formatted as its rollouts
    format them), else the producer."""
    if options is None:
        return producer
    stops, obs_text = (), lambda s: s
    if env is not None:
        from jaxrl_frontier.data.envs.base import env_from_config

        stops, obs_text, env = tuple(env.stop), task.observation_text, env_from_config(env)
    return PactProducer(
        producer, options, tokenizer, mesh=mesh, obs_text=obs_text, env=env, stops=stops
    )
