"""core/host_memory.py: when an entry point restarts itself with huge pages, and that the
restart is the same process (its pid) under the new environment."""

import os
import subprocess
import sys
import textwrap

import pytest

from jaxrl_frontier.core.host_memory import TUNABLE, huge_page_env, thp_mode, without_huge_pages

NEW = (2, 36)


def test_huge_page_env_asks_for_huge_pages_only_where_it_changes_something():
    env = huge_page_env({"PATH": "/bin"}, "madvise", NEW)
    assert env == {"PATH": "/bin", "GLIBC_TUNABLES": TUNABLE, "THP_MEM_ALLOC_ENABLE": "1"}
    # other tunables are kept, torch's switch as the caller set it
    env = huge_page_env(
        {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "THP_MEM_ALLOC_ENABLE": "0"}, "madvise", NEW
    )
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{TUNABLE}"
    assert env["THP_MEM_ALLOC_ENABLE"] == "0"
    for environ, mode, glibc in [
        ({"JAXRL_HUGE_PAGES": "0"}, "madvise", NEW),  # turned off
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", NEW),  # the caller's choice
        ({}, "always", NEW),  # every large mapping gets huge pages already
        ({}, "never", NEW),
        ({}, None, NEW),  # no THP (or not Linux)
        ({}, "madvise", (2, 34)),  # a glibc without the tunable
        ({}, "madvise", None),  # not glibc (musl)
    ]:
        assert huge_page_env(environ, mode, glibc) is None, (environ, mode, glibc)


def test_without_huge_pages_removes_only_what_huge_page_env_added():
    env = huge_page_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "X": "1"}, "madvise", NEW)
    plain = without_huge_pages(env)
    assert plain == {
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=2",
        "X": "1",
        "JAXRL_HUGE_PAGES": "0",
    }
    assert huge_page_env(plain, "madvise", NEW) is None  # an entry point leaves it so


@pytest.mark.parametrize(
    "text, mode", [("always [madvise] never\n", "madvise"), ("[always] madvise never", "always")]
)
def test_thp_mode_reads_the_bracketed_mode(tmp_path, text, mode):
    path = tmp_path / "enabled"
    path.write_text(text)
    assert thp_mode(str(path)) == mode
    assert thp_mode(str(tmp_path / "absent")) is None


def test_the_restart_is_the_same_process_with_the_tunable_set():
    """A child that sees a 'madvise' kernel and glibc 2.36 restarts once (the second run finds
    the tunable set and goes on), keeping its pid and its command line."""
    code = textwrap.dedent(
        """
        import os, sys
        from jaxrl_frontier.core import host_memory as h
        h.thp_mode, h.glibc_version = (lambda: "madvise"), (lambda: (2, 36))
        print(os.getpid(), os.environ.get("GLIBC_TUNABLES", ""), sys.argv[1:], flush=True)
        h.restart_with_huge_pages()
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "JAXRL_HUGE_PAGES")}
    out = subprocess.run(
        [sys.executable, "-c", code, "arg"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 2, out.stdout
    (pid0, rest0), (pid1, rest1) = (line.split(" ", 1) for line in lines)
    assert pid0 == pid1
    assert rest0 == " ['arg']" and rest1 == f"{TUNABLE} ['arg']"
