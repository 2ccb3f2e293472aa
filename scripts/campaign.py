r"""Run a campaign: a run as a sequence of segments, each an ordinary run directory; after each
round a policy picks the checkpoint the next starts from, its budget and its overrides.

    python scripts/campaign.py run --config=configs/grpo_arith.py --root=runs/campaigns/es \
        --campaign.policy=es --campaign.rounds=5 --campaign.budget=20 \
        --config.train.eval_every=2 --config.train.checkpoint_every=2 \
        --config.train.keep_checkpoints=20
    python scripts/campaign.py summary runs/campaigns/es

--campaign.KEY=VALUE sets the campaign's keys (policy: continue | es | rule_search; rounds,
budget, metric, es.margin, rule_search.propose / n / budget; docs/methods.md, "Campaigns");
--config.KEY=VALUE overrides the experiment config of every segment, as on scripts/train.py.
The same command after a kill continues the campaign: finished segments are not rerun, a
killed one resumes from its checkpoint. --launcher=slurm runs each round as one array job
(--partition, --timeout_min, --cpus_per_task, --gpus_per_node; --cluster=local runs the
tasks as local processes). Exit status 1 when a segment failed or is still running.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ml_collections  # noqa: E402
from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxrl_frontier.core.errors import ConfigError, SweepError  # noqa: E402
from jaxrl_frontier.run.config.flags import flags_help, key_problem, wants_help  # noqa: E402
from jaxrl_frontier.sweeps.campaign import defaults, run_campaign  # noqa: E402
from jaxrl_frontier.sweeps.campaign_tree import Campaign, summary_table  # noqa: E402
from jaxrl_frontier.sweeps.launch import LAUNCHERS, REPO, abs_config  # noqa: E402

USAGE = __doc__.split("\n\n")[1]


def define(fv: flags.FlagValues) -> None:
    config_flags.DEFINE_config_dict(
        "campaign", defaults(), "the campaign's keys (docs/methods.md)", flag_values=fv
    )
    flags.DEFINE_string("config", None, "experiment file FILE.py[:ARG]", flag_values=fv)
    flags.DEFINE_string("root", None, "the campaign directory", flag_values=fv)
    flags.DEFINE_enum("launcher", "local", LAUNCHERS.names(), "sweep launcher", flag_values=fv)
    flags.DEFINE_integer("parallel", 1, "local: segments of a round at once", flag_values=fv)
    flags.DEFINE_string("cluster", None, "slurm: None (detect), local or debug", flag_values=fv)
    flags.DEFINE_string("partition", None, "slurm partition", flag_values=fv)
    flags.DEFINE_integer("timeout_min", 240, "slurm: minutes a task", flag_values=fv)
    flags.DEFINE_integer("cpus_per_task", 8, "slurm: CPUs a task", flag_values=fv)
    flags.DEFINE_integer("gpus_per_node", 0, "slurm: GPUs a node", flag_values=fv)


def launcher(fv: flags.FlagValues, root: str):
    """launch(runs) -> results through the chosen sweep launcher."""
    params = dict(timeout_min=fv.timeout_min, cpus_per_task=fv.cpus_per_task, name="campaign")
    if fv.gpus_per_node:
        params["gpus_per_node"] = fv.gpus_per_node
    if fv.partition:
        params["slurm_partition"] = fv.partition
    launch = LAUNCHERS.get(fv.launcher)
    folder = os.path.join(root, "submitit")
    return lambda runs: launch(
        runs, parallel=fv.parallel, folder=folder, cluster=fv.cluster, params=params
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    passed = [a for a in argv[1:] if a.startswith("--config.")]
    own = [argv[0], *(a for a in argv[1:] if not a.startswith("--config."))]
    fv, saved = flags.FlagValues(), sys.argv
    try:  # ml_collections reads the --campaign.KEY flags from sys.argv when defining them
        sys.argv = own
        define(fv)
        if wants_help(own):
            print(flags_help(fv, __doc__))
            return 0
        rest = fv(own)[1:]
    except (AttributeError, KeyError) as e:  # a --campaign.KEY the campaign lacks
        keys = ml_collections.ConfigDict({"campaign": defaults()})
        for arg in (a for a in own if a.startswith("--campaign.")):
            problem = key_problem(keys, arg.split("=")[0][2:])
            if problem:  # no config key 'campaign.polcy'; did you mean 'campaign.policy'?
                raise SystemExit(f"campaign error: {arg}: {problem}") from None
        raise SystemExit(f"campaign error: {' '.join(str(e).split())}") from None
    except (flags.Error, TypeError, ValueError) as e:
        raise SystemExit(f"campaign error: {' '.join(str(e).split())}") from None
    finally:
        sys.argv = saved
    if rest[:1] == ["summary"] and len(rest) == 2:
        try:
            print(summary_table(Campaign.load(rest[1])))
        except SweepError as e:
            raise SystemExit(f"campaign error: {e}") from None
        return 0
    if rest != ["run"] or not fv.config or not fv.root:
        raise SystemExit(f"usage:\n{USAGE}")
    overrides = {}
    for arg in passed:
        key, sep, value = arg[len("--config.") :].partition("=")
        if not sep:
            raise SystemExit(f"campaign error: {arg!r}: give --config.KEY=VALUE")
        overrides[key] = value
    try:
        config = os.path.relpath(abs_config(fv.config), REPO)  # the same from any directory
        campaign = run_campaign(fv.root, config, overrides, fv.campaign, launcher(fv, fv.root))
    except (SweepError, ConfigError, ValueError) as e:
        raise SystemExit(f"campaign error: {e}") from None
    return 1 if campaign.pending() else 0


if __name__ == "__main__":
    sys.exit(main())
