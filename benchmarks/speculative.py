"""Speculative rollouts against plain ones: seconds per rollout batch, as the trainer runs it.

    python benchmarks/bench.py speculative --config=benchmarks/configs/grpo_random_qwen2.py \\
        --config.rollout.speculative.draft=1 --config.rollout.speculative.k=4

Both variants are the config's run, built by `Trainer` (the random model saved as a Hugging
Face directory first, as in the rl benchmark), one with `rollout.speculative` as the config
sets it and one with it off (`rollout.speculative.draft` None); each times `Trainer.rollout` on the same prompts
(rollout, rewards, advantages) for `--repeats` calls after one warm-up call (compiles). The
draft and `k` are the config's: see the `rollout.speculative` key in
jaxrl_frontier/run/config.py. Random weights are not a trained pair: the acceptance says little
about a real policy and draft; the cost at a given acceptance is what this measures.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time

from benchmarks import common, rl

DEFAULT_CONFIG = rl.DEFAULT_CONFIG


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=5, help="timed rollout batches per variant")


def _time_rollouts(config, repeats: int) -> dict:
    import jax

    from jaxrl_frontier.run.trainer import Trainer

    with tempfile.TemporaryDirectory() as workdir:
        trainer = Trainer(config, workdir)
        examples = [trainer.task.example("train", i) for i in range(config.data.prompt_batch)]
        times, infos = [], []
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            exp, info = trainer.step.rollout(examples, jax.random.key(i))
            jax.block_until_ready(exp)
            times.append(time.perf_counter() - t0)
            infos.append({k: v for k, v in info.items() if isinstance(v, int | float)})
    seconds = statistics.median(times[1:])
    return dict(seconds=seconds, compile_s=times[0] - seconds, times=times[1:], info=infos[-1])


def bench_speculative(args) -> dict:
    """Speculative vs plain rollouts (the config's `rollout.speculative`): seconds per batch."""
    from benchmarks import sampler
    from jaxrl_frontier.models import hf

    config_args = getattr(args, "config_args", [])
    config = common.load_config(config_args, DEFAULT_CONFIG)
    if "speculative" not in config.rollout or config.rollout.speculative.get("draft") is None:
        raise SystemExit(
            "speculative: set the config key rollout.speculative.draft (the policy's first N "
            "layers as the draft), e.g. --config.rollout.speculative.draft=1; this config has none"
        )
    result = dict(
        **common.machine_info(),
        config_args=config_args,
        speculative=common.config_text(config.rollout.speculative),
        rows=config.data.prompt_batch * config.rollout.group_size,
        new_tokens=config.rollout.max_new_tokens,
    )
    with tempfile.TemporaryDirectory() as model_dir:
        rl.save_tokenizer(model_dir, config.model.vocab_size)
        hf.save(sampler.build_model(config), model_dir, dtype="float32")
        config.model.update(init="hf", path=model_dir)
        config.tokenizer.update(kind="hf", path=model_dir)
        plain = copy.deepcopy(config)
        plain.rollout.speculative.draft = None
        result["plain"] = _time_rollouts(plain, args.repeats)
        result["speculative_rollout"] = _time_rollouts(config, args.repeats)
    result["speedup"] = result["plain"]["seconds"] / result["speculative_rollout"]["seconds"]
    return result
