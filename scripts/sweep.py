r"""Run a config sweep, on this machine or a slurm cluster, and collect its results.

    python scripts/sweep.py run sweeps/claim_a.py [--config=configs/grpo_arith.py:runlocal] \
        [--root=runs/sweeps/claim_a] [--launcher=local --parallel=1 | --launcher=slurm ...]
    python scripts/sweep.py collect runs/sweeps/claim_a

A sweep file defines get_sweep() -> list of override dicts (jaxrl_frontier.sweeps: grid,
zip_, product, seeds); each dict is one `scripts/train.py` run in ROOT/<name from its
overrides>. The same command again skips finished runs (sweep_done.json in the workdir)
and resumes killed ones from their checkpoints. `collect` writes ROOT/sweep_runs.csv (one
row per run), ROOT/sweep_table.csv (mean and std over seeds per group of runs that differ
only in the seed) and ROOT/sweep_results.json (both, with the curves).

Launchers: `local` runs one after another (--parallel=1), N at once (--parallel=N, each
pinned to its share of the cores) or as many as the cores allow at --cores_per_run each
(--parallel=0). `slurm` submits one submitit array job, one run per task (--partition,
--timeout_min, --cpus_per_task, --gpus_per_node, --array_parallelism; --cluster=local runs
the tasks as local processes through the same path; --no_wait returns after submitting).
Exit status 1 when a run failed.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl_frontier.core.errors import SweepError  # noqa: E402
from jaxrl_frontier.sweeps import populations  # noqa: E402
from jaxrl_frontier.sweeps.collect import RESULTS_JSON, TABLE_CSV, collect  # noqa: E402
from jaxrl_frontier.sweeps.launch import LAUNCHERS, plan  # noqa: E402
from jaxrl_frontier.sweeps.spec import sweep_name  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="launch the runs of a sweep file",
        description="Launch the runs of a sweep file, e.g.\n  python scripts/sweep.py run "
        "sweeps/claim_a.py --config=configs/grpo_arith.py:runlocal --parallel=2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "sweep", help="a sweep file (get_sweep() -> list of override dicts), or FILE:STAGE"
    )
    run.add_argument("--config", default=None, help="FILE.py[:ARG] for runs without 'config'")
    run.add_argument("--root", default=None, help="default: runs/sweeps/<sweep file name>")
    run.add_argument("--launcher", default="local", choices=LAUNCHERS.names())
    run.add_argument("--parallel", type=int, default=1, help="local: runs at once (0: auto)")
    run.add_argument("--cores_per_run", type=int, default=2, help="local --parallel=0 sizing")
    run.add_argument("--dry_run", action="store_true", help="print the runs, start none")
    run.add_argument(
        "--population",
        type=int,
        default=0,
        help="pack runs differing only in the seed and traced float keys into populations "
        "of up to N members, one job each (docs/population.md); 0: one job per run",
    )
    run.add_argument(
        "--same_prompts", action="store_true", help="--population: members share prompts"
    )
    run.add_argument("--cluster", default=None, help="slurm: None (detect), local or debug")
    run.add_argument("--partition", default=None)
    run.add_argument("--timeout_min", type=int, default=240)
    run.add_argument("--cpus_per_task", type=int, default=8)
    run.add_argument("--gpus_per_node", type=int, default=0)
    run.add_argument("--array_parallelism", type=int, default=64)
    run.add_argument("--no_wait", action="store_true", help="slurm: return after submitting")
    col = sub.add_parser(
        "collect",
        help="gather a sweep's runs into CSV and JSON tables",
        description="Gather a sweep's runs into CSV and JSON tables, e.g.\n"
        "  python scripts/sweep.py collect runs/sweeps/claim_a",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    col.add_argument("root", help="the sweep's directory (its --root)")
    return p.parse_args(argv)


def slurm_params(args: argparse.Namespace) -> dict:
    params = dict(
        timeout_min=args.timeout_min,
        cpus_per_task=args.cpus_per_task,
        slurm_array_parallelism=args.array_parallelism,
        name="jaxrl_sweep",
    )
    if args.gpus_per_node:
        params["gpus_per_node"] = args.gpus_per_node
    if args.partition:
        params["slurm_partition"] = args.partition
    return params


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.command == "collect":
        try:
            out = collect(args.root)
        except FileNotFoundError as e:
            raise SystemExit(f"error: {e}") from None
        print(
            f"[collect] {len(out['runs'])} runs in {len(out['groups'])} groups -> "
            f"{os.path.join(args.root, TABLE_CSV)}, {os.path.join(args.root, RESULTS_JSON)}"
        )
        return 0
    root = args.root or os.path.join(REPO, "runs", "sweeps", sweep_name(args.sweep))
    try:
        runs = populations.pack(plan(args.sweep, args.config, root), args.population,
                                same_prompts=args.same_prompts)  # fmt: skip
    except (SweepError, ValueError) as e:
        raise SystemExit(f"sweep error: {e}") from None
    if args.dry_run:
        for i, r in enumerate(runs):
            state = "finished" if r.done else "to run"
            print(
                f"[sweep] run {i + 1}/{len(runs)} {r.name} ({state}): train.py {' '.join(r.train_args())}"
            )
        return 0
    launcher = LAUNCHERS.get(args.launcher)
    results = launcher(
        runs,
        parallel=args.parallel,
        cores_per_run=args.cores_per_run,
        folder=os.path.join(root, "submitit"),
        cluster=args.cluster,
        wait=not args.no_wait,
        params=slurm_params(args),
    )
    failed = [r for r in results if r["status"] == "failed"]
    counts = {s: sum(r["status"] == s for r in results) for s in ("done", "skipped", "failed")}
    print(f"[sweep] {root}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
