"""Decode tokens/s of `Sampler.generate` against transformers `generate` on the same
weights, and the decode step against its FLOP roofline.

    python benchmarks/bench.py sampler --config=benchmarks/configs/random_qwen2.py:tiny
    python benchmarks/bench.py sampler --config=benchmarks/configs/random_qwen2.py:25m \\
        --batches 16,64 --repeats 3 --config.rollout.max_new_tokens=64
    python benchmarks/bench.py sampler --config.model.init=hf \\
        --config.model.path=smollm2-135m-instruct --batches 16,64 --repeats 3 \\
        --config.rollout.max_new_tokens=128       # a pretrained checkpoint (fetch_model.py)

The model, the prompt length (`data.max_prompt_len`), the completion length
(`rollout.max_new_tokens`), the sampling settings (`rollout.temperature`, `top_k`, `top_p`,
`min_p`), the KV-cache dtype (`rollout.cache_dtype`) and the sampler's compute dtype
(`rollout.dtype`) come from the config, as in training; the benchmark's own flags are the
row counts, repeats and the roofline's sizes.

Three kinds of process, one after the other: this one (imports neither jax nor torch) draws
the prompts; a JAX child builds the random model (`model.*`, seed `seed`), saves it as a
Hugging Face directory, and times ours (with `model.init = 'hf'`, both sides load the
checkpoint `model.path` names instead: a pretrained name, a .gguf file or a directory; the
JSON records its files' sha256); a torch child per thread count (`--torch-threads`,
default 1 and 2) and host allocator (`--hf-pages`: the huge pages every side inherits from
bench.py, jaxrl_frontier/core/host_memory.py, and the machine's default) loads that
directory and times `generate` on the same prompts, lengths and sampling settings (no EOS:
every row runs to the end on both sides). The speedup is ours over the fastest setting;
all are in the JSON.

Rounds (`--rounds R`): the sides run in turn R times (ours, then each transformers
setting); each tokens/s is the median of the rounds', the compared setting the fastest by
that median, and each speedup the median of the rounds' own ratios (`speedup_per_round`),
so a drift of the machine's speed between rounds cancels. The rooflines run in the first
round only (each times its own probe round-robin with the step).

Roofline: a decode step at `--roofline-batch` rows is timed as (T(Tn) - T(1)) / (Tn - 1)
(a Tn-token rollout is the prefill plus Tn - 1 steps; a 1-token one is the prefill alone),
against 2 x the parameters touched per token + attention over the cache, at the FLOP/s of
an n x n matmul timed round-robin with it (the machine is shared). Memory roofline: a decode
step at `--memory-roofline-batch` rows over the config's whole completion length, timed the
same way, against the bytes a step must read (`decode_step_bytes`: every weight but the
embedding table once, in the compute dtype, and the keys and values the rows have filled,
on average Tp + Tn / 2 slots) at the read bandwidth of a large array's sum timed
round-robin with it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time

import numpy as np

from benchmarks import common, peers

DEFAULT_CONFIG = "benchmarks/configs/random_qwen2.py:tiny"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batches", type=common.ints, default=[16, 64, 256], help="rows")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--rounds", type=int, default=1, help="alternating rounds of every side (ratio: median)"
    )
    p.add_argument("--torch-threads", type=common.ints, default=[1, 2])
    p.add_argument("--no-hf", action="store_true", help="skip transformers generate")
    peers.add_pages_argument(p, "--hf-pages", "transformers")
    p.add_argument("--roofline-batch", type=int, default=256, help="0: no roofline")
    p.add_argument("--roofline-new-tokens", type=int, default=32)
    p.add_argument(
        "--memory-roofline-batch",
        type=int,
        default=16,
        help="rows of the memory roofline (0: none)",
    )
    p.add_argument(
        "--peak-n", type=int, default=2048, help="matmul size of the peak (8192 on a GPU)"
    )


def sampling_settings(config) -> dict:
    """The settings both sides sample with (stated in the JSON)."""
    r = config.rollout
    return dict(
        prompt_len=config.data.max_prompt_len,
        new_tokens=r.max_new_tokens,
        temperature=r.temperature,
        top_k=r.top_k,
        top_p=r.top_p,
        min_p=r.min_p,
        eos="none (every row runs to new_tokens)",
        prompt_ids="uniform random token ids in [1, vocab), numpy default_rng(rows)",
    )


def prompts(vocab: int, rows: int, length: int) -> list[list[int]]:
    """The same prompts for both sides: [rows, length] token ids."""
    return np.random.default_rng(rows).integers(1, vocab, (rows, length)).tolist()


# ----------------------------------------------------------------------------- ours (JAX)


def build_model(config):
    """The config's model: with random weights (numpy-drawn: fast at any size), or the
    checkpoint `model.path` names (`model.init = 'hf'`), its weights held in the compute
    dtype `model.dtype` (a bf16 run reads bf16 weights, as a sampler's bf16 copy would)."""
    from jaxrl_frontier.models.random_init import random_model
    from jaxrl_frontier.run import build

    if config.model.init == "hf":
        from jaxrl_frontier.models import hf, pretrained

        dtype = config.model.dtype
        return hf.load(pretrained.local_path(config.model.path), dtype=dtype, param_dtype=dtype)
    if not config.model.vocab_size:
        raise SystemExit("config key 'model.vocab_size' must be set for a benchmark model")
    return random_model(build.model_config_from(config, None), seed=config.seed)


def decode_step_flops(cfg, batch: int, cache_len: float) -> float:
    """Matmul FLOPs of one decode step: 2 * params touched per token (the embedding is a
    gather, the output layer a matmul) plus attention's q.k and p.v over the cache."""
    per_token = cfg.num_params() - cfg.vocab_size * cfg.hidden_size * (
        0 if cfg.tie_word_embeddings else 1
    )
    attn = 4 * cfg.num_layers * cfg.num_heads * cfg.resolved_head_dim * cache_len
    return batch * (2 * per_token + attn)


def decode_step_bytes(cfg, batch: int, cache_len: float, cache_dtype: str | None) -> dict:
    """Bytes one decode step must read: each weight once in the compute dtype (the embedding
    table is a gather of B rows; an untied output layer is read whole) and the rows' filled
    keys and values, `cache_len` slots per row and layer."""
    import jax.numpy as jnp

    weight_bytes = jnp.dtype(cfg.compute_dtype).itemsize
    table = cfg.vocab_size * cfg.hidden_size
    weights = (cfg.num_params() - table * (0 if cfg.tie_word_embeddings else 1)) * weight_bytes
    kv_bytes = jnp.dtype(cache_dtype or cfg.compute_dtype).itemsize
    per_slot = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.resolved_head_dim * kv_bytes
    cache = batch * cache_len * per_slot
    return dict(weights=float(weights), cache=float(cache), total=float(weights + cache))


def bandwidth_probe(mib: int = 512, calls: int = 3):
    """A compiled sum over a `mib` MiB f32 array; probe() -> the best read bytes/s of `calls`
    (a stand-in for the memory bandwidth a decode step's reads can reach)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((mib * 2**20 // 4,), jnp.float32)
    total = jax.jit(jnp.sum).lower(x).compile()
    total(x).block_until_ready()

    def probe() -> float:
        best = float("inf")
        for _ in range(calls):
            t0 = time.perf_counter()
            total(x).block_until_ready()
            best = min(best, time.perf_counter() - t0)
        return x.nbytes / best

    return probe


def memory_roofline(model, config, rows: int, repeats: int) -> dict:
    """One decode step at `rows` rows over the config's completion length against the bytes
    it must read at the probed bandwidth (module doc)."""
    new_tokens = config.rollout.max_new_tokens
    tokens = prompts(model.cfg.vocab_size, rows, config.data.max_prompt_len)
    probe = bandwidth_probe()
    full, _ = rollout(model, config, tokens, new_tokens)
    prefill, _ = rollout(model, config, tokens, 1)
    t_full, t_prefill, bandwidths = map(
        np.asarray, common.decode_step_rounds(full, prefill, repeats, each_round=probe)
    )
    cache_len = config.data.max_prompt_len + new_tokens / 2
    cfg = model.cfg.replace(dtype=config.rollout.dtype or model.cfg.dtype)  # the sampler's
    bytes_ = decode_step_bytes(cfg, rows, cache_len, config.rollout.cache_dtype)
    steps = (t_full - t_prefill) / (new_tokens - 1)
    return dict(
        batch=rows,
        new_tokens=new_tokens,
        step_s=float(np.median(steps)),
        step_bytes=bytes_,
        mean_filled_slots=cache_len,
        bandwidth_gbs_per_round=(bandwidths / 1e9).tolist(),
        roofline_step_s=float(bytes_["total"] / np.median(bandwidths)),
        step_over_roofline=float(np.median(steps / (bytes_["total"] / bandwidths))),
        step_over_roofline_best=float(steps.min() / (bytes_["total"] / bandwidths.max())),
        step_method="(T(new_tokens) - T(1)) / (new_tokens - 1), per round",
        bandwidth_method="sum of a 512 MiB f32 array, best of 3 calls, per round",
    )


def rollout(model, config, tokens, new_tokens: int):
    """A warm rollout of `tokens` [B, T] -> (run, compile + first call seconds); run()
    blocks until the rollout is ready, each call with a new key."""
    import jax

    from jaxrl_frontier.sampling import Sampler, SamplingParams

    r = config.rollout
    tokens = np.asarray(tokens, np.int32)
    sampler = Sampler(
        model, pad_id=0, prompt_buckets=(tokens.shape[1],), cache_dtype=r.cache_dtype,
        dtype=r.dtype, decode_phases=r.decode_phases,
    )  # fmt: skip
    params = SamplingParams(
        max_new_tokens=new_tokens,
        temperature=r.temperature,
        top_k=r.top_k,
        top_p=r.top_p,
        min_p=r.min_p,
    )
    mask, calls = np.ones_like(tokens), itertools.count()

    def run():
        return jax.block_until_ready(
            sampler.generate(tokens, mask, params, jax.random.key(next(calls)))
        )

    t0 = time.perf_counter()
    ro = run()
    first = time.perf_counter() - t0
    assert int(np.asarray(ro.lengths).min()) == new_tokens  # no EOS: every row runs to the end
    return run, first


def peak_probe(dtype: str, n: int, calls: int = 3):
    """A compiled n x n matmul in the compute dtype; probe() -> best FLOP/s of `calls`."""
    import jax

    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    mm = jax.jit(lambda x, y: x @ y).lower(a, a).compile()
    mm(a, a).block_until_ready()

    def probe() -> float:
        best = float("inf")
        for _ in range(calls):
            t0 = time.perf_counter()
            mm(a, a).block_until_ready()
            best = min(best, time.perf_counter() - t0)
        return 2 * n**3 / best

    return probe


def roofline(model, config, rows: int, new_tokens: int, repeats: int, peak_n: int) -> dict:
    """One decode step at `rows` rows against its FLOPs at the matmul peak (module doc)."""
    if new_tokens < 2:
        raise ValueError(f"--roofline-new-tokens must be >= 2 (one decode step), got {new_tokens}")
    tokens = prompts(model.cfg.vocab_size, rows, config.data.max_prompt_len)
    probe = peak_probe(model.cfg.dtype, peak_n)
    full, _ = rollout(model, config, tokens, new_tokens)
    prefill, _ = rollout(model, config, tokens, 1)
    t_full, t_prefill, peaks = map(
        np.asarray, common.decode_step_rounds(full, prefill, repeats, each_round=probe)
    )
    flops = decode_step_flops(model.cfg, rows, config.data.max_prompt_len + new_tokens / 2)
    steps = (t_full - t_prefill) / (new_tokens - 1)
    return dict(
        batch=rows,
        new_tokens=new_tokens,
        step_s=float(np.median(steps)),
        step_gflops=flops / 1e9,
        peak_gflops_per_round=(peaks / 1e9).tolist(),
        roofline_step_s=float(flops / np.median(peaks)),
        step_over_roofline=float(np.median(steps / (flops / peaks))),
        step_over_roofline_best=float(steps.min() / (flops / peaks.max())),
        prefill_s=float(np.median(t_prefill)),
        step_method="(T(new_tokens) - T(1)) / (new_tokens - 1), per round",
    )


def time_ours(request: dict) -> dict:
    """The JAX child: build and save the model (or load the checkpoint), time ours at each
    row count, the rooflines."""
    from jaxrl_frontier.models import hf

    config = common.load_config(request["config_args"], DEFAULT_CONFIG)
    counter = common.CompileCounter()
    model = build_model(config)
    if not request.get("checkpoint"):  # the random model, for the peer to load
        hf.save(model, request["hf_dir"], dtype="float32")
    new_tokens, out = config.rollout.max_new_tokens, {}
    for rows, tokens in request["prompts"].items():
        run, first = rollout(model, config, tokens, new_tokens)
        before = counter.count
        median, times = common.median_time(run, request["repeats"])
        out[rows] = dict(
            seconds=median,
            tokens_per_s=int(rows) * new_tokens / median,
            best_tokens_per_s=int(rows) * new_tokens / min(times),
            compile_s=first - median,
            compiles_in_timed_calls=counter.count - before,
            times=times,
        )
        print(f"[ours] {rows} rows: {json.dumps(out[rows])}", file=sys.stderr)
    result = dict(
        **common.machine_info(),
        params=model.cfg.num_params(),
        dtype=config.rollout.dtype or model.cfg.dtype,  # the sampler's compute dtype
        batches=out,
    )
    if request["roofline_batch"]:
        result["roofline"] = roofline(
            model,
            config,
            request["roofline_batch"],
            request["roofline_new_tokens"],
            request["repeats"],
            request["peak_n"],
        )
        print(f"[ours] roofline: {json.dumps(result['roofline'])}", file=sys.stderr)
    if request.get("memory_roofline_batch"):
        result["memory_roofline"] = memory_roofline(
            model, config, request["memory_roofline_batch"], request["repeats"]
        )
        print(f"[ours] memory roofline: {json.dumps(result['memory_roofline'])}", file=sys.stderr)
    return result


# ----------------------------------------------------------------------------- orchestration


def bench_sampler(args) -> dict:
    """Decode tokens/s vs transformers `generate` (each in its own process), and the roofline."""
    config_args = getattr(args, "config_args", [])
    config = common.load_config(config_args, DEFAULT_CONFIG)
    settings = sampling_settings(config)
    ckpt = common.checkpoint(config)
    vocab = ckpt["config"]["vocab_size"] if ckpt else config.model.vocab_size
    shared = {str(b): prompts(vocab, b, config.data.max_prompt_len) for b in args.batches}
    result = dict(
        **common.machine_info(jax_device=False),
        config_args=config_args or [f"--config={DEFAULT_CONFIG}"],
        model=common.config_text(config.model),
        checkpoint=ckpt and {k: v for k, v in ckpt.items() if k != "config"},
        settings=settings,
        repeats=args.repeats,
        processes="ours, and transformers at each thread count and host allocator, each in "
        "its own process",
    )
    with tempfile.TemporaryDirectory() as scratch:
        hf_dir = ckpt["dir"] if ckpt else scratch
        request = dict(
            config_args=config_args,
            hf_dir=hf_dir,
            checkpoint=bool(ckpt),
            prompts=shared,
            repeats=args.repeats,
            roofline_batch=args.roofline_batch,
            roofline_new_tokens=args.roofline_new_tokens,
            memory_roofline_batch=args.memory_roofline_batch,
            peak_n=args.peak_n,
        )
        hf_request = dict(
            hf_dir=hf_dir, prompts=shared, repeats=args.repeats, dtype=config.model.dtype,
            **settings,
        )  # fmt: skip
        rounds = [
            one_round(request if i == 0 else dict(request, **NO_ROOFLINES), hf_request, args)
            for i in range(args.rounds)
        ]
    result["rounds"] = args.rounds

    def side(runs: list[dict], merged: dict) -> dict:  # the first round's, the rounds kept
        return dict(common.median_of_rounds(runs, ()), batches=merged)

    result["ours"] = ours = side([r["ours"] for r in rounds], merged_batches(rounds, "ours"))
    result["device"], result["device_kind"] = ours["device"], ours["device_kind"]
    if not args.no_hf:
        result["transformers"] = {
            name: side(
                [r["transformers"][name] for r in rounds],
                merged_batches(rounds, "transformers", name),
            )
            for name in rounds[0]["transformers"]
        }
    result["rows"] = compare(result, rounds)
    return result


NO_ROOFLINES = dict(roofline_batch=0, memory_roofline_batch=0)


def one_round(request: dict, hf_request: dict, args) -> dict:
    """One round: ours, then transformers at each thread count and host allocator, each in
    its own process -> {'ours': record, 'transformers': {setting: record}}."""
    out = dict(ours=peers.run_child("benchmarks.sampler", request), transformers={})
    if not args.no_hf:
        out["transformers"] = peers.thread_runs(
            "benchmarks.peer_hf", hf_request, args.torch_threads, args.hf_pages
        )
    return out


def merged_batches(rounds: list[dict], side: str, name: str | None = None) -> dict:
    """One side's per-row-count records over the rounds: the median tokens/s and seconds, the
    best call of any round, the compilations summed; one round as it is."""
    runs = [r[side] if name is None else r[side][name] for r in rounds]
    if len(runs) == 1:
        return runs[0]["batches"]
    out = {}
    for b, first in runs[0]["batches"].items():
        per = [run["batches"][b] for run in runs]
        out[b] = dict(
            first,
            tokens_per_s=statistics.median(p["tokens_per_s"] for p in per),
            best_tokens_per_s=max(p["best_tokens_per_s"] for p in per),
            seconds=statistics.median(p["seconds"] for p in per),
            tokens_per_s_per_round=[p["tokens_per_s"] for p in per],
        )
        if "compiles_in_timed_calls" in first:
            out[b]["compiles_in_timed_calls"] = sum(p["compiles_in_timed_calls"] for p in per)
    return out


def compare(result: dict, rounds: list[dict] | None = None) -> dict:
    """Per row count: ours over the fastest transformers setting by its median over the
    rounds (None: `result` is the one round); the speedup the median of the rounds' own
    ratios, best over best the best call of any round on each side."""
    rounds, rows = rounds or [result], {}
    for b, ours in result["ours"]["batches"].items():
        row = dict(ours_tokens_per_s=ours["tokens_per_s"])
        hf = {name: run["batches"][b] for name, run in result.get("transformers", {}).items()}
        if hf:
            best = peers.best_of(hf, "tokens_per_s", lower_is_better=False)
            ratios = [
                r["ours"]["batches"][b]["tokens_per_s"]
                / r["transformers"][best]["batches"][b]["tokens_per_s"]
                for r in rounds
            ]
            row.update(
                transformers_tokens_per_s={k: v["tokens_per_s"] for k, v in hf.items()},
                transformers_best=best,
                speedup=statistics.median(ratios),
                speedup_best=ours["best_tokens_per_s"]
                / max(v["best_tokens_per_s"] for v in hf.values()),
            )
            if len(rounds) > 1:
                row["speedup_per_round"] = ratios
        rows[b] = row
    return rows


if __name__ == "__main__":
    peers.child_main(time_ours, peers.JAX_SIDE)
