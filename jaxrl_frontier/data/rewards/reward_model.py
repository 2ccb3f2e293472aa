"""A learned reward: a sequence classifier (a reward model, Hugging Face
`*ForSequenceClassification`: the score head on each row's last real token,
`Transformer.sequence_scores`) scores every completion with its prompt, and its score joins
the rollout's rewards as the component `reward_model`, weighed with the task's verifiable
ones by `objective.reward_weights` (an empty table: correctness and the reward model at 1).

    text_i = the reward model's view of (prompt_i, completion_i): `template` 'plain' (the
             prompt the policy saw, then the completion) or 'chat' (its own chat template
             over a user turn, the task's question, and an assistant turn, the completion)
    s_i    = score(text_i)[label]                  one jitted forward per batch of rows
    r_i    = s_i                                   normalize 'none'
             (s_i - mean s) / (std s + 1e-6)       'batch': over this process's rows
             (s_i - mean_g s) / (std_g s + 1e-6)   'group': over each prompt's G rows

Rows are tokenized by the reward model's tokenizer to `max_len` tokens (a longer row keeps
its end: the completion), left-padded to that one static shape, so the forward compiles once;
it runs on the run's mesh, never inside the sampler's program. Logged: the raw scores' mean,
std, min and max (`reward_model/score_*`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_frontier.core import records
from jaxrl_frontier.core.records import key
from jaxrl_frontier.data.tasks.chat import ChatTemplate

REWARD_NAME = "reward_model"  # the reward component a reward model adds
NORMALIZE = ("none", "batch", "group")


@dataclasses.dataclass(frozen=True)
class RewardModelSection:
    """`reward_model`: a learned reward scoring each completion (module docstring)."""

    init: str = key(
        "none",
        "none | hf (a sequence classifier at `path`) | random (a random classifier of the "
        "policy's shape and tokenizer: runlocal checks)",
        choices=("none", "hf", "random"),
    )
    path: str = key("", "its checkpoint: an HF directory or a registered model name")
    label: int = key(0, "the score head's column read as the reward", low=0)
    template: str = key(
        "plain", "plain (the policy's prompt, then the completion) | chat (its chat template)",
        choices=("plain", "chat"),
    )  # fmt: skip
    normalize: str = key("none", "none | batch | group (module docstring)", choices=NORMALIZE)
    max_len: int = key(256, "tokens a scored row holds (a longer row keeps its end)", low=1)
    batch_size: int = key(0, "rows one forward scores (0: all of a step's rows)", low=0)
    dtype: str = key("float32", "its compute dtype", choices=("float32", "bfloat16"))

    def __post_init__(self):
        records.check(self, "reward_model")

    @property
    def enabled(self) -> bool:
        return self.init != "none"


def normalized(scores: np.ndarray, how: str, group_size: int) -> np.ndarray:
    """scores [N] (prompt-major groups of `group_size`) as the reward (module docstring)."""
    s = np.asarray(scores, np.float64)
    if how == "batch":
        s = (s - s.mean()) / (s.std() + 1e-6)
    elif how == "group":
        g = s.reshape(-1, group_size)
        s = ((g - g.mean(1, keepdims=True)) / (g.std(1, keepdims=True) + 1e-6)).reshape(-1)
    return s.astype(np.float32)


@dataclasses.dataclass(frozen=True)
class RewardModelRole:
    """A reward model as the run holds it: the classifier (`num_labels` > 0, on the run's
    mesh), its tokenizer, and its chat template (None: rows read as plain text)."""

    module: Any
    tokenizer: Any
    template: ChatTemplate | None = None


def in_static_batches(
    forward, tokenizer, texts: Sequence[str], max_len: int, batch_size: int, add_bos=True
) -> np.ndarray:
    """forward(tokens [b, L], mask [b, L]) over `texts` tokenized to L = `max_len` (left-
    padded; a longer text keeps its end), `batch_size` rows at a time (0: all at once; the
    last batch padded with rows of one real token, dropped after): one compiled shape.
    Returns the outputs' rows [N, ...] as numpy."""
    n = len(texts)
    tokens, mask = tokenizer.batch_encode(
        list(texts), max_len=max_len, pad_to_multiple=max_len, truncate=True, add_bos=add_bos
    )
    size = batch_size or n
    out = []
    for start in range(0, n, size):
        t, m = tokens[start : start + size], mask[start : start + size]
        pad = size - len(t)
        if pad:
            t = np.concatenate([t, np.full((pad, max_len), tokenizer.pad_id, np.int32)])
            m = np.concatenate([m, np.tile(np.eye(1, max_len, max_len - 1, np.int32), (pad, 1))])
        out.append(np.asarray(forward(jnp.asarray(t), jnp.asarray(m))))
    return np.concatenate(out)[:n]


def with_learned_column(rewards, raw, name: str, normalize: str, group_size: int):
    """(rewards [B, K] with the learned term's column appended: `raw` [B] normalized, the raw
    scores' metrics `<name>/score_mean`, `_std`, `_min`, `_max`)."""
    metrics = {
        f"{name}/score_{stat}": float(fn(raw))
        for stat, fn in (("mean", np.mean), ("std", np.std), ("min", np.min), ("max", np.max))
    }
    reward = normalized(raw, normalize, group_size)
    return np.concatenate([np.asarray(rewards, np.float32), reward[:, None]], axis=1), metrics


class RewardModelScorer:
    """The reward model as a reward shaper: `__call__(rows, rewards [B_l, K])` appends the
    `reward_model` column. rows: a rollout's rows (`examples` [P], `texts` [P * G],
    `group_size`); `question_of(example)` the task's question (the chat template's user
    turn), `prompt_of(example)` the prompt the policy saw."""

    reward_names = (REWARD_NAME,)

    def __init__(
        self,
        role: RewardModelRole,
        options: RewardModelSection,
        *,
        prompt_of: Callable[[dict], str],
        question_of: Callable[[dict], str],
    ):
        model, tokenizer, template = role.module, role.tokenizer, role.template
        if options.template == "chat" and template is None:
            raise ValueError(
                "config key 'reward_model.template' = 'chat': the reward model's directory "
                f"{options.path!r} has no chat template; use 'plain'"
            )
        self.options, self.tokenizer, self.template = options, tokenizer, template
        self.prompt_of, self.question_of = prompt_of, question_of
        graphdef, self.params = nnx.split(model)
        label = options.label
        if label >= model.cfg.num_labels:
            raise ValueError(
                f"config key 'reward_model.label' = {label}: the score head has "
                f"{model.cfg.num_labels} labels"
            )

        def scores(params, tokens, mask):  # [N, L] -> [N]
            return nnx.merge(graphdef, params).sequence_scores(tokens, mask)[:, label]

        self._scores = jax.jit(scores)
        self._metrics: dict[str, float] = {}

    def texts(self, rows) -> list[str]:
        """Each row's text as the reward model reads it."""
        g = rows.group_size
        out = []
        for i, completion in enumerate(rows.texts):
            example = rows.examples[i // g]
            if self.template is None:
                out.append(self.prompt_of(example) + completion)
            else:
                messages = [
                    {"role": "user", "content": self.question_of(example)},
                    {"role": "assistant", "content": completion},
                ]
                out.append(self.template.render(messages))
        return out

    def score(self, texts: Sequence[str]) -> np.ndarray:
        """Raw scores [N] of `texts` (`in_static_batches`)."""
        o = self.options
        forward = lambda t, m: self._scores(self.params, t, m)  # noqa: E731
        return in_static_batches(
            forward, self.tokenizer, texts, o.max_len, o.batch_size, add_bos=self.template is None
        )

    def __call__(self, rows, rewards: np.ndarray) -> np.ndarray:
        raw = self.score(self.texts(rows))
        out, self._metrics = with_learned_column(
            rewards, raw, REWARD_NAME, self.options.normalize, rows.group_size
        )
        return out

    def metrics(self) -> dict[str, Any]:
        return dict(self._metrics)
