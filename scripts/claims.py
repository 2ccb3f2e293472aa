"""The claims of docs/results.md: what each tests, the sweeps that redo it, its verdict rule.

    python scripts/claims.py            # every claim: its statement, sweeps and commands
    python scripts/claims.py a e        # claims (a) and (e) only

Each claim is one file, sweeps/claim_<key>.py: its sweep (`get_sweep`) and its analysis
(`CLAIM`: the statement, the task and the rule that turns the collected runs into a
verdict; jaxrl_frontier.sweeps.claims holds what they share). This script lists them;
scripts/report.py renders their findings.
"""

from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from jaxrl_frontier.sweeps.claims import (  # noqa: E402  (the repository root on the path first)
    MIN_SEEDS,
    Claim,
    Finding,
    describe,
    load_claims,
)

CLAIMS: dict[str, Claim] = load_claims(os.path.join(REPO, "sweeps"))
# The curves the analyses read: what scripts/report.py keeps of each run in the committed
# trimmed results (docs/results/data).
SERIES_USED = frozenset().union(*(c.series for c in CLAIMS.values()))

__all__ = ["CLAIMS", "MIN_SEEDS", "SERIES_USED", "Claim", "Finding"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("keys", nargs="*", help=f"claims to show (default: all of {', '.join(CLAIMS)})")
    args = p.parse_args(argv)
    unknown = [k for k in args.keys if k not in CLAIMS]
    if unknown:
        p.error(f"unknown claim {', '.join(unknown)}; known: {', '.join(CLAIMS)}")
    print("\n\n".join(describe(CLAIMS[k]) for k in args.keys or CLAIMS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
