"""Decode speed and rollout compile time of two checkouts' `Sampler`, side by side.

    python benchmarks/decode_before_after.py --before /tmp/old_sampler \
        --out artifacts/decode_before_after.json

`--before` is a checkout of the older code (e.g. `git worktree add /tmp/old_sampler <rev>`);
the current tree is the "after". Every (model, rows) cell runs each checkout in its own
subprocess (PYTHONPATH set to that checkout), alternating before / after for `--repeats`
rounds, so a shared machine's drifting load falls on both alike. A subprocess builds the
model from a numpy seed, compiles and runs one rollout (its XLA compile seconds are summed
from `jax.monitoring`), then times `--inner` warm rollouts of `--new-tokens` tokens with no
stop token (every row runs to the end). Reported per cell: the median over rounds of each
subprocess's median decode tokens/s (rows * new_tokens / rollout seconds), after / before,
and the median compile seconds of the rollout programs. Both checkouts run with their
Sampler's defaults and the same XLA flags (none unless XLA_FLAGS is set).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Qwen2-shaped models (qkv bias, untied embeddings, GQA), as in the sampler benchmark
MODELS = {
    "tiny": dict(vocab_size=512, hidden_size=256, intermediate_size=768, num_layers=4),
    "25m": dict(vocab_size=2048, hidden_size=512, intermediate_size=1536, num_layers=8),
}
COMMON = dict(num_heads=8, num_kv_heads=2, qkv_bias=True)


def worker(args) -> dict:
    """One checkout, one cell: compile seconds and warm rollout seconds (runs in a child)."""
    import jax
    import numpy as np

    from jaxrl_frontier.models.model_config import ModelConfig
    from jaxrl_frontier.models.random_init import random_model
    from jaxrl_frontier.sampling import Sampler, SamplingParams

    compile_s = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **kw: (
            compile_s.append(secs)
            if event == "/jax/core/compile/backend_compile_duration"
            else None
        )
    )
    cfg = ModelConfig(**MODELS[args.model], **COMMON)
    model = random_model(cfg, seed=0)
    sampler = Sampler(model, pad_id=0, prompt_buckets=(args.prompt_len,))
    rng = np.random.default_rng(args.rows)
    tokens = rng.integers(1, cfg.vocab_size, (args.rows, args.prompt_len)).astype(np.int32)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)

    def run(i):
        ro = sampler.generate(tokens, np.ones_like(tokens), params, jax.random.key(i))
        return jax.block_until_ready(ro)

    t0 = time.perf_counter()
    ro = run(0)
    first_s = time.perf_counter() - t0
    assert int(np.asarray(ro.lengths).min()) == args.new_tokens
    compiled = sum(compile_s)
    times = []
    for i in range(args.inner):
        t0 = time.perf_counter()
        run(i + 1)
        times.append(time.perf_counter() - t0)
    seconds = statistics.median(times)
    return dict(
        compile_s=compiled,
        first_call_s=first_s,
        rollout_s=seconds,
        tokens_per_s=args.rows * args.new_tokens / seconds,
        times=times,
        sampler_file=sys.modules["jaxrl_frontier.sampling"].__file__,
    )


def run_child(tree: Path, args, model: str, rows: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--model", model, "--rows", str(rows)]
    cmd += ["--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens)]
    cmd += ["--inner", str(args.inner)]
    env = dict(os.environ, PYTHONPATH=str(tree), JAX_PLATFORMS="cpu")
    out = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{tree} {model}/{rows}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def machine() -> dict:
    info = dict(platform=platform.platform(), python=platform.python_version())
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    for line in cpuinfo.splitlines():
        if line.startswith("model name") and "cpu" not in info:
            info["cpu"] = line.split(":", 1)[1].strip()
        if line.startswith("flags") and "simd_flags" not in info:
            simd = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")
            info["simd_flags"] = [f for f in line.split(":", 1)[1].split() if f in simd]
    info["cores"] = os.cpu_count()
    info["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    import jax

    info["jax"] = jax.__version__
    return info


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--before", default="/tmp/old_sampler", help="checkout of the older code")
    p.add_argument("--after", default=str(ROOT), help="checkout of the newer code")
    p.add_argument("--models", default="tiny,25m")
    p.add_argument("--rows", default="16,64")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="alternating rounds of subprocesses")
    p.add_argument("--inner", type=int, default=3, help="warm rollouts timed per subprocess")
    p.add_argument("--out", default="artifacts/decode_before_after.json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", default="tiny", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        args.rows = int(args.rows)
        print(json.dumps(worker(args)))
        return {}
    trees = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}
    result = dict(machine=machine(), settings=vars(args), cells={})
    for model in args.models.split(","):
        for rows in (int(r) for r in args.rows.split(",")):
            runs = {name: [] for name in trees}
            for _ in range(args.repeats):
                for name, tree in trees.items():
                    runs[name].append(run_child(tree, args, model, rows))
            med = {
                name: {
                    key: statistics.median(r[key] for r in rs)
                    for key in ("tokens_per_s", "compile_s", "rollout_s")
                }
                for name, rs in runs.items()
            }
            cell = dict(
                **med,
                speed_after_over_before=med["after"]["tokens_per_s"]
                / med["before"]["tokens_per_s"],
                compile_after_over_before=med["after"]["compile_s"] / med["before"]["compile_s"],
                runs=runs,
            )
            result["cells"][f"{model}/{rows}"] = cell
            print(
                f"{model:5s} rows {rows:3d}: tokens/s before {med['before']['tokens_per_s']:8.1f}"
                f" after {med['after']['tokens_per_s']:8.1f} (x{cell['speed_after_over_before']:.3f});"
                f" compile s before {med['before']['compile_s']:.2f} after"
                f" {med['after']['compile_s']:.2f}",
                flush=True,
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
