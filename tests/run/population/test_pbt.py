"""Population-based training's rules (run/population/pbt.py) by hand: the plan ranks the members and
draws the copies reproducibly, the options' checks name their keys, and when a PBT step is
due. (PBT through a population run: test_population.py.)"""

import ml_collections
import pytest

from jaxrl_frontier.core.errors import ConfigError
from jaxrl_frontier.run.config import schema
from jaxrl_frontier.run.population import pbt


def test_pbt_plan_ranks_and_draws_reproducibly():
    options = pbt.PBTOptions(every=2, metric="m", fraction=0.5, factors=(0.5, 2.0), seed=7)
    scores, values = [0.3, 0.1, 0.9, 0.5], [{"k": 1.0}, {"k": 2.0}, {"k": 3.0}, {"k": 4.0}]
    got = pbt.plan(options, 4, scores, values)
    assert [(r["member"], r["copied_from"] in (2, 3)) for r in got] == [(0, True), (1, True)]
    for r in got:
        assert r["values"]["k"] / values[r["copied_from"]]["k"] in (0.5, 2.0)
    assert got == pbt.plan(options, 4, scores, values)  # the same draws on a resume


def test_the_plan_of_a_single_bottom_member_by_hand():
    options = pbt.PBTOptions(every=2, metric="m", fraction=0.25, factors=(3.0,), seed=0)
    scores = [0.2, 0.8, 0.1, 0.5]  # k = 1: the best (1) is copied into the worst (2)
    (row,) = pbt.plan(options, 6, scores, [{"k": 1.0}, {"k": 0.1}, {"k": 7.0}, {"k": 2.0}])
    assert row == dict(
        step=6,
        member=2,
        copied_from=1,
        score=0.1,
        source_score=0.8,
        values_before={"k": 7.0},
        values={"k": pytest.approx(0.3)},
    )


def config(**pbt_keys):
    c = ml_collections.ConfigDict(dict(seed=3, train=dict(eval_every=2)))
    c.population = dict(pbt=schema.section(pbt.PBTSection))
    c.population.pbt.update(pbt_keys)
    return c


def test_the_options_check_their_keys_and_say_when_a_step_is_due():
    options = pbt.PBTOptions.from_config(config(every=4))
    assert options == pbt.PBTOptions(4, "eval/pass@1_greedy", 0.25, (0.8, 1.25), 3)
    assert [s for s in range(10) if options.due(s, 8)] == [4]  # not at 0 nor the last step
    assert not pbt.PBTOptions.from_config(config()).due(4, 8)  # every = 0: off
    for keys, words in [
        (dict(every=3), "'population.pbt.every' = 3.*multiple of train.eval_every"),
        (dict(fraction=0.6), "'population.pbt.fraction' = 0.6"),
        (dict(factors=(1.0, -1.0)), "'population.pbt.factors'"),
    ]:
        with pytest.raises(ConfigError, match=words):
            pbt.PBTOptions.from_config(config(**keys))
