"""The repository speaks of the project, never of its own making: no tracked file names the
work sessions, tickets or contributor notes it came from (history lives in `git log`)."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Spelled in pieces so that this file does not match itself.
PHRASES = [  # case-insensitive
    r"\bsess" + r"ion \d+",
    r"\bthis sess" + r"ion\b",
    r"\bthe iss" + r"ue\b",
    r"\bthe next one sh" + r"ould\b",
    r"\.\./sha" + r"red\b",
    r"\bsee" + r"ds/",
]
FILES = ["DES" + "IGN.md", "FORM" + "ULAS.md"]  # case-sensitive: docs/design.md is fine
PATTERN = re.compile("|".join(PHRASES), re.I)
FILE_PATTERN = re.compile("|".join(re.escape(f) for f in FILES))


def history_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each line of `text` that speaks of the project's history."""
    return [
        (i, line)
        for i, line in enumerate(text.splitlines(), 1)
        if PATTERN.search(line) or FILE_PATTERN.search(line)
    ]


def test_the_patterns_catch_history_words():
    bad = [
        "measured in sess" + "ion 9",
        "what This Sess" + "ion could not do",
        "as the iss" + "ue asks",
        "the next one sh" + "ould rerun it",
        "see ../sha" + "red/notes",
        "papers in see" + "ds/list.txt",
        "from DES" + "IGN.md",
        "written from FORM" + "ULAS.md",
    ]
    assert [i for i, _ in history_lines("\n".join(bad))] == list(range(1, len(bad) + 1))
    fine = ["docs/design.md explains it", "an issue of memory", "seed=3 in the config"]
    assert history_lines("\n".join(fine)) == []


def test_no_tracked_file_speaks_of_its_history():
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    found = []
    for name in filter(None, files):
        path = ROOT / name
        if not path.is_file():  # deleted in the working tree, not yet committed
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # binary
            continue
        found += [f"{name}:{i}: {line.strip()[:120]}" for i, line in history_lines(text)]
    assert not found, "history words in tracked files:\n" + "\n".join(found)


def test_gitignore_ignores_no_tracked_file():
    ignored = subprocess.run(
        ["git", "ls-files", "-ci", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert ignored == [], f".gitignore matches tracked files: {ignored}"
