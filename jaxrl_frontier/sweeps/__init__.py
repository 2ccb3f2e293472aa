"""Config sweeps: sweep files (spec), launchers (launch) and the results table (collect);
the results claims' records, statistics and loader (claims: one file per claim in
sweeps/); campaigns, runs cut into segments a policy chains (campaign, campaign_tree,
campaign_policies).

scripts/sweep.py and scripts/campaign.py are the command lines; docs/results.md the report
built from sweeps/, docs/methods.md ("Campaigns") the campaigns' page.
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
