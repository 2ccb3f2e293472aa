"""Tokenizers: a character tokenizer for the synthetic tasks and a wrapper over HF tokenizer.json.

Both classes share one interface, which is all the sampler, trainer and tasks may rely on:

    vocab_size, pad_id, bos_id, eos_id
    encode(text) -> list[int]                      # no special tokens added
    decode(ids, skip_special=True, stop_at_eos=False) -> str
    batch_encode(texts, *, max_len=None, add_bos=True, pad_to_multiple=1, truncate=False)
        -> (tokens int32 [B, T], attention_mask int32 [B, T])    # LEFT padded
    batch_decode(ids_bt, ...) -> list[str]
    save(directory); load_tokenizer(directory)

Prompts are LEFT padded so that every row's last prompt token sits at column T-1: decoding
then appends at the same position for the whole batch, and a KV cache needs no per-row offset.
Pad columns carry `pad_id` and mask 0.

`save` writes `jaxrl_tokenizer.json` (which class, and its settings) next to whatever the class
needs (`tokenizer.json` for HF), so a checkpoint directory carries its tokenizer and
`load_tokenizer` rebuilds the right class from it.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from jaxrl_frontier.core.errors import ModelFileError

META_FILE = "jaxrl_tokenizer.json"
HF_FILE = "tokenizer.json"
HF_CONFIG_FILE = "tokenizer_config.json"

# The synthetic tasks' alphabet: arithmetic, countdown expressions, lowercase prose and the
# markers the math checkers look for (\boxed{...}, ####). A few harmless extras (newline, ! ' $ %)
# so that hand-written grade-school problems encode too. Order is the id order: never reorder,
# only append (saved tokenizers store their own list, so old checkpoints are unaffected).
DEFAULT_CHARS = string.digits + "+-*/()= " + string.ascii_lowercase + ",.:?#\\{}_;" + "\n!'$%"

CHAR_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")  # ids 0, 1, 2, 3


class Tokenizer(Protocol):
    """The interface shared by `CharTokenizer` and `HFTokenizer`."""

    vocab_size: int
    pad_id: int
    bos_id: int | None
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Any, skip_special: bool = True, stop_at_eos: bool = False) -> str: ...

    def batch_encode(
        self,
        texts: Sequence[str],
        *,
        max_len: int | None = None,
        add_bos: bool = True,
        pad_to_multiple: int = 1,
        truncate: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def batch_decode(
        self, ids_bt: Any, skip_special: bool = True, stop_at_eos: bool = False
    ) -> list[str]: ...

    def save(self, directory: str | Path) -> None: ...


class _BatchMixin:
    """Left-padded batching and EOS-aware decoding, shared by both tokenizers.

    Subclasses provide `encode`, `_decode_ids` and the id attributes.
    """

    pad_id: int
    bos_id: int | None
    eos_id: int

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def _decode_ids(self, ids: list[int], skip_special: bool) -> str:
        raise NotImplementedError

    def decode(self, ids: Any, skip_special: bool = True, stop_at_eos: bool = False) -> str:
        """Text of a 1-D id sequence (list, numpy or jax array).

        `stop_at_eos=True` drops the first EOS and everything after it (sampled completions
        keep decoding past EOS inside a fixed-length buffer). `skip_special=True` drops
        pad/bos/eos (and unk for CharTokenizer) tokens.
        """
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if stop_at_eos and self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self._decode_ids(ids, skip_special)

    def batch_decode(
        self, ids_bt: Any, skip_special: bool = True, stop_at_eos: bool = False
    ) -> list[str]:
        """`decode` on each row of an int array [B, T] (or a list of id lists)."""
        return [self.decode(row, skip_special, stop_at_eos) for row in ids_bt]

    def batch_encode(
        self,
        texts: Sequence[str],
        *,
        max_len: int | None = None,
        add_bos: bool = True,
        pad_to_multiple: int = 1,
        truncate: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Encode and LEFT-pad a batch.

        Returns `tokens` int32 [B, T] and `attention_mask` int32 [B, T] (1 on real tokens,
        0 on the left padding). T is the longest row rounded up to `pad_to_multiple`
        (bucketing keeps the number of compiled shapes small), capped at `max_len`; pass
        `pad_to_multiple=max_len` for one static shape.

        BOS is prepended when `add_bos` and the tokenizer has one (Qwen-style HF tokenizers
        have none). A row longer than `max_len` is an error naming its length, unless
        `truncate=True`, which keeps its LAST tokens (the end of a prompt is what the model
        continues from), re-prefixed with BOS.
        """
        if isinstance(texts, str):
            raise TypeError("batch_encode takes a sequence of strings, got one str")
        if len(texts) == 0:
            raise ValueError("batch_encode: empty batch")
        if pad_to_multiple < 1:
            raise ValueError(f"batch_encode: pad_to_multiple must be >= 1, got {pad_to_multiple}")
        if max_len is not None and max_len < 1:
            raise ValueError(f"batch_encode: max_len must be >= 1, got {max_len}")
        prefix = [self.bos_id] if add_bos and self.bos_id is not None else []
        rows = []
        for b, text in enumerate(texts):
            body = self.encode(text)
            ids = prefix + body
            if max_len is not None and len(ids) > max_len:
                if not truncate:
                    raise ValueError(
                        f"batch_encode: text {b} is {len(ids)} tokens long"
                        f"{' (with BOS)' if prefix else ''}, more than max_len={max_len}; "
                        f"raise max_len or pass truncate=True (keeps the last tokens). "
                        f"Text starts: {text[:40]!r}"
                    )
                keep = max_len - len(prefix)
                ids = prefix + body[len(body) - keep :] if keep > 0 else ids[-max_len:]
            rows.append(ids)
        longest = max(1, max(len(r) for r in rows))
        t = -(-longest // pad_to_multiple) * pad_to_multiple
        if max_len is not None:
            t = min(t, max_len)
        tokens = np.full((len(rows), t), self.pad_id, dtype=np.int32)
        mask = np.zeros((len(rows), t), dtype=np.int32)
        for b, ids in enumerate(rows):
            if ids:
                tokens[b, t - len(ids) :] = ids
                mask[b, t - len(ids) :] = 1
        return tokens, mask


PAST_ALPHABET = "\ufffd"  # what an id past the alphabet decodes to


class CharTokenizer(_BatchMixin):
    """One token per character: ids 0..3 are <pad> <bos> <eos> <unk>, then `chars` in order.

    `encode` raises on a character outside the alphabet (naming it and its position) with
    `errors="strict"` (default); `errors="replace"` maps it to <unk> instead. A model may have
    more rows than the alphabet (its vocabulary padded, as Hugging Face checkpoints often are,
    or a benchmark's random model): `decode` writes U+FFFD for an id past the alphabet, so a
    completion that samples one is scored (as wrong) rather than crashing the run.
    """

    pad_id = 0
    bos_id = 1
    eos_id = 2
    unk_id = 3

    def __init__(self, chars: str = DEFAULT_CHARS):
        if len(set(chars)) != len(chars):
            dup = sorted({c for c in chars if chars.count(c) > 1})
            raise ValueError(f"CharTokenizer: duplicate characters {dup!r} in chars")
        if not chars:
            raise ValueError("CharTokenizer: chars must not be empty")
        self.chars = chars
        self._to_id = {c: i + len(CHAR_SPECIALS) for i, c in enumerate(chars)}
        self.vocab_size = len(CHAR_SPECIALS) + len(chars)

    def encode(self, text: str, errors: str = "strict") -> list[int]:
        """Ids of `text` (no BOS/EOS). Unknown char: ValueError, or <unk> if errors="replace"."""
        if errors not in ("strict", "replace"):
            raise ValueError(f"encode: errors must be 'strict' or 'replace', got {errors!r}")
        out = []
        for pos, ch in enumerate(text):
            i = self._to_id.get(ch)
            if i is None:
                if errors == "strict":
                    raise ValueError(
                        f"CharTokenizer: unknown character {ch!r} (U+{ord(ch):04X}) at position "
                        f"{pos} of {text[max(0, pos - 20) : pos + 20]!r}; known characters: "
                        f"{self.chars!r}"
                    )
                i = self.unk_id
            out.append(i)
        return out

    def _decode_ids(self, ids: list[int], skip_special: bool) -> str:
        n = len(CHAR_SPECIALS)
        parts = []
        for i in ids:
            if 0 <= i < n:
                if not skip_special:
                    parts.append(CHAR_SPECIALS[i])
            elif n <= i < self.vocab_size:
                parts.append(self.chars[i - n])
            elif i >= self.vocab_size:  # a model row past the alphabet (a padded vocabulary)
                parts.append(PAST_ALPHABET)
            else:
                raise ValueError(f"CharTokenizer: negative id {i}")
        return "".join(parts)

    def save(self, directory: str | Path) -> None:
        """Write `jaxrl_tokenizer.json` ({"class": "char", "chars": ...}) into `directory`."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        meta = {"class": "char", "chars": self.chars}
        (d / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> CharTokenizer:
        meta = _read_meta(Path(directory))
        if meta.get("class") != "char":
            raise ValueError(
                f"{Path(directory) / META_FILE}: class is {meta.get('class')!r}, not 'char'"
            )
        return cls(meta["chars"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and other.chars == self.chars

    def __hash__(self) -> int:
        return hash(self.chars)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


# Special-token spellings tried, in order, when neither the caller nor tokenizer_config.json
# names them. Covers Llama 2/3, Qwen, GPT-2 and BERT-style vocabularies.
_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "[BOS]", "<|startoftext|>")
_EOS_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "[EOS]", "<|eot_id|>")
_PAD_NAMES = ("<pad>", "[PAD]", "<|pad|>", "<|finetune_right_pad_id|>")


class HFTokenizer(_BatchMixin):
    """A Hugging Face `tokenizer.json` (the `tokenizers` library), with this repo's interface.

    Special ids come from, in order: the keyword arguments (an int id or a token string),
    the `tokenizer_config.json` next to the file (`bos_token`, `eos_token`, `pad_token`), the
    file's padding settings (pad only), and a list of common spellings. An EOS must be found;
    BOS may be absent (Qwen; or force it with `no_bos=True`); a missing pad falls back to EOS
    (the mask marks padding anyway).

    `encode` never adds special tokens itself; `batch_encode(add_bos=True)` adds BOS.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        pad: int | str | None = None,
        bos: int | str | None = None,
        eos: int | str | None = None,
        no_bos: bool = False,
    ):
        from tokenizers import Tokenizer as _HFTok  # deferred: only HF users pay the import

        path = Path(path)
        file = path / HF_FILE if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"HFTokenizer: no tokenizer file at {file}")
        self.path = file
        try:
            self._tok = _HFTok.from_file(str(file))
        except Exception as e:  # the tokenizers library's error names no file
            raise ModelFileError(f"{file}: not a readable tokenizer.json: {e}") from None
        cfg = _read_hf_config(file.parent / HF_CONFIG_FILE)
        padding = self._tok.padding
        file_pad = padding.get("pad_id") if padding else None

        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = self._resolve("eos", eos, cfg.get("eos_token"), None, _EOS_NAMES)
        # no_bos: the model was trained without one (recorded by `save`); skip the name guesses.
        self.bos_id = (
            None if no_bos else self._resolve("bos", bos, cfg.get("bos_token"), None, _BOS_NAMES)
        )
        pad_id = self._resolve("pad", pad, cfg.get("pad_token"), file_pad, _PAD_NAMES)
        if self.eos_id is None:
            raise ValueError(
                f"HFTokenizer: no EOS token found in {file} (tried {', '.join(_EOS_NAMES)}); "
                f"pass eos=<id or token string>"
            )
        self.pad_id = self.eos_id if pad_id is None else pad_id
        self._special = {i for i in (self.pad_id, self.bos_id, self.eos_id) if i is not None}

    def _resolve(
        self,
        role: str,
        given: int | str | None,
        from_config: Any,
        from_file: int | None,
        names: Sequence[str],
    ) -> int | None:
        if given is not None:
            return self._token_id(role, given, source="argument")
        if isinstance(from_config, dict):  # {"content": "<s>", ...} in older configs
            from_config = from_config.get("content")
        if from_config:
            return self._token_id(role, from_config, source=HF_CONFIG_FILE)
        if from_file is not None:
            return int(from_file)
        for name in names:
            i = self._tok.token_to_id(name)
            if i is not None:
                return i
        return None

    def _token_id(self, role: str, tok: int | str, source: str) -> int:
        if isinstance(tok, int):
            if not 0 <= tok < self.vocab_size:
                raise ValueError(
                    f"HFTokenizer: {role} id {tok} from {source} not in [0, {self.vocab_size})"
                )
            return tok
        i = self._tok.token_to_id(tok)
        if i is None:
            raise ValueError(
                f"HFTokenizer: {role} token {tok!r} from {source} "
                f"not in the vocabulary of {self.path}"
            )
        return i

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def _decode_ids(self, ids: list[int], skip_special: bool) -> str:
        if skip_special:
            # Our pad/bos/eos may not be flagged special in the file (pad = eos fallback, or ids
            # passed in), so drop them here rather than trust skip_special_tokens alone.
            ids = [i for i in ids if i not in self._special]
        return self._tok.decode(ids, skip_special_tokens=skip_special)

    def save(self, directory: str | Path) -> None:
        """Write `tokenizer.json` and `jaxrl_tokenizer.json` (class and special ids)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(d / HF_FILE))
        meta = {"class": "hf", "pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        (d / META_FILE).write_text(json.dumps(meta, indent=1) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> HFTokenizer:
        """From a directory written by `save`, or a plain HF model directory (no meta file)."""
        d = Path(directory)
        if not (d / META_FILE).is_file():
            return cls(d)
        meta = _read_meta(d)
        if meta.get("class") != "hf":
            raise ValueError(f"{d / META_FILE}: class is {meta.get('class')!r}, not 'hf'")
        return cls(
            d,
            pad=meta["pad_id"],
            eos=meta["eos_id"],
            bos=meta["bos_id"],
            no_bos=meta["bos_id"] is None,
        )

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, HFTokenizer)
            and (self.pad_id, self.bos_id, self.eos_id)
            == (other.pad_id, other.bos_id, other.eos_id)
            and self._tok.to_str() == other._tok.to_str()
        )

    def __hash__(self) -> int:
        return hash((self.pad_id, self.bos_id, self.eos_id, self.vocab_size))

    def __repr__(self) -> str:
        return (
            f"HFTokenizer({str(self.path)!r}, vocab_size={self.vocab_size}, pad_id={self.pad_id}, "
            f"bos_id={self.bos_id}, eos_id={self.eos_id})"
        )


_CLASSES = {"char": CharTokenizer, "hf": HFTokenizer}


def load_tokenizer(directory: str | Path) -> CharTokenizer | HFTokenizer:
    """The tokenizer saved in `directory` (by either class's `save`), or an HF model directory.

    Picks the class from `jaxrl_tokenizer.json`; without it, a `tokenizer.json` means HF.
    """
    d = Path(directory)
    if (d / META_FILE).is_file():
        cls_name = _read_meta(d).get("class")
        if cls_name not in _CLASSES:
            raise ValueError(
                f"{d / META_FILE}: unknown tokenizer class {cls_name!r}; known: {sorted(_CLASSES)}"
            )
        return _CLASSES[cls_name].load(d)
    if (d / HF_FILE).is_file():
        return HFTokenizer(d)
    raise FileNotFoundError(f"load_tokenizer: neither {META_FILE} nor {HF_FILE} in {d}")


def _read_meta(d: Path) -> dict[str, Any]:
    f = d / META_FILE
    try:
        return json.loads(f.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no tokenizer metadata {f}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{f}: invalid JSON at line {e.lineno}: {e.msg}") from None


def _read_hf_config(f: Path) -> dict[str, Any]:
    if not f.is_file():
        return {}
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{f}: invalid JSON at line {e.lineno}: {e.msg}") from None
