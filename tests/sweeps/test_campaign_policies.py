"""Campaign policies (sweeps/campaign_policies.py) on hand-made trees, without a launcher:
where continue, es and rule_search start the next segment and with what budget, their
settings' errors, and loading the rule-search proposer."""

import pytest

from jaxrl_frontier.sweeps.campaign_policies import (
    POLICIES,
    continue_policy,
    early_stop_policy,
    load_function,
    rule_search_policy,
)
from jaxrl_frontier.sweeps.campaign_tree import Campaign, CampaignError, Proposal, Segment

METRIC = "eval/pass@1_greedy"


def keys(**kw):
    k = dict(policy="es", rounds=3, budget=20, horizon=0, metric=METRIC, es=dict(margin=3))
    k["rule_search"] = dict(propose="", n=2, budget=0)
    k.update(kw)
    return k


def campaign(root, curve, last_step=None) -> Campaign:
    """s0 -> s1: s1 started at s0@4 with budget 6 (steps 4..10), its eval `curve`."""
    c = Campaign(str(root), {"campaign": keys()})
    c.segments = [
        Segment("s0", None, 0, 4, status="done", curve=[[4, 0.3]], checkpoints=[4]),
        Segment(
            "s1",
            "s0",
            1,
            6,
            start_from="s0",
            start_step=4,
            status="done",
            curve=curve,
            checkpoints=[6, 8, 10],
            last_step=last_step,
            overrides={"optimizer.lr": 0.5},
        ),
    ]
    return c


def test_the_registry_names_the_three_policies():
    assert {"continue", "es", "rule_search"} <= set(POLICIES.names())


def test_continue_starts_from_the_last_step(tmp_path):
    propose = continue_policy(keys(budget=5))
    c = campaign(tmp_path, [[4, 0.3]])
    assert propose(c) == [Proposal("s1", 10, 5, note="continue from s1@10")]  # planned end
    c.segments[1].last_step = 8  # stopped early (its collapse stop)
    assert propose(c)[0].step == 8


def test_es_rolls_forward_the_peak_with_margin(tmp_path):
    propose = early_stop_policy(keys(es=dict(margin=2)))
    c = campaign(tmp_path, [[4, 0.3], [6, 0.6], [8, 0.6], [10, 0.2]], last_step=10)
    (p,) = propose(c)
    # first peak at step 6: 2 steps into s1, budget 2 + margin 2; prompts from s1's end
    assert (p.parent, p.step, p.budget, p.data_step) == ("s1", 6, 4, 10)
    assert p.note == f"es: {METRIC} peaked at 0.6000 at step 6 (2 into s1); budget 2 + 2"
    with pytest.raises(CampaignError, match=r"segment s1 \(.*s1\): no eval of"):
        propose(campaign(tmp_path, []))


def write_proposer(tmp_path, body, name="rules.py"):
    path = tmp_path / name
    path.write_text(body)
    return f"{path}:propose"


def test_rule_search_tries_the_proposers_sets_from_the_best(tmp_path):
    spec = write_proposer(
        tmp_path,
        "def propose(best, history, n):\n"
        "    lr = best['overrides']['optimizer.lr']\n"
        "    return [{'optimizer.lr': lr * (i + 2)} for i in range(n)] + [{}] * (len(history) - 2)\n",
    )
    propose = rule_search_policy(keys(rule_search=dict(propose=spec, n=2, budget=3)))
    c = campaign(tmp_path, [[4, 0.3], [6, 0.4], [8, 0.9], [10, 0.1]])
    a, b = propose(c)
    assert (a.parent, a.step, a.budget, a.overrides) == ("s1", 8, 3, {"optimizer.lr": 1.0})
    assert b.overrides == {"optimizer.lr": 1.5}
    assert b.note == f"trial 2/2 from s1@8 ({METRIC} 0.9000)"
    c.segments.append(Segment("s2", "s1", 2, 3))  # history of 3: one set too many
    with pytest.raises(CampaignError, match="3 override sets, more than campaign.rule_search.n=2"):
        propose(c)
    budget = rule_search_policy(keys(budget=7, rule_search=dict(propose=spec, n=2, budget=0)))
    assert budget(campaign(tmp_path, [[6, 0.4]]))[0].budget == 7  # 0: campaign.budget


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: continue_policy(keys(budget=0)),
            "'campaign.budget' must be an integer >= 1, got 0",
        ),
        (lambda: early_stop_policy(keys(es=dict(margin=1.5))), "'campaign.es.margin' must be"),
        (lambda: rule_search_policy(keys()), "'campaign.rule_search.propose' is empty"),
    ],
)
def test_settings_errors_name_the_key(make, message):
    with pytest.raises(CampaignError, match=message):
        make()


def test_load_function_of_a_module_or_a_file(tmp_path):
    assert load_function("os.path:join", key="k")("a", "b") == "a/b"
    spec = write_proposer(tmp_path, "def propose(best, history, n):\n    return []\n", "p.py")
    assert load_function(spec, key="k")(None, [], 1) == []
    for bad, message in [
        ("nocolon", "give MODULE:FUNCTION or FILE.py:FUNCTION"),
        (f"{tmp_path}/none.py:f", "no such file"),
        ("no_such_module_xyz:f", "No module named 'no_such_module_xyz'"),
        ("os.path:nothing_here", "os.path defines no function 'nothing_here'"),
    ]:
        with pytest.raises(CampaignError, match=f"config key 'k' = .*{message}"):
            load_function(bad, key="k")
