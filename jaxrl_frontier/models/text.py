"""Text to token ids and back, as every stage that prompts a model does it: prompts
left-padded to a fixed width (static shapes for the jitted sampler), completions decoded up to
their stop token."""

from __future__ import annotations

import numpy as np


def encode_prompts(tokenizer, texts: list[str], max_len: int):
    """Left-padded int32 [N, max_len] prompts and their mask."""
    tokens, mask = tokenizer.batch_encode(texts, max_len=max_len, add_bos=True)
    pad = max_len - tokens.shape[1]
    if pad > 0:
        tokens = np.pad(tokens, ((0, 0), (pad, 0)), constant_values=tokenizer.pad_id)
        mask = np.pad(mask, ((0, 0), (pad, 0)))
    return tokens.astype(np.int32), mask.astype(np.int32)


def decode(tokenizer, tokens: np.ndarray, mask: np.ndarray) -> tuple[str, ...]:
    """Completions [B, Tn] -> texts (special tokens dropped, cut at EOS)."""
    return tuple(
        tokenizer.decode(t[m.astype(bool)].tolist(), skip_special=True, stop_at_eos=True)
        for t, m in zip(tokens, mask)
    )
