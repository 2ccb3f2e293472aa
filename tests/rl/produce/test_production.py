"""rl/produce/production.py: a Production hands its producer the weights, version, sampling
values and source it was set up with; a process-local producer's job is its draw and the
finish its finish, another's job the whole produce; info carries the sampling values."""

from jaxrl_frontier.rl.produce.production import Production


class ScriptedProducer:
    """Records each call; draw / produce return what they were given."""

    def __init__(self, local: bool):
        self.local, self.calls = local, []

    def draw(self, examples, weights, key, **options):
        self.calls.append(("draw", examples, weights, key, options))
        return ("drawn", examples, key)

    def finish(self, drawn, weights):
        self.calls.append(("finish", drawn, weights))
        return f"exp of {drawn[1]}", {"n_failed": 0}

    def produce(self, examples, weights, key, **options):
        self.calls.append(("produce", examples, weights, key, options))
        return f"exp of {examples}", {"n_failed": 0}


WEIGHTS = {"policy": "p@3", "reference": None, "teacher": None}


def test_a_process_local_producer_draws_in_the_job_and_finishes_after():
    producer = ScriptedProducer(local=True)
    job, finish = Production(producer, WEIGHTS, 3, {"temperature": 0.7}, "src").job("k1")
    drawn = job(["a", "b"])
    assert producer.calls == [
        (
            "draw",
            ["a", "b"],
            WEIGHTS,
            "k1",
            dict(version=3, source="src", sampling={"temperature": 0.7}),
        )
    ]
    assert finish(drawn) == ("exp of ['a', 'b']", {"n_failed": 0, "knobs": {"temperature": 0.7}})
    assert producer.calls[-1] == ("finish", drawn, WEIGHTS)


def test_another_producer_produces_in_the_job_and_the_finish_hands_it_on():
    producer = ScriptedProducer(local=False)
    production = Production(producer, WEIGHTS, 5, {})
    job, finish = production.job("k2")
    out = job(["c"])
    # no moving sampling keys: no `sampling` option, info['knobs'] is {}
    assert producer.calls == [("produce", ["c"], WEIGHTS, "k2", dict(version=5, source=None))]
    assert finish(out) is out and out == ("exp of ['c']", {"n_failed": 0, "knobs": {}})
    # the record is fixed: a second job samples with another key over the same weights
    job(["d"])
    production.job("k3")[0](["e"])
    assert [c[3] for c in producer.calls] == ["k2", "k2", "k3"]
