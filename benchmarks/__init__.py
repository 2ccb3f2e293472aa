"""Speed benchmarks of jaxrl_frontier against its peers and the machine's limits (tooling,
not part of the installed package): `python -m benchmarks.bench <name> [--config=...]`, or
`python benchmarks/bench.py <name> ...` from a checkout. docs/performance.md describes each.
"""
