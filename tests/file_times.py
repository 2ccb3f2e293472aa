"""A pytest plugin that appends each test file's seconds (setup, call and teardown of its
tests, summed) to the file named by JAXRL_FILE_TIMES, one JSON line a file: how
tests/run_files.py reports the slowest files when several share one process.

    JAXRL_FILE_TIMES=times.jsonl pytest -p file_times tests/core   # tests/ on sys.path
"""

import collections
import json
import os

_seconds: collections.Counter = collections.Counter()


def pytest_runtest_logreport(report):
    _seconds[report.nodeid.split("::")[0]] += report.duration


def pytest_sessionfinish(session):
    path = os.environ.get("JAXRL_FILE_TIMES")
    if not path:
        return
    with open(path, "a") as f:
        for name, seconds in _seconds.items():
            f.write(json.dumps({"file": name, "seconds": round(seconds, 2)}) + "\n")
