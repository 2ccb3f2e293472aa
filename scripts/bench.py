"""Speed benchmarks: `python scripts/bench.py <name> [options]`.

Each benchmark is a function registered under a name with `@benchmark(name)`; it gets the
parsed arguments and returns a JSON-able dict, written to `--out` (default
artifacts/bench_<name>.json) and printed. Speed is measured here, never asserted in tests.

    python scripts/bench.py sampler                      # ours vs transformers, roofline
    python scripts/bench.py sampler --models tiny --batches 16 --repeats 3 --no-hf
    python scripts/bench.py train                        # train-step MFU (bench_train.py)
    python scripts/bench.py memory                       # FSDP bytes per device, 8 fake CPUs
    python scripts/bench.py rl                           # GRPO step vs TRL (bench_rl.py)
    python scripts/bench.py speculative                  # bench_speculative.py
    python scripts/bench.py profile --models tiny        # a decode step's ops (bench_profile.py)
    python scripts/bench.py all --out artifacts/bench_all.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_common  # noqa: E402  (scripts/ is on sys.path when run or imported)

BENCHMARKS: dict[str, tuple[Callable, Callable]] = {}  # name -> (add_arguments, run)


def benchmark(name: str, add_arguments: Callable[[argparse.ArgumentParser], None]):
    """Register `run(args) -> dict` as `bench.py <name>`; `add_arguments` adds its flags."""

    def register(run):
        if name in BENCHMARKS:
            raise ValueError(f"benchmark {name!r} is registered twice")
        BENCHMARKS[name] = (add_arguments, run)
        return run

    return register


# ----------------------------------------------------------------------------- sampler

# Qwen2-shaped models (qkv bias, untied embeddings, GQA).
SAMPLER_MODELS = {
    "tiny": bench_common.TINY_QWEN2,
    "25m": dict(  # 24.1M in the blocks + 2.1M embeddings = 26.2M parameters
        vocab_size=2048,
        hidden_size=512,
        intermediate_size=1536,
        num_layers=8,
        num_heads=8,
        num_kv_heads=2,
    ),
    # Qwen2.5-0.5B (494,032,768 parameters with its qkv bias): for a GPU (scripts/gpu_check.sh)
    "0.5b": dict(**bench_common.QWEN2_5_0_5B, tie_word_embeddings=True),
}


def _sampler_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default="tiny,25m", help=f"from {sorted(SAMPLER_MODELS)}")
    p.add_argument("--batches", type=bench_common.ints, default=[16, 64, 256])
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dtype", default="float32", help="compute dtype of our model")
    p.add_argument("--decode-chunks", type=int, default=4)
    p.add_argument("--steps-per-check", type=int, default=8)
    p.add_argument("--roofline-batch", type=int, default=256)
    p.add_argument(
        "--peak-n",
        type=int,
        default=2048,
        help="size of the square matmul timed as the roofline's peak (8192 on a GPU, where "
        "2048 is too small to reach it)",
    )
    p.add_argument(
        "--roofline-new-tokens",
        type=int,
        default=32,
        help="decode length for the roofline batch (the step time is what is compared)",
    )
    p.add_argument(
        "--options-ab",
        default="",
        help="also time rollouts compiled with each set of XLA options, side by side: JSON "
        '{"name": {option: value}, ...}, the first the baseline (e.g. {"default": {}, ...})',
    )
    p.add_argument(
        "--mesh-ab",
        default="",
        help="also time one device against a (data,fsdp,tensor) mesh, e.g. 1,1,2 (heads over "
        "two devices); on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=2 first",
    )
    p.add_argument(
        "--cast-ab",
        action="store_true",
        help="also time Sampler(cast_weights_once=False) against True, side by side (bf16)",
    )
    p.add_argument(
        "--ab-only",
        action="store_true",
        help="time only the --options-ab / --mesh-ab / --cast-ab "
        "comparisons (no transformers, no plain run, no roofline)",
    )
    p.add_argument("--no-hf", action="store_true", help="skip transformers generate")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads (on a shared 2-core CPU, 2 threads is ~15x slower than 1)",
    )


def _build_model(name: str, dtype: str, seed: int = 0):
    """A random Qwen2-shaped Transformer; weights drawn with numpy (fast, any size)."""

    from jaxrl_frontier.models.transformer import ModelConfig

    cfg = ModelConfig(
        **SAMPLER_MODELS[name],
        qkv_bias=True,
        rope_theta=1_000_000.0,
        family="qwen2",
        dtype=dtype,
        max_position_embeddings=4096,
    )
    from jaxrl_frontier.models.random_init import random_model

    return random_model(cfg, seed=seed)


def _matmul_peak_flops(n: int, repeats: int = 5) -> float:
    """FLOP/s of a large f32 matmul on the default device (the roofline's peak)."""
    return bench_common.matmul_peak(n, repeats)["float32_gflops"] * 1e9


def _peak_probe(dtype: str = "float32", n: int = 2048, calls: int = 3):
    """A compiled n x n matmul in the decode's compute dtype; the returned probe() times
    `calls` of it -> best FLOP/s. Run round-robin with the decode so both see the same
    (shared, noisy) machine."""
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


def _decode_step_flops(cfg, batch: int, cache_len: float) -> float:
    """Matmul FLOPs of one decode step: 2 * params touched per token (the embedding is a
    gather, the output layer a matmul) plus attention's q.k and p.v over the cache."""
    per_token = cfg.num_params() - cfg.vocab_size * cfg.hidden_size * (
        0 if cfg.tie_word_embeddings else 1
    )
    attn = 4 * cfg.num_layers * cfg.num_heads * cfg.resolved_head_dim * cache_len
    return batch * (2 * per_token + attn)


def _rollout(model, batch: int, args, new_tokens: int, **sampler_kwargs):
    """A warm `Sampler.generate` call on `batch` random prompts -> (run, sampler, compile +
    first call seconds); run() blocks until the rollout is ready, each call with a new key.
    `sampler_kwargs` override the `Sampler` arguments taken from `args`."""
    import jax

    from jaxrl_frontier.sampling import Sampler, SamplingParams

    settings = dict(
        pad_id=0,
        prompt_buckets=(args.prompt_len,),
        decode_chunks=args.decode_chunks,
        steps_per_check=args.steps_per_check,
    )
    if sampler_kwargs.get("mesh") is not None:  # a copy of the weights, placed on the mesh
        from flax import nnx

        from jaxrl_frontier import sharding

        model = sharding.shard_model(nnx.clone(model), sampler_kwargs["mesh"])
    sampler = Sampler(model, **{**settings, **sampler_kwargs})
    rng = np.random.default_rng(batch)
    tokens = rng.integers(1, model.cfg.vocab_size, (batch, args.prompt_len)).astype(np.int32)
    mask = np.ones_like(tokens)
    params = SamplingParams(max_new_tokens=new_tokens, temperature=args.temperature)
    calls = itertools.count()

    def run():
        ro = sampler.generate(tokens, mask, params, jax.random.key(next(calls)))
        jax.block_until_ready(ro)
        return ro

    t0 = time.perf_counter()
    ro = run()
    first = time.perf_counter() - t0
    assert int(np.asarray(ro.lengths).min()) == new_tokens  # no EOS: every row runs to the end
    return run, sampler, first


def _ours(model, batch: int, args, new_tokens: int) -> dict:
    """`Sampler.generate` tokens/s, median over `args.repeats` calls, compile apart."""
    run, sampler, first = _rollout(model, batch, args, new_tokens)
    median, times = bench_common.median_time(run, args.repeats)
    return dict(
        seconds=median,
        tokens_per_s=batch * new_tokens / median,
        best_tokens_per_s=batch * new_tokens / min(times),  # robust to a shared, loaded CPU
        compile_s=first - median,
        times=times,
        traces=dict(sampler.num_traces),
    )


def _round_robin(runs: dict[str, Callable], repeats: int) -> dict[str, list[float]]:
    """Seconds of each warm `run()`, timed in turn for `repeats` rounds (a shared machine's
    load drifts; side by side it drifts for all of them alike)."""
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    return times


def _sampler_ab(model, batch: int, args, variants: dict[str, dict]) -> dict:
    """Rollouts of samplers built with each variant's `Sampler` arguments (name -> kwargs;
    the first is the baseline), round-robin (`args.repeats` rounds): ms per generated token
    and the median per-round speedup over the baseline. A variant that fails to build or
    compile (an option this XLA does not know) is reported with its error."""
    runs, out = {}, {}
    for name, kwargs in variants.items():
        settings = json.loads(json.dumps(kwargs, default=str))  # a mesh as its repr
        try:
            runs[name], _, first = _rollout(model, batch, args, args.new_tokens, **kwargs)
            out[name] = dict(settings=settings, compile_and_first_s=first)
        except Exception as e:
            out[name] = dict(settings=settings, error=f"{type(e).__name__}: {e}"[:500])
        print(f"[ab {name}] {json.dumps(out[name])}", file=sys.stderr)
    if not runs:
        return out
    times = _round_robin(runs, args.repeats)
    base = np.asarray(times[next(iter(runs))])
    for name, ts in times.items():
        out[name].update(
            ms_per_step=float(np.median(ts)) / args.new_tokens * 1e3,
            speedup=float(np.median(base / np.asarray(ts))),
            times=ts,
        )
    return out


def _mesh_variants(shape: str) -> dict[str, dict]:
    """'1,1,2' -> {one device, a (data, fsdp, tensor) = (1, 1, 2) mesh}, as `_sampler_ab`
    variants. On CPU the devices are fake ones, one per core:
    XLA_FLAGS=--xla_force_host_platform_device_count=N before jax starts."""
    import jax

    from jaxrl_frontier import sharding

    dims = tuple(int(d) for d in shape.split(","))
    mesh = sharding.make_mesh(dims, jax.devices()[: int(np.prod(dims))])
    return {"one_device": {}, "mesh_" + "x".join(map(str, dims)): dict(mesh=mesh)}


def _roofline(model, args) -> dict:
    """One decode step at `args.roofline_batch` rows against its FLOPs at the matmul peak.

    A decode step is timed as (T(Tn) - T(1)) / (Tn - 1): a rollout of Tn new tokens is the
    prefill (which also samples the first token) plus exactly Tn - 1 decode steps, and a
    1-token rollout is the prefill alone. Each round times the peak probe, the Tn-token
    rollout and the 1-token one back to back (the machine is shared); the ratio is the
    median over rounds. The rollout time over Tn (prefill included, an upper bound per
    step: the figure recorded before) is reported too.
    """
    rb, rt = args.roofline_batch, args.roofline_new_tokens
    if rt < 2:
        raise ValueError(f"--roofline-new-tokens must be >= 2 (one decode step), got {rt}")
    probe = _peak_probe(args.dtype, args.peak_n)
    full, _, compile_full = _rollout(model, rb, args, rt)
    prefill, _, compile_prefill = _rollout(model, rb, args, 1)
    rounds = bench_common.decode_step_rounds(full, prefill, args.repeats, each_round=probe)
    t_full, t_prefill, peaks = map(np.asarray, rounds)
    cfg = model.cfg
    flops = _decode_step_flops(cfg, rb, args.prompt_len + rt / 2)
    steps = (t_full - t_prefill) / (rt - 1)
    with_prefill = t_full / rt
    return dict(
        batch=rb,
        new_tokens=rt,
        step_s=float(np.median(steps)),
        step_gflops=flops / 1e9,
        peak_gflops_per_round=(peaks / 1e9).tolist(),
        roofline_step_s=float(flops / np.median(peaks)),
        step_over_roofline=float(np.median(steps / (flops / peaks))),  # median over rounds
        step_over_roofline_best=float(steps.min() / (flops / peaks.max())),
        prefill_s=float(np.median(t_prefill)),
        rollout_s=float(np.median(t_full)),
        step_with_prefill_s=float(np.median(with_prefill)),
        step_with_prefill_over_roofline=float(np.median(with_prefill / (flops / peaks))),
        tokens_per_s=rb * rt / float(np.median(t_full)),
        compile_s=compile_full - float(np.median(t_full)),
        prefill_compile_s=compile_prefill - float(np.median(t_prefill)),
        step_method="(T(new_tokens) - T(1)) / (new_tokens - 1), per round",
    )


def _hf_generate(model, batches: list[int], args) -> dict[int, dict]:
    """transformers `generate` on the same weights, sampling at the same settings."""
    import torch
    import transformers

    from jaxrl_frontier.models import hf

    torch.set_num_threads(args.torch_threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the GPU when JAX has one too
    torch_dtype = getattr(torch, args.dtype)  # the same compute dtype as ours
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        hf.save(model, tmp, dtype="float32")
        torch_model = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch_dtype)
        torch_model = torch_model.to(device).eval()
    for batch in batches:
        rng = np.random.default_rng(batch)
        tokens = rng.integers(1, model.cfg.vocab_size, (batch, args.prompt_len))
        input_ids = torch.as_tensor(tokens, dtype=torch.long, device=device)
        kwargs = dict(
            attention_mask=torch.ones_like(input_ids),
            do_sample=True,
            temperature=args.temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=args.new_tokens,
            min_new_tokens=args.new_tokens,  # no EOS stop: the same work as ours
            pad_token_id=0,
        )

        def run(input_ids=input_ids, kwargs=kwargs):
            with torch.inference_mode():
                out = torch_model.generate(input_ids, **kwargs)
            if device == "cuda":
                torch.cuda.synchronize()
            return out

        assert run().shape == (batch, args.prompt_len + args.new_tokens)  # warm-up
        median, times = bench_common.median_time(run, args.repeats)
        out[batch] = dict(
            seconds=median,
            tokens_per_s=batch * args.new_tokens / median,
            best_tokens_per_s=batch * args.new_tokens / min(times),
            times=times,
            device=device,
        )
    return out


@benchmark("sampler", _sampler_args)
def bench_sampler(args) -> dict:
    """Generated tokens/s of `Sampler.generate` (median over repeats, compile apart) vs
    transformers `generate` on the same weights, and the decode step vs the FLOP roofline."""

    peak = _matmul_peak_flops(args.peak_n)
    result = dict(
        **bench_common.machine_info(),
        matmul_peak_gflops=peak / 1e9,
        settings=dict(
            prompt_len=args.prompt_len,
            new_tokens=args.new_tokens,
            temperature=args.temperature,
            repeats=args.repeats,
            dtype=args.dtype,
            decode_chunks=args.decode_chunks,
            steps_per_check=args.steps_per_check,
            peak_n=args.peak_n,
        ),
        models={},
    )
    if args.ab_only:
        args.no_hf = True
    if not args.no_hf:
        try:
            import torch
            import transformers

            result["torch"], result["transformers"] = torch.__version__, transformers.__version__
            result["torch_threads"] = args.torch_threads
        except ImportError:
            args.no_hf = True
    for name in args.models.split(","):
        model = _build_model(name, args.dtype)
        cfg = model.cfg
        entry = dict(params=cfg.num_params(), config=SAMPLER_MODELS[name], batches={})
        hf_results = {} if args.no_hf else _hf_generate(model, args.batches, args)
        for batch in args.batches:
            row = {} if args.ab_only else dict(ours=_ours(model, batch, args, args.new_tokens))
            if args.options_ab:
                options = json.loads(args.options_ab)
                row["options_ab"] = _sampler_ab(
                    model, batch, args, {k: dict(compiler_options=v) for k, v in options.items()}
                )
            if args.mesh_ab:  # one device vs the weights split over a mesh of this host's
                row["mesh_ab"] = _sampler_ab(model, batch, args, _mesh_variants(args.mesh_ab))
            if args.cast_ab:  # bf16 weights cast at every use vs once per program
                row["cast_ab"] = _sampler_ab(
                    model,
                    batch,
                    args,
                    {f"once={c}": dict(cast_weights_once=c) for c in (False, True)},
                )
            if batch in hf_results:
                row["transformers"] = hf_results[batch]
                row["speedup"] = row["ours"]["tokens_per_s"] / hf_results[batch]["tokens_per_s"]
                row["speedup_best"] = (
                    row["ours"]["best_tokens_per_s"] / hf_results[batch]["best_tokens_per_s"]
                )
            entry["batches"][batch] = row
            print(f"[{name}] batch {batch}: {json.dumps(row)}", file=sys.stderr)
        if not args.ab_only:
            entry["roofline"] = _roofline(model, args)
            print(f"[{name}] roofline: {json.dumps(entry['roofline'])}", file=sys.stderr)
        result["models"][name] = entry
    return result


# ----------------------------------------------------------------------------- the others
# Implemented in their own files (each runnable alone); registered here as subcommands.

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_async  # noqa: E402
import bench_profile  # noqa: E402
import bench_rl  # noqa: E402
import bench_speculative  # noqa: E402
import bench_targets  # noqa: E402
import bench_train  # noqa: E402

benchmark("train", bench_train.add_mfu_arguments)(bench_train.bench_mfu)
benchmark("memory", bench_train.add_memory_arguments)(bench_train.bench_memory)
benchmark("rl", bench_rl.add_arguments)(bench_rl.bench_rl)
benchmark("async", bench_async.add_arguments)(bench_async.bench_async)
benchmark("speculative", bench_speculative.add_arguments)(bench_speculative.bench_speculative)


def _profile_args(p: argparse.ArgumentParser) -> None:
    bench_profile.add_arguments(p, _sampler_args)


@benchmark("profile", _profile_args)
def bench_decode_profile(args) -> dict:
    """Where a decode step's time goes: a trace's ops per step (bench_profile.py)."""
    result = dict(**bench_common.machine_info(), settings=dict(dtype=args.dtype), models={})
    for name in args.models.split(","):
        model = _build_model(name, args.dtype)
        result["models"][name] = {
            batch: bench_profile.profile_model(model, batch, args, _rollout)
            for batch in args.batches
        }
        for batch, row in result["models"][name].items():
            top = list(row["per_step"].items())[:5]
            print(
                f"[{name} {batch}] {row['wall_us_per_step']:.0f} us/step, ops busy "
                f"{row['busy_us_per_step']:.0f} us in {row['ops_per_step']:.0f} ops; top: "
                f"{json.dumps(top)}",
                file=sys.stderr,
            )
    return result


ALL = ("train", "memory", "rl", "speculative", "sampler")


def _all_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--only", default=",".join(ALL), help=f"subset of {ALL}")


@benchmark("all", _all_args)
def bench_all(args) -> dict:
    """Every benchmark at its defaults, one combined JSON (each also in its own file)."""
    out = {}
    for name in args.only.split(","):
        add_arguments, run = BENCHMARKS[name]
        p = argparse.ArgumentParser()
        add_arguments(p)
        t0 = time.perf_counter()
        out[name] = dict(benchmark=name, **run(p.parse_args([])))
        out[name]["wall_s"] = time.perf_counter() - t0
        bench_common.write_json(out[name], f"artifacts/bench_{name}.json", echo=False)
        print(f"[all] {name} done in {out[name]['wall_s']:.0f} s", file=sys.stderr)
    # The targets beside these figures (bench_targets.py; --doc there puts the same
    # table into docs/performance.md).
    rows = bench_targets.targets(
        {args.out or "artifacts/bench_all.json": dict(benchmark="all", **out)}
    )
    table = bench_targets.markdown(rows)
    Path("artifacts/bench_targets.md").write_text(table)
    print(table, file=sys.stderr)
    out["targets"] = [dataclasses.asdict(r) for r in rows]
    return out


# ----------------------------------------------------------------------------- main


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="name", required=True, metavar="name")
    for name, (add_arguments, run) in BENCHMARKS.items():
        p = sub.add_parser(name, help=(run.__doc__ or "").strip().splitlines()[0])
        p.add_argument(
            "--out", default=None, help="JSON path (default artifacts/bench_<name>.json)"
        )
        add_arguments(p)
    args = parser.parse_args(argv)
    _, run = BENCHMARKS[args.name]
    result = dict(benchmark=args.name, **run(args))
    return bench_common.write_json(result, args.out or f"artifacts/bench_{args.name}.json")


if __name__ == "__main__":
    main()
