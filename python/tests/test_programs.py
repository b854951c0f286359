"""bench/programs.py, the real programs: its allocator list (built-in names and NAME=PATH, threadheap bench's
grammar) and its two tables, time and peak RSS."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "programs.py"
LIB = Path(os.environ.get("TH_BUILD_DIR") or REPO / "build") / "libthreadheap.so"


def programs(*args):
    return subprocess.run([sys.executable, str(SCRIPT), "--lib", str(LIB), *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.skipif(not LIB.is_file(), reason="needs a build of the library")
@pytest.mark.parametrize("allocators, message", [
    ("glibc,nope", "unknown allocator 'nope'"),
    ("threadheap+profile", "unknown allocator 'threadheap+profile'"),
    ("glibc,other=/no/such/lib.so", "allocator 'other': /no/such/lib.so not found"),
    ("glibc,,threadheap", "malformed allocator list"),
])
def test_a_bad_allocator_is_one_line(allocators, message):
    proc = programs("--allocators", allocators, "--reps", "1")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("programs.py: ") and message in proc.stderr


@pytest.mark.skipif(not LIB.is_file(), reason="needs a build of the library")
def test_the_reference_must_be_run():
    proc = programs("--allocators", "glibc", "--reps", "1", "--programs", "sort")
    assert proc.returncode == 2 and "the reference threadheap is not among the allocators run" in proc.stderr


@pytest.mark.skipif(not LIB.is_file() or shutil.which("sort") is None, reason="needs the library and sort")
def test_a_named_library_is_preloaded_and_both_tables_are_printed():
    proc = programs("--allocators", f"glibc,mine={LIB}", "--ref", "glibc", "--programs", "sort", "--reps", "2",
                    "--scale", "1")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"mine {LIB.resolve()}" in out and "glibc none (the system malloc)" in out
    assert "Wall-clock seconds, median of 2" in out and "Peak RSS in MiB, median of 2" in out
    rows = re.findall(r"^\| sort --parallel \| (.*) \| (.*) \|$", out, re.M)
    assert len(rows) == 2  # one per table
    (t_glibc, t_mine), (m_glibc, m_mine) = rows
    # The reference's cells have no ratio, the other's have one.
    assert "×" not in t_glibc and "×" not in m_glibc and "×" in t_mine and "×" in m_mine
    for cell in (m_glibc, m_mine):
        median = float(cell.split()[0])
        assert 1.0 < median < 4096.0  # MiB: a real process's peak, not a count of pages or bytes
    # Each run is logged with its time and peak: two repetitions of each allocator.
    assert len(re.findall(r"^rep [12]/2 sort --parallel +mine +[0-9.]+ s +[0-9.]+ MiB$", proc.stderr, re.M)) == 2
    means = re.findall(r"^\| geometric mean \| (.*) \| (.*) \|$", out, re.M)
    assert len(means) == 2 and all(g == "×1.000" for g, _ in means)


@pytest.mark.skipif(not LIB.is_file() or shutil.which("git") is None, reason="needs the library and git")
def test_the_peak_is_the_program_s_not_the_script_s():
    # A process forked from Python would carry the script's own peak (14 MiB or more) into its ru_maxrss;
    # git's runs peak at 5-7 MiB under either allocator.
    proc = programs("--allocators", "glibc,threadheap", "--programs", "git", "--reps", "1", "--scale", "1")
    assert proc.returncode == 0, proc.stderr
    peaks = [float(m) for m in re.findall(r"^rep 1/1 git +\S+ +[0-9.]+ s +([0-9.]+) MiB$", proc.stderr, re.M)]
    assert len(peaks) == 2 and all(2.0 < m < 12.0 for m in peaks), peaks
