"""The main job: SFT warm start of a tiny model on 3-digit addition, then GRPO.

    python scripts/demo.py [--workdir runs/demo] [--rl_config configs/grpo_arith.py] [--seed 0]

Prints held-out greedy pass@1 after SFT (the RL start) and after RL, and writes
<workdir>/summary.json. Both stages resume if interrupted: run the same command again.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import time

from jaxrl_frontier.core import host_memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(path: str, arg: str | None = None):
    spec = importlib.util.spec_from_file_location("experiment_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workdir", default=os.path.join(ROOT, "runs", "demo"), help="sft/, rl/, summary.json"
    )
    parser.add_argument(
        "--sft_config",
        default=os.path.join(ROOT, "configs", "sft_arith.py"),
        help="the SFT stage's config file",
    )
    parser.add_argument(
        "--rl_config",
        default=os.path.join(ROOT, "configs", "grpo_arith.py"),
        help="the RL stage's config file (from the SFT policy)",
    )
    parser.add_argument("--seed", type=int, default=0, help="config key seed of both stages")
    parser.add_argument("--runlocal", action="store_true", help="seconds-long smoke run")
    args = parser.parse_args()
    host_memory.restart_with_huge_pages()  # huge pages for XLA:CPU's buffers (no jax yet)
    import jax  # after parsing: --help needs no jax

    from jaxrl_frontier.run import trainer

    logging.basicConfig(level=logging.WARNING)
    arg = "runlocal" if args.runlocal else None
    print(f"jaxrl_frontier demo on {jax.device_count()} {jax.devices()[0].platform} device(s)")

    t0 = time.time()
    sft_dir = os.path.join(args.workdir, "sft")
    print(f"\n== 1/2 SFT warm start ({args.sft_config}) -> {sft_dir}")
    sft_cfg = load_config(args.sft_config, arg)
    sft_cfg.seed = args.seed
    trainer.train(sft_cfg, sft_dir)
    t_sft = time.time() - t0

    rl_cfg = load_config(args.rl_config, arg)
    rl_cfg.seed = args.seed
    rl_cfg.model.init = "checkpoint"
    rl_cfg.model.path = sft_dir
    rl_dir = os.path.join(args.workdir, "rl")
    print(f"\n== 2/2 RL ({args.rl_config}) from the SFT policy -> {rl_dir}")
    rl = trainer.train(rl_cfg, rl_dir)
    t_rl = time.time() - t0 - t_sft

    evals = rl["history"]["eval"]
    before, after = evals[0], evals[-1]
    key = "eval/pass@1_greedy"
    summary = {
        "pass@1_greedy_after_sft": before[key],
        "pass@1_greedy_after_rl": after[key],
        "gain_points": 100 * (after[key] - before[key]),
        "seed": args.seed,
        "rl_steps": rl["step"],
        "sft_seconds": round(t_sft, 1),
        "rl_seconds": round(t_rl, 1),
        "evals": evals,
    }
    with open(os.path.join(args.workdir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(
        f"\nheld-out greedy pass@1: {before[key]:.1%} after SFT -> {after[key]:.1%} after RL "
        f"({summary['gain_points']:+.1f} points; SFT {t_sft:.0f}s, RL {t_rl:.0f}s)"
    )


if __name__ == "__main__":
    main()
