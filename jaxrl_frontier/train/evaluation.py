"""Held-out evaluation: greedy pass@1 and sampled pass@k on a fixed set of eval prompts, one
function (`evaluate`) for every kind of task, called by the trainer, for an environment run
and by scripts/evaluate.py.

    task.evaluation (a declared kind)  -> EVAL_BATCHES: the part that rolls one eval batch
                                          'completions': sample, decode, score (`Task`)
                                          'episodes': play to the end (`EnvTask`)
    part.examples(n)                   -> the held-out prompts (or environment seeds)
    the greedy pass (n = 1, key 0), then the sampled pass (n = k, temperature 1, key 1),
    each over chunks of `batch` prompts, one key split per chunk
                                       -> EvalRows: each row's correctness, prompt-major
    figures: pass@1_greedy, pass@k (any of a prompt's k rows right), mean_correct_sampled,
    reward_failed, and the part's own greedy means (an environment's return and turns)

Every process runs the same rollouts (the eval prompts are the same everywhere) and scores
every row, so each process returns the same figures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxrl_frontier.core import records, sharding
from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.data.defaults import EnvOptions
from jaxrl_frontier.data.rewards.scorer import InProcessScorer
from jaxrl_frontier.data.tasks import TaskOptions, chat, eval_examples
from jaxrl_frontier.models.text import decode, encode_prompts
from jaxrl_frontier.rl.produce import agent
from jaxrl_frontier.sampling import SamplingParams
from jaxrl_frontier.sampling.turns import TurnSession


@dataclasses.dataclass(frozen=True)
class EvalSection:
    """The `eval` config section, declared once (core/records.py): its keys, their defaults,
    docs and ranges."""

    num_prompts: int = records.key(
        256, "held-out prompts evaluated (the eval split's first)", low=0, low_open=True
    )
    pass_k: int = records.key(
        4, "samples a prompt in the sampled pass (pass@k; 1: none)", low=0, low_open=True
    )
    batch: int = records.key(
        128, "prompts a greedy batch (rows of the sampled pass)", low=0, low_open=True
    )
    at_start: bool = records.key(True, "RL: evaluate the starting policy at step 0")

    def __post_init__(self):
        records.check(self, "eval")


@dataclasses.dataclass(frozen=True)
class EvalOptions(EvalSection):
    """What the held-out evaluation reads: the `eval` section (`EvalSection`), the run's seed
    (which prompts), the completion budget (`rollout.max_new_tokens`), the prompt length
    (`data.max_prompt_len`), the task's `TaskOptions` (`prompts`: the stop tokens of its chat
    template) and, in an environment run, the `env` section (`environment`, with
    `max_prompt_len`).

    Not config keys (their defaults are the trainer's evaluation; scripts/evaluate.py sets
    them): key_seed, the greedy pass's PRNG key (the sampled pass's is key_seed + 1);
    sampled_batch, prompts per chunk of the sampled pass (0: `batch`); sampled, whether the
    sampled pass runs (None: when pass_k > 1)."""

    seed: int = 0
    max_new_tokens: int = 8
    max_prompt_len: int = 16
    prompts: TaskOptions = dataclasses.field(default_factory=TaskOptions)
    environment: EnvOptions | None = None
    key_seed: int = 0
    sampled_batch: int = 0
    sampled: bool | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.sampled_batch < 0:
            raise ValueError(f"EvalOptions.sampled_batch = {self.sampled_batch} must be >= 0")

    @property
    def runs_sampled(self) -> bool:
        """Whether the sampled pass runs (`sampled`; by default when pass_k > 1)."""
        return self.pass_k > 1 if self.sampled is None else bool(self.sampled)


@dataclasses.dataclass(frozen=True)
class EvalRows:
    """One eval batch, rolled: its rows prompt-major (prompt i's n rows at i*n ... i*n + n-1).

    correct [R]: each row's correctness (1: right); failed: rows whose reward raised (scored
    0); greedy_figures: name -> [R], reported after the greedy pass as the mean
    'eval/<name>_greedy'; batch: what was rolled (a `Rollout`, an `EpisodeBatch`), for a
    caller's `on_sampled`."""

    correct: np.ndarray
    failed: float = 0.0
    greedy_figures: dict = dataclasses.field(default_factory=dict)
    batch: Any = None


# task.evaluation (a kind each task class declares) -> the part that rolls one eval batch:
#   part = cls(sampler, tokenizer, task, options: EvalOptions, scorer)
#   part.examples(n) -> n held-out examples; part.params(greedy, k) -> SamplingParams;
#   part.roll(examples, params, key) -> EvalRows of len(examples) * params.n rows
EVAL_BATCHES = Registry("evaluation")


@EVAL_BATCHES.register("completions")
class CompletionBatches:
    """A prompt task's eval batch: sample each prompt's completions, decode and score them
    (`scorer`: the run's RewardScorer, whose first-failure warning is once per run)."""

    def __init__(self, sampler, tokenizer, task, options: EvalOptions, scorer=None):
        self.sampler, self.tokenizer, self.task, self.options = sampler, tokenizer, task, options
        self.scorer = scorer or InProcessScorer(task)
        self.column = list(task.reward_names).index("correctness")

    def examples(self, n: int) -> list:
        return eval_examples(self.task, n, self.options.seed)  # seeded draw of the eval split

    def params(self, greedy: bool, k: int) -> SamplingParams:
        eos = chat.stop_ids(self.options.prompts, self.tokenizer)
        temperature = dict(greedy=True) if greedy else dict(temperature=1.0)
        return SamplingParams(
            **temperature, n=k, max_new_tokens=self.options.max_new_tokens, eos_ids=eos
        )

    def roll(self, examples, params: SamplingParams, key) -> EvalRows:
        prompts = [self.task.prompt(e) for e in examples]
        tok, mask = encode_prompts(self.tokenizer, prompts, self.options.max_prompt_len)
        ro = self.sampler.generate(tok, mask, params, key)
        texts = decode(
            self.tokenizer,
            sharding.all_rows(ro.completion_tokens),
            sharding.all_rows(ro.completion_mask),
        )
        r, n_failed = self.scorer([e for e in examples for _ in range(params.n)], list(texts))
        return EvalRows(r[:, self.column], n_failed, batch=ro)


@EVAL_BATCHES.register("episodes")
class EpisodeBatches:
    """An environment's eval batch: play one episode per row from each seed to its end or a
    budget (`rl/produce/agent.py` `play`, the producer's own), success as correctness; the
    greedy pass also reports the mean return and turns. options.environment: the `env`
    section (with `max_prompt_len`)."""

    def __init__(self, sampler, tokenizer, task, options: EvalOptions, scorer=None):
        self.sampler, self.tokenizer, self.task = sampler, tokenizer, task
        self.env = options.environment
        self.stops = agent.stop_ids(tokenizer, tuple(self.env.stop), task)

    def examples(self, n: int) -> list:
        return [self.task.example("eval", i) for i in range(n)]  # the first n eval seeds

    def params(self, greedy: bool, k: int) -> SamplingParams:
        turn = int(self.env.turn_tokens)
        return SamplingParams(
            greedy=greedy, n=k, max_new_tokens=turn, eos_ids=(), stop_ids=self.stops
        )

    def roll(self, examples, params: SamplingParams, key) -> EvalRows:
        env = self.env
        session = TurnSession.shared(
            self.sampler, params, obs_tokens=int(env.obs_tokens), max_turns=int(env.max_turns)
        )
        seeds = [x["seed"] for x in examples]
        batch = agent.play(session, self.task, self.tokenizer, seeds, key, env=env).batch
        turns = np.asarray([ep.turns for ep in batch.episodes])
        figures = {"return": batch.returns(), "turns": turns}
        return EvalRows(batch.successes(), greedy_figures=figures, batch=batch)


def roll_all(part, examples, params: SamplingParams, key, batch: int, on_batch=None) -> list:
    """EvalRows of every chunk of `batch` examples, a key split off `key` for each; on_batch
    (chunk, rows) sees each."""
    out = []
    for i in range(0, len(examples), batch):
        key, sub = jax.random.split(key)
        out.append(part.roll(examples[i : i + batch], params, sub))
        if on_batch is not None:
            on_batch(examples[i : i + batch], out[-1])
    return out


def evaluate(
    sampler,
    tokenizer,
    task,
    options: EvalOptions,
    num_prompts: int | None = None,
    *,
    scorer=None,
    on_sampled: Callable[[list, EvalRows], None] | None = None,
) -> dict:
    """{'eval/pass@1_greedy', 'eval/pass@k', 'eval/mean_correct_sampled',
    'eval/reward_failed'} (and the part's 'eval/<name>_greedy': an environment's return and
    turns) of the sampler's current weights on `eval.num_prompts` held-out prompts (k =
    eval.pass_k, temperature 1); reward_failed counts the completions whose reward raised
    (scored 0). The task's declared `evaluation` kind picks the part (EVAL_BATCHES);
    on_sampled(examples, rows) sees each chunk of the sampled pass."""
    part = EVAL_BATCHES.get(task.evaluation)(sampler, tokenizer, task, options, scorer)
    # at most the held-out split (a small local JSONL may hold only a few eval rows)
    examples = part.examples(min(num_prompts or options.num_prompts, task.num_examples("eval")))
    greedy = roll_all(
        part, examples, part.params(True, 1), jax.random.key(options.key_seed), options.batch
    )
    out = {"eval/pass@1_greedy": float(np.mean(np.concatenate([r.correct for r in greedy])))}
    for name in greedy[0].greedy_figures:
        values = np.concatenate([r.greedy_figures[name] for r in greedy])
        out[f"eval/{name}_greedy"] = float(np.mean(values))
    k, failed = options.pass_k, [r.failed for r in greedy]
    if options.runs_sampled:
        key = jax.random.key(options.key_seed + 1)
        chunk = options.sampled_batch or options.batch
        sampled = roll_all(part, examples, part.params(False, k), key, chunk, on_sampled)
        per_prompt = np.concatenate([r.correct for r in sampled]).reshape(len(examples), k)
        out[f"eval/pass@{k}"] = float(per_prompt.max(1).mean())
        out["eval/mean_correct_sampled"] = float(per_prompt.mean())
        failed += [r.failed for r in sampled]
    out["eval/reward_failed"] = float(sum(failed))
    return out


def solve_rate(
    sampler,
    tokenizer,
    task,
    examples,
    params: SamplingParams,
    key,
    *,
    batch: int,
    max_prompt_len: int,
    scorer=None,
    failures: list | None = None,
) -> np.ndarray:
    """Correctness of each of the len(examples) * params.n completions, in prompt-major order
    (the 'completions' part over chunks of `batch` prompts).

    `scorer`: the run's RewardScorer (its first-failure warning is once per run); each
    chunk's failure count is appended to `failures` when given."""
    options = EvalOptions(batch=batch, max_prompt_len=max_prompt_len)
    part = CompletionBatches(sampler, tokenizer, task, options, scorer)
    rows = roll_all(part, examples, params, key, batch)
    if failures is not None:
        failures.extend(r.failed for r in rows)
    return np.concatenate([r.correct for r in rows])
