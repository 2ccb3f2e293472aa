"""The judge's sampled verdicts (`judge.mode = 'sampled'`, data/rewards/judge.py): each judge
prompt decoded by the project's jitted `Sampler` over the judge model, its own programs on
the judge's mesh (never inside the policy's sampler program), then read back as text for
`parse_verdict`.

    prompt_i   the judge's input (`judge_input`: its chat template's user turn, or plain),
               tokenized to L = `judge.max_len` tokens (a longer one keeps its end),
               left-padded
    y_i        ~ q(. | prompt_i), at most `judge.max_verdict_tokens` tokens, temperature
               `judge.verdict_temperature` (greedy at 0: argmax), ended by the judge's stop
               tokens (its EOS and, with a chat template, the token ending an assistant turn)

Prompts run `judge.batch_size` at a time (0: all of a call's) at one batch bucket and one
prompt bucket L, with one decode phase: the prefill and the decode compile once. Cost: a
prefill of [batch, L] and up to `max_verdict_tokens` decode steps per batch, against one
forward of the probability modes.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from jaxrl_frontier.core import sharding
from jaxrl_frontier.data.rewards.judge import JudgeRole, JudgeSection, judge_input
from jaxrl_frontier.models.text import decode
from jaxrl_frontier.sampling import Sampler, SamplingParams


def verdict_sampling(role: JudgeRole, options: JudgeSection) -> SamplingParams:
    """The verdicts' sampling settings (module docstring)."""
    stops = [role.tokenizer.eos_id]
    if role.template is not None and options.chat:
        stops += role.template.stop_token_ids(role.tokenizer)
    greedy = options.verdict_temperature == 0
    return SamplingParams(
        max_new_tokens=options.max_verdict_tokens,
        greedy=greedy,
        temperature=1.0 if greedy else options.verdict_temperature,
        eos_ids=tuple(dict.fromkeys(stops)),
    )


class SampledVerdicts:
    """prompts -> the judge's verdict texts [N] (module docstring). `key`: the verdicts'
    randomness (call j draws from fold_in(key, j)); mesh: the judge's (None: one device)."""

    def __init__(self, role: JudgeRole, options: JudgeSection, *, mesh=None, key=None):
        if jax.process_count() > 1:  # the Sampler reads its prompts as the global batch
            raise ValueError(
                "config key 'judge.mode' = 'sampled' decodes each process's own rows, which "
                f"the sampler does not on {jax.process_count()} processes: run on one process"
                " or use judge.mode = 'yes_prob' / 'expected_score'"
            )
        self.role, self.options = role, options
        self.params = verdict_sampling(role, options)
        multiple = 1 if mesh is None else sharding.batch_size_multiple(mesh)
        buckets = None
        if options.batch_size:
            buckets = (-(-options.batch_size // multiple) * multiple,)
        self.sampler = Sampler(
            role.module, pad_id=role.tokenizer.pad_id, mesh=mesh,
            prompt_buckets=(options.max_len,), batch_buckets=buckets, decode_phases=1,
        )  # fmt: skip
        self.key = jax.random.key(0) if key is None else key
        self.calls = 0

    def tokens(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Left-padded int32 (tokens, mask) [N, max_len]; a longer text keeps its end."""
        tok = self.role.tokenizer
        L = self.options.max_len
        return tok.batch_encode(list(texts), max_len=L, pad_to_multiple=L, truncate=True)

    def token_rows(self, prompts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The verdicts' tokens and masks [N, max_verdict_tokens] (pad after each end)."""
        texts = [judge_input(self.role.template, self.options, p) for p in prompts]
        tokens, mask = self.tokens(texts)
        size = self.options.batch_size or len(texts)
        key = jax.random.fold_in(self.key, self.calls)
        self.calls += 1
        out_t, out_m = [], []
        for start in range(0, len(texts), size):
            ro = self.sampler.generate(
                tokens[start : start + size], mask[start : start + size], self.params,
                jax.random.fold_in(key, start),
            )  # fmt: skip
            out_t.append(sharding.all_rows(ro.completion_tokens))
            out_m.append(sharding.all_rows(ro.completion_mask))
        return np.concatenate(out_t), np.concatenate(out_m)

    def __call__(self, prompts: Sequence[str]) -> list[str]:
        return list(decode(self.role.tokenizer, *self.token_rows(prompts)))
