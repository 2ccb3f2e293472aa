"""benchmarks/: each side of a peer comparison in its own process (the JAX timing process
never imports torch, the orchestrator neither framework), the comparison picks the faster
torch thread count, and every JSON names its machine."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import common, peers, sampler, targets

ROOT = Path(__file__).resolve().parents[2]

# A model small enough to compile in a few seconds (the config schema's keys, as a user
# overrides them).
TINY = [
    "--config.model.vocab_size=64",
    "--config.model.hidden_size=32",
    "--config.model.intermediate_size=64",
    "--config.model.num_layers=1",
    "--config.model.num_heads=2",
    "--config.model.num_kv_heads=1",
    "--config.data.max_prompt_len=4",
    "--config.rollout.max_new_tokens=3",
]


def test_jax_timing_process_never_imports_torch(tmp_path):
    request = dict(
        config_args=TINY,
        hf_dir=str(tmp_path / "hf"),
        prompts={"2": sampler.prompts(64, 2, 4)},
        repeats=1,
        roofline_batch=0,
        roofline_new_tokens=2,
        peak_n=64,
    )
    out = peers.run_child("benchmarks.sampler", request)
    assert out["foreign_modules"] == []  # no torch, transformers, trl, accelerate
    assert out["batches"]["2"]["compiles_in_timed_calls"] == 0
    assert out["batches"]["2"]["tokens_per_s"] > 0
    assert (tmp_path / "hf" / "config.json").is_file()  # the weights the torch side loads
    assert out["cpu_count"] >= 1 and "versions" in out and "load_average" in out
    quiet = out["quiet"]  # the busy share of the cores before and after this side ran
    assert 0.0 <= quiet["busy_share_before"] <= 1.0 and 0.0 <= quiet["busy_share_after"] <= 1.0
    assert len(quiet["load_average_before"]) == len(quiet["load_average_after"]) == 3


def test_orchestrator_imports_neither_framework():
    code = (
        "import sys; import benchmarks.bench; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'torch', 'flax'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_child_reports_the_other_sides_modules(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO('{"x": 2}'))
    for name in list(sys.modules):  # other tests in this process may have imported them
        if name.split(".")[0] in peers.TORCH_SIDE:
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", object())  # as if this JAX child had imported it
    peers.child_main(lambda request: dict(y=request["x"] * 3), peers.JAX_SIDE)
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result == dict(y=6, foreign_modules=["torch"])


def test_compare_takes_the_faster_thread_count():
    result = dict(
        ours=dict(batches={"16": dict(tokens_per_s=600.0, best_tokens_per_s=660.0)}),
        transformers={
            "threads_1": dict(batches={"16": dict(tokens_per_s=200.0, best_tokens_per_s=210.0)}),
            "threads_2": dict(batches={"16": dict(tokens_per_s=150.0, best_tokens_per_s=220.0)}),
        },
    )
    row = sampler.compare(result)["16"]
    assert row["transformers_best"] == "threads_1"
    assert row["speedup"] == 3.0  # 600 / 200, not / 150
    assert row["speedup_best"] == 3.0  # 660 / max(210, 220)
    runs = dict(a=dict(s=2.0), b=dict(s=1.0))
    assert peers.best_of(runs, "s", lower_is_better=True) == "b"


def test_a_peer_runs_at_each_thread_count_and_host_allocator(monkeypatch):
    """`thread_runs` with both `PAGES`: one child per (threads, pages), the machine's default
    pages asked for by `huge_pages=False` and named `/default_pages`; the comparison takes
    the fastest setting, whichever pages it ran with."""
    calls = []

    def fake_child(module, request, threads=None, huge_pages=True):
        calls.append((threads, huge_pages))
        tokens_per_s = 100.0 * threads + (0.0 if huge_pages else 50.0)
        return dict(torch_threads=threads, batches={"16": dict(tokens_per_s=tokens_per_s,
                    best_tokens_per_s=tokens_per_s)})  # fmt: skip

    monkeypatch.setattr(peers, "run_child", fake_child)
    runs = peers.thread_runs("benchmarks.peer_hf", {}, [1, 2], peers.PAGES)
    assert calls == [(1, True), (1, False), (2, True), (2, False)]
    assert list(runs) == ["threads_1", "threads_1/default_pages", "threads_2",
                          "threads_2/default_pages"]  # fmt: skip
    assert [r["pages"] for r in runs.values()] == ["huge", "default"] * 2
    result = dict(
        benchmark="sampler",
        ours=dict(
            batches={
                "16": dict(tokens_per_s=500.0, best_tokens_per_s=500.0, compiles_in_timed_calls=0)
            }
        ),
        transformers=runs,
    )
    result["rows"] = rows = sampler.compare(result)
    assert rows["16"]["transformers_best"] == "threads_2/default_pages"
    assert rows["16"]["speedup"] == 2.0  # 500 / 250
    row = targets.targets({"s.json": result})[0]
    assert row.measured.startswith(
        "**2.00x** (500 vs 250 tokens/s at torch 2 thread(s) (the machine's default pages); "
        "transformers: 1 thread(s) (huge pages) 100, 1 thread(s) (the machine's default pages)"
        " 150, 2 thread(s) (huge pages) 200, 2 thread(s) (the machine's default pages) 250;"
    )


def test_sampler_rounds_alternate_the_sides_and_take_the_median_of_each_rounds_ratio(
    monkeypatch,
):
    """bench.py sampler --rounds 3: ours, then transformers, in turn each round; the rooflines
    in the first round only. The speedup is the median of the rounds' own ratios (600 / 200,
    300 / 150, 450 / 300 -> 2.0), not the ratio of the medians (450 / 200 = 2.25)."""
    import argparse

    ours_tps, hf_tps, calls = iter([600.0, 300.0, 450.0]), iter([200.0, 150.0, 300.0]), []

    def batch(tps, **extra):
        return {"16": dict(tokens_per_s=tps, best_tokens_per_s=tps, seconds=1.0, **extra)}

    def fake_child(module, request, threads=None, huge_pages=True):
        if module == "benchmarks.sampler":
            calls.append(("ours", request["roofline_batch"], request["memory_roofline_batch"]))
            return dict(device="cpu:0", device_kind="cpu",
                        batches=batch(next(ours_tps), compiles_in_timed_calls=0))  # fmt: skip
        calls.append(("hf", threads))
        return dict(torch_threads=threads, batches=batch(next(hf_tps)))

    monkeypatch.setattr(peers, "run_child", fake_child)
    args = argparse.Namespace(
        config_args=TINY, batches=[16], repeats=1, rounds=3, torch_threads=[2], no_hf=False,
        hf_pages=["huge"], roofline_batch=4, roofline_new_tokens=2, memory_roofline_batch=4,
        peak_n=8,
    )  # fmt: skip
    out = sampler.bench_sampler(args)
    assert calls == [("ours", 4, 4), ("hf", 2)] + [("ours", 0, 0), ("hf", 2)] * 2
    row = out["rows"]["16"]
    assert row["speedup"] == 2.0 and row["speedup_per_round"] == [3.0, 2.0, 1.5]
    assert row["ours_tokens_per_s"] == 450.0 and row["transformers_tokens_per_s"] == {
        "threads_2": 200.0
    }
    assert row["speedup_best"] == 600.0 / 300.0  # the best call of any round on each side
    assert len(out["ours"]["rounds"]) == len(out["transformers"]["threads_2"]["rounds"]) == 3
    measured = targets.targets({"s.json": dict(benchmark="sampler", **out)})[0].measured
    assert measured.startswith("**2.00x** (450 vs 200 tokens/s")
    assert measured.endswith("best over best 2.00x; the median of 3 rounds' ratios)")


def test_config_args_are_read_as_training_reads_them():
    config_args, rest = common.split_config_args(["--repeats", "2", *TINY[:2], "--no-hf"])
    assert config_args == TINY[:2] and rest == ["--repeats", "2", "--no-hf"]
    config = common.load_config(config_args, sampler.DEFAULT_CONFIG)
    assert config.model.vocab_size == 64 and config.model.hidden_size == 32
    assert config.model.qkv_bias  # the rest from benchmarks/configs/random_qwen2.py:tiny


def test_a_checkpoint_is_named_by_its_weights_sha256(tmp_path):
    import hashlib

    from benchmarks import train

    hf_config = dict(  # a Llama-shaped config.json, as a Hugging Face directory has it
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    )
    (tmp_path / "config.json").write_text(json.dumps(hf_config))
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    args = ["--config.model.init=hf", f"--config.model.path={tmp_path}"]
    ckpt = common.checkpoint(common.load_config(args, sampler.DEFAULT_CONFIG))
    assert ckpt["dir"] == str(tmp_path) and ckpt["config"]["vocab_size"] == 64
    assert ckpt["sha256"] == {"model.safetensors": hashlib.sha256(b"weights").hexdigest()}
    assert common.checkpoint(common.load_config([], sampler.DEFAULT_CONFIG)) is None  # random
    cfg = train.model_config(str(tmp_path))  # the train benchmark at the checkpoint's shape
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_kv_heads, cfg.vocab_size) == (2, 32, 2, 64)
    with pytest.raises(SystemExit, match="no config.json"):
        common.checkpoint_of(str(tmp_path / "missing"))


def test_both_rl_sides_start_from_the_same_prompt_tokens():
    """A checkpoint's rl benchmark: the prompts the TRL child trains on tokenize, as TRL
    tokenizes plain text, to the tokens our run's prompts are, one chat template each."""
    import transformers

    from benchmarks import peer_trl, rl
    from jaxrl_frontier.models import pretrained
    from jaxrl_frontier.run import build

    pretrained.fetch("smollm2-135m-instruct", say=lambda _: None)
    config = common.load_config(["--config=configs/smollm2_reasoning.py"], rl.DEFAULT_CONFIG)
    task = rl.task_prompts(config, 3)
    hf = transformers.AutoTokenizer.from_pretrained(pretrained.local_path(config.model.path))
    ours = [build.build_tokenizer(config).encode(t) for t in task["texts"]]
    theirs = [
        hf(t, add_special_tokens=False)["input_ids"] for t in peer_trl.checkpoint_prompts(task, 5)
    ]
    assert [len(ids) for ids in ours] == task["tokens"]
    assert theirs == ours + ours[:2]
    assert all(t.count("<|im_start|>system") == 1 for t in task["texts"])


def test_targets_table_names_each_rows_machine():
    cpu = dict(cpu_model="AMD EPYC", cpu_count=2, vector_extensions=["AVX2"], device="cpu:0")
    assert targets.machine_of(cpu) == "AMD EPYC, 2 cores, AVX2"
    assert targets.machine_of(dict(device="cpu:0")) == "CPU (model not recorded)"
    assert targets.machine_of(dict(device="cuda:0", device_kind="NVIDIA H200")) == "NVIDIA H200"
    rl = dict(
        benchmark="rl",
        **cpu,
        prompts=2,
        group_size=8,
        new_tokens=32,
        steps=10,
        ours=dict(
            seconds_per_step=0.1,
            rollout_fraction=0.5,
            compiles_in_timed_steps=0,
            warmup_seconds=[2.1, 0.1],
        ),
        trl={
            "checkpointing_off/threads_1": dict(
                torch_threads=1,
                gradient_checkpointing=False,
                seconds_per_step=0.25,
                ours_speedup=2.5,
            ),
            "checkpointing_default/threads_1": dict(
                torch_threads=1,
                gradient_checkpointing=True,
                seconds_per_step=0.3,
                ours_speedup=3.0,
                gradient_checkpointing_setting="default",
            ),
        },
        trl_compared="checkpointing_off/threads_1",
    )
    rows = targets.targets({"rl.json": rl})
    assert all(r.machine == "AMD EPYC, 2 cores, AVX2" for r in rows)
    compared = [r for r in rows if r.met is not None and "TRL" in r.what]
    assert len(compared) == 1 and "checkpointing off" in compared[0].what
    assert compared[0].value == 2.5 and compared[0].met is True
    default = [r for r in rows if "TRL's default" in r.what]
    assert default[0].met is None  # reported beside, not compared
    table = targets.markdown(rows)
    assert table.startswith("| machine | what |") and "| AMD EPYC, 2 cores, AVX2 |" in table


def test_the_rl_benchmark_config_also_trains_through_the_trainer(tmp_path):
    """benchmarks/configs/grpo_random_qwen2.py runs as scripts/train.py runs it: loaded by
    path, with the char tokenizer and the model's 512 rows (more than its alphabet)."""
    import importlib.util

    from jaxrl_frontier.run import trainer

    path = ROOT / "benchmarks" / "configs" / "grpo_random_qwen2.py"
    spec = importlib.util.spec_from_file_location("grpo_random_qwen2_cfg", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config()
    assert c.model.vocab_size == 512
    c.rollout.max_new_tokens = 8
    c.train.update(steps=1, eval_every=10**6, checkpoint_every=10**6, log_every=1)
    summary = trainer.train(c, str(tmp_path))
    assert summary["step"] == 1 and not summary["stopped"]


def test_busy_share_is_the_other_work_over_the_window():
    samples = iter([(100.0, 1000.0), (130.0, 1100.0)])  # 30 of 100 jiffies busy
    slept = []
    share = peers.busy_share(2.0, times=lambda: next(samples), sleep=slept.append)
    assert share == pytest.approx(0.3) and slept == [2.0]


def test_a_busy_machine_is_waited_for_then_refused():
    shares, now = iter([0.5, 0.4, 0.05]), iter([0.0, 1.0, 2.0, 3.0])
    clock = lambda: next(now)
    assert (
        peers.wait_for_quiet(share=lambda: next(shares), limit=0.1, wait_s=10, clock=clock) == 0.05
    )
    now = iter([0.0, 5.0, 11.0])
    with pytest.raises(peers.NotQuiet, match=r"50% of the cores busy \(the bar is 10%\)"):
        peers.wait_for_quiet(share=lambda: 0.5, limit=0.1, wait_s=10, clock=lambda: next(now))


def test_async_spread_targets_by_hand():
    """bench.py async --workload spread: continuous over static on the rollout's useful
    tokens/s and the step's, and k = 1's step over max(static rollout, static update), where
    a static step is its rollout plus the rest (0.25 s + 0.75 s)."""
    from benchmarks.async_rl import ROUND_KEYS, _spread_targets

    static = dict(
        seconds_per_step=1.0, rollout_seconds=0.25, useful_tokens_per_second=100.0,
        rollout_useful_tokens_per_second=400.0,
    )  # fmt: skip
    continuous = dict(
        static, useful_tokens_per_second=120.0, rollout_useful_tokens_per_second=640.0
    )
    t = _spread_targets(dict(static=static, continuous=continuous, k1=dict(seconds_per_step=0.8)))
    assert t["continuous_vs_static_rollout_useful_tokens_per_second"] == dict(
        ratio=1.6, target=1.5, met=True
    )
    assert t["continuous_vs_static_useful_tokens_per_second"]["met"] is False
    k1 = t["k1_step_vs_max_rollout_update"]
    assert k1["ratio"] == pytest.approx(0.8 / 0.75) and k1["met"] is True
    rounds = [dict(static, seconds_per_step=s, finished_slot_step_share=0.5) for s in (1, 3, 2)]
    assert common.median_of_rounds(rounds, ROUND_KEYS)["seconds_per_step"] == 2


def test_rl_rounds_alternate_the_sides_and_take_the_median_of_each_rounds_ratio(monkeypatch):
    """bench.py rl --rounds 3: ours, then TRL at each setting, in turn each round. A TRL
    setting's ratio is the median of the rounds' own ratios (TRL with checkpointing off:
    3 s / 1 s, 4.5 s / 3 s, 5 s / 2 s -> 2.5), not the ratio of the medians (4.5 s / 2 s =
    2.25), and each side's seconds are the median of its rounds'."""
    import argparse

    from benchmarks import rl

    ours_s = iter([1.0, 3.0, 2.0])
    trl_s = dict(off=iter([3.0, 4.5, 5.0]), default=iter([4.0, 6.0, 6.0]))
    calls = []

    def fake_child(module, request, threads=None, huge_pages=True):
        if module == "benchmarks.rl":
            calls.append("ours")
            return dict(common.machine_info(jax_device=False), device="cpu:0",
                        device_kind="cpu", seconds_per_step=next(ours_s),
                        rollout_seconds=0.5, rollout_fraction=0.5, task_prompts=None)  # fmt: skip
        assert request["task_prompts"] is None and threads == 1
        calls.append(request["gradient_checkpointing"] + ("" if huge_pages else "/default"))
        if not huge_pages:  # TRL with the machine's pages: slower in every round here
            return dict(torch_threads=1, seconds_per_step=10.0)
        return dict(torch_threads=1, seconds_per_step=next(trl_s[calls[-1]]))

    monkeypatch.setattr(peers, "run_child", fake_child)
    args = argparse.Namespace(
        config_args=TINY, steps=1, warmup=1, rounds=3, torch_threads=[1], no_trl=False,
        trl_checkpointing=["off", "default"], trl_pages=["huge", "default"], completions="eos",
    )  # fmt: skip
    out = rl.bench_rl(args)
    assert calls == ["ours", "off", "off/default", "default", "default/default"] * 3
    slow = out["trl"]["checkpointing_off/threads_1/default_pages"]
    assert slow["pages"] == "default" and slow["seconds_per_step"] == 10.0
    off, default = (
        out["trl"]["checkpointing_off/threads_1"],
        out["trl"]["checkpointing_default/threads_1"],
    )
    assert off["ours_speedup"] == 2.5 and off["seconds_per_step"] == 4.5
    assert default["ours_speedup"] == 3.0  # 4 / 1, 6 / 3, 6 / 2
    assert out["ours"]["seconds_per_step"] == 2.0 and len(out["ours"]["rounds"]) == 3
    assert out["trl_compared"] == "checkpointing_off/threads_1"
    assert "task_prompts" not in out["ours"] and out["rounds"] == 3
    rows = targets.targets({"rl.json": dict(benchmark="rl", **out)})
    (row,) = [r for r in rows if r.met is not None]  # the compared setting's
    assert row.value == 2.5 and row.measured.startswith("**2.50x** (2.000 s vs 4.500 s")
    assert row.measured.endswith("; the median of 3 rounds' ratios; the compared figure")


def test_rl_full_completions_run_every_completion_to_the_budget_on_both_sides(monkeypatch):
    """bench.py rl --completions full: ours trains with rollout.ignore_eos, TRL generates with
    min_new_tokens = max_new_tokens (the same tokens on both sides); eos asks neither."""
    import argparse

    from benchmarks import rl

    requests = {}

    def fake_child(module, request, threads=None, huge_pages=True):
        requests[module] = request
        if module == "benchmarks.rl":
            return dict(common.machine_info(jax_device=False), device="cpu:0",
                        device_kind="cpu", seconds_per_step=1.0, rollout_seconds=0.5,
                        rollout_fraction=0.5, task_prompts=None)  # fmt: skip
        return dict(torch_threads=1, seconds_per_step=2.0)

    monkeypatch.setattr(peers, "run_child", fake_child)
    for completions in ("full", "eos"):
        args = argparse.Namespace(
            config_args=TINY, steps=1, warmup=1, rounds=1, torch_threads=[1], no_trl=False,
            trl_checkpointing=["off"], trl_pages=["huge"], completions=completions,
        )  # fmt: skip
        out = rl.bench_rl(args)
        ours, trl = requests["benchmarks.rl"], requests["benchmarks.peer_trl"]
        full = completions == "full"
        assert ("--config.rollout.ignore_eos=True" in ours["config_args"]) is full
        assert trl.get("min_new_tokens") == (out["new_tokens"] if full else None)
        assert out["completions"] == completions and args.config_args == TINY
        (row,) = targets.targets({"rl.json": dict(benchmark="rl", **out)})
        assert row.what.endswith("(every completion run to the budget on both sides)") is full
