"""Tests of `threadheap run`: the command line and its one-line errors; the counters file's parsing; the advice
thresholds; the fault calibration (a fake workload counts its runs: measured once, reused, measured again on
another machine or with --calibrate, and "not calibrated" without it); the report on made-up numbers; and the
command end to end: --stats on a program that faults in 32 MiB blocks (the fault estimate and its advice), on
/bin/true (no advice), with the real touch workload (the calibration file written once), --record writing a
real PNG and SVG, without matplotlib, and exit statuses; --profile's command line, and end to end (a test that
needs the library's heap profiler, below).

The end-to-end tests need the built library and workloads (TH_LIB, TH_BIN_DIR, else TH_BUILD_DIR or build/)
and gcc for the faulting program; outside CI they are skipped when these are missing, in CI they fail. The
advice test depends on the machine only through a ratio (fault CPU over wall time, about 0.5 here against a
threshold of 0.2), so a machine more than twice as loaded as usual could miss it.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from exports import write_export
from threadheap import procstat, run, run_record, run_stats

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TH_BUILD_DIR", REPO / "build"))
LIB = Path(os.environ.get("TH_LIB") or BUILD / "libthreadheap.so")
BIN_DIR = Path(os.environ.get("TH_BIN_DIR") or BUILD / "bin")
MIB = 1 << 20

# Allocates, writes one byte per page and frees a 32 MiB block, argv[1] times. Under threadheap with
# THREADHEAP_PURGE_DELAY=0 (no cache) every block is fresh memory: 8,192 first-touch faults each.
LOOP_C = r"""
#include <stdlib.h>
char *volatile sink;
int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 20;
  for (int i = 0; i < n; i++) {
    char *p = malloc(32u << 20);
    if (!p) return 1;
    for (size_t off = 0; off < (32u << 20); off += 4096) p[off] = (char)i;
    sink = p;
    free(p);
  }
  return 0;
}
"""


def need(ok, msg):
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(scope="session")
def built():
    need(LIB.exists(), f"needs the built library {LIB}")
    return LIB


def build_c(tmp_path_factory, name, source, flags, why):
    """The program `name` compiled from the C text `source` with gcc `flags`; skipped (failed in CI) without gcc."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    need(gcc is not None, f"needs gcc to build {why}")
    d = tmp_path_factory.mktemp(name)
    (d / f"{name}.c").write_text(source)
    subprocess.run([gcc, *flags, "-o", str(d / name), str(d / f"{name}.c")], check=True, timeout=60)
    return str(d / name)


@pytest.fixture(scope="session")
def loop32(tmp_path_factory):
    return build_c(tmp_path_factory, "loop32", LOOP_C, ["-O2"], "the faulting program")


def seed_calibration(cache, us=2.0):
    """A valid calibration file for this machine under cache (an XDG_CACHE_HOME), so that a test that is not
    about the calibration does not pay for one."""
    path = cache / "threadheap" / "touch.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"us_per_fault": us, "runs": [us], "machine": run_stats.machine_key()}))
    return path


def run_cmd(args, cache, extra=None, timeout=60):
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADHEAP_") and k != "LD_PRELOAD"}
    env.update({"PYTHONPATH": str(REPO / "python"), "TH_LIB": str(LIB), "TH_BIN_DIR": str(BIN_DIR),
                "XDG_CACHE_HOME": str(cache)})
    env.update(extra or {})
    proc = subprocess.run([sys.executable, "-m", "threadheap", "run"] + list(args), capture_output=True,
                          text=True, env=env, timeout=timeout)
    if "cannot be preloaded" in proc.stderr:
        pytest.skip("the library could not be preloaded (being rebuilt?)")
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def advice_lines(text):
    return [line for line in text.splitlines() if line.startswith("advice: ")]


# ------------------------------------------------------------------------------------------------ command line


def test_parse_args_accepts_the_documented_forms():
    o = run.parse_args(["--stats", "--", "prog", "--stats"])
    assert o.stats and o.record is None and o.command == ["prog", "--stats"]
    o = run.parse_args(["--record", "out.png", "--record-interval", "100ms", "--", "prog"])
    assert o.record == "out.png" and o.interval == pytest.approx(0.1) and not o.stats
    o = run.parse_args(["--record=out.svg", "--record-interval=0.5", "--stats", "--", "prog"])
    assert o.record == "out.svg" and o.interval == 0.5 and o.stats
    assert run.parse_args(["--calibrate"]).calibrate
    assert run.parse_args(["--help"]).help and run.parse_args(["--stats", "-h", "--", "x"]).help


def test_profile_takes_an_optional_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    o = run.parse_args(["--profile", "--", "prog"])
    assert o.profile == str(tmp_path) and o.command == ["prog"] and not o.stats
    assert run.profile_path(o.profile, 42) == str(tmp_path / "threadheap-profile.42.pb.gz")
    o = run.parse_args(["--profile", "--stats", "--", "prog"])
    assert o.profile == str(tmp_path) and o.stats
    o = run.parse_args(["--profile", "heap.pb.gz", "--", "prog"])
    assert o.profile == str(tmp_path / "heap.pb.gz")  # absolute: the program may change its directory
    assert run.profile_path(o.profile, 42) == o.profile
    (tmp_path / "out").mkdir()
    o = run.parse_args(["--profile=out", "--", "prog"])
    assert run.profile_path(o.profile, 7) == str(tmp_path / "out" / "threadheap-profile.7.pb.gz")


@pytest.mark.parametrize("argv, message", [
    (["prog"], "missing '--' before the program 'prog'"),
    (["--stats"], "missing '--' before the program"),
    (["--stats", "--"], "no program after '--'"),
    (["--bogus", "--", "true"], "unknown option '--bogus'"),
    (["--record", "--", "true"], "--record needs a value"),
    (["--record="], "--record needs a file name"),
    (["--record", "out.txt", "--", "true"], "--record FILE must end in .png or .svg"),
    (["--record", "/nonexistent-folder/out.png", "--", "true"], "--record: no folder /nonexistent-folder"),
    (["--record-interval", "abc", "--stats", "--", "true"], "malformed --record-interval 'abc'"),
    (["--record-interval", "0", "--stats", "--", "true"], "--record-interval must be at least"),
    (["--record-interval", "-1", "--stats", "--", "true"], "--record-interval must be at least"),
    (["--record-interval", "nan", "--stats", "--", "true"], "--record-interval must be at least"),
    (["--record-interval", "1", "--", "true"], "--record-interval needs --record or --stats"),
    (["--calibrate", "--stats"], "missing '--' before the program"),
    (["--calibrate", "--profile"], "missing '--' before the program"),
    (["--profile=", "--", "true"], "--profile= needs a path"),
    (["--profile", "/nonexistent-folder/p.pb.gz", "--", "true"], "--profile: no folder /nonexistent-folder"),
    (["--profile", "prog"], "missing '--' before the program"),
])
def test_bad_arguments_are_one_line(argv, message, capsys):
    status = run.main(argv)
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith(f"threadheap run: {message}") and err.count("\n") == 1, err


def test_program_not_found_and_not_executable(capsys, tmp_path, built):
    assert run.main(["--stats", "--", "no-such-program-here"]) == 127
    assert capsys.readouterr().err == "threadheap run: program not found: no-such-program-here\n"
    plain = tmp_path / "plain"
    plain.write_text("")
    assert run.main(["--", str(plain)]) == 126
    assert capsys.readouterr().err == f"threadheap run: program not executable: {plain}\n"


# ------------------------------------------------------------------------------------------------ parsing


EXIT_FILE = """threadheap: where the memory goes            MiB   share
threadheap:   in use by the program             1.0   50.0%
threadheap:   resident, total                   2.0
threadheap:   mapped, not resident              4.2
threadheap: who frees whose memory (remote frees, thread ids)
threadheap:     101 frees into 100           5000
threadheap:     102 frees into 0               12
threadheap: committed         8192
threadheap: in_use            1048576
threadheap: os_call_ns        59106
threadheap: remap_bytes_not_copied 7"""


def test_parse_counters_takes_only_name_value_lines():
    c = run_stats.parse_counters(EXIT_FILE)
    assert c == {"committed": 8192, "in_use": 1048576, "os_call_ns": 59106, "remap_bytes_not_copied": 7}
    pairs = run_stats.parse_exit_pairs(EXIT_FILE)
    assert [(p.from_tid, p.to_tid, p.frees_total) for p in pairs] == [(101, 100, 5000), (102, 0, 12)]


def test_parse_interval():
    assert run.parse_interval("0.25") == 0.25
    assert run.parse_interval("250ms") == pytest.approx(0.25)
    assert run.parse_interval("2s") == 2.0


# ------------------------------------------------------------------------------------------------ advice


def counters(**kw):
    base = {"in_use": 0, "free_in_pages": 0, "empty_pages": 0, "cached": 0, "metadata": 0, "os_calls": 0,
            "os_call_ns": 0}
    base.update(kw)
    return base


def test_advice_fires_over_each_threshold_and_not_under():
    F = run_stats.Facts
    assert run_stats.advice(F(1.0, fault_s=0.1, os_call_s=0.01, counters=counters())) == []
    # Faults: over 20% of wall and over the 50 ms floor.
    [line] = run_stats.advice(F(1.0, fault_s=0.3, counters=counters()))
    assert line == ("first-touch faults cost ~0.30 s of 1.00 s: reuse large buffers or keep them "
                    "(THREADHEAP_PURGE_DELAY)")
    assert run_stats.advice(F(0.01, fault_s=0.009)) == []  # 90% of a short run: under the floor
    # OS calls: over 5% of wall and over 10 ms.
    [line] = run_stats.advice(F(1.0, os_call_s=0.08, os_calls=400,
                                counters=counters(os_maps=200, os_unmaps=150, os_purges=50)))
    assert "400 mmap/munmap/madvise calls took 0.08 s of 1.00 s (200 maps, 150 unmaps, 50 purges)" in line
    assert run_stats.advice(F(1.0, os_call_s=0.04, os_calls=10, counters=counters())) == []
    # Held memory: over half of in_use and over 64 MiB; the remedy follows what dominates.
    [line] = run_stats.advice(F(1.0, counters=counters(in_use=10 * MIB, cached=100 * MIB)))
    assert "held 100.0 MiB unused at exit beside 10.0 MiB in use" in line and "THREADHEAP_CACHE_MAX" in line
    [line] = run_stats.advice(F(1.0, counters=counters(in_use=10 * MIB, free_in_pages=80 * MIB)))
    assert "fragmentation" in line
    [line] = run_stats.advice(F(1.0, counters=counters(in_use=10 * MIB, free_in_pages=80 * MIB,
                                                        segments_waiting=3)))
    assert "3 segments waiting to be adopted" in line
    assert run_stats.advice(F(1.0, counters=counters(in_use=10 * MIB, cached=60 * MIB))) == []  # < 64 MiB
    assert run_stats.advice(F(1.0, counters=counters(in_use=200 * MIB, cached=90 * MIB))) == []  # < half


# ------------------------------------------------------------------------------------------------ calibration

FAKE_TOUCH = r"""#!/bin/sh
# A stand-in for bench/touch: logs each run, and reports 100 ms for 50,000 faults (2 us per fault).
echo "$*" >> "$FAKE_LOG"
echo '{"experiment":"touch","method":"mmap","size_mb":256,"ms":100.0,"minflt":50000,"majflt":0,"sys_ms":90}'
"""


@pytest.fixture
def fake_touch(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "touch").write_text(FAKE_TOUCH)
    (bindir / "touch").chmod(0o755)
    log = tmp_path / "touch.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("TH_BIN_DIR", str(bindir))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return SimpleNamespace(log=log, bindir=bindir, path=tmp_path / "cache" / "threadheap" / "touch.json")


def runs(log):
    return log.read_text().splitlines() if log.exists() else []


def test_calibration_is_measured_once_and_reused(fake_touch, monkeypatch):
    cal = run_stats.calibrate()
    assert cal.us_per_fault == pytest.approx(2.0) and cal.fresh and cal.error is None
    assert cal.path == fake_touch.path and fake_touch.path.exists()
    assert runs(fake_touch.log) == ["--methods mmap"] * run_stats.FAULT_CALIBRATION_RUNS
    data = json.loads(fake_touch.path.read_text())
    assert data["us_per_fault"] == 2.0 and data["machine"] == run_stats.machine_key()
    again = run_stats.calibrate()
    assert again.us_per_fault == pytest.approx(2.0) and not again.fresh
    assert len(runs(fake_touch.log)) == run_stats.FAULT_CALIBRATION_RUNS  # no new run
    # --calibrate measures again; so does a file from another kernel, and an unreadable one.
    run_stats.calibrate(force=True)
    assert len(runs(fake_touch.log)) == 2 * run_stats.FAULT_CALIBRATION_RUNS
    data["machine"]["kernel"] = "0.0-other"
    fake_touch.path.write_text(json.dumps(data))
    assert run_stats.calibrate().fresh
    fake_touch.path.write_text("{not json")
    assert run_stats.calibrate().fresh
    assert len(runs(fake_touch.log)) == 4 * run_stats.FAULT_CALIBRATION_RUNS


def test_calibration_file_location(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert run_stats.cache_file() == tmp_path / "threadheap" / "touch.json"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert run_stats.cache_file() == tmp_path / "home" / ".cache" / "threadheap" / "touch.json"


def test_not_calibrated_without_the_workload_or_with_a_broken_one(fake_touch, monkeypatch, tmp_path):
    monkeypatch.setenv("TH_BIN_DIR", str(tmp_path / "empty"))
    cal = run_stats.calibrate()
    assert cal.us_per_fault is None and "no touch workload at" in cal.error
    assert not fake_touch.path.exists()
    (fake_touch.bindir / "touch").write_text("#!/bin/sh\necho garbage\nexit 1\n")
    monkeypatch.setenv("TH_BIN_DIR", str(fake_touch.bindir))
    cal = run_stats.calibrate()
    assert cal.us_per_fault is None and "failed (exit 1)" in cal.error


def test_calibration_unsaved_is_still_used(fake_touch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cal = run_stats.calibrate(path=blocker / "threadheap" / "touch.json")
    assert cal.us_per_fault == pytest.approx(2.0) and cal.error.startswith("not saved")


def test_calibrate_command(fake_touch, capsys):
    assert run.main(["--calibrate"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("threadheap run: 2.00 µs per minor fault (median of") and str(fake_touch.path) in err
    fake_touch.path.unlink()
    (fake_touch.bindir / "touch").unlink()
    assert run.main(["--calibrate"]) == 1
    assert capsys.readouterr().err.startswith("threadheap run: not calibrated: no touch workload at")


# ------------------------------------------------------------------------------------------------ report


def fake_rusage(minflt=1000, utime=0.5, stime=0.25, maxrss_kb=200 * 1024):
    return SimpleNamespace(ru_minflt=minflt, ru_majflt=0, ru_utime=utime, ru_stime=stime, ru_nvcsw=3,
                           ru_nivcsw=4, ru_maxrss=maxrss_kb)


def test_report_tells_the_story():
    peak = run_stats.Sample(0.5, 150 * MIB, 140 * MIB, 150 * MIB, 0, 0, 0,
                            parts={"in_use": 100 * MIB, "free_in_pages": 10 * MIB, "empty_pages": 5 * MIB,
                                   "cached": 20 * MIB, "metadata": MIB}, purged=3 * MIB)
    pair = procstat.RemotePair(101, 100, "worker", "main", 5, 4242)
    sampler = SimpleNamespace(peak_export=peak, peak_rss=peak, pairs=[pair], hwm=150 * MIB)
    cal = run_stats.Calibration(2.0, Path("/cache/threadheap/touch.json"))
    c = counters(in_use=MIB, cached=90 * MIB, metadata=MIB, purged=2 * MIB, os_calls=10, os_call_ns=2_000_000,
                 allocs=5)
    text = run_stats.report(["prog", "a b"], 0, fake_rusage(minflt=400_000, stime=1.0), 2.0, c, sampler, cal, "100",
                            parent_rss=30 * MIB)
    lines = text.splitlines()
    assert lines[0] == "threadheap run: prog 'a b' exited with status 0 after 2.000 s"
    assert any("minor page faults" in line and "400000" in line for line in lines)
    assert any("their cost, estimated" in line and "~800.0 ms" in line and "40.0% of wall" in line
               for line in lines)
    assert any("calibration: /cache/threadheap/touch.json" in line for line in lines)
    assert any("allocator's OS calls" in line and "2.0 ms" in line and "10 mmap/munmap/madvise" in line
               for line in lines)
    assert any(line.split()[:3] == ["in", "use", "by"] and line.split()[-2:] == ["100.0", "MiB"]
               for line in lines)
    assert "at peak (0.50 s)" in text and "200.0 MiB" in text  # peak RSS from wait4 (over Python's 30 MiB)
    assert any("101 worker" in line and "100 main" in line and "4242 frees" in line for line in lines)
    assert "counters at exit (th_stats_t)" in text
    first, held = advice_lines(text)
    assert first.startswith("advice: first-touch faults cost ~0.80 s of 2.00 s")
    assert held.startswith("advice: threadheap held 90.0 MiB unused at exit beside 1.0 MiB in use")


def test_fault_estimate_is_capped_at_the_cpu_time():
    cal = run_stats.Calibration(5.0, Path("/cache/touch.json"))
    lines, facts = run_stats.time_section(fake_rusage(minflt=400_000, utime=0.1, stime=0.9), 1.5, {}, cal)
    assert facts.fault_s == pytest.approx(1.0)  # 2 s estimated, 1 s of CPU
    assert any("~1.000 s" in line and "capped at the CPU time" in line for line in lines)


def test_report_without_counters_calibration_or_export():
    sampler = SimpleNamespace(peak_export=None, peak_rss=None, pairs=[], hwm=3 * MIB)
    cal = run_stats.Calibration(None, Path("/x"), error="no touch workload at /nowhere/touch")
    text = run_stats.report(["prog"], 3 << 8, fake_rusage(maxrss_kb=20 * 1024), 0.1, {}, sampler, cal, "100",
                            parent_rss=30 * MIB)
    assert "exited with status 3" in text
    assert "not calibrated (no touch workload at /nowhere/touch" in text
    assert "memory: no threadheap counters" in text
    # wait4's maxrss is under Python's RSS: an upper bound, with the sampled VmHWM beside it.
    assert any("peak RSS" in line and "≤ 20.0 MiB" in line and "3.0 MiB sampled (VmHWM)" in line
               for line in text.splitlines())
    assert advice_lines(text) == []


def test_sampler_reads_a_live_process():
    s = run_stats.Sampler(os.getpid(), 0.0, keep=True)
    first = s.sample()
    assert first is not None and first.rss > 0 and first.hwm >= first.rss and first.minflt > 0
    assert first.parts is None and s.samples == [first] and s.peak_rss is first
    assert run_stats.Sampler(2 ** 22 + 12345, 0.0).sample() is None


def test_sampler_dates_the_export_by_its_publication(tmp_path):
    """A publication read an interval after the library wrote it keeps its own time: the peak column is dated
    by it, and /proc's RSS beside it by the read."""
    counters = {k: MIB for k in run_stats.ATTRIBUTION}
    counters["purged"] = 0
    written = time.time_ns() - 600_000_000  # 0.6 s before the read
    write_export(tmp_path, os.getpid(), counters, time_ns=written, start_ns=written, interval_ms=100)
    sampler = run_stats.Sampler(os.getpid(), time.monotonic() - 1.0, export_dir=str(tmp_path))
    s = sampler.sample()
    assert s is not None and s.held == len(run_stats.ATTRIBUTION) * MIB
    assert 0.95 <= s.t < 1.5 and 0.35 <= s.published <= 0.45  # read 1 s after the start, written at 0.4 s
    assert sampler.peak_export is s
    lines = run_stats.memory_section(counters, sampler, "100")
    assert f"at peak ({s.published:.2f} s)" in lines[1]
    assert any(line.strip().startswith(f"process RSS (/proc) at {s.t:.2f} s") for line in lines)
    assert not any("committed at its highest" in line for line in lines)  # no committed_peak at exit
    # The library's own peak, past what the publications read, is named.
    lines = run_stats.memory_section(dict(counters, committed_peak=40 * MIB), sampler, "100")
    assert any(line.strip() == "committed at its highest: 40.0 MiB (committed_peak, counted at every change)"
               for line in lines)
    lines = run_stats.memory_section(dict(counters, committed_peak=3 * MIB), sampler, "100")
    assert not any("committed at its highest" in line for line in lines)  # under the peak column's total


def test_peak_read_at_its_publication_names_no_second_time():
    peak = run_stats.Sample(0.5, 150 * MIB, 140 * MIB, 150 * MIB, 0, 0, 0,
                            parts={k: MIB for k in run_stats.ATTRIBUTION}, purged=0, published=0.498)
    sampler = SimpleNamespace(peak_export=peak, peak_rss=peak, pairs=[], hwm=150 * MIB)
    lines = run_stats.memory_section(counters(in_use=MIB), sampler, "100")
    assert "at peak (0.50 s)" in lines[1]
    assert any(line.split()[:3] == ["process", "RSS", "(/proc)"] and line.split()[3] == "-" for line in lines)
    # The rest of RSS beside threadheap's 5 MiB: 135 MiB anonymous (the program's own), 10 MiB file-backed.
    assert "    anonymous, not threadheap's            -             135.0 MiB" in lines
    assert "    file-backed and shared                 -              10.0 MiB" in lines


def test_rates_per_interval():
    S = run_stats.Sample
    samples = [S(0.0, 0, 0, 0, 100, 10, 0), S(0.5, 0, 0, 0, 600, 12, 0), S(1.0, 0, 0, 0, 600, 11, 0)]
    assert run_record.rates(samples, "minflt") == ([0.0, 0.5, 1.0], [1000.0, 0.0])
    assert run_record.rates(samples, "voluntary") == ([0.0, 0.5, 1.0], [4.0, 0.0])  # a thread left: 0, not < 0


def test_attribution_is_drawn_at_each_publication():
    """A publication is drawn once, when the library wrote it, with /proc's RSS of that moment (interpolated)
    around it; samples before the first publication attribute nothing. The rest is split: anonymous memory
    threadheap does not hold (the program's own), and file-backed memory."""
    S = run_stats.Sample

    def parts(mib):
        return {k: mib * MIB for k in run_stats.ATTRIBUTION}

    n = len(run_stats.ATTRIBUTION)
    samples = [S(0.1, 10 * MIB, 6 * MIB, 0, 0, 0, 0),
               S(0.2, 20 * MIB, 16 * MIB, 0, 0, 0, 0, parts=parts(1), published=0.15),
               S(0.3, 30 * MIB, 26 * MIB, 0, 0, 0, 0, parts=parts(1), published=0.15),  # read again
               S(0.5, 50 * MIB, 40 * MIB, 0, 0, 0, 0, parts=parts(2), published=0.45),
               S(0.7, 70 * MIB, 60 * MIB, 0, 0, 0, 0, parts=parts(2), published=0.45)]
    times, stacks, anon, files = run_record.attribution_series(samples)
    assert times == [0.1, 0.15, 0.45]
    assert [stack for stack in stacks] == [[0, MIB, 2 * MIB]] * n
    # At 0.15 s: RSS 15 MiB, RssAnon 11 MiB, threadheap n MiB; at 0.45 s: 45, 36.5 and 2n.
    assert anon == [6 * MIB, pytest.approx((11 - n) * MIB), pytest.approx((36.5 - 2 * n) * MIB)]
    assert files == [4 * MIB, pytest.approx(4 * MIB), pytest.approx(8.5 * MIB)]
    for i, t in enumerate(times):  # the stack adds up to /proc's RSS
        rss = run_record.rss_at(samples, t)
        assert sum(stack[i] for stack in stacks) + anon[i] + files[i] == pytest.approx(rss)
    # A publication that holds more than /proc's RSS around it leaves no negative rest; one written before the
    # first sample takes that sample's RSS. One that holds more than the anonymous RSS (read at another
    # moment) leaves no anonymous rest, and the file-backed part as /proc says.
    samples = [S(0.2, 3 * MIB, 2 * MIB, 0, 0, 0, 0, parts=parts(1), published=0.05)]
    assert run_record.attribution_series(samples) == ([0.05], [[MIB]] * n, [0], [0])
    assert run_record.rss_at(samples, 0.05) == 3 * MIB and run_record.rss_at(samples, 0.9) == 3 * MIB
    assert run_record.rss_at(samples, 0.9, "rss_anon") == 2 * MIB
    samples = [S(0.2, 10 * MIB, 4 * MIB, 0, 0, 0, 0, parts=parts(1), published=0.2)]
    assert run_record.attribution_series(samples) == ([0.2], [[MIB]] * n, [0], [pytest.approx((10 - n) * MIB)])


def test_rest_is_one_part_without_rss_anon(tmp_path):
    """A kernel without RssAnon (before 4.5) reads 0 for it: the rest stays whole instead of being called
    file-backed, in the attribution's stack and in the plain RSS picture."""
    S = run_stats.Sample
    parts = {k: MIB for k in run_stats.ATTRIBUTION}
    n = len(run_stats.ATTRIBUTION)
    samples = [S(0.1, 10 * MIB, 0, 0, 0, 0, 0), S(0.2, 20 * MIB, 0, 0, 0, 0, 0, parts=parts, published=0.2)]
    times, stacks, anon, files = run_record.attribution_series(samples)
    [(label, values, _)] = run_record.rest_parts(samples, anon, files)
    assert "no RssAnon" in label and values == [10 * MIB, (20 - n) * MIB]
    samples[1].rss_anon = 15 * MIB
    assert len(run_record.rest_parts(samples, *run_record.attribution_series(samples)[2:])) == 2
    matplotlib = pytest.importorskip("matplotlib")
    for i, samples in enumerate(([S(0.1, 10 * MIB, 0, 0, 0, 0, 0), S(0.2, 20 * MIB, 0, 0, 0, 0, 0)],
                                 [S(0.1, 10 * MIB, 0, 0, 0, 0, 0),
                                  S(0.2, 20 * MIB, 0, 0, 0, 0, 0, parts=parts, published=0.2)])):
        out = tmp_path / f"old-kernel-{i}.svg"
        with matplotlib.rc_context({"svg.fonttype": "none"}):  # the legend as text, not glyph paths
            run_record.draw(out, samples, ["prog"], 0, 0.2)
        text = out.read_text()
        assert "no RssAnon" in text and "file-backed" not in text


def test_export_gap_is_noted_when_publications_stop():
    S = run_stats.Sample
    parts = {k: MIB for k in run_stats.ATTRIBUTION}
    samples = [S(0.1 * i, 10 * MIB, 0, 0, 0, 0, 0, parts=parts, published=0.1 * i - 0.05) for i in range(1, 4)]
    assert run_record.export_gap_note(samples) is None  # each sample reads a publication of its interval
    later = [S(0.1 * i, 10 * MIB, 0, 0, 0, 0, 0, parts=parts, published=0.25) for i in range(4, 9)]
    note = run_record.export_gap_note(samples + later)  # the program stopped publishing at 0.25 s
    assert note.startswith("no publication after 0.25 s")
    assert run_record.export_gap_note([S(0.1, MIB, 0, 0, 0, 0, 0), S(0.9, MIB, 0, 0, 0, 0, 0)]) is None


def test_draw_with_too_few_samples(tmp_path):
    pytest.importorskip("matplotlib")
    S = run_stats.Sample
    for n, samples in enumerate([[], [S(0.001, MIB, MIB // 2, MIB, 10, 1, 1)]]):
        out = tmp_path / f"few{n}.png"
        run_record.draw(out, samples, ["prog", "$HOME"], 0, 0.002)  # a "$" is not mathtext in the title
        assert png_size(out)[0] == (1100, 850)


# ------------------------------------------------------------------------------------------------ end to end


def test_stats_on_a_faulting_program_estimates_and_advises(built, loop32, tmp_path):
    cache = tmp_path / "cache"
    if not (BIN_DIR / "touch").exists():
        seed_calibration(cache)  # else the command measures it, as a user's first --stats does
    proc = run_cmd(["--stats", "--", loop32, "30"], cache, {"THREADHEAP_PURGE_DELAY": "0"})
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "exited with status 0" in err
    assert "their cost, estimated" in err and str(cache / "threadheap" / "touch.json") in err
    faults = next(int(line.split()[3]) for line in err.splitlines() if "minor page faults" in line)
    assert faults >= 30 * 8192
    assert any(a.startswith("advice: first-touch faults cost ~") and "THREADHEAP_PURGE_DELAY" in a
               for a in advice_lines(err)), err
    assert "allocator's OS calls" in err and "memory (threadheap's attribution" in err
    assert "at peak (" in err  # the run is long enough for the export to be sampled


def test_stats_on_true_gives_no_advice(built, tmp_path):
    cache = tmp_path / "cache"
    seed_calibration(cache)
    proc = run_cmd(["--stats", "--", "/bin/true"], cache)
    assert proc.returncode == 0
    assert "exited with status 0" in proc.stderr and "their cost, estimated" in proc.stderr
    assert advice_lines(proc.stderr) == []


def test_stats_writes_the_calibration_once_with_the_real_workload(built, tmp_path):
    need((BIN_DIR / "touch").exists(), f"needs the touch workload in {BIN_DIR}")
    cache = tmp_path / "cache"
    path = cache / "threadheap" / "touch.json"
    first = run_cmd(["--stats", "--", "/bin/true"], cache)
    assert first.returncode == 0
    assert f"measured now, saved in {path}" in first.stderr
    data = json.loads(path.read_text())
    assert 0.01 < data["us_per_fault"] < 100 and len(data["runs"]) == 3
    stamp = path.stat().st_mtime_ns
    second = run_cmd(["--stats", "--", "/bin/true"], cache)
    assert f"calibration: {path}" in second.stderr and "measured now" not in second.stderr
    assert path.stat().st_mtime_ns == stamp and json.loads(path.read_text()) == data


def test_stats_not_calibrated_without_the_workload(built, tmp_path):
    proc = run_cmd(["--stats", "--", "sh", "-c", "exit 3"], tmp_path / "cache",
                   {"TH_BIN_DIR": str(tmp_path / "empty")})
    assert proc.returncode == 3
    assert "not calibrated (no touch workload at" in proc.stderr
    assert not (tmp_path / "cache" / "threadheap" / "touch.json").exists()


def png_size(path):
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24]), len(data)


def test_record_draws_a_png(built, loop32, tmp_path):
    out = tmp_path / "run.png"
    proc = run_cmd(["--record", str(out), "--", loop32, "15"], tmp_path / "cache", {"THREADHEAP_PURGE_DELAY": "0"})
    assert proc.returncode == 0, proc.stderr
    (width, height), size = png_size(out)
    assert 800 <= width <= 2000 and 600 <= height <= 1500 and size > 20_000
    said = [line for line in proc.stderr.splitlines() if line.startswith("threadheap run: recorded")]
    assert len(said) == 1 and int(said[0].split()[3]) >= 2, proc.stderr


def test_record_svg_keeps_the_exit_status(built, tmp_path):
    out = tmp_path / "run.svg"
    proc = run_cmd(["--record", str(out), "--record-interval", "0.05", "--", "sh", "-c", "sleep 0.2; exit 3"],
                   tmp_path / "cache")
    assert proc.returncode == 3, proc.stderr
    text = out.read_text()
    assert text.startswith("<?xml") and "<svg" in text


def test_killed_program_kills_the_command(built, tmp_path):
    seed_calibration(tmp_path / "cache")
    proc = run_cmd(["--stats", "--", "sh", "-c", "kill -TERM $$"], tmp_path / "cache")
    assert proc.returncode == -15 and "was killed by signal 15 (SIGTERM)" in proc.stderr


def test_record_without_matplotlib_stops_before_the_program(built, tmp_path):
    fake = tmp_path / "site" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    marker = tmp_path / "ran"
    proc = run_cmd(["--record", str(tmp_path / "x.png"), "--", "sh", "-c", f"touch {marker}"], tmp_path / "cache",
                   {"PYTHONPATH": f"{tmp_path / 'site'}:{REPO / 'python'}"})
    assert proc.returncode == 2
    assert proc.stderr.startswith("threadheap run: --record needs matplotlib") and proc.stderr.count("\n") == 1
    assert not marker.exists() and not (tmp_path / "x.png").exists()


def test_profile_without_protobuf_stops_before_the_program(tmp_path, no_protobuf_pythonpath):
    marker = tmp_path / "ran"
    proc = run_cmd(["--profile", str(tmp_path), "--", "sh", "-c", f"touch {marker}"], tmp_path / "cache",
                   {"PYTHONPATH": no_protobuf_pythonpath})
    assert proc.returncode == 2
    assert proc.stderr.startswith("threadheap run: --profile: reading profiles needs the Python package protobuf")
    assert proc.stderr.count("\n") == 1 and not marker.exists()


# Allocates 64 blocks of 1 MiB that it keeps (grow_table) and 64 that it frees at once (scratch).
PROFILED_C = r"""
#include <stdlib.h>
#include <string.h>
char *volatile kept[64];
__attribute__((noinline)) void grow_table(int i) { kept[i] = malloc(1 << 20); memset(kept[i], 1, 1 << 20); }
__attribute__((noinline)) void scratch(void) {
  for (int i = 0; i < 64; i++) { char *volatile p = malloc(1 << 20); p[0] = 1; free(p); }
}
int main(void) {
  for (int i = 0; i < 64; i++) grow_table(i);
  scratch();
  return 0;
}
"""


@pytest.fixture(scope="session")
def profiled(tmp_path_factory):
    # -g: file:line through addr2line; -rdynamic: the names through the library's dladdr too.
    return build_c(tmp_path_factory, "profiled", PROFILED_C, ["-O1", "-g", "-fno-omit-frame-pointer", "-rdynamic"],
                   "the profiled program")


# NEEDS THE LIBRARY'S HEAP PROFILER (src/profile.c: THREADHEAP_PROFILE, written at exit). Until
# build/libthreadheap.so has it, this test fails with "no heap profile was written in ...".
def test_profile_end_to_end(built, profiled, tmp_path):
    pytest.importorskip("google.protobuf")
    folder = tmp_path / "profiles"
    folder.mkdir()
    proc = run_cmd(["--profile", str(folder), "--", profiled], tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert "no heap profile was written" not in proc.stderr, proc.stderr
    [path] = folder.glob("threadheap-profile.*.pb.gz")
    err = proc.stderr
    assert f"threadheap run: heap profile in {path}\n" in err
    inuse = err.split("\ninuse_space, ")[1].split("\nalloc_space, ")[0]
    held = float(inuse.split()[0])  # "64.0 MiB in all:": an estimate from samples
    assert inuse.split()[1] == "MiB" and 40 <= held <= 100, inuse
    assert "grow_table" in inuse and "scratch" not in inuse  # scratch freed all it took
    alloc = err.split("\nalloc_space, ")[1]
    assert "grow_table" in alloc and "scratch" in alloc
    # All of it with `threadheap profile`: file:line from the program's debug information.
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    again = subprocess.run([sys.executable, "-m", "threadheap", "profile", str(path), "--type", "alloc_space"],
                           capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "grow_table" in again.stdout and "profiled.c:" in again.stdout and "main" in again.stdout
