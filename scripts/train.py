r"""Train from a config file: SFT or RL, resuming when the workdir holds a checkpoint.

    python scripts/train.py --config=configs/grpo_arith.py --workdir=runs/grpo_arith \
        --config.optimizer.lr=1e-5 --config.objective.weight=dppo

`--config=FILE:ARG` passes ARG to get_config (e.g. `:runlocal`). Every key is overridable
with `--config.section.key=value`; unknown keys and bad values are errors naming the key.
Ctrl-C or SIGTERM saves a checkpoint; the same command resumes (after a kill too: at most the
steps since the last checkpoint are lost, no log row; docs/reliability.md). `--help` lists
the config's key groups and their defaults.
"""

from jaxrl_frontier.run.cli import train_main

if __name__ == "__main__":
    train_main()
