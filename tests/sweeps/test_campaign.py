"""Campaigns (sweeps/campaign.py): the policies and the campaign loop on scripted eval curves
through a fake launcher (seconds), resume after a kill, the summary table, the CLI, and one
real two-segment campaign whose second segment starts from a chosen checkpoint of the first.

The fake launcher plays a trainer: a segment resumes from the newest step directory in its
checkpoints/ (the copied start, or its own), writes an eval row per step to metrics.jsonl
from a scripted curve and a checkpoint directory per step holding its origin
("segment@step"), so a copied start checkpoint is recognisable in the next segment.
"""

import importlib.util
import json
import os
import re

import pytest

from jaxrl_frontier.core.errors import UnknownNameError
from jaxrl_frontier.sweeps.campaign import defaults, run_campaign
from jaxrl_frontier.sweeps.campaign_policies import POLICIES, load_function
from jaxrl_frontier.sweeps.campaign_tree import (
    STATE_FILE,
    SUMMARY_FILE,
    Campaign,
    CampaignError,
    Proposal,
)
from jaxrl_frontier.sweeps.launch import DONE_FILE, launch_local
from jaxrl_frontier.train.checkpoint import step_dirs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METRIC = "eval/pass@1_greedy"


class Killed(Exception):
    """The fake's stand-in for a kill of the campaign process."""


class FakeTrainer:
    """launch(runs) -> results, training each run on a scripted curve: value(run, step)."""

    def __init__(self, value, keep_every: int = 1, kill_at: tuple[str, int] | None = None):
        self.value, self.keep_every, self.kill_at = value, keep_every, kill_at
        self.trained: list[tuple[str, int]] = []  # (segment, step) of every step trained

    def __call__(self, runs):
        return [self.train(run) for run in runs]

    def train(self, run):
        if os.path.exists(os.path.join(run.workdir, DONE_FILE)):
            return dict(name=run.name, status="skipped")
        overrides = dict(run.overrides)
        os.makedirs(run.workdir, exist_ok=True)
        ckpts = os.path.join(run.workdir, "checkpoints")
        start = max(step_dirs(ckpts), default=0)
        rows = [] if start else [(0, self.value(run, 0))]  # eval.at_start of a fresh run
        with open(os.path.join(run.workdir, "metrics.jsonl"), "a") as f:
            for step in range(start + 1, overrides["train.steps"] + 1):
                self.trained.append((run.name, step))
                rows.append((step, self.value(run, step)))
                for s, v in rows:
                    f.write(json.dumps({"step": s, METRIC: v}) + "\n")
                rows = []
                if step % self.keep_every == 0:
                    os.makedirs(os.path.join(ckpts, str(step), "meta"))
                    with open(os.path.join(ckpts, str(step), "origin"), "w") as o:
                        o.write(f"{run.name}@{step}")
                    meta = {"history": {"eval": [{"step": step, METRIC: 0.0}]}, "config": {}}
                    meta["data"] = {"next": step}  # the prompt stream's position
                    with open(os.path.join(ckpts, str(step), "meta", "metadata"), "w") as m:
                        json.dump(meta, m)
                if self.kill_at == (run.name, step):
                    self.kill_at = None
                    raise Killed(f"killed at {run.name} step {step}")
        with open(os.path.join(run.workdir, DONE_FILE), "w") as f:
            json.dump({}, f)
        return dict(name=run.name, status="done")


def keys(**kw):
    k = defaults()
    k.update(kw)
    return k


def table(values):
    """A scripted curve: {segment: {step: value}}."""
    return lambda run, step: values[run.name][step]


def origin(root, seg, step):
    with open(os.path.join(root, seg, "checkpoints", str(step), "origin")) as f:
        return f.read()


# rise to 0.6 at step 4, then collapse
S0 = {s: v for s, v in enumerate([0.1, 0.2, 0.3, 0.5, 0.6, 0.4, 0.3, 0.2, 0.2, 0.1, 0.1])}
ES_CURVES = {
    "s0": S0,
    "s1": {s: 0.6 + 0.05 * (s - 4) if s <= 7 else 0.3 for s in range(5, 12)},  # peak 0.75 @ 7
    "s2": {s: 0.7 for s in range(8, 14)},  # never beats its start: peak at its start step
}
ES_LONG = {
    **ES_CURVES,
    "s3": dict.fromkeys(range(7, 30), 0.7),
    "s4": dict.fromkeys(range(7, 30), 0.7),
}


def run_es(root, margin=3, rounds=3, launch=None):
    launch = launch or FakeTrainer(table(ES_CURVES))
    k = keys(policy="es", rounds=rounds, budget=10)
    k.es.margin = margin
    return run_campaign(str(root), "configs/x.py", {"train.eval_every": 1}, k, launch, say=len)


# ============================================================================ policies


def test_es_restarts_from_the_peak_checkpoint_with_budget_peak_step_plus_3(tmp_path):
    c = run_es(tmp_path)
    s0, s1, s2 = c.segments
    assert s0.curve[4] == [4, 0.6] and s0.peak() == (4, 0.6)
    # the paper's rule: from the peak checkpoint, next budget = peak_step + 3
    assert (s1.parent, s1.start_from, s1.start_step, s1.budget) == ("s0", "s0", 4, 7)
    assert origin(tmp_path, "s1", 4) == "s0@4"  # its first checkpoint is s0's step 4
    assert s1.curve[0] == [4, 0.6] and s1.last_step == 11  # train.steps = 4 + 7
    # s1 peaked 3 steps into it: 3 + 3
    assert (s2.start_from, s2.start_step, s2.budget) == ("s1", 7, 6)
    assert origin(tmp_path, "s2", 7) == "s1@7"
    # the copy's history restarts at its start eval; its config is dropped
    with open(os.path.join(tmp_path, "s2", "checkpoints", "7", "meta", "metadata")) as f:
        meta = json.load(f)
    # the prompt stream continues from where the rolled-back segment ended (s1's step 11)
    assert meta == {
        "history": {"eval": [{"step": 7, METRIC: 0.0}]},
        "campaign_start": "s1@7",
        "data": {"next": 11},
    }
    assert (s1.data_from, s2.data_from) == ("s0@10", "s1@11")
    assert "peaked at 0.6000 at step 4 (4 into s0); budget 4 + 3" in s1.note


def test_es_margin_is_configurable(tmp_path):
    c = run_es(tmp_path, margin=1, rounds=2)
    assert [(s.start_step, s.budget) for s in c.segments] == [(0, 10), (4, 5)]


def test_es_starts_from_the_newest_kept_checkpoint_before_the_peak(tmp_path):
    curve = lambda run, step: S0[step] if run.name == "s0" else 0.5  # noqa: E731
    launch = FakeTrainer(curve, keep_every=3)  # s0 keeps steps 3, 6, 9
    c = run_es(tmp_path, rounds=2, launch=launch)
    s1 = c.segments[1]
    assert (s1.start_step, s1.wanted_step, s1.budget) == (3, 4, 7)
    assert origin(tmp_path, "s1", 3) == "s0@3"
    assert "s0@3 (asked 4)" in open(os.path.join(tmp_path, SUMMARY_FILE)).read()


def test_continue_starts_each_segment_from_the_last_checkpoint(tmp_path):
    launch = FakeTrainer(lambda run, step: step / 100)
    k = keys(policy="continue", rounds=3, budget=4)
    c = run_campaign(str(tmp_path), "configs/x.py", {}, k, launch, say=len)
    assert [(s.parent, s.start_from, s.start_step, s.last_step) for s in c.segments] == [
        (None, None, 0, 4),
        ("s0", "s0", 4, 8),
        ("s1", "s1", 8, 12),
    ]
    assert origin(tmp_path, "s2", 8) == "s1@8"
    # every step trained exactly once over the whole campaign
    assert [step for _, step in launch.trained] == list(range(1, 13))


PROPOSER = """
def propose(best, history, n):
    CALLS.append((best, len(history), n))
    if best["overrides"]:  # round 2: only a worse rule is tried
        return [{"optimizer.lr": 1e-4}]
    return [{"optimizer.lr": lr} for lr in (1e-4, 3e-4, 1e-3)]

CALLS = []
"""


def rule_curve(run, step):
    """s0 peaks at 0.5 at step 2; a trial moves by a gain per step set by its lr, from 0.5
    at step 2 in round 1, from 0.6 at step 4 later."""
    if run.name == "s0":
        return {0: 0.1, 1: 0.3, 2: 0.5, 3: 0.4, 4: 0.2}[step]
    gain = {1e-4: -0.05, 3e-4: 0.05, 1e-3: 0.02}[dict(run.overrides)["optimizer.lr"]]
    start, base = (2, 0.5) if run.name in ("s1", "s2", "s3") else (4, 0.6)
    return base + (step - start) * gain


def test_rule_search_keeps_the_best_of_n_by_held_out_eval(tmp_path):
    path = tmp_path / "rules.py"
    path.write_text(PROPOSER)
    k = keys(policy="rule_search", rounds=4, budget=4)
    k.rule_search.update(propose=f"{path}:propose", n=3, budget=2)
    c = run_campaign(str(tmp_path / "c"), "configs/x.py", {}, k, FakeTrainer(rule_curve), len)
    s0, *trials = c.segments
    # round 1: three trials from s0's best checkpoint (step 2), 2 steps each
    assert [(t.round, t.start_from, t.start_step, t.budget) for t in trials[:3]] == [
        (1, "s0", 2, 2)
    ] * 3
    assert [t.overrides for t in trials[:3]] == [{"optimizer.lr": v} for v in (1e-4, 3e-4, 1e-3)]
    assert [t.peak() for t in trials[:3]] == [(2, 0.5), (4, pytest.approx(0.6)), (4, 0.54)]
    # round 2 starts from the best: s2 (lr 3e-4) at step 4; its trial inherits lr and is worse
    s4, s5 = trials[3:]
    assert (s4.round, s4.parent, s4.start_step, s4.config_overrides) == (
        2,
        "s2",
        4,
        {"optimizer.lr": 1e-4},
    )
    assert s4.inherited == {"optimizer.lr": 3e-4} and s4.peak() == (4, pytest.approx(0.6))
    # no trial beat s2@4: round 3 starts from it again
    assert (s5.round, s5.parent, s5.start_step) == (3, "s2", 4)
    best = c.best()
    assert (best["segment"], best["step"], best["value"]) == ("s2", 4, pytest.approx(0.6))
    calls = load_function(f"{path}:propose", key="k").__globals__["CALLS"]
    assert [(b["segment"], h, n) for b, h, n in calls] == [("s0", 1, 3), ("s2", 4, 3), ("s2", 5, 3)]
    assert "campaign best (step 4)" in open(os.path.join(c.root, SUMMARY_FILE)).read()


@pytest.mark.parametrize(
    "body, message",
    [
        (
            "def propose(best, history, n):\n    return [{'train.steps': 3}]\n",
            "set by the campaign",
        ),
        ("def propose(best, history, n):\n    return [{'a': [1]}]\n", "a=\\[1\\] is a list"),
        (
            "def propose(best, history, n):\n    return [{}] * 9\n",
            "more than campaign.rule_search.n=3",
        ),
        ("x = 1\n", "defines no function 'propose'"),
    ],
)
def test_rule_search_proposer_errors_name_the_key(tmp_path, body, message):
    path = tmp_path / f"p{abs(hash(body))}.py"
    path.write_text(body)
    k = keys(policy="rule_search", rounds=2, budget=2)
    k.rule_search.update(propose=f"{path}:propose", n=3)
    with pytest.raises(CampaignError, match=message) as err:
        run_campaign(str(tmp_path / "c"), "configs/x.py", {}, k, FakeTrainer(rule_curve), len)
    assert "campaign.rule_search.propose" in str(err.value)


def test_settings_errors_name_the_key(tmp_path):
    fake = FakeTrainer(lambda run, step: 0.0)
    with pytest.raises(UnknownNameError, match="'campaign.policy'.*Did you mean 'es'"):
        run_campaign(str(tmp_path), "configs/x.py", {}, keys(policy="esx"), fake, len)
    with pytest.raises(CampaignError, match="'campaign.es.margin' must be an integer >= 1"):
        k = keys(policy="es")
        k.es.margin = 0
        run_campaign(str(tmp_path), "configs/x.py", {}, k, fake, len)
    for key in ("train.steps", "train.horizon"):
        with pytest.raises(CampaignError, match=f"{key} is set by the campaign"):
            run_campaign(str(tmp_path), "configs/x.py", {key: 5}, keys(), fake, len)
    with pytest.raises(CampaignError, match="'campaign.horizon' must be an int >= 0, got -1"):
        run_campaign(str(tmp_path), "configs/x.py", {}, keys(horizon=-1), fake, len)
    assert fake.trained == []
    # es without an eval curve: names the metric and the segment's workdir
    k = keys(policy="es", rounds=2, budget=2, metric="eval/none")
    with pytest.raises(CampaignError, match="s0 .*no eval of 'eval/none'"):
        run_campaign(str(tmp_path / "c"), "configs/x.py", {}, k, fake, len)
    # the same root with other settings
    with pytest.raises(CampaignError, match=r"campaign.metric: 'eval/none' -> 'eval/pass@1"):
        run_campaign(str(tmp_path / "c"), "configs/x.py", {}, keys(policy="es"), fake, len)


def test_every_segment_gets_the_horizon_fixed_when_the_campaign_started(tmp_path):
    """train.horizon = campaign.horizon, or rounds x budget as the campaign starts: growing
    rounds later to extend the campaign moves no schedule."""
    fake = FakeTrainer(table(ES_LONG))
    seen = []
    launch = lambda runs: (seen.extend(dict(r.overrides) for r in runs), fake(runs))[1]  # noqa: E731
    run_campaign(
        str(tmp_path), "configs/x.py", {}, keys(policy="es", rounds=2, budget=10), launch, len
    )
    run_campaign(
        str(tmp_path), "configs/x.py", {}, keys(policy="es", rounds=4, budget=10), launch, len
    )
    assert len(seen) == 4 and {o["train.horizon"] for o in seen} == {20}
    assert Campaign.load(str(tmp_path)).keys["horizon"] == 20
    with pytest.raises(CampaignError, match=r"campaign.horizon: 20 -> 50"):
        run_campaign(str(tmp_path), "configs/x.py", {}, keys(policy="es", horizon=50), launch, len)
    seen.clear()
    run_campaign(
        str(tmp_path / "b"), "configs/x.py", {}, keys(rounds=1, budget=10, horizon=7), launch, len
    )
    assert [o["train.horizon"] for o in seen] == [7]


# ============================================================================ resume


def test_resume_after_a_kill_reruns_no_finished_segment_and_gives_the_same_tree(tmp_path):
    whole = run_es(tmp_path / "whole", rounds=4, launch=FakeTrainer(table(ES_LONG)))
    killer = FakeTrainer(table(ES_LONG), kill_at=("s2", 9))
    with pytest.raises(Killed):
        run_es(tmp_path / "cut", rounds=4, launch=killer)
    state = Campaign.load(str(tmp_path / "cut"))
    assert [s.status for s in state.segments] == ["done", "done", "planned"]
    again = FakeTrainer(killer.value)
    cut = run_es(tmp_path / "cut", rounds=4, launch=again)
    # s0 and s1 are not trained again; s2 resumes after its step-9 checkpoint
    assert again.trained[0] == ("s2", 10) and {n for n, _ in again.trained} == {"s2", "s3"}
    assert origin(tmp_path / "cut", "s2", 7) == "s1@7"  # its start was not copied again
    rows = lambda c: [{**s.row(), "error": ""} for s in c.segments]  # noqa: E731
    assert rows(cut) == rows(whole) and len(rows(cut)) == 4
    # a finished campaign run again trains nothing; more rounds extend it
    idle = FakeTrainer(killer.value)
    assert len(run_es(tmp_path / "cut", rounds=4, launch=idle).segments) == 4
    assert idle.trained == []
    assert len(run_es(tmp_path / "cut", rounds=5, launch=idle).segments) == 5


def test_summary_table_shows_the_tree(tmp_path):
    c = run_es(tmp_path)
    text = open(os.path.join(tmp_path, SUMMARY_FILE)).read()
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    head = [x.strip() for x in lines[0].strip("|").split("|")]
    assert head == [
        "segment",
        "parent",
        "round",
        "start",
        "budget",
        "steps",
        "overrides",
        f"best {METRIC}",
        "outcome",
        "note",
    ]
    rows = [[x.strip() for x in line.strip("|").split("|")] for line in lines[2:]]
    assert [r[:6] for r in rows] == [
        ["s0", "-", "0", "init@0", "10", "0-10"],
        ["s0/s1", "s0", "1", "s0@4, prompts from s0@10", "7", "4-11"],
        ["s0/s1/s2", "s1", "2", "s1@7, prompts from s1@11", "6", "7-13"],
    ]
    assert [r[7] for r in rows] == ["0.6000 @ 4", "0.7500 @ 7", "0.7500 @ 7"]
    assert rows[1][8] == "done, campaign best (step 7)" and rows[0][8] == "done"
    saved = json.load(open(os.path.join(tmp_path, STATE_FILE)))
    assert [s["id"] for s in saved["segments"]] == ["s0", "s1", "s2"] == c.ids()


def test_cli_summary_and_errors(tmp_path, capsys):
    run_es(tmp_path / "c")
    spec = importlib.util.spec_from_file_location("campaign_cli", f"{REPO}/scripts/campaign.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli.main(["campaign.py", "summary", str(tmp_path / "c")]) == 0
    assert "| s0/s1 | s0 | 1 | s0@4, prompts from s0@10 | 7 |" in capsys.readouterr().out
    one_line = (
        "--campaign.polcy=es: no config key 'campaign.polcy'; did you mean 'campaign.policy'?"
    )
    with pytest.raises(SystemExit, match=re.escape(f"campaign error: {one_line}")):
        cli.main(["campaign.py", "run", "--config=configs/grpo_arith.py", "--campaign.polcy=es"])
    with pytest.raises(SystemExit, match="campaign error: .*no campaign here"):
        cli.main(["campaign.py", "summary", str(tmp_path / "none")])


# ============================================================================ real runs

TINY = {
    "mesh.num_devices": 1,
    "task.kwargs.max_digits": 1,
    "task.kwargs.prompt_template": "{a}{op}{b}=",
    "data.max_prompt_len": 5,
    "data.prompt_batch": 4,
    "rollout.max_new_tokens": 3,
    "rollout.group_size": 4,
    "train.minibatches": 1,
    "train.log_every": 1,
    "train.eval_every": 1,
    "train.checkpoint_every": 1,
    "train.keep_checkpoints": 10,
    "train.rollout_log_every": 1,
    "eval.at_start": True,
    "eval.num_prompts": 4,
    "eval.batch": 4,
    "eval.pass_k": 1,
}

if "test_from_step_1" not in POLICIES:

    @POLICIES.register("test_from_step_1")
    def _from_step_1(keys):
        """Segments from the root's step-1 checkpoint for 2 steps: the first as it stands, the
        second with the prompt stream of the root's step 3."""
        return lambda c: [Proposal("s0", 1, 2, data_step=3 if len(c.segments) > 1 else None)]


def _state(root, seg, step):
    import orbax.checkpoint as ocp

    path = os.path.join(root, seg, "checkpoints", str(step), "state")
    return ocp.StandardCheckpointer().restore(path)


def test_two_real_segments_the_second_from_a_chosen_checkpoint(tmp_path):
    """s0 trains 3 steps; s1 starts from s0's step-1 checkpoint (not its last) and trains
    steps 2-3 with the same config: its start is that checkpoint (the trainer resumed from
    it), and its step 2 repeats s0's step 2 (same weights, optimizer state, RNG, prompts).
    s2 starts there too with the prompt stream of s0's step 3: other prompts at step 2."""
    import numpy as np

    root = str(tmp_path)
    k = keys(policy="test_from_step_1", rounds=3, budget=3)
    launch = lambda runs: launch_local(runs, say=len, inprocess=True)  # noqa: E731
    # a schedule with steps=0 spans the campaign's horizon (rounds x budget = 9) in every
    # segment, so a resumed segment follows the same curve
    overrides = {**TINY, "schedules.rollout.temperature": "linear(1.0, 0.1)"}
    c = run_campaign(root, "configs/grpo_arith.py:runlocal", overrides, k, launch, say=len)
    s0, s1, s2 = c.segments
    assert [s.status for s in c.segments] == ["done"] * 3, [s.error for s in c.segments]
    assert (s1.start_from, s1.start_step, s1.last_step) == ("s0", 1, 3)
    assert s0.checkpoints == [1, 2, 3] and s1.checkpoints == [1, 2, 3]
    log = open(os.path.join(root, "s1", "sweep.log")).read()
    assert f"resumed from step 1 ({os.path.join(root, 's1', 'checkpoints')})" in log
    rows = lambda seg: [json.loads(x) for x in open(os.path.join(root, seg, "metrics.jsonl"))]  # noqa: E731
    train = lambda seg: {r["step"]: r for r in rows(seg) if "train/loss" in r}  # noqa: E731
    assert sorted(train("s1")) == [2, 3]
    temperature = lambda seg: {  # noqa: E731
        s: r["schedule/rollout.temperature"] for s, r in train(seg).items()
    }
    assert temperature("s0") == pytest.approx({s: 1.0 - 0.9 * (s - 1) / 9 for s in (1, 2, 3)})
    assert temperature("s1") == {s: temperature("s0")[s] for s in (2, 3)}
    for key in ("train/loss", "reward/total", "train/grad_norm"):
        assert train("s1")[2][key] == pytest.approx(train("s0")[2][key], rel=1e-5, abs=1e-7)
    # the start checkpoint is s0's step 1; after one step the weights agree with s0's step 2
    for step in (1, 2):
        a, b = _state(root, "s0", step), _state(root, "s1", step)
        assert int(a["step"]) == int(b["step"]) == step
        for x, y in zip(
            __import__("jax").tree.leaves(a["params"]), __import__("jax").tree.leaves(b["params"])
        ):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
    # s2: the same start, the prompt stream where s0 was at step 3
    assert (s2.start_from, s2.start_step, s2.data_from) == ("s0", 1, "s0@3")
    meta = json.load(open(os.path.join(root, "s2", "checkpoints", "1", "meta", "metadata")))
    s0_meta = json.load(open(os.path.join(root, "s0", "checkpoints", "3", "meta", "metadata")))
    assert (
        meta["data"]
        == s0_meta["data"]
        != json.load(open(os.path.join(root, "s0", "checkpoints", "1", "meta", "metadata")))["data"]
    )
    prompts = lambda seg: {  # noqa: E731
        json.loads(x)["prompt"]
        for x in open(os.path.join(root, seg, "rollouts.jsonl"))
        if json.loads(x)["step"] == 2
    }
    assert prompts("s1") == prompts("s0") != prompts("s2")
