"""Verified greedy answers of the run's teacher model (ZPPO's BCQ reference answer).

`TeacherAnswers(teacher, ...)(examples)` decodes the teacher greedily on each example's own
prompt, scores the answers with the run's scorer, and returns each answer that is correct
(correctness > 0) or None. Every process must call it with the same examples (the sampler
runs on the global batch), as ZPPO's source does: its buffer is the same everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from jaxrl_frontier.core import sharding
from jaxrl_frontier.data.tasks.base import Example
from jaxrl_frontier.models.text import decode, encode_prompts
from jaxrl_frontier.sampling import Sampler, SamplingParams


class TeacherAnswers:
    """examples -> [the teacher's verified greedy answer, or None], one per example.

    teacher: the teacher `Transformer` (frozen; placed on `mesh`); task / scorer: the run's
    (the answer must score correctness > 0 on the example); max_prompt_len /
    max_new_tokens: the rollout's (`data.max_prompt_len`, `rollout.max_new_tokens`).
    """

    def __init__(
        self,
        teacher,
        tokenizer,
        task,
        scorer,
        *,
        max_prompt_len: int,
        max_new_tokens: int,
        mesh=None,
    ):
        self.sampler = Sampler(teacher, pad_id=tokenizer.pad_id, mesh=mesh)
        self.tokenizer, self.task, self.scorer = tokenizer, task, scorer
        self.max_prompt_len = max_prompt_len
        self.params = SamplingParams(
            greedy=True, n=1, max_new_tokens=max_new_tokens, eos_ids=(tokenizer.eos_id,)
        )
        names = list(scorer.reward_names)
        self.column = names.index("correctness") if "correctness" in names else 0

    def __call__(self, examples: Sequence[Example]) -> list[str | None]:
        if not examples:
            return []
        prompts = [self.task.prompt(e) for e in examples]
        tok, mask = encode_prompts(self.tokenizer, prompts, self.max_prompt_len)
        ro = self.sampler.generate(tok, mask, self.params, jax.random.key(0))  # greedy: no noise
        texts = decode(
            self.tokenizer,
            sharding.all_rows(ro.completion_tokens),
            sharding.all_rows(ro.completion_mask),
        )
        rewards, _ = self.scorer(list(examples), list(texts))
        ok = np.asarray(rewards)[:, self.column] > 0
        return [t.strip() if good and t.strip() else None for t, good in zip(texts, ok)]
