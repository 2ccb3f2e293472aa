"""A generative judge: a causal LM reads each completion with its question (and the task's
reference answer, when it has one) under a judge prompt, and its next-token distribution at
the end of that prompt gives a score, the reward component `judge`:

    z = the judge's logits after the judge prompt,  p = softmax(z)  (over the vocabulary)
    'yes_prob'        s = P(yes) / (P(yes) + P(no)),  P(yes) = sum of p over the `yes`
                      verdict tokens, P(no) over the `no` ones
    'expected_score'  s = sum_k k p(k) / sum_k p(k)  over the labels k = 1 .. `scale`
                      (each label one token of the judge's tokenizer)
    'pairwise'        two completions a and b of one group, shown in both orders:
                      P(a > b) = (P(yes | a first, b second) + 1 - P(yes | b first, a second)) / 2,
                      so a judge's preference for a position cancels (a judge that only
                      prefers the first position scores every pair 1/2); each completion's
                      score is the mean of its P(wins) against its neighbours in the group
                      (i against i + 1 and i - 1, cyclically; the other one when G = 2)

The judge prompt is `prompt` with {question}, {completion}, {reference} ({first} and {second}
pairwise) filled in, rendered as a user turn of the judge's chat template (`chat`) or as
plain text. It is tokenized to `max_len` tokens (a longer one keeps its end, where the verdict
is asked), left-padded to that one static shape: the forward compiles once, runs on the
run's mesh, and reads only the last position's logits. The score is normalized as a reward
model's is (none / batch / group) and logged raw (`judge/score_*`).

    'sampled'         the judge decodes a short verdict y (at most `max_verdict_tokens`
                      tokens, at `verdict_temperature`, greedy at 0, up to its stop token) and
                      s = parse(y): the first match of `verdict_pattern` in y (its first
                      group, else the whole match), read as an integer k in 1 .. `scale`
                      (s = k), or as one of the `yes` strings (s = 1) or `no` strings (s = 0);
                      anything else (no match, a number out of range, another word) is a
                      parse failure, scored `unparsed_score` and counted
                      (`judge/parse_failures`, this step's); a rating read from the
                      judge's own text, as in "Judging LLM-as-a-Judge with MT-Bench and
                      Chatbot Arena" (Zheng et al., 2023)

The probability modes read one forward's last position; the sampled mode costs a decode per
completion (a prefill and up to `max_verdict_tokens` steps) and can fail to parse, but reads
a verdict as the judge would write it (a reasoning judge, a free-form answer). Its decode is
the project's jitted `Sampler` over the judge (rl/produce/judge_verdicts.py: data/ does not
import sampling/), compiled once at the static shape [batch, `max_len`].
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_frontier.core import records
from jaxrl_frontier.core.records import key
from jaxrl_frontier.data.rewards.reward_model import (
    NORMALIZE,
    in_static_batches,
    with_learned_column,
)
from jaxrl_frontier.data.tasks.chat import ChatTemplate

REWARD_NAME = "judge"
MODES = ("yes_prob", "expected_score", "pairwise", "sampled")
# the sampled mode's default parse: the first number, or a yes / no word, standing alone
VERDICT_PATTERN = r"\b(\d+|[Yy]es|YES|[Nn]o|NO)\b"

DEFAULT_PROMPT = (
    "Question: {question}\nReference answer: {reference}\nResponse: {completion}\n"
    "Is the response correct and helpful? Answer yes or no."
)
PAIRWISE_PROMPT = (
    "Question: {question}\nFirst response: {first}\nSecond response: {second}\n"
    "Is the first response better than the second? Answer yes or no."
)


@dataclasses.dataclass(frozen=True)
class JudgeSection:
    """`judge`: a causal LM scoring each completion (module docstring)."""

    init: str = key(
        "none",
        "none | hf (a causal LM at `path`) | random (a random LM of the policy's shape and "
        "tokenizer: runlocal checks)",
        choices=("none", "hf", "random"),
    )
    path: str = key("", "its checkpoint: an HF directory or a registered model name")
    mode: str = key(
        "yes_prob", "yes_prob | expected_score | pairwise | sampled (a decoded, parsed verdict)",
        choices=MODES,
    )  # fmt: skip
    prompt: str = key("", "the judge prompt ('': the mode's default; module docstring)")
    chat: bool = key(True, "the prompt as a user turn of the judge's chat template")
    yes: tuple = key(("yes", "Yes"), "verdict strings read as yes (one token each; sampled: words)")
    no: tuple = key(("no", "No"), "verdict strings read as no (one token each; sampled: words)")
    scale: int = key(9, "expected_score, sampled: the labels 1 .. scale", low=2)
    max_verdict_tokens: int = key(8, "sampled: a verdict's tokens at most (stop included)", low=1)
    verdict_temperature: float = key(0.0, "sampled: the verdict's temperature (0: greedy)", low=0.0)
    verdict_pattern: str = key(
        VERDICT_PATTERN, "sampled: the regex whose first match is the verdict (module docstring)"
    )
    unparsed_score: float = key(0.0, "sampled: the score of a verdict that does not parse")
    normalize: str = key("none", "none | batch | group, as the reward model's", choices=NORMALIZE)
    max_len: int = key(512, "tokens a judge prompt holds (a longer one keeps its end)", low=1)
    batch_size: int = key(0, "prompts one forward reads (0: all of a step's)", low=0)
    dtype: str = key("float32", "its compute dtype", choices=("float32", "bfloat16"))

    def __post_init__(self):
        records.check(self, "judge")
        try:
            re.compile(self.verdict_pattern)
        except re.error as e:
            raise ValueError(
                f"config key 'judge.verdict_pattern' = {self.verdict_pattern!r} is not a "
                f"regular expression ({e})"
            ) from None

    @property
    def text(self) -> str:
        """The judge prompt this mode uses."""
        return self.prompt or (PAIRWISE_PROMPT if self.mode == "pairwise" else DEFAULT_PROMPT)


@dataclasses.dataclass(frozen=True)
class JudgeRole:
    """A judge as the run holds it: the causal LM (on the run's mesh), its tokenizer, and its
    chat template (None: plain text)."""

    module: Any
    tokenizer: Any
    template: ChatTemplate | None = None


def single_token(tokenizer, text: str, what: str) -> int:
    """The one token id of `text` (a ValueError naming the config key otherwise)."""
    ids = tokenizer.encode(text)
    if len(ids) != 1:
        raise ValueError(
            f"config key 'judge.{what}': {text!r} is {len(ids)} tokens of the judge's "
            "tokenizer; each verdict must be one token"
        )
    return ids[0]


def judge_input(template: ChatTemplate | None, options: JudgeSection, prompt: str) -> str:
    """The judge's input text for a filled-in judge prompt: a user turn of its chat template
    (`chat`; its BOS left to the tokenizer) or the plain prompt."""
    if template is None or not options.chat:
        return prompt
    bos = template.special_tokens.get("bos_token")
    text = template.prompt(prompt)
    return text[len(bos) :] if bos and text.startswith(bos) else text  # BOS added on encode


class NextTokenProbs:
    """The judge's next-token probabilities after each prompt: `__call__(prompts, ids)` ->
    p [N, len(ids)] of the token ids `ids` (a softmax over the whole vocabulary at each
    prompt's last position), in batches of `batch_size` prompts of `max_len` tokens."""

    def __init__(self, role: JudgeRole, options: JudgeSection):
        self.tokenizer, self.template, self.options = role.tokenizer, role.template, options
        graphdef, self.params = nnx.split(role.module)

        def probs(params, tokens, mask, ids):  # [N, L] -> [N, len(ids)]
            model = nnx.merge(graphdef, params)
            hidden, _ = model.hidden_states(tokens, mask)
            logits = model.logits(hidden[:, -1])  # left-padded: the last real token
            return jax.nn.softmax(logits, axis=-1)[:, ids]

        self._probs = jax.jit(probs)

    def text(self, prompt: str) -> str:
        """The judge's input for a filled-in judge prompt (`judge_input`)."""
        return judge_input(self.template, self.options, prompt)

    def __call__(self, prompts: Sequence[str], ids: Sequence[int]) -> np.ndarray:
        o, ids = self.options, jnp.asarray(ids, jnp.int32)
        forward = lambda t, m: self._probs(self.params, t, m, ids)  # noqa: E731
        texts = [self.text(p) for p in prompts]
        return in_static_batches(forward, self.tokenizer, texts, o.max_len, o.batch_size)


def parse_verdict(text: str, options: JudgeSection) -> float | None:
    """A sampled verdict's score (module docstring, 'sampled'), or None when it does not
    parse: the first match of `verdict_pattern` (its first group, else the whole match) as
    an integer k in 1 .. `scale` -> k, a `yes` string -> 1, a `no` string -> 0."""
    match = re.search(options.verdict_pattern, text)
    if match is None:
        return None
    word = match.group(1) if match.re.groups else match.group(0)
    word = (word or "").strip()
    if word.isdigit():
        k = int(word)
        return float(k) if 1 <= k <= options.scale else None
    if word in options.yes:
        return 1.0
    if word in options.no:
        return 0.0
    return None


def pairwise_scores(p_yes: Callable[[list[tuple[int, int]]], np.ndarray], g: int) -> np.ndarray:
    """Each of a group's G completions' score (module docstring, 'pairwise') from
    `p_yes(pairs)`: P(yes | first = i, second = j) [len(pairs)] of (i, j) pairs of the group."""
    pairs = [(0, 1)] if g == 2 else [(i, (i + 1) % g) for i in range(g)]
    both = p_yes(pairs + [(j, i) for i, j in pairs])
    wins = (both[: len(pairs)] + 1.0 - both[len(pairs) :]) / 2.0  # P(i > j), both orders
    total, count = np.zeros(g), np.zeros(g)
    for (i, j), w in zip(pairs, wins):
        total[i] += w
        total[j] += 1.0 - w
        count[i] += 1
        count[j] += 1
    return total / count


class JudgeScorer:
    """The judge as a reward shaper: `__call__(rows, rewards [B_l, K])` appends the `judge`
    column (rows: `examples` [P], `texts` [P * G], `group_size`). `probs` reads the judge: a
    `NextTokenProbs`, or any function of (prompts, ids) -> [N, len(ids)]; in the sampled mode
    a function of prompts -> their verdict texts [N] (rl/produce/judge_verdicts.py's
    `SampledVerdicts`). `question_of` gives an example's question."""

    reward_names = (REWARD_NAME,)

    def __init__(self, probs, tokenizer, options: JudgeSection, *, question_of):
        self.probs, self.options, self.question_of = probs, options, question_of
        o = options
        self.parse_failures = 0  # the last call's (sampled)
        if o.mode == "sampled":
            self.ids = []  # verdicts are read as text: no one-token strings needed
        elif o.mode == "expected_score":
            self.ids = [single_token(tokenizer, str(k), "scale") for k in range(1, o.scale + 1)]
        else:
            self.yes = [single_token(tokenizer, s, "yes") for s in o.yes]
            self.no = [single_token(tokenizer, s, "no") for s in o.no]
            self.ids = self.yes + self.no
        self._metrics: dict[str, float] = {}

    def fill(self, example, **texts) -> str:
        """The judge prompt for one example and its completion(s)."""
        reference = example.get("answer", "")
        return self.options.text.format(
            question=self.question_of(example), reference=reference, **texts
        )

    def verdicts(self, prompts: list[str]) -> np.ndarray:
        """The score of each judge prompt [N]: P(yes) among the verdicts, the expected
        label, or the sampled verdict parsed (`parse_verdict`; failures counted)."""
        if self.options.mode == "sampled":
            parsed = [parse_verdict(text, self.options) for text in self.probs(prompts)]
            self.parse_failures += sum(s is None for s in parsed)
            fallback = self.options.unparsed_score
            return np.asarray([fallback if s is None else s for s in parsed], np.float64)
        p = self.probs(prompts, self.ids)
        if self.options.mode == "expected_score":
            labels = np.arange(1, self.options.scale + 1)
            return (p * labels).sum(1) / p.sum(1)
        p_yes = p[:, : len(self.yes)].sum(1)
        return p_yes / (p_yes + p[:, len(self.yes) :].sum(1))

    def score(self, rows) -> np.ndarray:
        """Raw scores [B_l] of the rows."""
        g, texts = rows.group_size, list(rows.texts)
        if self.options.mode != "pairwise":
            return self.verdicts(
                [self.fill(rows.examples[i // g], completion=t) for i, t in enumerate(texts)]
            )
        if g < 2:
            raise ValueError("config key 'judge.mode' = 'pairwise' needs rollout.group_size >= 2")
        out = []
        for p, example in enumerate(rows.examples):
            group = texts[p * g : (p + 1) * g]

            def p_yes(pairs, example=example, group=group):
                return self.verdicts(
                    [self.fill(example, first=group[i], second=group[j]) for i, j in pairs]
                )

            out.append(pairwise_scores(p_yes, g))
        return np.concatenate(out)

    def __call__(self, rows, rewards: np.ndarray) -> np.ndarray:
        self.parse_failures = 0
        out, self._metrics = with_learned_column(
            rewards, self.score(rows), REWARD_NAME, self.options.normalize, rows.group_size
        )
        if self.options.mode == "sampled":
            self._metrics[f"{REWARD_NAME}/parse_failures"] = float(self.parse_failures)
        return out

    def metrics(self) -> dict[str, Any]:
        return dict(self._metrics)
