"""Chat templates: an instruct model's own `chat_template`, rendered as transformers does.

An instruct model expects its prompts in the markup it was tuned on (Qwen2.5:
`<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n`). The markup is a Jinja
template shipped with the tokenizer: `chat_template.jinja` in the model directory, else the
`chat_template` entry of `tokenizer_config.json` (a string, or a list of named templates of
which "default" is taken), the order transformers reads them in.

Rendering follows `transformers.utils.chat_template_utils`: a sandboxed Jinja environment
(`ImmutableSandboxedEnvironment`, trim_blocks, lstrip_blocks, the loopcontrols extension and
a `{% generation %}` block), the `tojson` filter of json.dumps (ensure_ascii=False, no HTML
escaping), the globals `raise_exception` (a template's own error, as `jinja2.TemplateError`),
`strftime_now`, and the variables `messages`, `tools`, `documents`, `add_generation_prompt`
and the tokenizer's special tokens (`bos_token`, `eos_token`, ...). Message keys set to None
are dropped first, as transformers does. The rendered text is tokenized without adding
special tokens (the template writes them).

Stop tokens. A turn of the policy ends where the template closes an assistant message: the
text the template writes right after an assistant's content (`assistant_suffix`, e.g.
`<|im_end|>\\n`) begins with the turn's end token (`stop_text`, e.g. `<|im_end|>`); the
sampler stops at it or at the tokenizer's EOS (`stop_token_ids`).

Multi-turn episodes. After a sampled turn (content + stop token) the context continues with
the rest of the assistant suffix, then the template's rendering of the new messages (an
environment observation as a user or tool message) and the generation prompt:
`turn_text(history, new_messages)`, the text to prefill before the next turn. It is exact
for templates that render earlier turns the same way whatever follows (checked: a template
that rewrites history, e.g. dropping old reasoning, is refused with an error).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
# the special-token entries transformers passes to a template (its special_tokens_map)
SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
_SENTINEL = "\x00CONTENT\x00"

Message = Mapping[str, Any]


class ChatTemplateError(ValueError):
    """No usable chat template, or a template that cannot be used as asked; names the file."""


def _token_string(value: Any) -> str | None:
    if isinstance(value, Mapping):  # {"content": "<s>", ...} (AddedToken serialised)
        value = value.get("content")
    return value if isinstance(value, str) else None


def read_template(directory: str | Path) -> tuple[str, dict[str, str]]:
    """(template source, special tokens) of a model directory; ChatTemplateError naming the
    files looked at when there is no template."""
    d = Path(directory)
    cfg: dict[str, Any] = {}
    cfg_file = d / CONFIG_FILE
    if cfg_file.is_file():
        try:
            cfg = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as e:
            raise ChatTemplateError(
                f"{cfg_file}: invalid JSON at line {e.lineno}: {e.msg}"
            ) from None
    specials = {k: s for k in SPECIAL_TOKEN_KEYS if (s := _token_string(cfg.get(k)))}
    if (d / TEMPLATE_FILE).is_file():
        return (d / TEMPLATE_FILE).read_text(), specials
    source = cfg.get("chat_template")
    if isinstance(source, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, Mapping)}
        source = named.get("default")
        if source is None:
            raise ChatTemplateError(
                f"{cfg_file}: chat_template lists {sorted(map(str, named))}, no 'default'"
            )
    if not isinstance(source, str) or not source:
        raise ChatTemplateError(
            f"no chat template in {d}: neither {TEMPLATE_FILE} nor a 'chat_template' in "
            f"{CONFIG_FILE} (a base model has none: use raw prompts)"
        )
    return source, specials


@lru_cache(maxsize=16)
def _compile(source: str):
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (assistant-token masks in transformers):
        rendered as its body; the masks are not needed here."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno
            )

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    class Namespace(jinja2.utils.Namespace):
        """`namespace(...)` refusing underscore attributes (no reach into Python internals)."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot set underscore attributes on a namespace: {name!r}"
                )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["namespace"] = Namespace
    return env.from_string(source)


def _plain(messages: Sequence[Message]) -> list[dict[str, Any]]:
    for m in messages:
        if not isinstance(m, Mapping):
            raise TypeError(f"chat messages must be dicts with 'role' and 'content', got {m!r}")
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


class ChatTemplate:
    """A compiled chat template and the special tokens it may read.

    Args:
      source: the Jinja template text.
      special_tokens: {bos_token, eos_token, ...: token string}, passed to the template.
      name: where the template came from (for error messages).
    """

    def __init__(
        self, source: str, special_tokens: Mapping[str, str] | None = None, name: str = "template"
    ):
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self.name = name
        self._template = _compile(source)

    @classmethod
    def from_dir(cls, directory: str | Path) -> ChatTemplate:
        """The template of a model directory (`read_template`)."""
        source, specials = read_template(directory)
        return cls(source, specials, name=str(directory))

    def render(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool = False,
        tools: Sequence[Mapping] | None = None,
        documents: Sequence[Mapping] | None = None,
        **kwargs: Any,
    ) -> str:
        """The conversation as text (module docstring); `kwargs` reach the template (they
        override the special tokens of the same name, as in transformers)."""
        if not messages:
            raise ValueError("chat template: empty conversation")
        variables = {**self.special_tokens, **kwargs}
        return self._template.render(
            messages=_plain(messages),
            tools=None if tools is None else [dict(t) for t in tools],
            documents=None if documents is None else [dict(d) for d in documents],
            add_generation_prompt=add_generation_prompt,
            **variables,
        )

    def encode(self, tokenizer, messages: Sequence[Message], **render_kwargs) -> list[int]:
        """Token ids of `render(messages, ...)`; `tokenizer.encode` adds no special tokens."""
        return list(tokenizer.encode(self.render(messages, **render_kwargs)))

    def prompt(self, text: str, system: str | None = None) -> str:
        """A single-turn prompt: [system,] user `text`, and the generation prompt."""
        messages = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": text}
        ]
        return self.render(messages, add_generation_prompt=True)

    # ------------------------------------------------------------ turn ends

    @property
    def assistant_suffix(self) -> str:
        """What the template writes right after an assistant message's content."""
        text = self.render(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}]
        )
        at = text.rfind(_SENTINEL)
        if at < 0:
            raise ChatTemplateError(f"{self.name}: the template does not render assistant content")
        return text[at + len(_SENTINEL) :]

    def stop_text(self, tokenizer) -> str:
        """The token that ends an assistant turn: the first special token of the assistant
        suffix ('' if it has none; the EOS then ends turns)."""
        ids = self.stop_token_ids(tokenizer, include_eos=False)
        return tokenizer.decode(ids[:1], skip_special=False) if ids else ""

    def stop_token_ids(self, tokenizer, include_eos: bool = True) -> list[int]:
        """The ids a turn stops at: the first special token the template writes after an
        assistant's content (e.g. <|im_end|>), and the tokenizer's EOS."""
        out = []
        for i in tokenizer.encode(self.assistant_suffix):
            # special: dropped by a decode that skips specials, though it has text of its own
            if tokenizer.decode([i], skip_special=True) == "" and tokenizer.decode(
                [i], skip_special=False
            ):
                out.append(int(i))
                break
        if include_eos and tokenizer.eos_id not in out:
            out.append(int(tokenizer.eos_id))
        return out

    def turn_text(
        self, tokenizer, history: Sequence[Message], new_messages: Sequence[Message]
    ) -> str:
        """The text to append after a sampled assistant turn (which ended with its stop
        token): the rest of the assistant suffix, the new messages, the generation prompt.

        `history` ends with that assistant message (its content as sampled, without the stop
        token). ChatTemplateError when the template renders `history` differently once
        `new_messages` follow (then the context must be rebuilt, not extended).
        """
        if not history or history[-1].get("role") != "assistant":
            raise ValueError("turn_text: history must end with the assistant's message")
        before = self.render(history)
        after = self.render(list(history) + list(new_messages), add_generation_prompt=True)
        if not after.startswith(before):
            raise ChatTemplateError(
                f"{self.name}: the template renders earlier turns differently once later ones "
                "follow; a multi-turn context cannot be extended turn by turn"
            )
        stop = self.stop_text(tokenizer)
        suffix = self.assistant_suffix
        rest = suffix[suffix.find(stop) + len(stop) :] if stop and stop in suffix else suffix
        return rest + after[len(before) :]


class ChatPrompts:
    """A task whose prompts are rendered by a chat template (`task.chat_template`): the task's
    raw prompt becomes the user message ([system,] user, generation prompt). A leading BOS the
    template writes is dropped, since the tokenizer's `batch_encode` adds its own."""

    def __init__(self, task, template: ChatTemplate, system: str | None = None):
        self._task, self.template, self._system = task, template, system or None

    def prompt(self, example) -> str:
        text = self.template.prompt(self._task.prompt(example), system=self._system)
        bos = self.template.special_tokens.get("bos_token")
        return text[len(bos) :] if bos and text.startswith(bos) else text

    def question(self, example) -> str:
        """The task's own prompt, before the template (the user message)."""
        return self._task.prompt(example)

    def __getattr__(self, name):  # everything else is the task's
        return getattr(self._task, name)

    def __repr__(self) -> str:
        return f"ChatPrompts({self._task!r}, template={self.template.name!r})"


def question_of(task, example) -> str:
    """An example's question as the user wrote it: the task's prompt without the chat
    template a `ChatPrompts` task wraps it in."""
    return task.question(example) if isinstance(task, ChatPrompts) else task.prompt(example)


def template_for(options) -> ChatTemplate | None:
    """The chat template `task.chat_template` asks for (from `tokenizer.path`), or None.
    `options`: the run's `TaskOptions`."""
    if not options.chat_template:
        return None
    if not options.tokenizer_path:
        raise ChatTemplateError(
            "config key 'task.chat_template' = True needs a model directory in 'tokenizer.path' "
            f"(tokenizer.kind = {options.tokenizer_kind!r} has none); set task.chat_template=False"
        )
    return ChatTemplate.from_dir(options.tokenizer_path)


def stop_ids(options, tokenizer) -> tuple[int, ...]:
    """The ids a rollout stops at: the tokenizer's EOS, and with a chat template the token
    that ends an assistant turn (e.g. Qwen2.5's <|im_end|>). `options`: the `TaskOptions`."""
    template = template_for(options)
    ids = [int(tokenizer.eos_id)]
    if template is not None:
        ids += [i for i in template.stop_token_ids(tokenizer) if i not in ids]
    return tuple(ids)
