"""Round-trip a Hugging Face checkpoint through our Transformer (load + save).

    python scripts/convert_hf.py --in /ckpt/Qwen3-0.6B --out /tmp/qwen3 [--dtype bfloat16]

Prints the parameter count and a logit check: the max |logit difference| between the
model loaded from --in and the one loaded back from --out, on a small fixed left-padded
batch. --dtype sets the dtype of the written tensors (default: the checkpoint's own).
Tokenizer and generation files next to the weights are copied, so --out serves as is.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

import numpy as np

# Files a serving stack reads besides config.json and the weights.
_COPIED = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)


def _probe_batch(vocab: int):
    """[2, 16] tokens and mask (jax arrays); the second row left-padded by 5."""
    import jax.numpy as jnp

    tokens = np.random.RandomState(0).randint(0, vocab, size=(2, 16)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[1, :5] = 0
    return jnp.asarray(tokens * mask), jnp.asarray(mask)


def main(argv: list[str] | None = None) -> float:
    """Runs the conversion; returns the max |logit diff| (also printed)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--in", dest="src", required=True, help="HF checkpoint directory")
    parser.add_argument("--out", dest="dst", required=True, help="output directory")
    parser.add_argument("--dtype", default=None, help="saved tensor dtype: float32 | bfloat16")
    parser.add_argument("--max-shard-size", default="5GB", help="e.g. 5GB, 500MB")
    args = parser.parse_args(argv)
    from jaxrl_frontier.models import hf  # after parsing: --help needs no jax

    base = hf.read_config(args.src)
    saved_dtype = args.dtype or base.get("torch_dtype") or base.get("dtype") or "float32"
    model = hf.load(args.src)
    print(
        f"loaded {base.get('architectures')} from {args.src}: {hf.count_params(model):,} parameters"
    )

    hf.save(
        model, args.dst, dtype=saved_dtype, max_shard_size=args.max_shard_size, base_config=base
    )
    for name in _COPIED:
        if os.path.isfile(os.path.join(args.src, name)):
            shutil.copy2(os.path.join(args.src, name), os.path.join(args.dst, name))

    tokens, mask = _probe_batch(model.cfg.vocab_size)
    before = np.asarray(model(tokens, mask))
    after = np.asarray(hf.load(args.dst)(tokens, mask))
    diff = float(np.abs(before - after)[np.asarray(mask, bool)].max())
    print(f"saved {saved_dtype} to {args.dst}; max |logit diff| in vs out: {diff:.3e}")
    return diff


if __name__ == "__main__":
    main(sys.argv[1:])
