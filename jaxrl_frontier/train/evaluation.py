"""Held-out evaluation: greedy pass@1 and sampled pass@k on a fixed set of eval prompts.

Every process runs the same rollouts (the eval prompts are the same everywhere) and scores
every row, so each process returns the same figures.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jaxrl_frontier.core import sharding
from jaxrl_frontier.data.envs.task import EnvTask
from jaxrl_frontier.data.rewards.scorer import InProcessScorer
from jaxrl_frontier.data.tasks import TaskOptions, chat, eval_examples
from jaxrl_frontier.models.text import decode, encode_prompts
from jaxrl_frontier.rl.produce.agent import evaluate_episodes
from jaxrl_frontier.sampling import SamplingParams


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
    """Correctness of each of the len(examples) * params.n completions, in prompt-major order.

    `scorer`: the run's RewardScorer (its first-failure warning is once per run); each
    chunk's failure count is appended to `failures` when given."""
    scorer = scorer or InProcessScorer(task)
    column = list(task.reward_names).index("correctness")
    correct = []
    for i in range(0, len(examples), batch):
        chunk = examples[i : i + batch]
        tok, mask = encode_prompts(tokenizer, [task.prompt(e) for e in chunk], max_prompt_len)
        key, sub = jax.random.split(key)
        ro = sampler.generate(tok, mask, params, sub)
        texts = decode(
            tokenizer,
            sharding.all_rows(ro.completion_tokens),
            sharding.all_rows(ro.completion_mask),
        )
        r, n_failed = scorer([e for e in chunk for _ in range(params.n)], list(texts))
        if failures is not None:
            failures.append(n_failed)
        correct.append(r[:, column])
    return np.concatenate(correct)


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    """What the held-out evaluation reads: `eval.num_prompts`, `eval.pass_k`, `eval.batch`,
    the run's seed (which prompts), the completion budget (`rollout.max_new_tokens`), the
    prompt length (`data.max_prompt_len`), the task's `TaskOptions` (`prompts`: the stop
    tokens of its chat template) and, in an environment run, the `env` section (`environment`,
    with `max_prompt_len`)."""

    num_prompts: int = 256
    pass_k: int = 4
    batch: int = 128
    seed: int = 0
    max_new_tokens: int = 8
    max_prompt_len: int = 16
    prompts: TaskOptions = dataclasses.field(default_factory=TaskOptions)
    environment: Any = None

    def __post_init__(self):
        for key in ("num_prompts", "pass_k", "batch"):
            if getattr(self, key) < 1:
                raise ValueError(f"config key 'eval.{key}' = {getattr(self, key)} must be >= 1")


def evaluate(
    sampler, tokenizer, task, options: EvalOptions, num_prompts: int | None = None, *, scorer=None
) -> dict:
    """{'eval/pass@1_greedy', 'eval/pass@k', 'eval/mean_correct_sampled',
    'eval/reward_failed'} of the sampler's current weights on `eval.num_prompts` held-out
    prompts (k = eval.pass_k, temperature 1); reward_failed counts the completions whose
    reward raised (scored 0)."""
    if isinstance(task, EnvTask):  # an environment: greedy and sampled held-out episodes
        return evaluate_episodes(
            task, sampler, tokenizer, options.environment, options, num_prompts
        )
    failures: list = []
    # at most the held-out split (a small local JSONL may hold only a few eval rows)
    n = min(num_prompts or options.num_prompts, task.num_examples("eval"))
    examples = eval_examples(task, n, options.seed)
    eos, tn = chat.stop_ids(options.prompts, tokenizer), options.max_new_tokens
    run = lambda params, key: solve_rate(
        sampler,
        tokenizer,
        task,
        examples,
        params,
        key,
        batch=options.batch,
        max_prompt_len=options.max_prompt_len,
        scorer=scorer,
        failures=failures,
    )
    greedy = run(
        SamplingParams(greedy=True, n=1, max_new_tokens=tn, eos_ids=eos), jax.random.key(0)
    )
    out = {"eval/pass@1_greedy": float(np.mean(greedy))}
    if options.pass_k > 1:
        k = options.pass_k
        sampled = run(
            SamplingParams(temperature=1.0, n=k, max_new_tokens=tn, eos_ids=eos), jax.random.key(1)
        )
        per_prompt = sampled.reshape(len(examples), k)
        out[f"eval/pass@{k}"] = float(per_prompt.max(1).mean())
        out["eval/mean_correct_sampled"] = float(per_prompt.mean())
    out["eval/reward_failed"] = float(sum(failures))
    return out
