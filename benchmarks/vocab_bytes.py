r"""The log-prob path's compiled bytes at a large vocabulary: chunked vs whole logits.

    python benchmarks/bench.py vocab-bytes                      # Gemma-3-270M, 8 x 256 tokens
    python benchmarks/bench.py vocab-bytes --rows 16 --seq 512 --out artifacts/memory/vocab_bytes.json

At Gemma-3-270M's shape (vocabulary 262,144, width 640; the `gemma-3-270m` checkpoint's
config when it is fetched, else the same shape built from its published config) and one
device, compiles (nothing runs) the two programs whose size the vocabulary sets:

  logp     the reference / behaviour log-prob pass (`forward.make_logp_fn`)
  grad     the gradient of the RL loss (`learn.loss.rl_loss`, the base config's objective)

each with the output layer and log-softmax over chunks of 256 positions (what the trainer
runs: [256, V] logits at a time, recomputed in the backward pass) and over the whole batch
([B, T, V] f32 logits). Reports `compiled.memory_analysis()`'s temporaries per program, and
B x T x V x 4, the bytes one f32 copy of the whole logits takes. Writes JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common  # noqa: E402

# Gemma-3-270M's config.json (the fields the converted GGUF writes; models/gguf_file.py)
GEMMA3_270M = dict(
    architectures=["Gemma3ForCausalLM"], vocab_size=262144, hidden_size=640,
    intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
    num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
    rope_theta=1e6, rope_local_base_freq=1e4, max_position_embeddings=32768,
    tie_word_embeddings=True, rms_norm_eps=1e-6,
)  # fmt: skip


def measure(rows: int, seq: int, prompt_len: int, group_size: int) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxrl_frontier.models import hf, pretrained
    from jaxrl_frontier.models.transformer import Transformer
    from jaxrl_frontier.rl.learn.forward import make_logp_fn
    from jaxrl_frontier.rl.learn.loss import rl_loss
    from jaxrl_frontier.run.build import objective_section
    from jaxrl_frontier.run.config import base_config

    hf_config = GEMMA3_270M
    if pretrained.is_fetched("gemma-3-270m"):
        hf_config = hf.read_config(pretrained.model_dir("gemma-3-270m"))
    cfg = hf.config_from_hf(hf_config)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    tn = seq - prompt_len
    tokens = jax.ShapeDtypeStruct((rows, seq), jnp.int32)
    f32 = jax.ShapeDtypeStruct((rows, seq), jnp.float32)
    batch = dict(tokens=tokens, attention_mask=tokens, loss_mask=f32, old_logp=f32,
                 advantages=f32)  # fmt: skip
    objective = objective_section(base_config().objective)
    layout = dict(group_size=group_size, completion_len=tn)
    out = dict(model="gemma-3-270m", vocab=cfg.vocab_size, rows=rows, seq=seq,
               completion=tn, whole_logits_f32_bytes=rows * seq * cfg.vocab_size * 4)  # fmt: skip
    for name, chunk in (("chunked_256", 256), ("whole", None)):
        logp = make_logp_fn(graphdef, logprob_chunk=chunk, **layout)
        loss_of = rl_loss(graphdef, objective, chunk, **layout)
        grad = jax.jit(jax.grad(lambda p, b: loss_of(p, b)[0]))
        for program, lowered in (
            ("logp", logp.lower(state, tokens, tokens)),
            ("grad", grad.lower(state, batch)),
        ):
            temp = common.compiled_memory(lowered.compile())["temporaries"]
            out[f"{program}/{name}/temp_bytes"] = int(temp)
            print(f"{program:5s} {name:12s} temporaries {temp / 2**30:7.3f} GiB", file=sys.stderr)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=8, help="rows of the batch")
    p.add_argument("--seq", type=int, default=256, help="tokens per row")
    p.add_argument("--prompt-len", type=int, default=128, help="the prompt's part of --seq")
    p.add_argument("--group-size", type=int, default=4, help="completions per prompt")
    p.add_argument("--out", default=None, help="JSON file to write")
    a = p.parse_args(argv)
    result = dict(**measure(a.rows, a.seq, a.prompt_len, a.group_size), **common.machine_info())
    if a.out:
        common.write_json(result, a.out)
    else:
        print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
