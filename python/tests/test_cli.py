"""The command's own parts (cli.py): `threadheap --version`, and bench's one line when rich or matplotlib is
missing."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from threadheap import cli

REPO = Path(__file__).resolve().parents[2]
LIB = Path(os.environ.get("TH_BUILD_DIR") or REPO / "build") / "libthreadheap.so"


def header_version():
    text = (REPO / "include" / "threadheap.h").read_text()
    return ".".join(re.search(rf"#define TH_VERSION_{part} +(\d+)", text).group(1)
                    for part in ("MAJOR", "MINOR", "PATCH"))


@pytest.mark.skipif(not LIB.is_file(), reason="needs a build of the library")
def test_version_is_the_library_s_and_the_header_s():
    # THREADHEAP_SHOW_STATS would make the loaded library print its counters at exit: the command drops it.
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), TH_LIB=str(LIB), THREADHEAP_SHOW_STATS="1")
    proc = subprocess.run([sys.executable, "-m", "threadheap", "--version"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"threadheap {header_version()}\n", "")


def test_bench_without_rich_or_matplotlib_is_one_line(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rich" else real(name, *a))
    assert cli.main(["bench", "--smoke"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs the Python package rich:" in err
    assert "apt-get install python3-rich" in err


def test_bench_help_needs_neither(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert cli.missing_for_bench(["--help"]) is None
