r"""Train with restarts that need nobody: N local processes (a multi-process job on
127.0.0.1, as the tests start them), started again from the last checkpoint when the job
fails, with a restart budget and a back-off.

    python scripts/launch.py --processes=2 [--max_restarts=5] [--same_failure_limit=3] \
        [--backoff=10] -- --config=configs/grpo_arith.py:runlocal --workdir=runs/mh

Everything after `--` goes to scripts/train.py (every process gets the same arguments, plus
the `--config.distributed.*` flags when --processes > 1). A job that fails the same way
--same_failure_limit times in a row (same exit status, same last line) stops with the reason;
SIGTERM / SIGINT go to every process (they save one agreed step and exit 0) and end the launch.
Exit status: the failed process's, 0 after success (docs/reliability.md).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl_frontier.sweeps.supervise import Job, RestartPolicy, supervise  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("usage: launch.py [options] -- TRAIN_ARGS (see --help)")
    cut = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--processes", type=int, default=1, help="local processes of the job")
    p.add_argument("--max_restarts", type=int, default=5)
    p.add_argument("--same_failure_limit", type=int, default=3)
    p.add_argument("--backoff", type=float, default=10.0, help="s before the first restart")
    p.add_argument("--max_backoff", type=float, default=300.0)
    p.add_argument("--grace", type=float, default=30.0, help="s for the others to exit")
    p.add_argument("--train_script", default=os.path.join(REPO, "scripts", "train.py"))
    return p.parse_args(argv[:cut]), argv[cut + 1 :]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    args, train_args = parse(argv)
    if args.processes < 1:
        raise SystemExit(f"--processes={args.processes}: must be at least 1")
    policy = RestartPolicy(
        max_restarts=args.max_restarts,
        same_failure_limit=args.same_failure_limit,
        backoff_s=args.backoff,
        max_backoff_s=args.max_backoff,
        grace_s=args.grace,
    )
    job = Job([sys.executable, args.train_script, *train_args], args.processes)
    attempt = supervise(job, policy, say=lambda m: print(m, file=sys.stderr, flush=True))
    if attempt.ok:
        return 0
    code = attempt.returncodes[attempt.failed]
    return code if code > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
