"""Campaign policies: after each round of segments, where the next starts and with what.

An entry of `POLICIES` (config key `campaign.policy`) takes the campaign.* keys and returns
`propose(campaign) -> list[Proposal]`; its settings are checked when the campaign starts.
An empty list ends the campaign.

  continue     the next segment starts from the last segment's last checkpoint and trains
               `campaign.budget` steps: one run cut into segments.
  es           the early-stop rule (ES) of "Self-Improvement Can Self-Regress: The
               Rise-and-Collapse Failure Mode of LLM Self-Training": roll forward the peak
               checkpoint (the first maximum of the last segment's eval curve) and set the
               next budget to peak_step + 3, peak_step counted from the segment's start (each
               of the paper's campaigns counts from 0); `campaign.es.margin` replaces the 3.
               The prompt stream continues from where the rolled-back segment ended (its
               last checkpoint's data state): the next segment trains the peak's weights on
               prompts not seen yet instead of replaying the steps that collapsed (a
               restored run is deterministic). The stop at a collapse is the segment's own:
               `train.collapse.stop`.
  rule_search  from the campaign's best checkpoint by held-out eval, try N override sets
               for a short budget each; the next round starts from the best checkpoint then
               (which stays where it was when no trial beat it): the multi-parameter
               transitions between checkpoints of "LLMZero: Discovering Adaptive Training
               Strategies for RL Post-Training via LLM Agents", proposed by a user function
               (`campaign.rule_search.propose`, MODULE:FUNCTION or FILE.py:FUNCTION) rather
               than an agent: propose(best, history, n) -> list of at most n override dicts;
               `best` = {segment, step, value, overrides}, `history` the segments as dicts.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable

from jaxrl_frontier.core.registry import Registry
from jaxrl_frontier.sweeps.campaign_tree import Campaign, CampaignError, Proposal, check_overrides

Policy = Callable[[Campaign], list[Proposal]]
POLICIES = Registry("campaign policy", key="campaign.policy")


def _positive(keys: dict, name: str) -> int:
    node = keys
    for part in name.split("."):
        node = node[part]
    if not isinstance(node, int) or node < 1:
        raise CampaignError(f"config key 'campaign.{name}' must be an integer >= 1, got {node!r}")
    return node


def _last(campaign: Campaign):
    """The segment of the last round (continue and es run one per round)."""
    return campaign.segments[-1]


@POLICIES.register("continue")
def continue_policy(keys: dict) -> Policy:
    """Continue from the last segment's last checkpoint for `campaign.budget` steps."""
    budget = _positive(keys, "budget")

    def propose(campaign: Campaign) -> list[Proposal]:
        seg = _last(campaign)
        step = seg.end_step if seg.last_step is None else seg.last_step
        return [Proposal(seg.id, step, budget, note=f"continue from {seg.id}@{step}")]

    return propose


@POLICIES.register("es")
def early_stop_policy(keys: dict) -> Policy:
    """ES of "Self-Improvement Can Self-Regress": the next segment starts from the last
    one's peak eval checkpoint with budget (peak_step - its start) + campaign.es.margin, its
    prompt stream from the last one's end."""
    margin = _positive(keys, "es.margin")
    metric = keys["metric"]

    def propose(campaign: Campaign) -> list[Proposal]:
        seg = _last(campaign)
        peak = seg.peak()
        if peak is None:
            raise CampaignError(
                f"segment {seg.id} ({campaign.workdir(seg.id)}): no eval of {metric!r} in its "
                "metrics.jsonl: the es policy needs its eval curve (campaign.metric, "
                "train.eval_every)"
            )
        step, value = peak
        into = step - seg.start_step
        note = (
            f"es: {metric} peaked at {value:.4f} at step {step} ({into} into {seg.id}); "
            f"budget {into} + {margin}"
        )
        end = seg.end_step if seg.last_step is None else seg.last_step
        return [Proposal(seg.id, step, into + margin, note=note, data_step=end)]

    return propose


@POLICIES.register("rule_search")
def rule_search_policy(keys: dict) -> Policy:
    """N override sets from the user's proposer, tried from the best checkpoint for a short
    budget each (campaign.rule_search.{propose, n, budget}; budget 0: campaign.budget)."""
    rs = keys["rule_search"]
    spec = rs["propose"]
    if not spec:
        raise CampaignError(
            "config key 'campaign.rule_search.propose' is empty: give MODULE:FUNCTION or "
            "FILE.py:FUNCTION, a function propose(best, history, n) -> list of override dicts"
        )
    fn = load_function(spec, key="campaign.rule_search.propose")
    n = _positive(keys, "rule_search.n")
    budget = rs["budget"] or _positive(keys, "budget")
    where = f"campaign.rule_search.propose = {spec!r}"

    def propose(campaign: Campaign) -> list[Proposal]:
        best = campaign.best()
        sets = check_overrides(
            fn(best=best, history=[s.row() for s in campaign.segments], n=n), where
        )
        if len(sets) > n:
            raise CampaignError(
                f"{where}: {len(sets)} override sets, more than campaign.rule_search.n={n}"
            )
        at = f"{best['segment']}@{best['step']} ({keys['metric']} {best['value']:.4f})"
        return [
            Proposal(
                best["segment"], best["step"], budget, o, f"trial {i + 1}/{len(sets)} from {at}"
            )
            for i, o in enumerate(sets)
        ]

    return propose


def load_function(spec: str, key: str) -> Callable:
    """The function `spec` names: MODULE:FUNCTION (a module on sys.path) or FILE.py:FUNCTION.
    CampaignError naming `key` when the module, the file or the function is missing."""
    module, sep, name = spec.rpartition(":")
    if not sep or not module or not name:
        raise CampaignError(
            f"config key {key!r} = {spec!r}: give MODULE:FUNCTION or FILE.py:FUNCTION"
        )
    if module.endswith(".py"):
        path = os.path.abspath(module)
        if not os.path.isfile(path):
            raise CampaignError(f"config key {key!r} = {spec!r}: no such file {path}")
        mod_name = "jaxrl_campaign_" + "".join(c if c.isalnum() else "_" for c in path)
        mod = sys.modules.get(mod_name)
        if mod is None:
            loader_spec = importlib.util.spec_from_file_location(mod_name, path)
            mod = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(mod)
            sys.modules[mod_name] = mod
    else:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            raise CampaignError(f"config key {key!r} = {spec!r}: {e}") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise CampaignError(f"config key {key!r} = {spec!r}: {module} defines no function {name!r}")
    return fn
