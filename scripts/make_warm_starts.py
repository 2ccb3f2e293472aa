"""Build the tiny SFT policies the `runlocal` variants of the RL configs start from.

    python scripts/make_warm_starts.py [--only arith1,code,frozenlake]

A policy at random init solves nothing, so every group's rewards are equal, every advantage
is 0 and a seconds-long RL run would test wiring, not training. Each warm start here is the
runlocal-size model (2 layers, d=32, char tokenizer) after a short SFT on its task, far from
solved, so that sampled groups at temperature 1 disagree: advantages, gradients and updates
are not 0. The exports (config.json, model.safetensors, tokenizer; about 100 KB each) are
committed under data/warm_starts/<name>/; `presets.shrink` points the RL configs at them.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jaxrl_frontier.run import trainer  # noqa: E402
from jaxrl_frontier.run.config import presets  # noqa: E402


def arith1():
    c = presets.arithmetic("sft")
    c.task.kwargs = dict(presets.RUNLOCAL_ARITH_TASK)
    c.data.max_prompt_len = 5
    c.rollout.max_new_tokens = 3
    c.train.update(steps=250, sft_batch=64)
    return c


def code():
    c = presets.code("sft")
    c.train.update(steps=150, sft_batch=32)  # part of the way: some problems right, not all
    return c


def countdown():
    c = presets.arithmetic("sft")
    c.task.name, c.task.kwargs = "countdown", dict()
    c.data.max_prompt_len = 32
    c.rollout.max_new_tokens = 24
    c.train.update(steps=200, sft_batch=64)
    return c


def frozenlake():
    c = presets.frozenlake("sft")
    # a mover of down and right only: on the corners board (start top-left, goal bottom-right)
    # about half its episodes reach the goal, so groups of episodes disagree
    c.env.demonstrations = ("down", "right")
    c.train.update(steps=60, sft_batch=64)
    return c


def calculator():
    """The calculator runlocal's problems (numbers up to 2): a policy that answers at once
    with one of the commonest answers, each cloned equally often (right on about 1 in 4)."""
    spec = importlib.util.spec_from_file_location(
        "grpo_calculator_tool", os.path.join(ROOT, "configs", "grpo_calculator_tool.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config()
    c.mode = "sft"
    c.env.kwargs = dict(c.env.kwargs, **presets.RUNLOCAL_CALCULATOR_ENV)
    answer = c.env.kwargs["syntax"]["answer_open"], c.env.kwargs["syntax"]["answer_close"]
    c.env.demonstrations = tuple(
        f"{answer[0]}{n}{answer[1]}" for n in presets.CALCULATOR_WARM_ANSWERS
    )
    c.train.update(steps=100, sft_batch=32)
    return c


def math():
    """The qwen_math runlocal's task: the sample JSONL's worked solutions, char tokenizer."""
    c = presets.arithmetic("sft")
    c.task.name, c.task.kwargs = "jsonl_math", dict(path="data/sample_math.jsonl")
    c.data.max_prompt_len = 160
    c.rollout.max_new_tokens = 64
    c.train.update(steps=300, sft_batch=32)
    return c


WARM_STARTS = {
    "arith1": arith1,
    "calculator": calculator,
    "code": code,
    "countdown": countdown,
    "frozenlake": frozenlake,
    "math": math,
}


def build(name: str) -> str:
    c = WARM_STARTS[name]()
    c.model.update(hidden_size=32, intermediate_size=64)  # the runlocal model (presets.shrink)
    c.optimizer.update(lr=3e-3, warmup_steps=10, schedule="constant")
    c.train.update(log_every=50, eval_every=10**6, checkpoint_every=10**6, stop_at_pass1=0.0)
    c.eval.update(num_prompts=8, batch=8, pass_k=1, at_start=False)
    c.mesh.num_devices = 1
    c = presets.with_defaults(c)
    out = os.path.join(ROOT, presets.WARM_STARTS_DIR, name)
    with tempfile.TemporaryDirectory() as workdir:
        summary = trainer.train(c, workdir)
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(os.path.join(workdir, "export"), out)
    print(f"{name}: {summary} -> {out}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only", default=",".join(WARM_STARTS), help="comma-separated names (default: all)"
    )
    for name in parser.parse_args().only.split(","):
        build(name)


if __name__ == "__main__":
    main()
