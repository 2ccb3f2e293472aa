"""GGUF checkpoints (llama.cpp's single-file format) read as Hugging Face checkpoints.

    ckpt = gguf_file.read("SmolLM2-135M-Instruct.Q4_1.gguf")
    ckpt.hf_config                  # a config.json dict (LlamaForCausalLM, ...)
    ckpt.tensor("model.layers.0.self_attn.q_proj.weight")   # f32 [out, in], HF layout
    gguf_file.convert(FILE, OUT_DIR)  # config.json, model.safetensors, tokenizer files

A GGUF file carries the weights (quantized in blocks: Q4_0, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0, ...),
the architecture's hyperparameters as metadata keys (`llama.block_count`, ...) and the
tokenizer (vocabulary, merges, special ids, chat template). llama.cpp's own reader (the
`gguf` package, `pip install 'jaxrl_frontier[models]'`) dequantizes every block type; this
module maps the rest back to the Hugging Face form the model code reads (`hf.load`):

- **Tensor names**: `blk.{i}.attn_q.weight` -> `model.layers.{i}.self_attn.q_proj.weight`, ...
  (`_TENSOR_NAMES`); a tensor of a type the reader cannot dequantize is an error naming it.
- **Llama's Q and K rows**: llama.cpp's converter permutes the rows of each head of q_proj and
  k_proj from HF's rotate-half RoPE layout to interleaved pairs; `_unpermute` undoes it
  (Llama-architecture files only: Qwen and Gemma files keep HF's order).
- **Gemma's norms**: llama.cpp stores Gemma's RMSNorm scales as 1 + w (its norm multiplies by
  the weight); HF stores w (the model adds the 1): 1 is subtracted back.
- **Metadata llama.cpp does not store** takes the architecture's fixed values, as llama.cpp's
  own loader does: Gemma 3's local RoPE base (10000), its sliding-window pattern (every 6th
  layer global) and GeLU-tanh MLP.
- **The tokenizer**: a byte-level BPE vocabulary (`tokenizer.ggml.model = gpt2`: SmolLM2,
  Qwen, Llama 3) is rebuilt as a `tokenizer.json` from its tokens, merges and pre-tokenizer
  (`tokenizer.ggml.pre`: smollm, gpt-2, qwen2, llama-bpe). A SentencePiece vocabulary
  (`llama`: Gemma) cannot be rebuilt exactly from GGUF metadata (its merges are implied by
  scores, and the published converters get Gemma 3's wrong), so it takes the model's own
  `tokenizer.json` (`tokenizer=`), checked id for id against the file's vocabulary.
- **Special tokens**: BOS only where the file says the model adds one
  (`tokenizer.ggml.add_bos_token`): SmolLM2's id 1 `<|im_start|>` opens every chat turn and is
  written by its template, not added; EOS is the file's `eos_token_id`; pad the file's pad id.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import numpy as np

from jaxrl_frontier.core.errors import ModelFileError

EXTRA = "pip install 'jaxrl_frontier[models]'"

# GGUF tensor name (after `blk.{i}.`) -> HF name (after `model.layers.{i}.`)
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
# Gemma's sandwich norms: llama.cpp's names of the four norms of a layer
_GEMMA_LAYER_TENSORS = {
    **_LAYER_TENSORS,
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Tensors some files carry that hold no weights of the model (precomputed RoPE tables).
_SKIPPED = re.compile(r"^(rope_freqs|rope_factors_long|rope_factors_short)\.weight$")

# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp) for the byte-level BPE vocabularies
_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"""
_PRE_SPLITS = {
    "qwen2": r"""(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "llama-bpe": r"""(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values of added tokens


@dataclasses.dataclass(frozen=True)
class Family:
    """How one GGUF `general.architecture` maps to Hugging Face.

    hf_name: config.json `architectures[0]`; permute_qk: the file's q/k rows are llama.cpp's
    interleaved RoPE layout (undone on reading); gemma: the norms are stored as 1 + w and the
    layer has Gemma's four norms."""

    hf_name: str
    model_type: str
    permute_qk: bool = False
    gemma: bool = False
    qkv_bias: bool = False


FAMILIES = {
    "llama": Family("LlamaForCausalLM", "llama", permute_qk=True),
    "qwen2": Family("Qwen2ForCausalLM", "qwen2", qkv_bias=True),
    "qwen3": Family("Qwen3ForCausalLM", "qwen3"),
    "gemma3": Family("Gemma3ForCausalLM", "gemma3_text", gemma=True),
}


def _gguf():
    try:
        import gguf
    except ImportError:  # an optional extra: the core never needs it
        raise ImportError(f"reading GGUF files needs the `gguf` package: {EXTRA}") from None
    return gguf


@cache
def _reader_class():
    """gguf's `GGUFReader` over a plain ndarray view of its memory map. The reader slices
    its map once or twice per array element of the metadata (Gemma 3's 262k-token
    vocabulary: about 3 million slices), and each slice of an `np.memmap` pays the subclass's
    bookkeeping: 3x the time of the same slices of a plain view (33 s against 11 s for
    Gemma-3-270M's header here). The view keeps the map open and copies nothing."""

    class Reader(_gguf().GGUFReader):
        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, mapped):
            self._data = mapped.view(np.ndarray)

    return Reader


class GGUFCheckpoint:
    """One GGUF file, read lazily: metadata at once, each tensor dequantized when asked for.

    Attributes: path, family (a `Family`), metadata ({key: value}), hf_config (config.json),
    tensor_names (HF names, in the file's order)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"no GGUF file at {self.path!r}")
        try:
            self._reader = _reader_class()(self.path)
        except (ValueError, OSError) as e:  # not GGUF, truncated
            raise ModelFileError(f"{self.path}: not a readable GGUF file: {e}") from None
        self.metadata = {k: _field_value(f) for k, f in self._reader.fields.items()}
        arch = self.metadata.get("general.architecture")
        if arch not in FAMILIES:
            raise ModelFileError(
                f"{self.path}: GGUF architecture {arch!r} is not supported; supported: "
                f"{', '.join(FAMILIES)}"
            )
        self.arch, self.family = arch, FAMILIES[arch]
        self._tensors = {}
        for t in self._reader.tensors:
            if _SKIPPED.match(t.name):
                continue
            self._tensors[_hf_tensor_name(t.name, self.family, self.path)] = t
        self.tensor_names = list(self._tensors)

    def _meta(self, key: str, default: Any = ...) -> Any:
        value = self.metadata.get(f"{self.arch}.{key}", default)
        if value is ...:
            raise ModelFileError(f"{self.path}: metadata key {self.arch}.{key} is missing")
        return value

    @cached_property
    def hf_config(self) -> dict:
        """The config.json dict of this checkpoint (transformers 4 key style)."""
        heads = int(self._meta("attention.head_count"))
        hidden = int(self._meta("embedding_length"))
        vocab = int(self._meta("vocab_size", len(self.metadata.get("tokenizer.ggml.tokens", []))))
        if not vocab:
            vocab = int(self._tensors["model.embed_tokens.weight"].shape[-1])
        hf = {
            "architectures": [self.family.hf_name],
            "model_type": self.family.model_type,
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": int(self._meta("feed_forward_length")),
            "num_hidden_layers": int(self._meta("block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(self._meta("attention.head_count_kv", heads)),
            "head_dim": int(self._meta("attention.key_length", hidden // heads)),
            "rms_norm_eps": float(self._meta("attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(self._meta("rope.freq_base", 10000.0)),
            "max_position_embeddings": int(self._meta("context_length", 2048)),
            "tie_word_embeddings": "lm_head.weight" not in self._tensors,
            "torch_dtype": "float32",
        }
        scaling = self._meta("rope.scaling.type", None)
        if scaling not in (None, "none"):
            raise ModelFileError(
                f"{self.path}: RoPE scaling {scaling!r} ({self.arch}.rope.scaling.type) is not "
                "supported in GGUF files; convert the Hugging Face checkpoint instead"
            )
        for role in ("bos", "eos", "padding"):
            tid = self.metadata.get(f"tokenizer.ggml.{role}_token_id")
            if tid is not None:
                hf[f"{'pad' if role == 'padding' else role}_token_id"] = int(tid)
        if self.family.model_type == "llama":
            hf.update(hidden_act="silu", attention_bias=False, mlp_bias=False)
        elif not self.family.gemma:
            hf.update(hidden_act="silu", use_sliding_window=False)
        if self.family.gemma:  # what llama.cpp fixes for Gemma 3 rather than storing
            layers = hf["num_hidden_layers"]
            hf.update(
                hidden_activation="gelu_pytorch_tanh",
                query_pre_attn_scalar=hf["head_dim"],
                sliding_window=int(self._meta("attention.sliding_window")),
                layer_types=[
                    "sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)
                ],
                rope_local_base_freq=10000.0,
                attn_logit_softcapping=None,
                final_logit_softcapping=None,
                attention_bias=False,
            )
        return hf

    def tensor(self, name: str) -> np.ndarray:
        """The HF tensor `name`, dequantized to float32, in HF's [out, in] layout."""
        t = self._tensors[name]
        gguf = _gguf()
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except (NotImplementedError, gguf.quants.QuantError, KeyError) as e:
            raise ModelFileError(
                f"{self.path}: tensor {t.name!r} has block type {t.tensor_type.name}, which "
                f"cannot be dequantized ({e})"
            ) from None
        w = np.asarray(w, dtype=np.float32).reshape(tuple(int(d) for d in reversed(t.shape)))
        if self.family.permute_qk and name.endswith(("q_proj.weight", "k_proj.weight")):
            kv = name.endswith("k_proj.weight")
            w = _unpermute(
                w, self.hf_config["num_key_value_heads" if kv else "num_attention_heads"]
            )
        if self.family.gemma and name.endswith("norm.weight"):
            w = w - 1.0
        return w

    # ------------------------------------------------------------------ tokenizer

    @property
    def chat_template(self) -> str | None:
        return self.metadata.get("tokenizer.chat_template")

    @property
    def special_ids(self) -> dict[str, int | None]:
        """{'bos', 'eos', 'pad', 'unk'} ids as the model uses them (module docstring)."""
        m = self.metadata
        add_bos = bool(m.get("tokenizer.ggml.add_bos_token", False))
        ids = {
            "bos": m.get("tokenizer.ggml.bos_token_id") if add_bos else None,
            "eos": m.get("tokenizer.ggml.eos_token_id"),
            "pad": m.get("tokenizer.ggml.padding_token_id"),
            "unk": m.get("tokenizer.ggml.unknown_token_id"),
        }
        if ids["eos"] is None:
            raise ModelFileError(f"{self.path}: no tokenizer.ggml.eos_token_id")
        if ids["pad"] is None:
            ids["pad"] = ids["eos"]
        return {k: None if v is None else int(v) for k, v in ids.items()}

    @property
    def tokens(self) -> list[str]:
        return list(self.metadata["tokenizer.ggml.tokens"])

    def tokenizer_json(self) -> str:
        """The `tokenizer.json` text of this file's byte-level BPE vocabulary."""
        kind = self.metadata.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ModelFileError(
                f"{self.path}: its tokenizer is tokenizer.ggml.model={kind!r} (SentencePiece), "
                "which GGUF metadata does not determine exactly; pass the model's own "
                "tokenizer.json (convert(..., tokenizer=PATH), scripts/convert_gguf.py "
                "--tokenizer PATH)"
            )
        return _bpe_tokenizer(self).to_str()


def read(path: str | os.PathLike) -> GGUFCheckpoint:
    """The GGUF file at `path` (GGUFCheckpoint)."""
    return GGUFCheckpoint(path)


def is_gguf(path: str | os.PathLike) -> bool:
    return os.fspath(path).endswith(".gguf") and os.path.isfile(path)


def _field_value(field) -> Any:
    try:
        return field.contents()
    except Exception:  # a key of a type the reader cannot render: unused here
        return None


def _hf_tensor_name(name: str, family: Family, path: str) -> str:
    if name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[name]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
    table = _GEMMA_LAYER_TENSORS if family.gemma else _LAYER_TENSORS
    if m and m.group(2) in table:
        return f"model.layers.{m.group(1)}.{table[m.group(2)]}"
    raise ModelFileError(f"{path}: tensor {name!r} has no Hugging Face counterpart here")


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """HF's q/k rows from llama.cpp's: per head, rows (2j, 2j+1) back to (j, j + d/2).

    llama.cpp's converter applies `w.reshape(h, 2, d/2, n).swapaxes(1, 2).reshape(h*d, n)`."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _bpe_tokenizer(ckpt: GGUFCheckpoint):
    """A `tokenizers.Tokenizer` from a byte-level BPE vocabulary's tokens and merges."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    m = ckpt.metadata
    tokens = ckpt.tokens
    types = list(m.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(x.split(" ", 1)) for x in m.get("tokenizer.ggml.merges") or []]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    pre = m.get("tokenizer.ggml.pre", "gpt-2")
    if pre == "smollm":  # every digit alone, then GPT-2's split
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    elif pre in ("gpt-2", "default"):
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif pre in _PRE_SPLITS:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_PRE_SPLITS[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        raise ModelFileError(
            f"{ckpt.path}: pre-tokenizer tokenizer.ggml.pre={pre!r} is not supported; supported: "
            f"smollm, gpt-2, {', '.join(_PRE_SPLITS)}"
        )
    tok.decoder = decoders.ByteLevel()
    added = [
        AddedToken(t, special=ty == _CONTROL, normalized=False)
        for t, ty in zip(tokens, types)
        if ty in (_CONTROL, _USER_DEFINED)
    ]
    tok.add_tokens(added)  # ids kept: each is in the vocabulary already
    return tok


def matching_tokenizer(ckpt: GGUFCheckpoint, tokenizer_file: str | os.PathLike) -> str:
    """The text of `tokenizer_file` (a tokenizer.json), checked to give every id of the GGUF
    vocabulary that id's token; added tokens past the vocabulary (Gemma 3's multimodal
    `<image_soft_token>`, which the text model has no row for) are dropped from it.
    ModelFileError naming the first id that differs."""
    from tokenizers import Tokenizer

    spec = json.loads(Path(tokenizer_file).read_text())
    tokens = ckpt.tokens
    spec["added_tokens"] = [a for a in spec.get("added_tokens", []) if a["id"] < len(tokens)]
    tok = Tokenizer.from_str(json.dumps(spec))
    size = tok.get_vocab_size(with_added_tokens=True)
    if size != len(tokens):
        raise ModelFileError(
            f"{tokenizer_file}: {size} tokens, but {ckpt.path} has {len(tokens)}: not its tokenizer"
        )
    # SentencePiece writes a space as U+2581 in its pieces; llama.cpp keeps literal spaces in
    # the pieces made only of spaces (Gemma 3's ids 138-167): the same tokens
    same = lambda a, b: a == b or a.replace("\u2581", " ") == b.replace("\u2581", " ")
    for i, t in enumerate(tokens):
        if not same(tok.id_to_token(i), t):
            raise ModelFileError(
                f"{tokenizer_file}: id {i} is {tok.id_to_token(i)!r}, but {t!r} in {ckpt.path}: "
                "not its tokenizer"
            )
    return json.dumps(spec, ensure_ascii=False)


# ---------------------------------------------------------------------- conversion


def convert(
    path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    tokenizer: str | os.PathLike | None = None,
    chat_template: str | None = None,
    eos: str | None = None,
) -> Path:
    """Write the GGUF file at `path` as a Hugging Face directory `out_dir`: config.json,
    model.safetensors (f32), tokenizer.json, tokenizer_config.json (special tokens, the chat
    template) and jaxrl_tokenizer.json (the special ids this repo's tokenizer uses).

    Args:
      tokenizer: the model's own tokenizer.json (a file, or a directory holding one; its
        tokenizer_config.json's chat template is taken when the GGUF has none), checked id
        for id against the file's vocabulary; required for SentencePiece vocabularies.
      chat_template: overrides the template of the file and of `tokenizer`.
      eos: the EOS token's text, where the file names another (a base model's).
    """
    from safetensors.numpy import save_file

    ckpt = read(path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: ckpt.tensor(name) for name in ckpt.tensor_names}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    ids = ckpt.special_ids
    tokens = ckpt.tokens
    if eos is not None:
        if eos not in tokens:
            raise ValueError(f"eos={eos!r} is not a token of {ckpt.path}")
        ids["eos"] = tokens.index(eos)
    template = ckpt.chat_template
    if tokenizer is not None:
        tok_file = Path(tokenizer)
        if tok_file.is_dir():
            tok_file = tok_file / "tokenizer.json"
        (out / "tokenizer.json").write_text(matching_tokenizer(ckpt, tok_file))
        their_config = tok_file.parent / "tokenizer_config.json"
        if template is None and their_config.is_file():
            template = json.loads(their_config.read_text()).get("chat_template")
    else:
        (out / "tokenizer.json").write_text(ckpt.tokenizer_json())
    template = chat_template or template
    hf = dict(ckpt.hf_config)
    hf.update(bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    (out / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    name = lambda i: None if i is None else tokens[i]
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name(ids["bos"]),
        "eos_token": name(ids["eos"]),
        "pad_token": name(ids["pad"]),
        "unk_token": name(ids["unk"]),
        "add_bos_token": ids["bos"] is not None,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": hf["max_position_embeddings"],
    }
    if template:
        tok_config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    meta = {"class": "hf", "pad_id": ids["pad"], "bos_id": ids["bos"], "eos_id": ids["eos"]}
    (out / "jaxrl_tokenizer.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out


__all__ = ["FAMILIES", "GGUFCheckpoint", "convert", "is_gguf", "matching_tokenizer", "read"]
