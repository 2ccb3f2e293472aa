"""Command-line entry points (thin: parse flags, call the library)."""

from __future__ import annotations

import json
import logging
import re
import sys


def train_main(argv: list[str] | None = None) -> None:
    """`scripts/train.py` / `jaxrl-train`: --config=FILE[:ARG] --workdir=DIR [--config.k=v ...]."""
    from absl import flags
    from ml_collections import config_flags

    flags_ = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config",
        None,
        "Experiment config file (get_config).",
        lock_config=False,
        flag_values=flags_,
    )
    flags.DEFINE_string("workdir", None, "Run directory (checkpoints, logs).", flag_values=flags_)
    argv = list(sys.argv if argv is None else argv)
    try:
        flags_(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
        # ml_collections rejects an override of a key the config lacks (a typo) or of the
        # wrong type with a bare traceback; name the --config.* key instead.
        raise SystemExit(f"config error: {_override_error(argv, e)}") from None
    if flags_.config is None or not flags_.workdir:
        raise SystemExit("usage: train.py --config=configs/FILE.py[:ARG] --workdir=DIR")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "orbax", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from jaxrl_frontier import distributed

    try:  # once, before anything touches a device (docs/distributed.md)
        distributed.initialize(flags_.config)
    except ValueError as e:
        raise SystemExit(f"config error: {e}") from None

    from jaxrl_frontier import trainer
    from jaxrl_frontier.config import ConfigError

    try:
        summary = trainer.train(flags_.config, flags_.workdir)
    except ConfigError as e:
        raise SystemExit(f"config error: {e}") from None
    last = summary["history"]["eval"][-1] if summary["history"]["eval"] else {}
    print(json.dumps({"step": summary["step"], "stopped": summary["stopped"], **last}))


def _override_error(argv: list[str], err: Exception) -> str:
    """Which `--config.KEY=V` override `err` is about (matched on the key's last part)."""
    text = str(err).replace("\\'", "'")
    for arg in argv:
        if arg.startswith("--config."):
            key = arg[len("--config.") :].split("=", 1)[0]
            if re.search(rf"\b{re.escape(key.rsplit('.', 1)[-1])}\b", text):
                return f"bad override {arg!r}: config key {key!r}: {text}"
    return text
