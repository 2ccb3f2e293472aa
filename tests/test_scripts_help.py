"""Every script answers --help: exit 0, its flags named, an example command line."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# script (and arguments before --help) -> the flags its help must name
FLAGS = {
    ("scripts/train.py",): ["--config=", "--workdir=", "--config.KEY=VALUE", "temperature=1.0"],
    ("scripts/evaluate.py",): ["--config", "--policy", "--reference", "--n", "--rerank", "--json"],
    ("scripts/campaign.py",): ["--config", "--root", "--launcher", "--campaign.KEY=VALUE"],
    ("scripts/sweep.py",): ["{run,collect}"],
    ("scripts/sweep.py", "run"): ["sweep", "--config", "--root", "--launcher", "--dry_run"],
    ("scripts/report.py",): ["--runs", "--out", "--data"],
    ("scripts/claims.py",): ["keys"],
    ("scripts/convert_hf.py",): ["--in", "--out", "--dtype", "--max-shard-size"],
    ("scripts/convert_gguf.py",): ["file", "out_dir", "--tokenizer", "--chat_template", "--eos"],
    ("scripts/fetch_model.py",): ["names", "--list", "--force", "smollm2-135m-instruct"],
    ("scripts/demo.py",): ["--workdir", "--sft_config", "--rl_config", "--seed", "--runlocal"],
    ("scripts/make_warm_starts.py",): ["--only"],
    ("scripts/mutants.py",): ["module", "tests", "--workers", "--timeout", "--kinds"],
    ("scripts/launch.py",): ["--processes", "--max_restarts", "--same_failure_limit", "--backoff"],
    ("benchmarks/bench.py",): ["sampler", "rl", "memory", "--config=FILE[:ARG]"],
    ("benchmarks/bench.py", "memory"): ["--model", "--mesh", "--programs", "--lora", "--compare"],
}


def test_every_script_answers_help_with_its_flags_and_an_example():
    scripts = {os.path.join("scripts", f) for f in os.listdir(os.path.join(REPO, "scripts"))}
    covered = {args[0] for args in FLAGS}
    assert {s for s in scripts if s.endswith(".py")} <= covered  # a new script gets a row
    env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
    procs = {  # all at once: most of the time is imports
        args: subprocess.Popen(
            [sys.executable, *args, "--help"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for args in FLAGS
    }
    for args, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, (args, out[-2000:])
        missing = [flag for flag in FLAGS[args] if flag not in out]
        assert not missing, (args, missing)
        assert f"python {args[0]}" in out, (args, "no example command line")
