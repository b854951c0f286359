"""Tests of `threadheap top`: /proc parsing and rates on fixture trees; the live-export reader on files written
here (a torn read, a sequence that moves during the read, a stale pid, truncated and foreign files); each
hint provoked and quiet; the JSON keys; and the command against processes the tests start: a glibc program
with heap contention, one that re-faults 32 MiB blocks, idle ones, ones that exit while watched, a process
with a live export written by a thread here, a producer/consumer under build/libthreadheap.so publishing its
own export (when the build has it), the live view under tmux, bad PIDs and permissions.

The workloads are tests/prog_top.c, compiled with gcc into a temporary folder (skipped without gcc, a failure
when CI is set). Every process a test starts is killed in a finally. The numbers the workloads produce depend
on what else the machine runs: the tests assert that a hint shows, never how large a rate is, and retry a
sample a few times where a busy machine can starve a workload.
"""

import contextlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from exports import export_bytes, write_export
from threadheap import procstat, top, top_view

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
REQUIRED_KEYS = {"pid", "command", "rss_bytes", "rss_anon_bytes", "rss_file_bytes", "lazyfree_bytes",
                 "minor_faults_per_s", "major_faults_per_s", "voluntary_switches_per_s",
                 "involuntary_switches_per_s", "cpu_user_percent", "cpu_system_percent", "threads", "hints",
                 "system", "threadheap"}
REQUIRED_TH_KEYS = {"in_use_bytes", "free_in_pages_bytes", "empty_pages_bytes", "cached_bytes", "metadata_bytes",
                    "purged_bytes", "os_call_seconds", "os_calls_per_s", "remote_frees_per_s", "fresh_bytes_per_s",
                    "reused_bytes_per_s", "allocs_per_s", "frees_per_s", "remote_pairs"}
SYSTEM_KEYS = {"pgfault_per_s", "pgmajfault_per_s", "pgalloc_per_s", "pgfree_per_s", "thp_fault_alloc_per_s"}


# ------------------------------------------------------------------------------------------------ helpers


def top_cmd(*args):
    return [sys.executable, "-m", "threadheap", "top", *map(str, args)]


def top_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "python") + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_top(*args, timeout=30):
    return subprocess.run(top_cmd(*args), capture_output=True, text=True, env=top_env(), timeout=timeout)


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def one_line_error(result, status):
    """A failure that is one `threadheap top: ...` line on stderr and no traceback."""
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("threadheap top: "), result.stderr
    return lines[0]


@contextlib.contextmanager
def started(argv, env=None):
    """A process for the duration of a with block, killed (and reaped) at its end whatever happens."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def boosted(argv):
    """argv run at a higher priority when the tests run as root: on two cores that other jobs keep busy, a
    starved workload gets too little CPU to contend or to fault at the rates the hints look for (measured: 16
    contending threads given 45-80% of a core in all switched 400-13,500 times a second)."""
    if os.geteuid() == 0 and shutil.which("nice"):
        return ["nice", "-n", "-10", *argv]
    return argv


def glibc_env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def prog_top(tmp_path_factory):
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        if os.environ.get("CI"):
            pytest.fail("gcc is needed to build tests/prog_top.c")
        pytest.skip("no gcc to build tests/prog_top.c")
    exe = tmp_path_factory.mktemp("prog_top") / "prog_top"
    subprocess.run([gcc, "-O2", "-pthread", "-o", str(exe), str(REPO / "tests" / "prog_top.c")], check=True,
                   timeout=60)
    return str(exe)


# A fake /proc: stat, status, smaps_rollup, cmdline and task/ of one process, and the system files.


def stat_line(pid, comm, state="S", minflt=0, majflt=0, utime=0, stime=0, threads=1, start=1000, rss_pages=0):
    fields = [state, 1, pid, pid, 0, -1, 4194304, minflt, 0, majflt, 0, utime, stime, 0, 0, 20, 0, threads, 0,
              start, 1 << 24, rss_pages]
    return f"{pid} ({comm}) " + " ".join(map(str, fields)) + " 0 0 0\n"


def write_fake_proc(root, pid=4242, comm="my (odd) app", minflt=0, majflt=0, utime=0, stime=0, rss_kb=20480,
                    anon_kb=16384, file_kb=3072, shmem_kb=1024, smaps=True, lazyfree_kb=512, state="S",
                    threads=None, vmstat=None):
    """threads: {tid: (name, utime, stime, minflt, voluntary, involuntary)}."""
    threads = threads or {pid: ("main", utime, stime, minflt, 0, 0)}
    base = root / str(pid)
    (base / "task").mkdir(parents=True, exist_ok=True)
    for old in (base / "task").iterdir():
        shutil.rmtree(old)
    (base / "stat").write_text(stat_line(pid, comm, state, minflt, majflt, utime, stime, len(threads),
                                         rss_pages=rss_kb // 4))
    (base / "status").write_text(f"Name:\t{comm}\nTgid:\t{pid}\nPid:\t{pid}\nVmRSS:\t{rss_kb} kB\n"
                                 f"RssAnon:\t{anon_kb} kB\nRssFile:\t{file_kb} kB\nRssShmem:\t{shmem_kb} kB\n"
                                 f"Threads:\t{len(threads)}\n")
    if smaps:
        (base / "smaps_rollup").write_text(
            f"00400000-7fff00000000 ---p 00000000 00:00 0 [rollup]\nRss: {rss_kb + 4} kB\nPss: 100 kB\n"
            f"Anonymous: {anon_kb + 4} kB\nLazyFree: {lazyfree_kb} kB\n")
    elif (base / "smaps_rollup").exists():
        (base / "smaps_rollup").unlink()
    (base / "cmdline").write_bytes(b"/usr/bin/app\0--flag\0")
    for tid, (name, tu, ts, tf, vol, inv) in threads.items():
        t = base / "task" / str(tid)
        t.mkdir()
        (t / "stat").write_text(stat_line(tid, name, state, tf, 0, tu, ts, len(threads)))
        (t / "status").write_text(f"Name:\t{name}\nvoluntary_ctxt_switches:\t{vol}\n"
                                  f"nonvoluntary_ctxt_switches:\t{inv}\n")
    (root / "vmstat").write_text("".join(f"{k} {v}\n" for k, v in (vmstat or {}).items()))
    (root / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    return base


class ExportWriter:
    """A thread that publishes an export for pid every period seconds, in place and under the seqlock (odd
    sequence, contents, even sequence), its counters growing at the given rates per second."""

    def __init__(self, directory, pid, fixed, rates, pairs=(), period=0.2):
        self.path = Path(directory) / f"threadheap.{pid}"
        self.pid, self.fixed, self.rates, self.pairs, self.period = pid, fixed, rates, pairs, period
        self.start = time.time_ns()
        self.stop = threading.Event()
        self.seq = 2
        self.path.write_bytes(self.publication())
        self.thread = threading.Thread(target=self.run, daemon=True)

    def publication(self):
        now = time.time_ns()
        elapsed = (now - self.start) / 1e9
        counters = dict(self.fixed)
        counters.update({k: int(v * elapsed) for k, v in self.rates.items()})
        pairs = [(f, t, fn, tn, int(r * self.period), int(r * elapsed)) for f, t, fn, tn, r in self.pairs]
        return export_bytes(self.pid, counters, pairs, seq=self.seq, time_ns=now, start_ns=self.start,
                            interval_ms=int(self.period * 1000))

    def run(self):
        fd = os.open(self.path, os.O_WRONLY)
        try:
            while not self.stop.wait(self.period):
                os.pwrite(fd, struct.pack("<Q", self.seq + 1), 16)
                self.seq += 2
                data = self.publication()
                os.pwrite(fd, data[24:], 24)
                os.pwrite(fd, data[:16], 0)
                os.pwrite(fd, struct.pack("<Q", self.seq), 16)
        finally:
            os.close(fd)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


# ------------------------------------------------------------------------------------------------ /proc parsing


def test_parse_stat_comm_with_spaces_and_parentheses():
    comm, fields = procstat.parse_stat(stat_line(7, "a) (b c", minflt=11, majflt=3, utime=5, stime=6, threads=4,
                                                 start=99, rss_pages=10))
    assert comm == "a) (b c"
    assert [procstat.stat_field(fields, n) for n in (3, 10, 12, 14, 15, 20, 22, 24)] == \
        ["S", "11", "3", "5", "6", "4", "99", "10"]


def test_parse_status_and_smaps_rollup_units():
    s = procstat.parse_status("Name:\tx y\nVmRSS:\t  100 kB\nThreads:\t3\nvoluntary_ctxt_switches:\t12\n")
    assert s == {"Name": "x y", "VmRSS": 102400, "Threads": 3, "voluntary_ctxt_switches": 12}
    r = procstat.parse_smaps_rollup("5555-7fff ---p 00000000 00:00 0 [rollup]\nRss: 8 kB\nLazyFree: 4 kB\n")
    assert r == {"Rss": 8192, "LazyFree": 4096}


def test_read_process_from_smaps_rollup(tmp_path):
    write_fake_proc(tmp_path, minflt=50, majflt=2, utime=30, stime=10,
                    threads={4242: ("main", 20, 5, 40, 7, 1), 4243: ("worker", 10, 5, 10, 3, 2)})
    s = procstat.read_process(4242, proc=str(tmp_path))
    assert (s.name, s.command, s.minflt, s.majflt, s.utime, s.stime, s.num_threads) == \
        ("my (odd) app", "/usr/bin/app --flag", 50, 2, 30, 10, 2)
    assert s.rss_source == "smaps_rollup"
    assert (s.rss, s.rss_anon, s.rss_file, s.lazyfree) == (20484 * 1024, 16388 * 1024, 4096 * 1024, 512 * 1024)
    assert (s.voluntary, s.involuntary) == (10, 3)
    assert s.threads[4243].name == "worker" and s.threads[4243].utime == 10


def test_read_process_falls_back_to_status(tmp_path, monkeypatch):
    write_fake_proc(tmp_path, smaps=False)
    s = procstat.read_process(4242, proc=str(tmp_path))
    assert s.rss_source == "status" and s.lazyfree is None
    assert (s.rss, s.rss_anon, s.rss_file) == (20480 * 1024, 16384 * 1024, (3072 + 1024) * 1024)
    # smaps_rollup there but not readable (another user's process): the same fallback, no error.
    write_fake_proc(tmp_path, smaps=True)
    deny_opening(monkeypatch, "smaps_rollup")
    s = procstat.read_process(4242, proc=str(tmp_path))
    assert s.rss_source == "status" and s.lazyfree is None


def test_read_process_gone_and_zombie(tmp_path):
    with pytest.raises(procstat.ProcessGone):
        procstat.read_process(999, proc=str(tmp_path))
    write_fake_proc(tmp_path, state="Z")
    with pytest.raises(procstat.ProcessGone):
        procstat.read_process(4242, proc=str(tmp_path))


def deny_opening(monkeypatch, suffix, pid=None):
    """Makes procstat's open raise PermissionError for /proc files whose path ends with suffix."""
    import builtins

    def fake_open(path, *a, **kw):
        p = str(path)
        if p.endswith("/" + suffix) and (pid is None or f"/{pid}/" in p):
            raise PermissionError(13, "Permission denied", p)
        return builtins.open(path, *a, **kw)

    monkeypatch.setattr(procstat, "open", fake_open, raising=False)


# ------------------------------------------------------------------------------------------------ rates


class FakeTarget:
    def __init__(self, loaded=False):
        self.loaded = loaded
        self.history = top.ExportHistory()


def two_samples(tmp_path, first, second, dt=2.0):
    write_fake_proc(tmp_path, **first)
    a = procstat.read_process(4242, proc=str(tmp_path))
    write_fake_proc(tmp_path, **second)
    b = procstat.read_process(4242, proc=str(tmp_path))
    a.when, b.when = 100.0, 100.0 + dt
    return a, b


def test_rates_between_two_samples(tmp_path):
    ticks = procstat.CLOCK_TICKS
    a, b = two_samples(
        tmp_path,
        dict(minflt=1000, majflt=4, utime=ticks, stime=0, rss_kb=20480,
             threads={4242: ("main", ticks, 0, 1000, 100, 10), 4243: ("gone", 0, 0, 0, 5000, 5000)}),
        dict(minflt=5000, majflt=10, utime=3 * ticks, stime=ticks, rss_kb=30720,
             threads={4242: ("main", 2 * ticks, ticks, 5000, 300, 30), 4244: ("born", ticks, 0, 0, 40, 4)}))
    r = top.process_record(a, b, FakeTarget(), top.system_rates(None, None), time.time(), want_threads=True)
    assert r["interval_s"] == 2.0
    assert r["minor_faults_per_s"] == 2000 and r["major_faults_per_s"] == 3
    assert r["cpu_user_percent"] == pytest.approx(100) and r["cpu_system_percent"] == pytest.approx(50)
    # main: +200 and +20; born counts from zero (+40, +4); gone has left and adds nothing (never negative).
    assert r["voluntary_switches_per_s"] == 120 and r["involuntary_switches_per_s"] == 12
    assert r["rss_change_bytes"] == 10240 * 1024
    per = {t["name"]: t for t in r["per_thread"]}
    assert set(per) == {"main", "born"}
    assert per["main"]["cpu_percent"] == pytest.approx(100) and per["born"]["cpu_percent"] == pytest.approx(50)
    assert per["main"]["minor_faults_per_s"] == 2000
    assert r["busy_threads"] == 2 and r["threads"] == 2


def test_system_rates_from_vmstat():
    a = (10.0, {"pgfault": 100, "pgmajfault": 1, "pgalloc_normal": 50, "pgalloc_dma32": 10, "pgfree": 40,
                "thp_fault_alloc": 0})
    b = (12.0, {"pgfault": 300, "pgmajfault": 3, "pgalloc_normal": 150, "pgalloc_dma32": 30, "pgfree": 80,
                "thp_fault_alloc": 2})
    s = top.system_rates(a, b)
    assert s == {"pgfault_per_s": 100, "pgmajfault_per_s": 1, "pgalloc_per_s": 60,
                 "pgalloc_bytes_per_s": 60 * procstat.PAGE_SIZE, "pgfree_per_s": 20, "thp_fault_alloc_per_s": 1}
    assert top.system_rates(a, (12.0, {}))["pgfault_per_s"] is None  # a kernel without the counter


def calm_record(**overrides):
    """A record of an idle process, as process_record makes it."""
    r = {"pid": 1, "command": "idle", "name": "idle", "time": 0.0, "interval_s": 1.0, "rss_bytes": 100 * MIB,
         "rss_anon_bytes": 90 * MIB, "rss_file_bytes": 10 * MIB, "lazyfree_bytes": 0, "rss_source": "status",
         "rss_change_bytes": 0, "minor_faults_per_s": 0.0, "major_faults_per_s": 0.0,
         "voluntary_switches_per_s": 2.0, "involuntary_switches_per_s": 0.0, "cpu_user_percent": 0.0,
         "cpu_system_percent": 0.0, "threads": 4, "busy_threads": 0, "threadheap_loaded": False, "hints": [],
         "system": top.system_rates(None, None), "per_thread": None, "threadheap": None}
    r.update(overrides)
    return r


def test_json_keys_of_a_record(tmp_path):
    a, b = two_samples(tmp_path, {}, {})
    target = FakeTarget()
    target.history.add(procstat.parse_export(export_bytes(4242, {"in_use": 1})), True)
    r = top.process_record(a, b, target, top.system_rates(None, None), time.time(), want_threads=False)
    assert REQUIRED_KEYS <= set(r) and SYSTEM_KEYS <= set(r["system"])
    assert REQUIRED_TH_KEYS <= set(r["threadheap"])
    assert r["per_thread"] is None and r["threadheap_loaded"] is True
    assert r["threadheap"]["in_use_bytes"] == 1 and r["threadheap"]["allocs_per_s"] is None
    json.loads(top.to_json(r))


# ------------------------------------------------------------------------------------------------ live export


def live_pid():
    return os.getpid()  # this test process: alive, ours, started before any export written here


def test_read_export_valid(tmp_path):
    pid = live_pid()
    write_export(tmp_path, pid, {"in_use": 5 * MIB, "allocs": 10, "some_future_counter": 3},
                 pairs=[(11, 12, "consumer", "producer", 7, 70)])
    e = procstat.read_export(pid, str(tmp_path))
    assert e is not None and e.pid == pid and e.interval_ms == 1000
    assert e.counters["in_use"] == 5 * MIB and e.counters["allocs"] == 10
    assert e.pairs == [procstat.RemotePair(11, 12, "consumer", "producer", 7, 70)]
    # A name the reader does not know is carried but never breaks the view.
    history = top.ExportHistory()
    history.add(e, True)
    view = top.export_view(history, time.time_ns(), 1.0)
    assert view["in_use_bytes"] == 5 * MIB and view["cached_bytes"] is None


def test_read_export_torn_read_gives_up(tmp_path):
    write_export(tmp_path, live_pid(), {"in_use": 1}, seq=3)  # odd: the writer is (forever) mid-update
    t0 = time.monotonic()
    assert procstat.read_export(live_pid(), str(tmp_path)) is None
    assert time.monotonic() - t0 < 1.0


def test_read_export_retries_until_the_writer_is_done(tmp_path, monkeypatch):
    path = write_export(tmp_path, live_pid(), {"in_use": 1}, seq=5)
    waits = []

    def writer_finishes(seconds):  # the reader's wait between tries: the writer ends its update meanwhile
        waits.append(seconds)
        path.write_bytes(export_bytes(live_pid(), {"in_use": 2}, seq=6))

    monkeypatch.setattr(procstat.time, "sleep", writer_finishes)
    e = procstat.read_export(live_pid(), str(tmp_path))
    assert e is not None and e.counters["in_use"] == 2 and e.sequence == 6 and len(waits) == 1


def test_read_export_sequence_moving_during_the_read_is_retried(tmp_path, monkeypatch):
    write_export(tmp_path, live_pid(), {"in_use": 1}, seq=8)
    real_pread = os.pread
    calls = []

    def pread(fd, n, offset):
        calls.append((n, offset))
        data = real_pread(fd, n, offset)
        if len(calls) == 3:  # the first check of the sequence after the contents: a writer has been through
            return struct.pack("<Q", 10)
        return data

    monkeypatch.setattr(procstat.time, "sleep", lambda s: None)
    monkeypatch.setattr(procstat.os, "pread", pread)
    e = procstat.read_export(live_pid(), str(tmp_path))
    assert e is not None and e.sequence == 8 and len(calls) == 6


def test_read_export_ignores_stale_files(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    write_export(tmp_path, dead.pid, {"in_use": 1})
    assert procstat.read_export(dead.pid, str(tmp_path)) is None  # the pid is not alive
    write_export(tmp_path, live_pid(), {"in_use": 1})
    os.rename(tmp_path / f"threadheap.{live_pid()}", tmp_path / "threadheap.1")
    assert procstat.read_export(1, str(tmp_path)) is None  # the pid inside is not the one in the name
    # Written by an earlier process with the same pid: its export started before this process did.
    write_export(tmp_path, live_pid(), {"in_use": 1}, start_ns=time.time_ns() - 10**9 * 10**6)
    assert procstat.read_export(live_pid(), str(tmp_path)) is None


@pytest.mark.parametrize("damage", ["truncated", "header only", "empty", "magic", "version", "size", "huge size"])
def test_read_export_rejects_damaged_files(tmp_path, damage):
    pid = live_pid()
    good = export_bytes(pid, {"in_use": 1, "allocs": 2}, pairs=[(1, 2, "a", "b", 3, 4)])
    data = {"truncated": good[:-10], "header only": good[:64], "empty": b"",
            "magic": export_bytes(pid, {"in_use": 1}, magic=b"THSTATS0"),
            "version": export_bytes(pid, {"in_use": 1}, version=2),
            "size": export_bytes(pid, {"in_use": 1, "allocs": 2}, size=70),
            "huge size": export_bytes(pid, {"in_use": 1}, size=1 << 30)}[damage]
    (tmp_path / f"threadheap.{pid}").write_bytes(data)
    assert procstat.read_export(pid, str(tmp_path)) is None


def test_read_export_refuses_fifo_symlink_and_folder(tmp_path):
    pid = live_pid()
    os.mkfifo(tmp_path / f"threadheap.{pid}")  # must not block the reader
    assert procstat.read_export(pid, str(tmp_path)) is None
    os.unlink(tmp_path / f"threadheap.{pid}")
    write_export(tmp_path, 99, {"in_use": 1})
    os.symlink(tmp_path / "threadheap.99", tmp_path / f"threadheap.{pid}")
    assert procstat.read_export(pid, str(tmp_path)) is None
    os.unlink(tmp_path / f"threadheap.{pid}")
    (tmp_path / f"threadheap.{pid}").mkdir()
    assert procstat.read_export(pid, str(tmp_path)) is None


def test_export_rates_between_publications():
    t0 = 1_700_000_000 * 10**9
    first = procstat.parse_export(export_bytes(
        7, {"allocs": 1000, "frees": 900, "remote_frees": 100, "os_calls": 10, "os_call_ns": 1_000_000,
            "fresh_bytes": MIB, "reused_bytes": 0, "in_use": 10 * MIB},
        pairs=[(2, 1, "consumer", "producer", 50, 100)], time_ns=t0, start_ns=t0 - 10**9))
    second = procstat.parse_export(export_bytes(
        7, {"allocs": 3000, "frees": 2900, "remote_frees": 20100, "os_calls": 30, "os_call_ns": 3_000_000,
            "fresh_bytes": 3 * MIB, "reused_bytes": 8 * MIB, "in_use": 10 * MIB},
        pairs=[(2, 1, "consumer", "producer", 9000, 18100), (3, 1, "other", "producer", 500, 500)],
        time_ns=t0 + 2 * 10**9, start_ns=t0 - 10**9))
    history = top.ExportHistory()
    history.add(first, True)
    history.add(first, True)  # the same publication read again: no rate from it
    assert history.previous is None
    history.add(second, True)
    v = top.export_view(history, t0 + 2 * 10**9, 1.0)
    assert (v["allocs_per_s"], v["frees_per_s"], v["remote_frees_per_s"], v["os_calls_per_s"]) == \
        (1000, 1000, 10000, 10)
    assert v["os_call_seconds"] == pytest.approx(0.003) and v["os_call_seconds_per_s"] == pytest.approx(0.001)
    assert v["os_call_us_avg"] == pytest.approx(100)
    assert (v["fresh_bytes_per_s"], v["reused_bytes_per_s"]) == (MIB, 4 * MIB)
    # The pair seen twice: its growth over the 2 s; the new one: its last interval over the export's interval.
    assert [(p["from_name"], p["frees_per_s"]) for p in v["remote_pairs"]] == [("consumer", 9000), ("other", 500)]
    # Nothing published for a long time: the process has not been through the allocator's slow paths.
    idle = top.export_view(history, t0 + 60 * 10**9, 1.0)
    assert idle["allocs_per_s"] == 0 and idle["remote_pairs"][0]["frees_per_s"] == 0
    # A busy or damaged read keeps what was read; the file gone forgets it.
    history.add(None, True)
    assert history.latest is second
    history.add(None, False)
    assert history.latest is None and top.export_view(history, t0, 1.0) is None


def test_missing_counters_are_shown_as_dashes(tmp_path):
    a, b = two_samples(tmp_path, {}, {})
    target = FakeTarget()
    target.history.add(procstat.parse_export(export_bytes(4242, {"in_use": MIB}, time_ns=1)), True)
    target.history.add(procstat.parse_export(export_bytes(4242, {"in_use": MIB}, time_ns=10**9 + 1)), True)
    r = top.process_record(a, b, target, top.system_rates(None, None), time.time(), want_threads=True)
    th = r["threadheap"]
    assert th["in_use_bytes"] == MIB and th["allocs_per_s"] is None and th["os_call_seconds"] is None
    assert th["held_bytes"] is None and th["remote_pairs"] == []
    text = top_view.plain_processes([r], [])
    assert "allocs —/s" in text and "in use 1.0 MiB" in text


# ------------------------------------------------------------------------------------------------ hints


def export_record(held=0, pairs=(), remote=None, rss=400 * MIB):
    th = {k: None for k in REQUIRED_TH_KEYS}
    th.update({"in_use_bytes": rss - held, "free_in_pages_bytes": held, "empty_pages_bytes": 0, "cached_bytes": 0,
               "metadata_bytes": 0, "held_bytes": held, "remote_frees_per_s": remote,
               "remote_pairs": [{"from_tid": 12, "from_name": "consumer", "to_tid": 11, "to_name": "producer",
                                 "frees_per_s": r, "frees_total": 1} for r in pairs]})
    return calm_record(rss_bytes=rss, threadheap=th, threadheap_loaded=True)


PROVOKED = {
    "contention": (top.hint_contention,
                   calm_record(voluntary_switches_per_s=52000.0, busy_threads=3, cpu_user_percent=250.0),
                   "52,000 context switches/s over 3 busy threads: heap contention? try `threadheap run`"),
    "refault": (top.hint_refault,
                calm_record(minor_faults_per_s=230000.0, rss_change_bytes=MIB),
                "re-faulting 898 MiB/s of fresh pages"),
    "held": (top.hint_held, export_record(held=312 * MIB), "312.0 MiB held by the allocator, not the program"),
    "pair": (top.hint_pair, export_record(pairs=[45000.0, 3000.0], remote=50000.0),
             "consumer (12) frees 45,000 blocks/s of producer (11), 90% of the remote frees"),
}
QUIET = {
    "contention": [calm_record(), calm_record(voluntary_switches_per_s=52000.0, busy_threads=1),
                   calm_record(voluntary_switches_per_s=4000.0, busy_threads=8)],
    "refault": [calm_record(), calm_record(minor_faults_per_s=230000.0, rss_change_bytes=800 * MIB),
                calm_record(minor_faults_per_s=15000.0)],
    "held": [calm_record(), export_record(held=40 * MIB, rss=100 * MIB), export_record(held=70 * MIB, rss=1 << 40)],
    "pair": [calm_record(), export_record(pairs=[45000.0], remote=100000.0), export_record(pairs=[9000.0],
                                                                                            remote=9000.0)],
}


@pytest.mark.parametrize("name", list(PROVOKED))
def test_hint_provoked(name):
    hint, record, text = PROVOKED[name]
    said = hint(record)
    assert said is not None and text in said, said


@pytest.mark.parametrize("name", list(QUIET))
def test_hint_quiet(name):
    hint = PROVOKED[name][0]
    for record in QUIET[name]:
        assert hint(record) is None


def test_contention_hint_when_threadheap_is_already_there():
    said = top.hint_contention(calm_record(voluntary_switches_per_s=52000.0, busy_threads=3,
                                           threadheap_loaded=True))
    assert "threadheap run" not in said and "already" in said


# ------------------------------------------------------------------------------------------------ workloads


def sample_until(pid, want, attempts, interval, *extra):
    """`top --once --json PID` up to `attempts` times, until want(record) holds; the last record."""
    record = None
    for _ in range(attempts):
        result = run_top("--once", "--json", "--interval", interval, *extra, pid)
        assert result.returncode == 0, result.stderr
        lines = json_lines(result.stdout)
        assert len(lines) == 1
        record = lines[0]
        if want(record):
            break
    return record


def test_glibc_heap_contention_shows_the_hint(prog_top):
    with started(boosted([prog_top, "contention", "16", "20"]), env=glibc_env(MALLOC_ARENA_MAX="1")) as proc:
        time.sleep(0.2)
        r = sample_until(proc.pid, lambda r: any("heap contention" in h for h in r["hints"]), 6, 0.5, "--threads")
    assert any("heap contention" in h for h in r["hints"]), r
    assert r["voluntary_switches_per_s"] >= top.CONTENTION_SWITCHES_PER_S
    assert r["threadheap_loaded"] is False and r["threadheap"] is None
    assert r["threads"] == 17 and sum(t["name"].startswith("worker-") for t in r["per_thread"]) == 16


def test_refaulting_32_mib_blocks_shows_the_hint(prog_top):
    with started(boosted([prog_top, "refault", "32", "20"]), env=glibc_env()) as proc:
        time.sleep(0.2)
        # One second: RSS swings by up to a block between samples, against the bytes faulted in the sample.
        r = sample_until(proc.pid, lambda r: any("re-faulting" in h for h in r["hints"]), 4, 1.0)
    assert any("re-faulting" in h and "reuse buffers" in h for h in r["hints"]), r
    assert r["minor_faults_per_s"] >= top.REFAULT_FAULTS_PER_S


def test_idle_processes_show_no_hint_one_object_each():
    with started(["sleep", "30"]) as a, started(["sleep", "30"]) as b:
        result = run_top("--once", "--json", "--interval", "0.3", a.pid, b.pid)
    assert result.returncode == 0, result.stderr
    records = json_lines(result.stdout)
    assert sorted(r["pid"] for r in records) == sorted([a.pid, b.pid])
    for r in records:
        assert REQUIRED_KEYS <= set(r) and SYSTEM_KEYS <= set(r["system"])
        assert r["hints"] == [] and r["threadheap"] is None and r["command"] == "sleep 30"
        assert r["minor_faults_per_s"] == 0 and r["threads"] == 1


def test_thread_id_is_replaced_by_its_process():
    ready, done = threading.Event(), threading.Event()
    tid = []
    worker = threading.Thread(target=lambda: (tid.append(threading.get_native_id()), ready.set(), done.wait(30)))
    worker.start()
    try:
        ready.wait(5)
        result = run_top("--once", "--json", "--interval", "0.2", tid[0])
    finally:
        done.set()
        worker.join()
    assert result.returncode == 0, result.stderr
    assert [r["pid"] for r in json_lines(result.stdout)] == [os.getpid()]
    assert f"{tid[0]} is a thread of process {os.getpid()}" in result.stderr


def test_libthreadheap_in_maps_is_detected():
    lib = REPO / "build" / "libthreadheap.so"
    if not lib.exists():
        pytest.skip("no build/libthreadheap.so")
    with started(["sleep", "30"], env=glibc_env(LD_PRELOAD=str(lib))) as proc:
        time.sleep(0.2)
        if "libthreadheap" not in Path(f"/proc/{proc.pid}/maps").read_text():
            pytest.skip("the library could not be preloaded (being rebuilt?)")
        result = run_top("--once", "--interval", "0.2", proc.pid)
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.lstrip().startswith(str(proc.pid)))
    assert "lib" in row.split(), row  # the TH column (`sleep 30` has no such word)


def test_live_export_counters_and_hints_end_to_end(tmp_path):
    with started(["sleep", "30"]) as proc:
        fixed = {"in_use": 50 * MIB, "free_in_pages": 250 * MIB, "empty_pages": 40 * MIB, "cached": 20 * MIB,
                 "metadata": 2 * MIB, "purged": 64 * MIB, "os_call_ns": 0, "threads_live": 3}
        rates = {"allocs": 1_000_000, "frees": 990_000, "remote_frees": 50_000, "os_calls": 100,
                 "fresh_bytes": MIB, "reused_bytes": 100 * MIB}
        pairs = [(proc.pid + 2, proc.pid + 1, "consumer", "producer", 45_000)]
        with ExportWriter(tmp_path, proc.pid, fixed, rates, pairs):
            result = run_top("--once", "--json", "--interval", "0.4", "--export-dir", tmp_path, proc.pid)
            plain = run_top("--once", "--interval", "0.4", "--export-dir", tmp_path, proc.pid)
        calm = {"in_use": 50 * MIB, "free_in_pages": MIB}
        with ExportWriter(tmp_path, proc.pid, calm, {"allocs": 10}):
            quiet = run_top("--once", "--json", "--interval", "0.4", "--export-dir", tmp_path, proc.pid)
    assert result.returncode == 0, result.stderr
    [r] = json_lines(result.stdout)
    th = r["threadheap"]
    assert REQUIRED_TH_KEYS <= set(th) and r["threadheap_loaded"] is True
    assert th["in_use_bytes"] == 50 * MIB and th["held_bytes"] == 312 * MIB
    assert th["allocs_per_s"] == pytest.approx(1e6, rel=0.05) and th["os_calls_per_s"] == pytest.approx(100, rel=0.2)
    assert th["remote_pairs"][0]["from_name"] == "consumer"
    assert any("held by the allocator" in h for h in r["hints"])
    assert any("producer/consumer" in h for h in r["hints"])
    assert plain.returncode == 0 and "\x1b" not in plain.stdout
    assert "RSS [" in plain.stdout and "# in use 50.0 MiB" in plain.stdout and "hint: " in plain.stdout
    [q] = json_lines(quiet.stdout)
    assert q["threadheap"]["in_use_bytes"] == 50 * MIB and q["hints"] == []


def top_of_preloaded(argv, ready=lambda export: True):
    """`threadheap top --once --json` of argv run with build/libthreadheap.so preloaded and its live export on,
    once ready(export) holds (or after 5 s); skips when the build has no export."""
    lib = REPO / "build" / "libthreadheap.so"
    if not lib.exists() or b"THSTATS1" not in lib.read_bytes():
        pytest.skip("build/libthreadheap.so has no live export")
    env = glibc_env(LD_PRELOAD=str(lib), THREADHEAP_STATS_INTERVAL="100")
    with started(argv, env=env) as proc:
        path = Path(procstat.export_path(proc.pid))
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                export = procstat.read_export(proc.pid)
                if export is not None and ready(export):
                    break
                time.sleep(0.05)
            if not path.exists() and "libthreadheap" not in Path(f"/proc/{proc.pid}/maps").read_text():
                pytest.skip("the library could not be preloaded (being rebuilt?)")
            return run_top("--once", "--json", "--interval", "0.5", proc.pid)
        finally:
            proc.kill()
            proc.wait()
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # killed, the program could not remove its file


def test_the_librarys_own_live_export(prog_top):
    """The reader against the writer of build/libthreadheap.so (src/export.c), when the build has it."""
    result = top_of_preloaded([prog_top, "handoff", "2", "20"])
    assert result.returncode == 0, result.stderr
    [r] = json_lines(result.stdout)
    th = r["threadheap"]
    assert th is not None and REQUIRED_TH_KEYS <= set(th) and r["threadheap_loaded"] is True
    assert th["allocs_per_s"] > 0 and th["remote_frees_per_s"] > 0 and th["in_use_bytes"] is not None
    assert (th["remote_pairs"][0]["from_name"], th["remote_pairs"][0]["to_name"]) == ("consumer", "producer")
    assert any("producer/consumer" in h for h in r["hints"]), r["hints"]


def test_steady_threadheap_program_reports_its_live_set(prog_top):
    """A preloaded program that holds 64 MiB and then only mallocs and frees four small blocks (every call on the
    fast paths) still publishes, and in_use_bytes is within 1% of what it holds."""
    result = top_of_preloaded([prog_top, "steady", "64", "20"],
                              ready=lambda export: export.counters.get("in_use", 0) >= 64 * MIB)
    assert result.returncode == 0, result.stderr
    [r] = json_lines(result.stdout)
    th = r["threadheap"]
    assert th is not None, "no live export seen"
    assert abs(th["in_use_bytes"] - 64 * MIB) <= 0.01 * 64 * MIB, th["in_use_bytes"]
    assert th["allocs_per_s"] > 0


def test_process_list_marks_live_exports(tmp_path):
    write_export(tmp_path, os.getpid(), {"in_use": 1})  # this test process (alive, large enough to be listed)
    result = run_top("--once", "--json", "--interval", "0.2", "--limit", "500", "--export-dir", tmp_path)
    assert result.returncode == 0, result.stderr
    [sample] = json_lines(result.stdout)
    assert SYSTEM_KEYS <= set(sample["system"])
    rows = {p["pid"]: p for p in sample["processes"]}
    assert rows[os.getpid()]["threadheap_export"] is True
    assert sum(p["threadheap_export"] for p in sample["processes"]) == 1
    sizes = [p["rss_bytes"] for p in sample["processes"]]
    assert sizes == sorted(sizes, reverse=True)
    plain = run_top("--once", "--interval", "0.2", "--limit", "3")
    lines = plain.stdout.splitlines()
    assert plain.returncode == 0 and "\x1b" not in plain.stdout
    assert lines[3].split()[:2] == ["PID", "COMMAND"]
    assert len([line for line in lines[4:] if line.split() and line.split()[0].isdigit()]) == 3


# ------------------------------------------------------------------------------------------------ errors


def test_nonexistent_pid_is_one_line():
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    line = one_line_error(run_top("--once", pid_max + 1), 1)
    assert f"no process {pid_max + 1}" in line


@pytest.mark.parametrize("args", [["abc"], ["--interval", "0"], ["--interval", "x", "1"], ["--count", "0", "1"],
                                  ["--bogus"], ["--limit", "-3"], ["0"]])
def test_bad_arguments_are_one_line(args):
    one_line_error(run_top(*args), 2)


def watch_until_killed(victim, *args):
    """`top --json ARGS` until it has printed its first sample, then victim killed (left a zombie, as a child
    that exits is until its parent waits); (exit status, stdout, stderr) of top. Killing after the first
    sample, not after a fixed time, keeps a slow start of top on a busy machine from seeing no process."""
    proc = subprocess.Popen(top_cmd("--json", *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=top_env())
    try:
        first = proc.stdout.readline()
        victim.kill()
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode, first + out, err


def test_pid_that_exits_while_watched():
    with started(["sleep", "30"]) as short:
        status, out, err = watch_until_killed(short, "--interval", "0.3", short.pid)
    assert status == 1 and "Traceback" not in err
    assert err.splitlines() == [f"threadheap top: process {short.pid} (sleep) exited",
                                "threadheap top: every watched process has exited"]
    assert [r["pid"] for r in json_lines(out)] and all(r["pid"] == short.pid for r in json_lines(out))
    # One of two gone: the other goes on being sampled, and the exit status is 0.
    with started(["sleep", "30"]) as short, started(["sleep", "30"]) as long:
        status, out, err = watch_until_killed(short, "--interval", "0.3", "--count", "4", short.pid, long.pid)
    assert status == 0, err
    assert err.strip() == f"threadheap top: process {short.pid} (sleep) exited"
    assert [r["pid"] for r in json_lines(out)][-2:] == [long.pid, long.pid]


def test_unreadable_process_is_one_line(monkeypatch, capsys):
    with started(["sleep", "30"]) as proc:
        deny_opening(monkeypatch, "status", proc.pid)
        status = top.main(["--once", "--json", str(proc.pid)])
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1
    assert err.startswith(f"threadheap top: process {proc.pid}: cannot read /proc/{proc.pid}/status: "
                          "permission denied")


def test_unreadable_smaps_rollup_falls_back(monkeypatch, capsys):
    with started(["sleep", "30"]) as proc:
        status = top.main(["--once", "--json", "--interval", "0.1", str(proc.pid)])
        [r] = json_lines(capsys.readouterr().out)
        assert status == 0 and r["rss_source"] == "smaps_rollup" and r["lazyfree_bytes"] is not None
        status = top.main(["--once", "--json", "--interval", "0.1", "--no-smaps", str(proc.pid)])
        [r] = json_lines(capsys.readouterr().out)
        assert status == 0 and r["lazyfree_bytes"] is None and r["rss_source"] == "status"
        deny_opening(monkeypatch, "smaps_rollup")
        status = top.main(["--once", "--json", "--interval", "0.1", str(proc.pid)])
    [r] = json_lines(capsys.readouterr().out)
    assert status == 0 and r["lazyfree_bytes"] is None and r["rss_source"] == "status" and r["rss_bytes"] > 0


def test_real_permissions_of_another_users_process():
    """pid 1 seen by a user that is not its owner: smaps_rollup and maps are unreadable, status is not."""
    if os.stat("/proc/1").st_uid == os.geteuid() and os.geteuid() != 0:
        pytest.skip("pid 1 belongs to this user")
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # as root: become nobody first; the modules are loaded already
        status = 3
        try:
            os.close(read)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            sys.stdout = os.fdopen(write, "w")  # pytest's capture replaced sys.stdout: fd 1 is not it
            sys.stderr = open(os.devnull, "w")
            status = top.main(["--once", "--json", "--interval", "0.2", "1"])
            sys.stdout.flush()
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    [r] = json_lines(out)
    assert r["pid"] == 1 and r["rss_source"] == "status" and r["lazyfree_bytes"] is None
    assert r["threadheap_loaded"] is None and r["rss_bytes"] > 0


# ------------------------------------------------------------------------------------------------ interface


def test_json_stream_stops_cleanly_on_ctrl_c_and_broken_pipe():
    with started(["sleep", "30"]) as target:
        # Ctrl-C as a terminal sends it: a shell's background job would otherwise pass SIGINT on ignored.
        proc = subprocess.Popen(top_cmd("--json", "--interval", "0.1", target.pid), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=top_env(),
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            assert json.loads(proc.stdout.readline())["pid"] == target.pid
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=10)
        finally:
            proc.kill()
        assert proc.returncode == 0 and err == ""
        # The reader goes away (`| head -1`): a quiet exit 0.
        proc = subprocess.Popen(top_cmd("--json", "--interval", "0.05", target.pid), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=top_env())
        try:
            proc.stdout.readline()
            proc.stdout.close()
            err = proc.stderr.read()
            proc.wait(timeout=10)
        finally:
            proc.kill()
        assert proc.returncode == 0 and err == b""


def test_live_view_without_rich(monkeypatch, capsys):
    for name in ("rich", "rich.console", "rich.live", "rich.text"):
        monkeypatch.setitem(sys.modules, name, None)
    status = top_view.run_live(None, None, True)
    err = capsys.readouterr().err
    assert status == 1 and err.count("\n") == 1 and "needs the Python package rich" in err


def tmux(sock, *args):
    return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True, timeout=10)


def wait_screen(sock, predicate, seconds, session="top"):
    """The screen of a tmux session once predicate(screen) holds, or as it is after seconds."""
    deadline = time.monotonic() + seconds
    screen = ""
    while time.monotonic() < deadline:
        screen = tmux(sock, "capture-pane", "-p", "-t", session).stdout
        if predicate(screen):
            return screen
        time.sleep(0.1)
    return screen


def start_in_tmux(sock, session, argv, tmp_path):
    """argv in a new tmux session of 150x40; (status file, stderr file) of the command."""
    status_file, err_file = tmp_path / f"{session}.status", tmp_path / f"{session}.err"
    shell = (f"cd {REPO} && PYTHONPATH={REPO / 'python'} {' '.join(argv)} 2>{err_file}; "
             f"echo $? >{status_file}; sleep 30")
    assert tmux(sock, "new-session", "-d", "-s", session, "-x", "150", "-y", "40", shell).returncode == 0
    return status_file, err_file


def wait_file(path, seconds):
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return path.read_text().strip() if path.exists() else None


def test_live_view_under_tmux(tmp_path, prog_top):
    if shutil.which("tmux") is None:
        if os.environ.get("CI"):
            pytest.fail("tmux is needed for the live-view test (apt-get install tmux)")
        pytest.skip("no tmux")
    try:
        import rich  # noqa: F401
    except ImportError:
        pytest.skip("rich is not installed (test_live_view_without_rich covers the error)")
    sock = f"threadheap-top-test-{os.getpid()}"
    with started([prog_top, "contention", "2", "20"], env=glibc_env()) as target:
        argv = top_cmd("--interval", "0.3", "--threads", target.pid)
        try:
            # Redraws in place, says when the terminal is too small, exits 0 on Ctrl-C.
            status_file, err_file = start_in_tmux(sock, "top", argv, tmp_path)
            screen = wait_screen(sock, lambda s: str(target.pid) in s and "RSS" in s and "worker-1" in s, 10)
            assert str(target.pid) in screen and "RSS" in screen and "worker-1" in screen, screen
            first = screen
            screen = wait_screen(sock, lambda s: s != first, 3)  # it redraws (the clock, the rates)
            assert screen != first, err_file.read_text()
            tmux(sock, "resize-window", "-t", "top", "-x", "40", "-y", "6")
            small = wait_screen(sock, lambda s: "terminal too small" in s, 3)
            assert "terminal too small" in small, (small, err_file.read_text())
            tmux(sock, "resize-window", "-t", "top", "-x", "150", "-y", "40")
            assert str(target.pid) in wait_screen(sock, lambda s: str(target.pid) in s, 3)
            tmux(sock, "send-keys", "-t", "top", "C-c")
            assert wait_file(status_file, 10) == "0"
            assert err_file.read_text() == ""
            # q quits too.
            status_file, err_file = start_in_tmux(sock, "q", argv, tmp_path)
            assert "RSS" in wait_screen(sock, lambda s: "RSS" in s, 10, "q")
            tmux(sock, "send-keys", "-t", "q", "q")
            assert wait_file(status_file, 10) == "0"
            assert err_file.read_text() == ""
            # A process that exits is shown as exited; when every one has, the view ends with status 1.
            with started(["sleep", "30"]) as short:
                status_file, err_file = start_in_tmux(sock, "exit", top_cmd("--interval", "0.3", short.pid,
                                                                             target.pid), tmp_path)
                assert "sleep 30" in wait_screen(sock, lambda s: "sleep 30" in s, 10, "exit")
                short.kill()
                # The whole message, not just "exited": the table's row says it first, and a capture can
                # land while the frame is still being drawn.
                gone = f"process {short.pid} (sleep) exited"
                screen = wait_screen(sock, lambda s: gone in s, 10, "exit")
                assert gone in screen, screen
                tmux(sock, "send-keys", "-t", "exit", "q")
                assert wait_file(status_file, 10) == "0"
                assert err_file.read_text().strip() == f"threadheap top: process {short.pid} (sleep) exited"
            with started(["sleep", "30"]) as short:
                status_file, err_file = start_in_tmux(sock, "gone", top_cmd("--interval", "0.3", short.pid),
                                                      tmp_path)
                assert "sleep 30" in wait_screen(sock, lambda s: "sleep 30" in s, 10, "gone")
                short.kill()
                assert wait_file(status_file, 10) == "1"
                assert "every watched process has exited" in err_file.read_text()
                assert "Traceback" not in err_file.read_text()
            # The terminal goes away (SIGHUP, then EIO on the last redraw): no traceback.
            _, err_file = start_in_tmux(sock, "hup", argv, tmp_path)
            assert "RSS" in wait_screen(sock, lambda s: "RSS" in s, 10, "hup")
            tmux(sock, "kill-server")
            time.sleep(0.5)
            assert err_file.read_text() == ""
        finally:
            tmux(sock, "kill-server")


def test_bar_splits_the_rest_of_rss():
    """The bar's rest of RSS in two: anonymous memory that is not threadheap's, and file-backed memory; the
    parts add up to the RSS, and neither is negative when threadheap holds more than RssAnon said."""
    from threadheap import top_view
    th = {k: 0 for k, *_ in top_view.BAR_PARTS if k.endswith("_bytes")}
    th.update(in_use_bytes=40 * MIB, free_in_pages_bytes=10 * MIB, purged_bytes=8 * MIB)
    r = {"rss_bytes": 100 * MIB, "rss_anon_bytes": 90 * MIB, "threadheap": th}
    parts = {label: value for label, value, _, _ in top_view.bar_parts(r)}
    assert parts["rest of RSS: anonymous, not threadheap's"] == 40 * MIB and parts["file-backed"] == 10 * MIB
    assert sum(parts.values()) - parts["purged (not resident)"] == 100 * MIB
    r["rss_anon_bytes"] = 30 * MIB  # read at another moment than the publication
    parts = {label: value for label, value, _, _ in top_view.bar_parts(r)}
    assert parts["rest of RSS: anonymous, not threadheap's"] == 0 and parts["file-backed"] == 50 * MIB
    r["rss_anon_bytes"] = 0  # a kernel without RssAnon: the rest in one part
    parts = {label: value for label, value, _, _ in top_view.bar_parts(r)}
    assert parts["rest of RSS"] == 50 * MIB and "file-backed" not in parts
