"""A campaign's tree (sweeps/campaign_tree.py): a segment's peak, resolving a wanted step to a
kept checkpoint, adding a proposal, the best checkpoint, the state file's round trip and its
settings check, the override check, and the summary table of a hand-made tree."""

import json

import pytest

from jaxrl_frontier.sweeps.campaign_tree import (
    STATE_FILE,
    Campaign,
    CampaignError,
    Proposal,
    Segment,
    check_overrides,
    summary_table,
)

METRIC = "eval/pass@1_greedy"
SETTINGS = {"config": "configs/x.py", "overrides": {}, "campaign": {"metric": METRIC, "rounds": 2}}


def tree(root) -> Campaign:
    """s0 (steps 0-6, peak 0.5 at 4) -> s1 (from s0@4, lr 0.1, peak 0.7 at 6)."""
    c = Campaign(str(root), json.loads(json.dumps(SETTINGS)))
    c.segments = [
        Segment(
            "s0",
            None,
            0,
            6,
            status="done",
            curve=[[0, 0.1], [2, 0.5], [4, 0.5], [6, 0.2]],
            checkpoints=[2, 4, 6],
            last_step=6,
        ),
        Segment(
            "s1",
            "s0",
            1,
            3,
            start_from="s0",
            start_step=4,
            overrides={"optimizer.lr": 0.1},
            status="done",
            curve=[[4, 0.5], [5, 0.6], [6, 0.7]],
            checkpoints=[6],
            last_step=7,
        ),
    ]
    return c


def test_resolve_falls_back_to_the_start_and_the_config(tmp_path):
    c = Campaign(str(tmp_path), {"campaign": {"metric": METRIC}})
    c.segments = [
        Segment("s0", None, 0, 6, checkpoints=[3, 6]),
        # its copied start (step 3) rotated out by train.keep_checkpoints
        Segment("s1", "s0", 1, 4, start_from="s0", start_step=3, checkpoints=[5, 7]),
    ]
    assert c.resolve("s1", 6) == ("s1", 5)
    assert c.resolve("s1", 4) == ("s0", 3)  # its start, in its parent
    assert c.resolve("s0", 2) == (None, 0)  # the config's start
    with pytest.raises(CampaignError, match="segment s1: no checkpoint at or before step 2"):
        c.resolve("s1", 2)


def test_a_segments_peak_is_its_first_maximum():
    s0 = tree("/r").segments[0]
    assert s0.peak() == (2, 0.5) and s0.value_at(4) == 0.5 and s0.value_at(3) is None
    assert s0.end_step == 6 and Segment("s9", None, 0, 1).peak() is None
    s = Segment("s2", "s1", 2, 5, start_step=3, overrides={"a": 2}, inherited={"a": 1, "b": 1})
    assert s.config_overrides == {"a": 2, "b": 1} and s.end_step == 8


def test_a_proposal_becomes_a_segment_from_a_kept_checkpoint(tmp_path):
    c = tree(tmp_path)
    seg = c.add(Proposal("s1", 7, 4, {"rollout.temperature": 0.5}, "why", data_step=7), 2)
    assert (seg.id, seg.parent, seg.round, seg.budget) == ("s2", "s1", 2, 4)
    assert (seg.start_from, seg.start_step, seg.wanted_step) == ("s1", 6, 7)
    assert seg.inherited == {"optimizer.lr": 0.1} and seg.data_from is None  # the same step
    assert seg.curve == [[6, 0.7]] and seg.note == "why"
    back = c.add(Proposal("s1", 5, 2, data_step=7), 2)  # s1's start, in s0; prompts from s1@6
    assert (back.start_from, back.start_step, back.data_from) == ("s0", 4, "s1@6")
    assert back.curve == [[4, 0.5]]
    assert c.path("s3") == "s0/s1/s3" and c.ids() == ["s0", "s1", "s2", "s3"]
    assert [s.id for s in c.pending()] == ["s2", "s3"]
    with pytest.raises(CampaignError, match="budget 0 < 1"):
        c.add(Proposal("s1", 6, 0), 2)
    with pytest.raises(CampaignError, match=r"no segment 's7' \(segments: \['s0', 's1'"):
        c.get("s7")


def test_the_best_checkpoint_is_the_highest_kept_eval(tmp_path):
    c = tree(tmp_path)
    assert c.best() == dict(segment="s1", step=6, value=0.7, overrides={"optimizer.lr": 0.1})
    c.segments[1].status = "failed"
    assert c.best() == dict(segment="s0", step=2, value=0.5, overrides={})  # first of equals
    c.segments[0].checkpoints = []
    c.segments[0].start_step = 1  # no kept checkpoint anywhere
    with pytest.raises(CampaignError, match="no eval of 'eval/pass@1_greedy' at a kept"):
        c.best()


def test_the_state_file_round_trips_and_guards_its_settings(tmp_path):
    with pytest.raises(CampaignError, match="no campaign here"):
        Campaign.load(str(tmp_path))
    c = tree(tmp_path)
    c.ended = "no proposal"
    c.save()
    again = Campaign.load(str(tmp_path))
    assert again.segments == c.segments and again.ended == "no proposal"
    grown = dict(SETTINGS, campaign={"metric": METRIC, "rounds": 9})  # more rounds: allowed
    assert Campaign.open(str(tmp_path), grown).keys["rounds"] == 9
    other = dict(SETTINGS, campaign={"metric": "eval/x", "rounds": 2})
    with pytest.raises(CampaignError, match=r"campaign.metric: 'eval/pass@1_greedy' -> 'eval/x'"):
        Campaign.open(str(tmp_path), other)
    (tmp_path / STATE_FILE).write_text("{")
    with pytest.raises(CampaignError, match="not a campaign state file"):
        Campaign.load(str(tmp_path))
    assert Campaign.open(str(tmp_path / "new"), SETTINGS).segments == []


@pytest.mark.parametrize(
    "sets, message",
    [
        ({"a": 1}, "expected a list of override dicts, got dict"),
        ([{"a": 1}, 3], "item 1 is a int, not a dict"),
        ([{"a b": 1}], "item 0: 'a b' is not a config key"),
        ([{"train.horizon": 1}], "item 0: train.horizon is set by the campaign"),
        ([{"a": None}], "item 0: a=None is a NoneType"),
    ],
)
def test_check_overrides_names_the_problem(sets, message):
    with pytest.raises(CampaignError, match=f"^here: {message}"):
        check_overrides(sets, "here")


def test_check_overrides_passes_scalars():
    sets = [{"optimizer.lr": 0.1, "a": True, "b": "x", "c": 3}, {}]
    assert check_overrides(sets, "here") is sets


def test_summary_table_of_a_tree(tmp_path):
    c = tree(tmp_path)
    c.add(Proposal("s1", 7, 2, data_step=5), 2)
    c.segments[2].error = "exit 1"
    c.ended = "rounds done"
    lines = summary_table(c).splitlines()
    assert lines[0] == (
        f"| segment | parent | round | start | budget | steps | overrides | best {METRIC} "
        "| outcome | note |"
    )
    assert lines[2] == "| s0 | - | 0 | init@0 | 6 | 0-6 | - | 0.5000 @ 2 | done |  |"
    assert lines[3] == (
        "| s0/s1 | s0 | 1 | s0@4 | 3 | 4-7 | optimizer.lr=0.1 | 0.7000 @ 6 "
        "| done, campaign best (step 6) |  |"
    )
    assert lines[4] == (
        "| s0/s1/s2 | s1 | 2 | s1@6 (asked 7), prompts from s0@4 | 2 | 6- | - "
        "| 0.7000 @ 6 | planned: exit 1 |  |"
    )
    assert lines[-1] == "ended: rounds done"
