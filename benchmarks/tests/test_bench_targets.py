"""benchmarks/targets.py: the targets table, against hand-made benchmark results, and the
docs page's generated table against the committed JSON it names."""

import re
import shlex
from pathlib import Path

import pytest

from benchmarks import targets as bench_targets

ROOT = Path(__file__).resolve().parents[2]


def _sampler(speedups: dict[int, float], roofline: float, compiles=0, memory=None) -> dict:
    ours = {
        str(b): dict(tokens_per_s=100.0 * v, compiles_in_timed_calls=0) for b, v in speedups.items()
    }
    first = next(iter(ours))
    ours[first]["compiles_in_timed_calls"] = compiles
    rows = {
        str(b): dict(
            ours_tokens_per_s=100.0 * v,
            transformers_tokens_per_s=dict(threads_1=100.0, threads_2=60.0),
            transformers_best="threads_1",
            speedup=v,
            speedup_best=v + 0.1,
        )
        for b, v in speedups.items()
    }
    roof = dict(
        batch=256,
        step_s=roofline * 0.01,
        roofline_step_s=0.01,
        step_over_roofline=roofline,
        step_over_roofline_best=roofline,
    )
    ours = dict(batches=ours, roofline=roof)
    if memory is not None:
        ours["memory_roofline"] = dict(
            batch=16,
            new_tokens=128,
            step_s=memory * 0.001,
            roofline_step_s=0.001,
            step_over_roofline=memory,
            step_over_roofline_best=memory,
            step_bytes=dict(weights=12.6e6, cache=3.4e6, total=16e6),
            bandwidth_gbs_per_round=[15.0, 16.0, 17.0],
        )
    return dict(
        benchmark="sampler",
        device="TFRT_CPU_0",
        config_args=["--config=benchmarks/configs/random_qwen2.py:m"],
        ours=ours,
        transformers=dict(threads_1=dict(torch_threads=1), threads_2=dict(torch_threads=2)),
        rows=rows,
    )


def _by_what(rows):
    return {r.what: r for r in rows}


def test_sampler_targets_are_judged_at_their_thresholds():
    result = _sampler({16: 1.99, 64: 1.6, 256: 1.5}, 2.01, memory=2.51)
    rows = bench_targets.targets({"s.json": result})
    met = {r.what.split(", ", 1)[1]: r.met for r in rows if "transformers" in r.what}
    assert met == {
        "random_qwen2:m, 16 rows": False,
        "random_qwen2:m, 64 rows": True,
        "random_qwen2:m, 256 rows": None,
    }
    assert "at torch 1 thread(s)" in rows[0].measured and "2 thread(s) 60" in rows[0].measured
    (roof,) = [r for r in rows if "FLOP roofline" in r.what]
    assert roof.met is False and roof.value == 2.01 and "20.10 ms vs 10.00 ms" in roof.measured
    (memory,) = [r for r in rows if "memory roofline" in r.what]
    assert memory.met is False and memory.value == 2.51 and memory.target == "<= 2.5x"
    assert "2.51 ms vs 1.00 ms: 12.6 MB of weights + 3.4 MB of filled cache at 16.0 GB/s" in (
        memory.measured
    )
    (compiled,) = [r for r in rows if "compilations" in r.what]
    assert compiled.met is True and compiled.measured == "none"
    assert all(r.source == "s.json" for r in rows)

    rows = bench_targets.targets({"s": _sampler({16: 2.0}, 2.0, compiles=1, memory=2.5)})
    met = [r.met for r in rows]
    assert met == [True, True, True, False]  # 2x >= 2x, 2x <= 2x, 2.5x <= 2.5x, a compile
    assert '"16": 1' in rows[-1].measured


def test_a_bf16_sampler_is_named_so_and_not_held_to_the_f32_memory_target():
    """Our side in bf16 (`rollout.dtype` or `model.dtype`: `ours.dtype`): the label says so,
    and its memory roofline row carries no target (the f32 figure is the one held to it)."""
    result = _sampler({16: 2.0}, 2.0, memory=9.0)
    result["ours"]["dtype"] = "bfloat16"
    rows = bench_targets.targets({"s.json": result})
    (memory,) = [r for r in rows if "memory roofline" in r.what]
    assert "random_qwen2:m bf16, 16 rows" in memory.what and memory.met is None


def test_train_memory_rl_rows():
    variant = dict(batch=2, seq=256, dtype="float32", mfu=0.699, mfu_best=0.71, achieved_gflops=70)
    train = dict(
        benchmark="train",
        device="TFRT_CPU_0",
        models={
            "100m": dict(peak_gflops=100, variants=dict(rl_plain=variant)),
            "25m": dict(peak_gflops=100, variants=dict(rl_plain=dict(variant, mfu=0.7))),
        },
    )
    memory = {
        "benchmark": "memory",
        "model": "100m",
        "devices": 8,
        "ratio_total": 7.19,
        "1_device": dict(total_bytes=719e6),
        "fsdp_8": dict(total_bytes=100e6),
    }
    trl = dict(
        torch_threads=1,
        ours_speedup=1.5,
        seconds_per_step=0.6,
        rollout_seconds=0.25,
        prompt_tokens=81.75,
        mean_completion_len=24.5,
    )  # 1.5x: met
    rl = dict(
        benchmark="rl",
        device="cuda:0",
        prompts=2,
        group_size=8,
        new_tokens=32,
        steps=10,
        warmup=2,
        ours=dict(
            seconds_per_step=0.4,
            rollout_seconds=0.125,
            prompt_tokens=81.75,  # no completion length: left out of the row
            compiles_in_timed_steps=2,
            warmup_seconds=[12.2, 0.6],
        ),
        trl={"checkpointing_off/threads_1": trl},
        trl_compared="checkpointing_off/threads_1",
    )
    rows = bench_targets.targets(
        {"all.json": dict(benchmark="all", train=train, memory=memory), "rl.json": rl}
    )
    by_what = _by_what(rows)
    mfu_100m = by_what["train-step MFU, 100m, rl_plain (B=2, T=256, float32)"]
    assert mfu_100m.met is False and mfu_100m.target == ">= 70%"  # 69.9%
    assert mfu_100m.machine == "CPU (model not recorded)"
    assert by_what["train-step MFU, 25m, rl_plain (B=2, T=256, float32)"].met is True
    (mem,) = [r for r in rows if "FSDP" in r.what]
    assert mem.met is False and mem.target.startswith(">= 7.2x")  # 7.19 < 0.9 * 8
    assert "719 MB -> 100 MB" in mem.measured
    gpu = [r for r in rows if r.source == "rl.json"]
    assert gpu[0].machine == "GPU cuda:0 (kind not recorded)" and gpu[0].met is True
    assert gpu[0].what.startswith("full GRPO step vs TRL `GRPOTrainer`, torch 1 thread(s)")
    assert gpu[0].measured == (  # each side's rollout and prompt tokens beside the step
        "**1.50x** (0.400 s vs 0.600 s per step; rollout 0.12 vs 0.25 s; prompts 81.8 vs "
        "81.8 tokens); the compared figure"
    )
    assert gpu[1].met is False and gpu[1].measured == "2"  # compiled in the timed steps
    assert gpu[2].met is None and gpu[2].value == 12.2 + 0.6 - 2 * 0.4


def test_memory_peak_rows():
    """The compiled update's per-device peak against 1/N of one device's + one layer."""
    memory = {
        "benchmark": "memory",
        "model": "100m",
        "devices": 8,
        "ratio_total": 7.99,
        "peak_bound_bytes": 342e6,
        "1_device": dict(total_bytes=1201e6, programs=dict(update=dict(peak=2537e6))),
        "fsdp_8": dict(total_bytes=150e6, programs=dict(update=dict(peak=379e6))),
        "fsdp_8_remat_full": dict(total_bytes=150e6, programs=dict(update=dict(peak=322e6))),
    }
    rows = bench_targets.targets({"m.json": memory})
    ratio, plain, remat = rows
    assert ratio.met is True
    assert plain.met is False and plain.target.startswith("<= 342 MB")
    assert "379 MB" in plain.measured and "6.69x" in plain.measured
    assert remat.met is True and "remat" in remat.what


def test_unknown_benchmark_and_missing_doc_block_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match=r"x.json: no targets for benchmark 'nope'"):
        bench_targets.targets({"x.json": dict(benchmark="nope")})
    doc = tmp_path / "perf.md"
    doc.write_text("# no block here\n")
    with pytest.raises(ValueError, match="perf.md: no block"):
        bench_targets.rewrite_doc(doc, "| t |\n", "cmd")


def test_rewrite_doc_replaces_only_the_block(tmp_path):
    doc = tmp_path / "perf.md"
    doc.write_text(f"before\n{bench_targets.DOC_BEGIN}\nold\n{bench_targets.DOC_END}\nafter\n")
    rows = bench_targets.targets({"s.json": _sampler({16: 4.0}, 1.5)})
    bench_targets.rewrite_doc(doc, bench_targets.markdown(rows), "python x.py s.json")
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text
    assert "python x.py s.json" in text and "3 of 3 targets met." in text


def test_docs_table_is_the_committed_jsons_table():
    """docs/performance.md shows what benchmarks/targets.py makes of the JSON files it names."""
    text = (ROOT / "docs" / "performance.md").read_text()
    block = re.search(
        re.escape(bench_targets.DOC_BEGIN)
        + r"\n\n    (.*?)\n\n(.*?)\n"
        + re.escape(bench_targets.DOC_END),
        text,
        re.S,
    )
    assert block, "docs/performance.md has no generated targets block"
    command, table = block.groups()
    files = shlex.split(command)[3:]  # python -m benchmarks.targets FILE...
    assert files, command
    import json

    rows = bench_targets.targets({f: json.loads((ROOT / f).read_text()) for f in files})
    assert table == bench_targets.markdown(rows), "re-run the command in the block (with --doc)"
