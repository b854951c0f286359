"""bench/live_peak.c (build/lib/liblive_peak.so): the most bytes a process held live at once, counted exactly
under any allocator, with glibc's malloc and with threadheap beneath it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TH_BUILD_DIR") or REPO / "build")
SHIM = BUILD / "lib" / "liblive_peak.so"
LIB = BUILD / "libthreadheap.so"
PAIRS = BUILD / "bin" / "pairs"
MIB = 1 << 20

needs_build = pytest.mark.skipif(not SHIM.is_file() or not LIB.is_file(), reason="needs a build")
BENEATH = [pytest.param("", id="glibc"), pytest.param(str(LIB), id="threadheap")]


def peaks(cmd, beneath):
    """Each process's line: {pid: bytes}, and the process itself."""
    env = dict(os.environ, LD_PRELOAD=f"{SHIM} {beneath}".strip(), PYTHONMALLOC="malloc")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    found = {int(pid): int(n) for pid, n in re.findall(r"^live_peak: pid (\d+): (\d+) bytes$", proc.stderr, re.M)}
    assert found, proc.stderr
    return found, proc


def python_peak(code, beneath):
    """The peak of a Python process running code (with PYTHONMALLOC=malloc, so every object is a malloc)."""
    found, proc = peaks([sys.executable, "-c", "import os, sys\n" + code + "\nprint(os.getpid())"], beneath)
    return found[int(proc.stdout.split()[-1])]


@needs_build
@pytest.mark.parametrize("beneath", BENEATH)
def test_the_peak_is_the_largest_block_held(beneath):
    small = python_peak("b = bytearray(10 << 20)\ndel b", beneath)
    large = python_peak("b = bytearray(40 << 20)\ndel b", beneath)
    # The same interpreter, a block 30 MiB larger: the peaks differ by that block (to the page it rounds to).
    assert abs((large - small) - 30 * MIB) < MIB // 4, (small, large)


@needs_build
@pytest.mark.parametrize("beneath", BENEATH)
def test_freed_blocks_leave_the_count(beneath):
    once = python_peak("b = bytearray(20 << 20)\ndel b", beneath)
    five = python_peak("for i in range(5):\n    b = bytearray(20 << 20)\n    del b", beneath)
    assert abs(five - once) < MIB // 4, (once, five)


@needs_build
@pytest.mark.parametrize("beneath", BENEATH)
def test_realloc_counts_the_block_once(beneath):
    # 48 reallocs that grow a block by 1 MiB each: the peak is the last size (and what Python over-allocates),
    # not the sum of every size it passed through (1.2 GB).
    grown = python_peak("b = bytearray()\nfor i in range(48):\n    b.extend(bytes(1 << 20))", beneath)
    base = python_peak("pass", beneath)
    assert 48 * MIB <= grown - base < 64 * MIB, (base, grown)


@needs_build
@pytest.mark.skipif(not PAIRS.is_file(), reason="needs build/bin/pairs")
@pytest.mark.parametrize("beneath", BENEATH)
def test_operator_new_is_counted_once(beneath):
    # threadheap defines operator new itself, glibc's programs get libstdc++'s, which calls malloc: a 4 MiB
    # new is counted once either way.
    found, _ = peaks([str(PAIRS), "--count", "1", "--size", str(4 * MIB), "--new"], beneath)
    (peak,) = found.values()
    assert 4 * MIB <= peak < 5 * MIB, peak
