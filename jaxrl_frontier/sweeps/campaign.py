"""Campaigns: a run as a sequence of segments; after each round a policy decides which
checkpoint the next segment starts from, for how many steps, with which overrides.

    python scripts/campaign.py run --config=configs/grpo_arith.py --root=runs/campaigns/es \
        --campaign.policy=es --campaign.rounds=5 --campaign.budget=20

Each segment is an ordinary run directory ROOT/<id> run like a sweep's runs
(`sweeps/launch.py`: scripts/train.py with `--config.KEY=VALUE` overrides, sweep_run.json,
sweep_done.json, any launcher), with `train.steps` = its start step + its budget. A segment
that starts from a checkpoint of another gets a copy of that step as its own first
checkpoint (`train.checkpoint.copy_step`), so the trainer's ordinary resume continues from
it: the parameters, the optimizer state (moments and count: a schedule is the segment's own,
read at the continued count), the step counter, the RNG, the data position and the
controllers' states. The copy's history restarts (`segment_start_meta`): the eval at the
start step stays as the first point of its curve; 'best', 'collapse' and 'target_reached_at'
go, so the segment trains and keeps its own best; its checkpointed config goes too, so a
segment may change the learning rate. A proposal may take the prompt stream's state from
another checkpoint of its parent (`Proposal.data_step`; es: where the rolled-back segment
ended, so a restart from the peak does not replay the same steps). The reference policy of a KL term stays the config's
start, as in one long run. Schedules and controllers (`schedules.*`, `controllers.*`) are
checked against the checkpoint's as on any resume. Every segment runs with train.horizon =
campaign.horizon (fixed when the campaign starts; 0: rounds x budget), so a schedule with
steps=0 follows one curve over the whole campaign, whichever checkpoint a segment starts from.

Policies (`sweeps/campaign_policies.py`): continue, es (the early-stop rule of
"Self-Improvement Can Self-Regress: The Rise-and-Collapse Failure Mode of LLM
Self-Training"), rule_search (the transitions of "LLMZero: Discovering Adaptive Training
Strategies for RL Post-Training via LLM Agents", proposed by a user function).

Resume: the tree is saved (ROOT/campaign.json, atomically) before each round starts and
after it ends; the same command after a kill reruns no finished segment (its state says
done, or its sweep_done.json does) and starts the unfinished ones again, which resume from
their own checkpoints. The summary table is printed and written to ROOT/campaign_summary.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import ml_collections

from jaxrl_frontier.core.errors import CheckpointError
from jaxrl_frontier.sweeps.campaign_policies import POLICIES
from jaxrl_frontier.sweeps.campaign_tree import (
    STATE_FILE,
    Campaign,
    CampaignError,
    Segment,
    check_overrides,
    write_summary,
)
from jaxrl_frontier.sweeps.collect import read_series
from jaxrl_frontier.sweeps.launch import Run, launch_local
from jaxrl_frontier.train.checkpoint import copy_step, read_step_meta, step_dirs

Launch = Callable[[list[Run]], list[dict]]
Say = Callable[[str], None]


def defaults() -> ml_collections.ConfigDict:
    """The campaign.* keys.

    policy       continue | es | rule_search (campaign_policies.POLICIES)
    rounds       rounds in all, the root's included (a round: one segment, or rule_search's
                 N trials); may grow between invocations to extend a campaign
    budget       steps of the root segment and of each continue segment
    horizon      train.horizon of every segment: the steps a schedule with steps=0 spans
                 (0: rounds x budget, as the campaign starts; kept when rounds grow)
    metric       the held-out eval metric the policies read (metrics.jsonl)
    es.margin    es: the next budget is the steps to the peak plus this (the paper's 3)
    rule_search  propose (MODULE:FUNCTION or FILE.py:FUNCTION), n (override sets a round),
                 budget (steps of each trial; 0: campaign.budget)
    """
    return ml_collections.ConfigDict(
        dict(
            policy="continue",
            rounds=3,
            budget=20,
            horizon=0,
            metric="eval/pass@1_greedy",
            es=dict(margin=3),
            rule_search=dict(propose="", n=4, budget=0),
        )
    )


def segment_start_meta(origin: str, step: int, data: dict | None = None) -> Callable[[dict], dict]:
    """The metadata edit of a segment's start checkpoint (module docstring): the history keeps
    only the eval at `step`, the checkpointed config is dropped, `campaign_start` records
    where the copy came from (`origin`@`step`), and `data` (another checkpoint's data state,
    when given) replaces the prompt stream's state."""

    def edit(meta: dict) -> dict:
        history = meta.get("history") or {}
        evals = [e for e in history.get("eval", []) if int(e.get("step", -1)) == step]
        kept = {k: v for k, v in meta.items() if k != "config"}
        if data is not None:
            kept["data"] = data
        return {**kept, "history": {"eval": evals}, "campaign_start": f"{origin}@{step}"}

    return edit


def segment_run(campaign: Campaign, seg: Segment) -> Run:
    """The segment as a sweep Run: the campaign's overrides, the segment's (inherited and
    own), and train.steps = start step + budget."""
    overrides = {**campaign.settings["overrides"], **seg.config_overrides}
    overrides["train.steps"] = seg.end_step
    overrides["train.horizon"] = campaign.keys["horizon"]
    workdir = campaign.workdir(seg.id)
    return Run(seg.id, campaign.settings["config"], tuple(overrides.items()), workdir, seg.id)


def seed_segment(campaign: Campaign, seg: Segment) -> bool:
    """Copy the segment's start checkpoint into its workdir (a no-op for a root start or a
    segment that already holds a checkpoint); True when it copied."""
    if seg.start_from is None:
        return False
    src = os.path.join(campaign.workdir(seg.start_from), "checkpoints")
    dst = os.path.join(campaign.workdir(seg.id), "checkpoints")
    try:
        data = None
        if seg.data_from and not step_dirs(dst):
            holder, step = seg.data_from.split("@")
            ckpts = os.path.join(campaign.workdir(holder), "checkpoints")
            data = read_step_meta(ckpts, int(step)).get("data")
        edit = segment_start_meta(seg.start_from, seg.start_step, data)
        return copy_step(src, seg.start_step, dst, edit_meta=edit)
    except CheckpointError as e:
        raise CampaignError(f"segment {seg.id}: its start checkpoint: {e}") from None


def record(campaign: Campaign, seg: Segment, result: dict) -> None:
    """The launcher's result of `seg`: done (its outcome read from its workdir), failed, or
    left planned (e.g. a slurm job submitted without waiting)."""
    status = result.get("status")
    if status in ("done", "skipped"):
        workdir = campaign.workdir(seg.id)
        series = read_series(workdir)
        points = {int(s): v for s, v in seg.curve if int(s) == seg.start_step}
        points.update({int(s): v for s, v in series.get(campaign.keys["metric"], [])})
        seg.curve = [[s, points[s]] for s in sorted(points)]
        seg.checkpoints = step_dirs(os.path.join(workdir, "checkpoints"))
        steps = [int(s) for values in series.values() for s, _ in values]
        seg.last_step = max(steps + seg.checkpoints, default=seg.start_step)
        seg.status, seg.error = "done", ""
    elif status == "failed":
        seg.status, seg.error = "failed", str(result.get("error", ""))[-300:]


def run_campaign(
    root: str,
    config: str,
    overrides: dict,
    keys: dict | ml_collections.ConfigDict,
    launch: Launch | None = None,
    say: Say = print,
) -> Campaign:
    """Run (or continue) the campaign in `root`: `config` the experiment file (FILE.py[:ARG]),
    `overrides` the config overrides of every segment, `keys` the campaign.* keys
    (`defaults()`), `launch(runs) -> results` the sweep launcher of each round (default: one
    after another, each in its own process). Returns the campaign; its summary is written."""
    keys = keys.to_dict() if isinstance(keys, ml_collections.ConfigDict) else dict(keys)
    check_overrides([dict(overrides)], "the campaign's --config overrides")
    propose = POLICIES.get(keys["policy"])(keys)  # its settings checked before any run
    if not isinstance(keys["rounds"], int) or keys["rounds"] < 1:
        raise CampaignError(f"config key 'campaign.rounds' must be >= 1, got {keys['rounds']!r}")
    keys["horizon"] = campaign_horizon(root, keys)
    settings = dict(config=config, overrides=dict(overrides), campaign=keys)
    campaign = Campaign.open(root, settings)
    launch = launch or (lambda runs: launch_local(runs, say=say))
    if not campaign.segments:
        campaign.add_root(keys["budget"])
        campaign.save()
    while True:
        pending = campaign.pending()
        if pending:
            if not _run_round(campaign, pending, launch, say):
                break
            continue
        next_round = campaign.segments[-1].round + 1
        if campaign.ended or next_round >= keys["rounds"]:
            break
        proposals = propose(campaign)
        if not proposals:
            campaign.ended = f"the {keys['policy']} policy proposed no segment"
        for proposal in proposals:
            seg = campaign.add(proposal, next_round)
            say(
                f"[campaign] {seg.id}: from {seg.start_from or 'init'}@{seg.start_step}, "
                f"{seg.budget} steps; {seg.note}"
            )
        campaign.save()
    say(write_summary(campaign))
    return campaign


def campaign_horizon(root: str, keys: dict) -> int:
    """campaign.horizon, resolved once: the given value, else the one the campaign in `root`
    started with, else rounds x budget (so growing `rounds` later moves no schedule)."""
    horizon = keys.get("horizon", 0)
    if not isinstance(horizon, int) or isinstance(horizon, bool) or horizon < 0:
        raise CampaignError(f"config key 'campaign.horizon' must be an int >= 0, got {horizon!r}")
    if horizon:
        return horizon
    if os.path.exists(os.path.join(root, STATE_FILE)):
        return int(Campaign.load(root).keys.get("horizon") or 0) or keys["rounds"] * keys["budget"]
    return keys["rounds"] * keys["budget"]


def _run_round(campaign: Campaign, pending: list[Segment], launch: Launch, say: Say) -> bool:
    """Launch the pending segments; False when one did not finish (the campaign stops)."""
    for seg in pending:
        seed_segment(campaign, seg)
    results = launch([segment_run(campaign, seg) for seg in pending])
    for seg, result in zip(pending, results):
        record(campaign, seg, result)
    campaign.save()
    unfinished = [s for s in pending if s.status != "done"]
    for seg in unfinished:
        say(
            f"[campaign] segment {seg.id} is {seg.status}" + (f": {seg.error}" if seg.error else "")
        )
    return not unfinished
