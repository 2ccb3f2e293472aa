"""Continuous batching against static batching on completions whose lengths spread widely.

    python benchmarks/bench.py continuous
    python benchmarks/bench.py continuous --rows 64 --slots 16,32 --repeats 5

The random tiny Qwen2 (`benchmarks/configs/random_qwen2.py:tiny` unless `--config`), P
prompts x n completions (`--rows` = P * n, n = 8), `--new-tokens` at most, sampled at
temperature 1 with `--stop-ids` stop tokens (the first ids of the vocabulary past 0): a
random policy then stops each step with probability ~ stop ids / vocab, so the lengths are
roughly geometric, from a few tokens to the cap (their spread is in the JSON). Sides, each
its own `Sampler` in this process on the same prompts and keys, timed in alternating rounds
(the medians over `--repeats` rounds):
- `static`: every row of the batch decodes at once until the batch's longest ends
  (`Sampler`, its default phases): B slots;
- `static_waves_S`: the same `Sampler` on S / n prompts at a time (waves of S rows, each
  until its longest row ends): the static engine with S slots, the same KV-cache memory as
  continuous batching with S slots (its rows draw other keys: the same length distribution,
  not the same tokens);
- `continuous_S`: `ContinuousSampler` with S slots.
Per side: seconds per rollout, useful tokens/s (the rows' completion tokens, stop included),
decode steps, and the share of slot-steps spent on finished (or no) rows, 1 - busy share,
where a static slot-step is one row of one decode step. The tokens of `continuous_S` are
checked equal to `static`'s (same keys). The machine must be quiet (`peers.wait_for_quiet`);
the busy share and load are recorded before and after.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from typing import NamedTuple

import numpy as np

from benchmarks import common, peers

DEFAULT_CONFIG = "benchmarks/configs/random_qwen2.py:tiny"
GROUP = 8


class WaveRollout(NamedTuple):  # a pytree: jax.block_until_ready waits for its arrays
    lengths: object
    completion_tokens: object


class Waves:
    """A static `Sampler` run on `prompts` prompts at a time: the static engine with
    prompts * n slots. generate -> the waves' rows concatenated (a `Rollout`-like record of
    lengths and completion tokens)."""

    def __init__(self, sampler, prompts: int):
        self.sampler, self.prompts, self.rows = sampler, prompts, prompts * GROUP

    def generate(self, tokens, mask, params, key):
        import jax
        import jax.numpy as jnp

        outs = [
            self.sampler.generate(tokens[i : i + self.prompts], mask[i : i + self.prompts], params,
                                  jax.random.fold_in(key, i))
            for i in range(0, len(tokens), self.prompts)
        ]  # fmt: skip
        cat = lambda name: jnp.concatenate([getattr(o, name) for o in outs])
        return WaveRollout(cat("lengths"), cat("completion_tokens"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, default=64, help="P * n completions (n = 8)")
    p.add_argument("--slots", type=common.ints, default=[16, 32], help="continuous slot counts")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--stop-ids", type=int, default=12, help="stop tokens: ids 1 .. this")
    p.add_argument("--repeats", type=int, default=5)


def bench_continuous(args) -> dict:
    """Static against continuous batching: useful tokens/s on widely spread lengths."""
    import jax

    from benchmarks.sampler import build_model
    from jaxrl_frontier.sampling import ContinuousSampler, Sampler, SamplingParams

    config = common.load_config(args.config_args, DEFAULT_CONFIG)
    model = build_model(config)
    vocab = config.model.vocab_size
    prompts = args.rows // GROUP
    tokens = (
        np.random.default_rng(0)
        .integers(args.stop_ids + 1, vocab, (prompts, args.prompt_len))
        .astype(np.int32)
    )
    mask = np.ones_like(tokens)
    params = SamplingParams(
        max_new_tokens=args.new_tokens, n=GROUP, stop_ids=tuple(range(1, args.stop_ids + 1))
    )
    buckets = dict(pad_id=0, prompt_buckets=(args.prompt_len,))
    static = Sampler(model, **buckets)
    sides = {"static": static}
    for s in args.slots:
        sides[f"static_waves_{s}"] = Waves(static, max(s // GROUP, 1))
        sides[f"continuous_{s}"] = ContinuousSampler(model, slots=s, **buckets)

    busy_before, load_before = peers.wait_for_quiet(), os.getloadavg()
    compile_s, reference = {}, None
    for name, sampler in sides.items():  # compile, and check the tokens on key 0
        t0 = time.perf_counter()
        ro = jax.block_until_ready(sampler.generate(tokens, mask, params, jax.random.key(0)))
        compile_s[name] = time.perf_counter() - t0
        got = np.asarray(ro.completion_tokens)
        reference = got if reference is None else reference
        if name.startswith("continuous") and not np.array_equal(got, reference):
            raise AssertionError(f"{name} sampled other tokens than static for the same keys")
    times = {name: [] for name in sides}
    record = {}
    keys = itertools.count(1)
    for _ in range(args.repeats):
        key = jax.random.key(next(keys))
        for name, sampler in sides.items():
            t0 = time.perf_counter()
            ro = jax.block_until_ready(sampler.generate(tokens, mask, params, key))
            times[name].append(time.perf_counter() - t0)
            lengths = np.asarray(ro.lengths)
            if name.startswith("static"):  # a wave's rows run until its longest ends
                waves = lengths.reshape(-1, getattr(sampler, "rows", lengths.size))
                steps = int((waves.max(axis=1) - 1).sum())
                busy = float((lengths - 1).sum() / max(steps * waves.shape[1], 1))
            else:
                steps, busy = int(sampler.stats["steps"]), sampler.stats["slot_busy_share"]
            record.setdefault(name, []).append((int(lengths.sum()), steps, busy, lengths))
    out = {}
    for name in sides:
        seconds = statistics.median(times[name])
        useful = statistics.median(r[0] for r in record[name])
        out[name] = dict(
            seconds=seconds,
            times=times[name],
            useful_tokens=useful,
            useful_tokens_per_s=statistics.median(
                r[0] / t for r, t in zip(record[name], times[name], strict=True)
            ),
            decode_steps=statistics.median(r[1] for r in record[name]),
            finished_slot_step_share=1.0 - statistics.median(r[2] for r in record[name]),
            compile_and_first_s=compile_s[name],
        )
    lengths = np.concatenate([r[3] for r in record["static"]])
    for name in sides:
        out[name]["speedup_vs_static"] = (
            out[name]["useful_tokens_per_s"] / out["static"]["useful_tokens_per_s"]
        )
    return dict(
        machine=common.machine_info(),
        config=common.config_text(config),
        settings=dict(
            rows=args.rows,
            group=GROUP,
            new_tokens=args.new_tokens,
            prompt_len=args.prompt_len,
            stop_ids=args.stop_ids,
            repeats=args.repeats,
            temperature=1.0,
        ),  # fmt: skip
        lengths=dict(
            min=int(lengths.min()),
            median=float(np.median(lengths)),
            max=int(lengths.max()),
            p10=float(np.percentile(lengths, 10)),
            p90=float(np.percentile(lengths, 90)),
        ),  # fmt: skip
        sides=out,
        quiet=dict(
            busy_share_before=busy_before,
            busy_share_after=peers.busy_share(),
            load_average_before=list(load_before),
            load_average_after=list(os.getloadavg()),
        ),  # fmt: skip
    )
