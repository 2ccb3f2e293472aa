"""A campaign's tree of segments, its state file and its summary table.

A campaign (`sweeps/campaign.py`) is one run cut into segments. Each segment is an ordinary
run directory ROOT/<id> (`s0`, `s1`, ...) started through the sweep launchers; it starts
from the config's own start (the root, `s0`) or from a checkpoint of an earlier segment, and
trains `budget` steps. Its parent is the segment whose outcome the policy read to propose it.

ROOT/campaign.json holds the whole tree: per segment its parent, round, start (segment and
step, and the step the policy asked for), budget, overrides, the policy's note, its status
(planned, done, failed) and outcome (the eval curve of `campaign.metric`, the steps it kept
checkpoints at). It is rewritten atomically (a temporary file renamed over it) after every
change, so a campaign killed at any point continues from the last state written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from jaxrl_frontier.core.errors import SweepError

STATE_FILE, SUMMARY_FILE = "campaign.json", "campaign_summary.md"
RESERVED = ("train.steps", "train.horizon")  # the campaign sets them: start + budget, horizon
_KEY = re.compile(r"[A-Za-z_]\w*(\.\w+)*")
_SCALARS = (bool, int, float, str)


class CampaignError(SweepError):
    """A campaign that cannot go on: its settings, its state file or a policy's proposal."""


@dataclasses.dataclass(frozen=True)
class Proposal:
    """A policy's next segment: start from the checkpoint of segment `parent` at `step` (the
    newest one kept at or before it), train `budget` steps with `overrides` on top of the
    parent's; `note` says why (shown in the summary). `data_step`: continue the prompt stream
    from the parent's checkpoint at that step instead (the newest kept at or before it), e.g.
    where a rolled-back segment ended, so the next one sees prompts not trained on yet."""

    parent: str
    step: int
    budget: int
    overrides: dict = dataclasses.field(default_factory=dict)
    note: str = ""
    data_step: int | None = None


@dataclasses.dataclass
class Segment:
    """One segment of the tree (module docstring); JSON through dataclasses.asdict."""

    id: str
    parent: str | None
    round: int
    budget: int
    start_from: str | None = None  # the segment whose checkpoint it starts from (None: config)
    start_step: int = 0
    wanted_step: int | None = None  # the step the policy asked for
    data_from: str | None = None  # "segment@step": the checkpoint its prompt stream resumes
    overrides: dict = dataclasses.field(default_factory=dict)  # this segment's own
    inherited: dict = dataclasses.field(default_factory=dict)  # its ancestors', under its own
    note: str = ""
    status: str = "planned"  # planned | done | failed
    curve: list = dataclasses.field(default_factory=list)  # [[step, value]] of campaign.metric
    checkpoints: list = dataclasses.field(default_factory=list)
    last_step: int | None = None
    error: str = ""

    @property
    def config_overrides(self) -> dict:
        """The overrides its run gets besides the campaign's own and train.steps."""
        return {**self.inherited, **self.overrides}

    @property
    def end_step(self) -> int:
        return self.start_step + self.budget

    def peak(self) -> tuple[int, float] | None:
        """(step, value) of the first maximum of its eval curve (None: no eval)."""
        if not self.curve:
            return None
        step, value = max(self.curve, key=lambda p: (p[1], -p[0]))
        return int(step), float(value)

    def value_at(self, step: int) -> float | None:
        return next((float(v) for s, v in self.curve if int(s) == step), None)

    def row(self) -> dict:
        """The segment as a plain dict (what a rule-search proposer reads)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Campaign:
    """The tree and the settings it was started with; `save()` after each change."""

    root: str
    settings: dict  # {config, overrides, campaign}: what identifies the campaign
    segments: list[Segment] = dataclasses.field(default_factory=list)
    ended: str = ""  # why the policy stopped proposing ("" while it goes on)

    # ------------------------------------------------------------------ file

    @classmethod
    def open(cls, root: str, settings: dict) -> Campaign:
        """The campaign in `root` (a new one when it has no state file). CampaignError when
        the state file records other settings (config, overrides, campaign keys other than
        `campaign.rounds`, which may grow to extend a campaign)."""
        root = os.path.abspath(root)
        path = os.path.join(root, STATE_FILE)
        if not os.path.exists(path):
            return cls(root, json.loads(json.dumps(settings)))
        campaign = cls.load(root)
        before, now = _identity(campaign.settings), _identity(json.loads(json.dumps(settings)))
        if before != now:
            diff = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
            shown = ", ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in diff)
            raise CampaignError(
                f"{path}: this campaign was started with other settings ({shown}); "
                "give the same ones to continue it, or another root"
            )
        campaign.settings = json.loads(json.dumps(settings))
        return campaign

    @classmethod
    def load(cls, root: str) -> Campaign:
        path = os.path.join(os.path.abspath(root), STATE_FILE)
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            raise CampaignError(f"{path}: no campaign here (no such file)") from None
        except ValueError as e:
            raise CampaignError(f"{path}: not a campaign state file ({e})") from None
        segments = [Segment(**s) for s in data["segments"]]
        return cls(os.path.abspath(root), data["settings"], segments, data.get("ended", ""))

    def save(self) -> None:
        """Write ROOT/campaign.json atomically."""
        os.makedirs(self.root, exist_ok=True)
        path = os.path.join(self.root, STATE_FILE)
        data = dict(
            settings=self.settings,
            ended=self.ended,
            segments=[dataclasses.asdict(s) for s in self.segments],
        )
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    # ------------------------------------------------------------------ tree

    @property
    def keys(self) -> dict:
        """The campaign.* keys."""
        return self.settings["campaign"]

    def get(self, sid: str) -> Segment:
        for seg in self.segments:
            if seg.id == sid:
                return seg
        raise CampaignError(f"{self.root}: no segment {sid!r} (segments: {self.ids()})")

    def ids(self) -> list[str]:
        return [s.id for s in self.segments]

    def workdir(self, sid: str) -> str:
        return os.path.join(self.root, sid)

    def pending(self) -> list[Segment]:
        return [s for s in self.segments if s.status != "done"]

    def path(self, sid: str) -> str:
        """`s0/s2/s5`: the segment's ancestry, root first."""
        seg = self.get(sid)
        return seg.id if seg.parent is None else f"{self.path(seg.parent)}/{seg.id}"

    def add_root(self, budget: int) -> Segment:
        seg = Segment("s0", None, 0, budget, note="the config's start")
        self.segments.append(seg)
        return seg

    def add(self, proposal: Proposal, round_: int) -> Segment:
        """A new planned segment from a proposal: its start resolved to a kept checkpoint,
        its curve's first point the eval recorded there (if any)."""
        parent = self.get(proposal.parent)
        if proposal.budget < 1:
            raise CampaignError(f"a proposal from {parent.id}: budget {proposal.budget} < 1")
        check_overrides([proposal.overrides], f"the proposal from {parent.id}")
        holder, step = self.resolve(parent.id, proposal.step)
        seg = Segment(
            id=f"s{len(self.segments)}",
            parent=parent.id,
            round=round_,
            budget=int(proposal.budget),
            start_from=holder,
            start_step=step,
            wanted_step=int(proposal.step),
            overrides=dict(proposal.overrides),
            inherited=parent.config_overrides,
            note=proposal.note,
        )
        if proposal.data_step is not None:
            data_holder, data_step = self.resolve(parent.id, proposal.data_step)
            if data_holder is not None and (data_holder, data_step) != (holder, step):
                seg.data_from = f"{data_holder}@{data_step}"
        value = parent.value_at(step)
        if value is None and holder is not None:
            value = self.get(holder).value_at(step)
        seg.curve = [[step, value]] if value is not None else []
        self.segments.append(seg)
        return seg

    def resolve(self, sid: str, wanted: int) -> tuple[str | None, int]:
        """(segment holding the checkpoint, step): the newest checkpoint at or before step
        `wanted` of segment `sid`, else its own start (from its parent's checkpoint, or from
        the config's start, (None, 0)). CampaignError when none is kept."""
        seg = self.get(sid)
        own = [s for s in seg.checkpoints if seg.start_step <= s <= wanted]
        if own:
            return seg.id, max(own)
        if wanted >= seg.start_step:
            if seg.start_from is None and seg.start_step == 0:
                return None, 0
            if seg.start_from is not None:
                return seg.start_from, seg.start_step
        raise CampaignError(
            f"segment {seg.id}: no checkpoint at or before step {wanted} kept in "
            f"{os.path.join(self.workdir(seg.id), 'checkpoints')} (kept: {seg.checkpoints}); "
            "set train.checkpoint_every to train.eval_every and train.keep_checkpoints high "
            "enough that every eval's checkpoint is kept"
        )

    def best(self) -> dict[str, Any]:
        """The campaign's best checkpoint by held-out eval: {segment, step, value, overrides}
        over the eval points of finished segments whose exact step has a checkpoint (the
        first of equal values); CampaignError when there is none."""
        found = None
        for seg in self.segments:
            if seg.status != "done":
                continue
            for step, value in seg.curve:
                try:
                    _, at = self.resolve(seg.id, int(step))
                except CampaignError:
                    continue
                if at == int(step) and (found is None or value > found["value"]):
                    found = dict(segment=seg.id, step=int(step), value=float(value))
        if found is None:
            raise CampaignError(
                f"{self.root}: no eval of {self.keys['metric']!r} at a kept checkpoint in any "
                "finished segment (campaign.metric, train.eval_every, train.checkpoint_every)"
            )
        found["overrides"] = self.get(found["segment"]).config_overrides
        return found


def _identity(settings: dict) -> dict:
    """The settings flattened, campaign.rounds left out."""
    flat = {"config": settings.get("config"), "overrides": settings.get("overrides")}
    for key, value in (settings.get("campaign") or {}).items():
        if isinstance(value, dict):
            flat.update({f"campaign.{key}.{k}": v for k, v in value.items()})
        elif key != "rounds":
            flat[f"campaign.{key}"] = value
    return flat


def check_overrides(sets: Any, where: str) -> list[dict]:
    """`sets` if it is a list of {config key: bool | int | float | str} dicts none of which
    sets a key the campaign owns (train.steps), else CampaignError naming `where`."""
    if not isinstance(sets, list):
        raise CampaignError(
            f"{where}: expected a list of override dicts, got {type(sets).__name__}"
        )
    for i, overrides in enumerate(sets):
        if not isinstance(overrides, dict):
            raise CampaignError(f"{where}: item {i} is a {type(overrides).__name__}, not a dict")
        for key, value in overrides.items():
            if not isinstance(key, str) or not _KEY.fullmatch(key):
                raise CampaignError(f"{where}: item {i}: {key!r} is not a config key")
            if key in RESERVED:
                raise CampaignError(
                    f"{where}: item {i}: {key} is set by the campaign (campaign.budget, "
                    "campaign.horizon)"
                )
            if not isinstance(value, _SCALARS):
                raise CampaignError(
                    f"{where}: item {i}: {key}={value!r} is a {type(value).__name__}; values "
                    "must be bool, int, float or str"
                )
    return sets


# ---------------------------------------------------------------------------- summary


def summary_table(campaign: Campaign) -> str:
    """The tree as a markdown table: one row per segment (its ancestry as the id), parent,
    round, start (segment@step, or init@0; the asked step when the kept one differs; where the
    prompt stream resumes when elsewhere), budget,
    steps trained, own overrides, best eval (value @ step), outcome and the policy's note."""
    metric = campaign.keys["metric"]
    try:
        best = campaign.best()
    except CampaignError:
        best = None
    head = ["segment", "parent", "round", "start", "budget", "steps", "overrides"]
    head += [f"best {metric}", "outcome", "note"]
    rows = [head, ["---"] * len(head)]
    for seg in campaign.segments:
        start = f"{seg.start_from or 'init'}@{seg.start_step}"
        if seg.wanted_step is not None and seg.wanted_step != seg.start_step:
            start += f" (asked {seg.wanted_step})"
        if seg.data_from:
            start += f", prompts from {seg.data_from}"
        peak = seg.peak()
        outcome = seg.status + (f": {seg.error}" if seg.error else "")
        if best is not None and best["segment"] == seg.id:
            outcome += f", campaign best (step {best['step']})"
        last = "" if seg.last_step is None else seg.last_step
        rows.append(
            [
                campaign.path(seg.id),
                seg.parent or "-",
                str(seg.round),
                start,
                str(seg.budget),
                f"{seg.start_step}-{last}",
                ", ".join(f"{k}={v}" for k, v in seg.overrides.items()) or "-",
                "-" if peak is None else f"{peak[1]:.4f} @ {peak[0]}",
                outcome,
                seg.note.replace("|", "/"),
            ]
        )
    lines = ["| " + " | ".join(r) + " |" for r in rows]
    if campaign.ended:
        lines.append(f"\nended: {campaign.ended}")
    return "\n".join(lines) + "\n"


def write_summary(campaign: Campaign) -> str:
    """Write the table to ROOT/campaign_summary.md; returns the table."""
    table = summary_table(campaign)
    with open(os.path.join(campaign.root, SUMMARY_FILE), "w") as f:
        f.write(f"# Campaign {campaign.root}\n\n{table}")
    return table
