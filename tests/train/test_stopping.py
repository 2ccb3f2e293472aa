"""The stop agreement (train/stopping.py) in one process: a signal's stop after the step, the
local-only mode, and the answer when another process (a stubbed all-gather) was signalled.
SIGTERM to one of two real processes: tests/run/test_multihost.py."""

import signal

from jaxrl_frontier.core import distributed
from jaxrl_frontier.train.stopping import StopAgreement


def test_a_signal_is_a_stop_after_the_step_and_agree_false_keeps_it_local():
    stop = StopAgreement()
    try:
        assert not stop.agreed(1)
        signal.raise_signal(signal.SIGTERM)
        assert stop.requested and stop.agreed(2)
        assert (stop.signal_name, stop.stopped_at) == ("SIGTERM", 2)
    finally:
        stop.close()
    stop = StopAgreement(agree=False)
    try:
        signal.raise_signal(signal.SIGINT)
        assert stop.after_step(5) and stop.signal_name == "SIGINT"
    finally:
        stop.close()


def test_a_signal_on_another_process_stops_this_one_and_names_it(monkeypatch):
    seen = []

    def gather(value):  # three processes; process 2 got SIGINT, process 1 SIGTERM
        seen.append(value)
        return [value, 0, 0] if len(seen) == 1 else [value, int(signal.SIGTERM), int(signal.SIGINT)]

    monkeypatch.setattr(distributed, "gather_ints", gather)
    stop = StopAgreement()
    try:
        assert not stop.agreed(3) and not stop.requested
        assert stop.agreed(4) and stop.requested  # this process was never signalled
        assert (stop.signal_name, stop.stopped_at) == ("SIGTERM on process 1", 4)
        assert seen == [0, 0]  # it contributed no request of its own
    finally:
        stop.close()
