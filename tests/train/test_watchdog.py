"""The watchdog (train/watchdog.py) in one process: a hang's stacks file and line, the phase
markers, a lost process's line. (The stop agreement: test_stopping.py.) The same pieces on
real runs: tests/train/test_reliability.py (a hang), tests/run/test_multihost.py (a lost
process)."""

import threading
import time

from jaxrl_frontier.train import watchdog as wd


def test_a_step_past_the_timeout_dumps_every_thread_and_names_the_phase(tmp_path):
    said, exits, hung = [], [], threading.Event()

    def leave(code):
        exits.append(code)
        hung.set()

    dog = wd.Watchdog(tmp_path, hang_timeout_s=0.2, poll_s=0.02, say=said.append, exit=leave)
    dog.start()
    started = time.monotonic()  # before step 4's clock starts: the wait is at least 0.2 s
    dog.after_step(3)  # step 4's clock: 0.2 s
    scorer = dog.marked(lambda: hung.wait(5), "scoring")
    with dog.phase("rollout"):
        scorer()  # returns once the watchdog fired
    took = time.monotonic() - started
    dog.close()
    stacks = tmp_path / "hang-0.txt"
    assert exits == [wd.EXIT_HANG] and 0.2 <= took < 2.0
    assert said == [
        "hang: step 4 (phase: scoring) ran past train.hang_timeout_s=0.2 s on process 0; "
        f"every thread's stack is in {stacks}"
    ]
    text = stacks.read_text()
    assert text.startswith("step 4 (phase: scoring) overran train.hang_timeout_s=0.2\n")
    assert "test_watchdog.py" in text and "watchdog.py" in text  # the main and its own thread
    assert dog.current_phase == "rollout"  # markers nest


def test_a_step_within_the_timeout_is_not_a_hang_and_the_first_step_gets_more(tmp_path):
    exits = []
    dog = wd.Watchdog(tmp_path, hang_timeout_s=0.5, poll_s=0.01, exit=exits.append)
    dog.start()
    time.sleep(1.0)  # the first step (compiles): FIRST_STEP_FACTOR x the timeout
    for step in range(1, 4):
        time.sleep(0.05)
        dog.after_step(step)
    dog.close()
    assert exits == [] and not (tmp_path / "hang-0.txt").exists()


def test_a_lost_process_is_one_line_naming_it_and_the_step(tmp_path, monkeypatch):
    """Process 2's heartbeat stops moving: once it has not for heartbeat_timeout_s, the
    watchdog says so in one line and exits; a moving one is never lost."""
    said, exits, published = [], [], {}
    dog = wd.Watchdog(
        tmp_path,
        process_count=3,
        heartbeat_timeout_s=0.3,
        poll_s=0.05,
        say=said.append,
        exit=exits.append,
    )
    ticks = [0]

    def heartbeats():
        ticks[0] += 1
        return {0: published.get(0), 1: str(ticks[0]), 2: "5"}  # process 2 froze

    monkeypatch.setattr(wd.distributed, "beat", lambda count: published.update({0: str(count)}))
    monkeypatch.setattr(wd.distributed, "heartbeats", heartbeats)
    dog.after_step(7)
    dog.on_error(wait_s=0.1)  # within the timeout: not lost yet, the error is returned
    assert exits == [] and published[0] == str(dog._beats)
    with dog.phase("save"):
        dog.on_error(wait_s=2.0)
    assert exits == [wd.EXIT_LOST_PROCESS]
    assert said == [
        "lost process 2 of 3 during step 8 (phase: save): it died or was silent past "
        "distributed.heartbeat_timeout_s=0.3; process 0 exits (resume from the last checkpoint)"
    ]
