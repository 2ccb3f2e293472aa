"""How long each test file takes, for the order files start in (tests/run_files.py runs N
processes at a time, so a long file started last would run alone at the end).

`FILE_SECONDS`: each file's tests' seconds in a full run (repo-relative path -> seconds), as
`python tests/run_files.py --record-times` wrote them to tests/file_seconds.json; a file
not in it counts as `UNKNOWN_SECONDS`. `SLOW_FILES_FIRST`: the file names, longest first.
"""

import json
import os

_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "file_seconds.json")
UNKNOWN_SECONDS = 5.0

FILE_SECONDS: dict[str, float] = {}
if os.path.exists(_PATH):
    with open(_PATH) as f:
        FILE_SECONDS = json.load(f)

SLOW_FILES_FIRST = tuple(
    os.path.basename(p) for p in sorted(FILE_SECONDS, key=lambda p: -FILE_SECONDS[p])
)


def seconds(path: str) -> float:
    """A file's expected seconds (`path` repo-relative, as in FILE_SECONDS)."""
    return FILE_SECONDS.get(path, UNKNOWN_SECONDS)
