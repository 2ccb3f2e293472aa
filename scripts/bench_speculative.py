"""Speculative rollouts vs the plain sampler: tokens/s, acceptance rate, tokens per policy
forward, for a random Qwen2-shaped policy with (a) a shallow draft (its first layer, final
norm and head) and (b) a draft equal to the policy (acceptance 1: the best case for the
verify path, the worst for draft cost).

    python scripts/bench_speculative.py --out artifacts/bench_speculative.json
    python scripts/bench_speculative.py --batch 16 --new-tokens 64 --k 2,4 --repeats 5

`bench_speculative(args)` is the library entry (scripts/bench.py wires it as a subcommand
with `add_arguments`). Times are medians over repeats of a full `generate` (prefill
included), compile time reported apart. Random weights are not a trained model: the
acceptance rates say little about a real policy/draft pair; the cost side (tokens/s at a
given acceptance) is what this measures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_common  # noqa: E402  (scripts/ is on sys.path when run or imported)

POLICY = bench_common.TINY_QWEN2  # the sampler benchmark's "tiny" shape


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument(
        "--k", type=bench_common.ints, default=[4], help="draft tokens per round, e.g. 2,4"
    )
    p.add_argument("--draft-layers", type=int, default=1, help="layers of the shallow draft")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dtype", default="float32", help="compute dtype")
    p.add_argument(
        "--head-std", type=float, default=0.05, help="std of the random output layer weights"
    )


def _build_policy(dtype: str, head_std: float, seed: int = 0):

    from jaxrl_frontier.models.transformer import ModelConfig

    cfg = ModelConfig(**POLICY, qkv_bias=True, rope_theta=1_000_000.0, family="qwen2", dtype=dtype)
    from jaxrl_frontier.models.random_init import random_model

    return random_model(cfg, seed=seed, head_std=head_std)


def _timed(generate, repeats: int) -> dict:
    """First call (compile + run) apart, then the median of `repeats` calls."""
    import jax

    t0 = time.perf_counter()
    out = jax.block_until_ready(generate(0))
    first = time.perf_counter() - t0
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(generate(i + 1))
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    return dict(out=out, seconds=median, compile_s=first - median, times=times)


def bench_speculative(args) -> dict:
    """Speculative vs plain rollouts: tokens/s, acceptance rate, tokens per policy forward."""
    import jax

    from jaxrl_frontier.sampling import Sampler, SamplingParams
    from jaxrl_frontier.speculative import SpeculativeSampler, shallow_draft

    policy = _build_policy(args.dtype, args.head_std)
    b, tn = args.batch, args.new_tokens
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, POLICY["vocab_size"], (b, args.prompt_len)).astype(np.int32)
    mask = np.ones_like(tokens)
    params = SamplingParams(max_new_tokens=tn, temperature=args.temperature)
    keys = jax.random.split(jax.random.key(0), args.repeats + 1)
    result = dict(
        **bench_common.machine_info(),
        policy=POLICY | dict(dtype=args.dtype, head_std=args.head_std),
        batch=b,
        prompt_len=args.prompt_len,
        new_tokens=tn,
        temperature=args.temperature,
        repeats=args.repeats,
    )

    sampler = Sampler(policy, pad_id=0, prompt_buckets=(args.prompt_len,))
    plain = _timed(lambda i: sampler.generate(tokens, mask, params, keys[i]), args.repeats)
    emitted = int(np.asarray(plain.pop("out").lengths).sum())
    plain.update(tokens_per_s=emitted / plain["seconds"], tokens_per_policy_forward=1.0)
    result["plain"] = plain
    print(f"[plain] {json.dumps(plain)}", file=sys.stderr)

    drafts = {
        f"shallow_{args.draft_layers}_layer": shallow_draft(policy, args.draft_layers),
        "draft_equals_policy": policy,
    }
    result["speculative"] = {}
    for name, draft in drafts.items():
        for k in args.k:
            spec = SpeculativeSampler(
                policy, draft, pad_id=0, k=k, prompt_buckets=(args.prompt_len,)
            )
            row = _timed(lambda i: spec.generate(tokens, mask, params, keys[i]), args.repeats)
            rollout, stats = jax.device_get(row.pop("out"))
            emitted = int(rollout.lengths.sum())
            row.update(
                k=k,
                tokens_per_s=emitted / row["seconds"],
                speedup=plain["seconds"] / row["seconds"],
                **{key: float(v) for key, v in stats.items()},
            )
            result["speculative"][f"{name}/k{k}"] = row
            print(f"[{name} k={k}] {json.dumps(row)}", file=sys.stderr)
    return result


def main(argv=None) -> dict:
    return bench_common.standalone_main(
        "speculative", __doc__, add_arguments, bench_speculative, argv
    )


if __name__ == "__main__":
    main()
