"""Convert a GGUF file (llama.cpp's format) to a Hugging Face checkpoint directory.

    python scripts/convert_gguf.py SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2
    python scripts/convert_gguf.py gemma-3-270m-q4_k_m.gguf /tmp/gemma3 --tokenizer tok/tokenizer.json

Writes config.json, model.safetensors (the blocks dequantized to f32), tokenizer.json,
tokenizer_config.json (special tokens and the chat template) and jaxrl_tokenizer.json; the
directory loads in transformers and in `jaxrl_frontier.models.hf.load`. A SentencePiece
vocabulary (Gemma) needs the model's own tokenizer.json (--tokenizer), checked id for id
against the file's. Prints the max |logit difference| between the model read from the GGUF
file and from the written directory on a small batch. Needs `pip install '.[models]'`.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("file", help="the .gguf file")
    parser.add_argument("out_dir", help="the Hugging Face directory to write")
    parser.add_argument("--tokenizer", default=None, help="the model's tokenizer.json (or its dir)")
    parser.add_argument(
        "--chat_template", default=None, help="a Jinja file overriding the template"
    )
    parser.add_argument("--eos", default=None, help="the EOS token's text, if not the file's")
    args = parser.parse_args(argv)
    import jax.numpy as jnp  # after parsing: --help needs no jax
    import numpy as np

    from jaxrl_frontier.models import gguf_file, hf

    template = open(args.chat_template).read() if args.chat_template else None
    out = gguf_file.convert(
        args.file, args.out_dir, tokenizer=args.tokenizer, chat_template=template, eos=args.eos
    )
    from_file, from_dir = hf.load(args.file), hf.load(out)
    print(f"wrote {out}: {hf.count_params(from_dir):,} parameters ({from_dir.cfg.family})")
    tokens = np.random.RandomState(0).randint(0, from_dir.cfg.vocab_size, size=(1, 16))
    tokens, mask = jnp.asarray(tokens, jnp.int32), jnp.ones((1, 16), jnp.int32)
    diff = float(
        np.abs(np.asarray(from_file(tokens, mask)) - np.asarray(from_dir(tokens, mask))).max()
    )
    print(f"max |logit diff| GGUF file vs directory: {diff:.3e}")
    return diff


if __name__ == "__main__":
    main(sys.argv[1:])
