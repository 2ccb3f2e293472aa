"""Config sweeps: sweep files (spec), launchers (launch) and the results table (collect).

scripts/sweep.py is the command line; docs/results.md the report built from sweeps/.
"""

from jaxrl_frontier.core.errors import SweepError
from jaxrl_frontier.sweeps.spec import (
    CONFIG_KEY,
    SEED_KEY,
    grid,
    group_key,
    load_sweep,
    product,
    run_name,
    seeds,
    zip_,
)

__all__ = [
    "CONFIG_KEY",
    "SEED_KEY",
    "SweepError",
    "grid",
    "group_key",
    "load_sweep",
    "product",
    "run_name",
    "seeds",
    "zip_",
]
