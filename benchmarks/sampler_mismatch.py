"""What the sampler's precision settings cost in train / rollout mismatch on a real checkpoint:
the log-probs the sampler records for its own tokens against the learner's forward over the
same sequences, as `train.measure_mismatch` logs them in a run.

    python benchmarks/bench.py mismatch --config=configs/smollm2_reasoning.py \\
        --prompts 8 --config.rollout.group_size=4 --config.rollout.max_new_tokens=64 \\
        --out artifacts/sampler_mismatch_smollm2_cpu.json

The config's checkpoint (`model.path`, f32 weights), task prompts (its chat template, the
first `--prompts` train examples) and sampling settings; every completion runs to
`rollout.max_new_tokens` (no stop). Per setting, over the completion tokens, with
d = log p_learner - log p_sampler: max |d|, mean |d| and the K3 estimate of
KL(sampler || learner), mean(e^d - 1 - d) (`rl/diagnostics.logp_mismatch`). Settings:

  f32           sampler and learner in f32: what the decode's different op order leaves.
  cache_bf16    `rollout.cache_dtype = 'bfloat16'`: the keys and values rounded to bf16.
  sampler_bf16  `rollout.dtype = 'bfloat16'`: the sampler in bf16 (weights rounded once a
                rollout, compute and cache in bf16), the learner in f32.
  model_bf16    `model.dtype = 'bfloat16'`: both in bf16 (the learner's forward too), the
                gap between two bf16 computations of the same function.

Accuracy, not speed: the settings run one after another in this process.
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks import common, rl

DEFAULT_CONFIG = "configs/smollm2_reasoning.py"
SETTINGS = {  # name -> (model.dtype, rollout.cache_dtype, rollout.dtype)
    "f32": ("float32", None, None),
    "cache_bf16": ("float32", "bfloat16", None),
    "sampler_bf16": ("float32", None, "bfloat16"),
    "model_bf16": ("bfloat16", None, None),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=int, default=8, help="task prompts (x rollout.group_size)")
    p.add_argument("--seed", type=int, default=0, help="the sampling key")
    p.add_argument(
        "--settings", default=",".join(SETTINGS), help=f"comma-separated, of {list(SETTINGS)}"
    )


def mismatch(sampler_logp, learner_logp, mask) -> dict:
    """max |d|, mean |d| and mean(e^d - 1 - d) over mask > 0, d = learner - sampler."""
    d = (np.asarray(learner_logp, np.float64) - np.asarray(sampler_logp, np.float64))[
        np.asarray(mask) > 0
    ]
    return dict(
        max=float(np.abs(d).max()),
        mean=float(np.abs(d).mean()),
        k3=float(np.mean(np.expm1(d) - d)),
        tokens=int(d.size),
    )


def learner_logprobs(model):
    """The learner's jitted forward: (tokens, mask) [B, T] -> log p(token_t | tokens_<t)
    [B, T] (0 at t = 0), in the model's compute dtype, log-softmax in f32."""
    import jax
    from flax import nnx

    from jaxrl_frontier.objectives.logprobs import token_logprobs

    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, tokens, mask):
        return token_logprobs(nnx.merge(graphdef, state)(tokens, mask), tokens)

    return lambda tokens, mask: run(state, tokens, mask)


def measure(model, learner, tokens, mask, params, setting: str, key) -> dict:
    """One setting's rollout of the left-padded prompts tokens, mask [P, Tp] with the
    `SamplingParams` params, scored by `learner` (`learner_logprobs(model)`); model: the
    checkpoint loaded at the setting's `model.dtype` (module docstring)."""
    from jaxrl_frontier.sampling import Sampler

    dtype, cache_dtype, sampler_dtype = SETTINGS[setting]
    sampler = Sampler(
        model, pad_id=0, prompt_buckets=(tokens.shape[1],), cache_dtype=cache_dtype,
        dtype=sampler_dtype,
    )  # fmt: skip
    seq = sampler.generate(tokens, mask, params, key).sequences()
    return dict(
        model_dtype=dtype,
        cache_dtype=cache_dtype,
        sampler_dtype=sampler_dtype or dtype,
        **mismatch(seq.old_logp, learner(seq.tokens, seq.attention_mask), seq.loss_mask),
    )


def bench_mismatch(args) -> dict:
    """The mismatch of each sampler precision setting (module docstring)."""
    config_args = getattr(args, "config_args", [])
    config = common.load_config(config_args, DEFAULT_CONFIG)
    if config.model.init != "hf":
        raise SystemExit("mismatch: the config must load a checkpoint (model.init = 'hf')")
    settings = [s for s in args.settings.split(",") if s]
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise SystemExit(f"mismatch: unknown settings {unknown}; allowed: {list(SETTINGS)}")
    import jax

    from jaxrl_frontier.models import hf, pretrained, text
    from jaxrl_frontier.run import build
    from jaxrl_frontier.sampling import SamplingParams

    texts = rl.task_prompts(config, args.prompts)["texts"]
    # the prompts as the run encodes them: its tokenizer, left-padded to data.max_prompt_len
    tokens, mask = text.encode_prompts(
        build.build_tokenizer(config), texts, config.data.max_prompt_len
    )
    r = config.rollout
    params = SamplingParams(
        max_new_tokens=r.max_new_tokens, n=r.group_size, temperature=r.temperature
    )
    result = dict(
        **common.machine_info(),
        config_args=config_args,
        checkpoint=common.checkpoint(config),
        prompts=len(texts),
        group_size=r.group_size,
        new_tokens=r.max_new_tokens,
        temperature=r.temperature,
        prompt_tokens=float(mask.sum(axis=1).mean()),
        method="d = log p_learner - log p_sampler over the completion tokens: max |d|, "
        "mean |d|, K3 = mean(e^d - 1 - d)",
        settings={},
    )
    loaded = {}  # model.dtype -> (the checkpoint, its learner forward): loaded, compiled once
    for s in settings:
        dtype = SETTINGS[s][0]
        if dtype not in loaded:
            model = hf.load(
                pretrained.local_path(config.model.path), dtype=dtype, param_dtype="float32"
            )
            loaded[dtype] = (model, learner_logprobs(model))
        key = jax.random.key(args.seed)
        result["settings"][s] = measure(*loaded[dtype], tokens, mask, params, s, key)
    return result
