"""`threadheap top [PID...]`: what memory costs a running process, whatever allocator it uses.

Without a PID: the processes with the largest RSS, one row each, marked when they publish threadheap's live
export. With PIDs: a live view of those processes (rich's Live; q or Ctrl-C quits), from /proc for any
process (procstat.py) and from threadheap's live export (docs/live-export.md) when the process has it on.
--once takes two samples --interval apart and prints one plain-text table; --json prints one JSON object
per line: with PIDs one per process per sample, without one per sample holding the list. Rates need two
samples, so the first object comes one interval after the start; --count N stops after N samples. On a
stdout that is not a terminal and without --once or --json, the plain table is printed once per sample.
Standard library only, except the live view, which needs rich (a one-line error says so when it is missing).

The JSON keys of a watched process (docs/top.md says the same for users; null where a number is unknown):
  pid, command, name          the process, its command line, its comm
  time, interval_s            when the sample ended (s since the epoch) and the seconds it spans
  rss_bytes                   resident memory (smaps_rollup Rss, else status VmRSS)
  rss_anon_bytes              anonymous part (smaps_rollup Anonymous, else status RssAnon)
  rss_file_bytes              file-backed and shared part (Rss - Anonymous, else RssFile + RssShmem)
  lazyfree_bytes              MADV_FREE'd pages not yet reclaimed (smaps_rollup LazyFree; null without it)
  rss_source                  "smaps_rollup" or "status"
  rss_change_bytes            RSS at the end of the sample minus RSS at its start
  minor_faults_per_s, major_faults_per_s        /proc/PID/stat fields 10 and 12
  voluntary_switches_per_s, involuntary_switches_per_s
                              summed over the threads' /proc/PID/task/TID/status (threads that exit within
                              the sample lose their last interval's switches)
  cpu_user_percent, cpu_system_percent          utime and stime, % of one core
  threads                     threads now; busy_threads: those that used >= BUSY_THREAD_PERCENT of a core
  threadheap_loaded           true if the export is there or libthreadheap is in /proc/PID/maps, null if the
                              maps cannot be read
  hints                       sentences (below), each with the numbers that triggered it
  system                      /proc/vmstat per second: pgfault_per_s, pgmajfault_per_s, pgalloc_per_s (the
                              sum of pgalloc_*), pgalloc_bytes_per_s, pgfree_per_s, thp_fault_alloc_per_s.
                              Linux counts no page zeroing: every page allocated for an anonymous fault is
                              zeroed, so pgalloc is the best proxy for it.
  per_thread                  with --threads, one object per thread: tid, name, cpu_percent,
                              voluntary_switches_per_s, involuntary_switches_per_s, minor_faults_per_s;
                              else null
  threadheap                  null without a live export; else, bytes from the last publication:
                              in_use_bytes, free_in_pages_bytes, empty_pages_bytes, cached_bytes,
                              metadata_bytes, purged_bytes, mapped_bytes, committed_bytes, in_use_peak_bytes,
                              held_bytes (free_in_pages + empty_pages + cached + metadata: what the allocator
                              holds and the program does not), threads_live; os_call_seconds (time spent in
                              OS calls since the export started); and rates over the last two publications
                              seen (null until two have been): allocs_per_s, frees_per_s, remote_frees_per_s,
                              os_calls_per_s, os_call_seconds_per_s (OS-call time per second of wall time),
                              os_call_us_avg (per call), fresh_bytes_per_s, reused_bytes_per_s, and
                              remote_pairs: [{from_tid, from_name, to_tid, to_name, frees_per_s, frees_total}],
                              largest first. published_age_s: seconds since the last publication;
                              interval_ms: the export's. When no publication has come for longer than twice
                              the export's interval plus the sampling interval, the process has not passed
                              the allocator's slow paths meanwhile, so the rates are 0.
Without a PID, each object has time, interval_s, system and processes: [{pid, command, rss_bytes, threads,
cpu_percent, threadheap_export}], largest RSS first.
"""

import argparse
import json
import os
import signal
import sys
import time

from . import procstat
from .procstat import NoAccess, ProcessGone

PROG = "threadheap top"
MIB = 1 << 20

# ------------------------------------------------------------------------------------------------ hints
# Each hint is a function of one process's record (the dict --json prints) that returns a sentence or None.
# The thresholds are here, and in docs/top.md.

# Heap contention: threads that wait for a lock sleep in futex, one voluntary switch per wait.
CONTENTION_SWITCHES_PER_S = 5000  # voluntary switches per second, whole process
CONTENTION_BUSY_THREADS = 2       # with at least this many busy threads (one thread cannot contend)
BUSY_THREAD_PERCENT = 5.0         # a thread is busy from this % of one core over the sample
# Memory freed to the OS and faulted in again: many first-touch faults while RSS does not grow.
REFAULT_FAULTS_PER_S = 20000      # minor faults per second (~80 MiB/s of 4 KiB pages)
REFAULT_FLAT_FRACTION = 0.10      # RSS changed by less than this fraction of the bytes faulted in the sample
# Memory the allocator holds and the program does not (live export only).
HELD_MIN_BYTES = 64 * MIB
HELD_MIN_RSS_FRACTION = 0.25
# One remote-free pair that carries most of the remote frees (live export only).
PAIR_MIN_SHARE = 0.5              # of the remote frees per second
PAIR_MIN_PER_S = 10000


def hint_contention(r):
    """Many voluntary switches while several threads are busy: threads queueing on a lock, the heap's or not."""
    vol, busy = r["voluntary_switches_per_s"], r["busy_threads"]
    if vol is None or vol < CONTENTION_SWITCHES_PER_S or busy < CONTENTION_BUSY_THREADS:
        return None
    if r["threadheap_loaded"]:
        return (f"{vol:,.0f} context switches/s over {busy} busy threads: lock contention, but threadheap "
                "is already the allocator: look at the program's own locks")
    return f"{vol:,.0f} context switches/s over {busy} busy threads: heap contention? try `threadheap run`"


def hint_refault(r):
    """Many minor faults while RSS stays flat: memory given back to the OS and touched again."""
    faults, dt, change = r["minor_faults_per_s"], r["interval_s"], r["rss_change_bytes"]
    if faults is None or faults < REFAULT_FAULTS_PER_S or change is None:
        return None
    faulted = faults * dt * procstat.PAGE_SIZE
    if abs(change) >= REFAULT_FLAT_FRACTION * faulted:
        return None  # RSS grew (or shrank) with the faults: new memory, not the same memory again
    return (f"re-faulting {faults * procstat.PAGE_SIZE / MIB:,.0f} MiB/s of fresh pages ({faults:,.0f} minor "
            f"faults/s while RSS changed {signed_bytes(change)} in {dt:.1f} s): reuse buffers")


def hint_held(r):
    """The allocator holds (free, empty, cached, metadata) much of the RSS: memory the program does not use."""
    th = r["threadheap"]
    if not th or th["held_bytes"] is None or not r["rss_bytes"]:
        return None
    held, rss = th["held_bytes"], r["rss_bytes"]
    if held < HELD_MIN_BYTES or held < HELD_MIN_RSS_FRACTION * rss:
        return None
    parts = ", ".join(f"{label} {human_bytes(th[key])}" for key, label in
                      (("free_in_pages_bytes", "free in pages"), ("empty_pages_bytes", "empty pages"),
                       ("cached_bytes", "cached"), ("metadata_bytes", "metadata")) if th[key] is not None)
    return (f"{human_bytes(held)} held by the allocator, not the program ({held / rss:.0%} of RSS: {parts}): "
            "threadheap purges after THREADHEAP_PURGE_DELAY")


def hint_pair(r):
    """One pair of threads carries most of the remote frees: one allocates, the other frees."""
    th = r["threadheap"]
    if not th or not th["remote_pairs"] or th["remote_pairs"][0]["frees_per_s"] is None:
        return None
    first = th["remote_pairs"][0]
    total = th["remote_frees_per_s"]
    if total is None:
        total = sum(p["frees_per_s"] or 0 for p in th["remote_pairs"])
    rate = first["frees_per_s"]
    if rate < PAIR_MIN_PER_S or total <= 0 or rate < PAIR_MIN_SHARE * total:
        return None
    return (f"a producer/consumer pair: {thread_label(first['from_name'], first['from_tid'])} frees "
            f"{rate:,.0f} blocks/s of {thread_label(first['to_name'], first['to_tid'])}, "
            f"{min(rate / total, 1):.0%} of the remote frees: each block "
            "crosses threads; handing buffers back to the producer in batches saves the remote frees")


HINTS = (hint_contention, hint_refault, hint_held, hint_pair)


def thread_label(name, tid):
    """A thread of a remote-free pair: the writer names no owner (tid 0) when its heap has no thread left,
    and an exited thread's name may be empty."""
    return "a heap with no thread" if tid == 0 else f"{name or '?'} ({tid})"


# ------------------------------------------------------------------------------------------------ numbers

MISSING = "—"


def human_bytes(n):
    if n is None:
        return MISSING
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    return str(n)


def signed_bytes(n):
    return ("+" if n >= 0 else "") + human_bytes(n)


def rate_text(v):
    """A per-second rate, compact: '—', '0.4', '1,234', '12.3M'."""
    if v is None:
        return MISSING
    if v < 10:
        return f"{v:.1f}" if v else "0"
    return f"{v:,.0f}" if v < 1e7 else f"{v / 1e6:,.1f}M"


def percent_text(v):
    return MISSING if v is None else f"{v:.1f}"


def per_s(new, old, dt):
    """The rate of a counter between two readings; None if either is unknown. A counter that went back (a
    thread id reused within the sample) counts as 0."""
    if new is None or old is None or dt <= 0:
        return None
    return max(new - old, 0) / dt


def cpu_percent(new_ticks, old_ticks, dt):
    """CPU time between two readings in clock ticks, as a % of one core."""
    return (per_s(new_ticks, old_ticks, dt) or 0.0) * 100 / procstat.CLOCK_TICKS


# ------------------------------------------------------------------------------------------------ records


def system_rates(prev, cur):
    """The /proc/vmstat line: rates between two (monotonic time, {counter: value}) readings."""
    keys = ("pgfault_per_s", "pgmajfault_per_s", "pgalloc_per_s", "pgalloc_bytes_per_s", "pgfree_per_s",
            "thp_fault_alloc_per_s")
    if prev is None:
        return dict.fromkeys(keys)
    dt = cur[0] - prev[0]

    def pgalloc(vm):
        values = [v for k, v in vm.items() if k.startswith("pgalloc_")]
        return sum(values) if values else None

    alloc = per_s(pgalloc(cur[1]), pgalloc(prev[1]), dt)
    out = {f"{k}_per_s": per_s(cur[1].get(k), prev[1].get(k), dt)
           for k in ("pgfault", "pgmajfault", "pgfree", "thp_fault_alloc")}
    out["pgalloc_per_s"] = alloc
    out["pgalloc_bytes_per_s"] = None if alloc is None else alloc * procstat.PAGE_SIZE
    return {k: out[k] for k in keys}


def thread_rates(prev, cur, dt):
    """Per-thread rates, busiest first. A thread born within the sample counts from zero."""
    rows = []
    for tid, t in cur.threads.items():
        p = prev.threads.get(tid) or procstat.ThreadSample(tid, t.name, 0, 0, 0, 0, 0)
        rows.append({"tid": tid, "name": t.name,
                     "cpu_percent": cpu_percent(t.utime + t.stime, p.utime + p.stime, dt),
                     "voluntary_switches_per_s": per_s(t.voluntary, p.voluntary, dt),
                     "involuntary_switches_per_s": per_s(t.involuntary, p.involuntary, dt),
                     "minor_faults_per_s": per_s(t.minflt, p.minflt, dt)})
    rows.sort(key=lambda r: (-r["cpu_percent"], r["tid"]))
    return rows


class ExportHistory:
    """The last two distinct publications of one process's export: rates are taken between them."""

    def __init__(self):
        self.latest = self.previous = None

    def add(self, export, path_exists):
        if export is None:
            if not path_exists:  # gone (export off, or the program exec'd): forget it
                self.latest = self.previous = None
            return  # else busy or unreadable this once: keep what was read before
        if self.latest is not None and export.start_ns != self.latest.start_ns:
            self.latest = self.previous = None  # a new export (the pid's file was replaced)
        if self.latest is None or export.time_ns != self.latest.time_ns:
            self.previous, self.latest = self.latest, export


def export_view(history, now_ns, interval_s):
    """The record's "threadheap" object, or None without an export."""
    e, p = history.latest, history.previous
    if e is None:
        return None
    c = e.counters
    out = {f"{k}_bytes": c.get(k) for k in ("in_use", "free_in_pages", "empty_pages", "cached", "metadata",
                                          "purged", "mapped", "committed", "in_use_peak")}
    parts = [c[k] for k in ("free_in_pages", "empty_pages", "cached", "metadata") if k in c]
    if parts:
        out["held_bytes"] = sum(parts)
    elif "committed" in c and "in_use" in c:
        out["held_bytes"] = max(c["committed"] - c["in_use"], 0)
    else:
        out["held_bytes"] = None
    out["threads_live"] = c.get("threads_live")
    out["os_call_seconds"] = c["os_call_ns"] / 1e9 if "os_call_ns" in c else None
    age = max(now_ns - e.time_ns, 0) / 1e9
    out["published_age_s"] = age
    out["interval_ms"] = e.interval_ms
    dt = (e.time_ns - p.time_ns) / 1e9 if p is not None else 0
    # No publication for this long: the allocator's slow paths were not passed, so nothing moved.
    idle = age > 2 * e.interval_ms / 1000 + interval_s

    def rate(name):
        if name not in c:
            return None
        if idle:
            return 0.0
        return per_s(c[name], p.counters.get(name), dt) if p is not None else None

    for name in ("allocs", "frees", "remote_frees", "os_calls", "fresh_bytes", "reused_bytes"):
        key = name.replace("_bytes", "") + "_bytes_per_s" if name.endswith("_bytes") else f"{name}_per_s"
        out[key] = rate(name)
    ns = rate("os_call_ns")
    out["os_call_seconds_per_s"] = None if ns is None else ns / 1e9
    calls = out["os_calls_per_s"]
    out["os_call_us_avg"] = ns / calls / 1e3 if ns is not None and calls else None
    previous_pairs = {(q.from_tid, q.to_tid): q for q in p.pairs} if p is not None else {}
    pairs = []
    for q in e.pairs:
        before = previous_pairs.get((q.from_tid, q.to_tid))
        if idle:
            r = 0.0
        elif before is not None and dt > 0:
            r = per_s(q.frees_total, before.frees_total, dt)
        else:  # new in the list: its last interval's frees over the export's interval
            r = q.frees_interval * 1000 / e.interval_ms if e.interval_ms else None
        pairs.append({"from_tid": q.from_tid, "from_name": q.from_name, "to_tid": q.to_tid,
                      "to_name": q.to_name, "frees_per_s": r, "frees_total": q.frees_total})
    pairs.sort(key=lambda q: -(q["frees_per_s"] or 0))
    out["remote_pairs"] = pairs
    return out


def process_record(prev, cur, target, system, now, want_threads):
    """The record of one process over one sample (prev, cur: ProcessSample); the keys are in the docstring."""
    dt = max(cur.when - prev.when, 1e-6)
    threads = thread_rates(prev, cur, dt)
    th = export_view(target.history, int(now * 1e9), dt)
    loaded = True if th is not None else target.loaded
    r = {"pid": cur.pid, "command": cur.command, "name": cur.name, "time": now, "interval_s": dt,
         "rss_bytes": cur.rss, "rss_anon_bytes": cur.rss_anon, "rss_file_bytes": cur.rss_file,
         "lazyfree_bytes": cur.lazyfree, "rss_source": cur.rss_source, "rss_change_bytes": cur.rss - prev.rss,
         "minor_faults_per_s": per_s(cur.minflt, prev.minflt, dt),
         "major_faults_per_s": per_s(cur.majflt, prev.majflt, dt),
         "voluntary_switches_per_s": sum(t["voluntary_switches_per_s"] for t in threads),
         "involuntary_switches_per_s": sum(t["involuntary_switches_per_s"] for t in threads),
         "cpu_user_percent": cpu_percent(cur.utime, prev.utime, dt),
         "cpu_system_percent": cpu_percent(cur.stime, prev.stime, dt),
         "threads": cur.num_threads,
         "busy_threads": sum(1 for t in threads if t["cpu_percent"] >= BUSY_THREAD_PERCENT),
         "threadheap_loaded": loaded, "hints": [], "system": system,
         "per_thread": threads if want_threads else None, "threadheap": th}
    r["hints"] = [h for h in (f(r) for f in HINTS) if h]
    return r


# ------------------------------------------------------------------------------------------------ sampling


class TopError(Exception):
    """A one-line error for the user (exit status 1)."""


class Target:
    """One watched process."""

    def __init__(self, pid, first, loaded):
        self.pid, self.prev, self.loaded = pid, first, loaded
        self.start_ticks = first.start_ticks
        self.history = ExportHistory()
        self.gone = None  # why it is no longer watched
        self.last = None  # its last record


class Watch:
    """The processes named on the command line, sampled together."""

    def __init__(self, pids, proc="/proc", export_dir=procstat.EXPORT_DIR, smaps=True, threads=False):
        self.proc, self.export_dir, self.smaps, self.threads = proc, export_dir, smaps, threads
        self.vm = (time.monotonic(), procstat.read_vmstat(proc))
        self.targets = []
        for pid in pids:
            first = procstat.read_process(pid, proc, smaps)
            t = Target(pid, first, procstat.threadheap_loaded(pid, proc))
            t.history.add(procstat.read_export(pid, export_dir, proc, t.start_ticks), False)
            self.targets.append(t)

    @property
    def live(self):
        return [t for t in self.targets if t.gone is None]

    def sample(self):
        """(records of the processes still alive, targets that went away in this sample)."""
        vm = (time.monotonic(), procstat.read_vmstat(self.proc))
        system = system_rates(self.vm, vm)
        self.vm = vm
        now = time.time()
        records, gone = [], []
        for t in self.live:
            try:
                s = procstat.read_process(t.pid, self.proc, self.smaps)
                if s.start_ticks != t.start_ticks:
                    raise ProcessGone(t.pid)  # the pid now names another process
            except ProcessGone:
                t.gone = f"process {t.pid} ({t.prev.name}) exited"
            except NoAccess as e:
                t.gone = f"process {t.pid}: {e}"
            if t.gone:
                gone.append(t)
                continue
            export = procstat.read_export(t.pid, self.export_dir, self.proc, t.start_ticks)
            t.history.add(export, os.path.exists(procstat.export_path(t.pid, self.export_dir)))
            t.last = process_record(t.prev, s, t, system, now, self.threads)
            t.prev = s
            records.append(t.last)
        return records, gone

    def await_publication(self, deadline):
        """Until deadline, wait for a second publication of the exports seen only once (for --once)."""
        waiting = [t for t in self.live if t.history.latest is not None and t.history.previous is None]
        while waiting and time.monotonic() < deadline:
            time.sleep(0.05)
            for t in list(waiting):
                e = procstat.read_export(t.pid, self.export_dir, self.proc, t.start_ticks)
                if e is not None and e.time_ns != t.history.latest.time_ns:
                    waiting.remove(t)


def resolve_pids(pids, proc, warn):
    """The processes to watch: each pid checked, a thread's id replaced by its process's. TopError names
    the first pid that is not there or not readable."""
    out = []
    for pid in pids:
        try:
            tgid = procstat.thread_group(pid, proc)
            procstat.read_process(tgid, proc, smaps=False)
        except ProcessGone:
            raise TopError(f"no process {pid}") from None
        except NoAccess as e:
            raise TopError(f"process {pid}: {e} (run as its user or as root)") from None
        if tgid != pid:
            warn(f"{PROG}: {pid} is a thread of process {tgid}: watching {tgid}")
        if tgid not in out:
            out.append(tgid)
    return out


class ProcessList:
    """The processes with the largest RSS (no PID given)."""

    def __init__(self, limit, proc="/proc", export_dir=procstat.EXPORT_DIR):
        self.limit, self.proc, self.export_dir = limit, proc, export_dir
        self.vm = (time.monotonic(), procstat.read_vmstat(proc))
        self.prev = {(r.pid, r.start_ticks): r for r in procstat.list_processes(proc)}

    def sample(self):
        vm = (time.monotonic(), procstat.read_vmstat(self.proc))
        system = system_rates(self.vm, vm)
        dt = vm[0] - self.vm[0]
        self.vm = vm
        rows = procstat.list_processes(self.proc)
        exports = {pid for pid in procstat.export_pids(self.export_dir)
                   if procstat.read_export(pid, self.export_dir, self.proc) is not None}
        out = []
        for r in sorted(rows, key=lambda r: -r.rss)[:self.limit]:
            before = self.prev.get((r.pid, r.start_ticks))
            cpu = cpu_percent(r.cpu_ticks, before.cpu_ticks, dt) if before else None
            out.append({"pid": r.pid, "command": procstat.command_line(r.pid, self.proc) or f"[{r.name}]",
                        "rss_bytes": r.rss, "threads": r.threads, "cpu_percent": cpu,
                        "threadheap_export": r.pid in exports})
        self.prev = {(r.pid, r.start_ticks): r for r in rows}
        return {"time": time.time(), "interval_s": dt, "system": system, "processes": out}


# ------------------------------------------------------------------------------------------------ main


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line."""

    def error(self, message):
        sys.stderr.write(f"{PROG}: {message} (see {PROG} --help)\n")
        sys.exit(2)


def _positive(kind, minimum):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"malformed number '{text}'") from None
        if v < minimum or v != v:
            raise argparse.ArgumentTypeError(f"'{text}' is below {minimum}")
        return v
    return parse


def build_parser():
    p = _Parser(prog=PROG,
                description="What memory costs a running process, whatever its allocator: RSS and its split, "
                            "page faults, context switches and CPU from /proc, and threadheap's own counters "
                            "when the process publishes its live export (THREADHEAP_STATS_INTERVAL). Without "
                            "a PID: the processes with the largest RSS. The live view quits on q or Ctrl-C.",
                epilog=f"Hints: heap contention (>= {CONTENTION_SWITCHES_PER_S:,} voluntary switches/s with >= "
                       f"{CONTENTION_BUSY_THREADS} threads using >= {BUSY_THREAD_PERCENT:g}% of a core); "
                       f"re-faulting (>= {REFAULT_FAULTS_PER_S:,} minor faults/s while RSS changes by less than "
                       f"{REFAULT_FLAT_FRACTION:.0%} of the bytes faulted); memory held by the allocator (live "
                       f"export: >= {HELD_MIN_BYTES // MIB} MiB and >= {HELD_MIN_RSS_FRACTION:.0%} of RSS); a "
                       f"producer/consumer pair (live export: one pair >= {PAIR_MIN_SHARE:.0%} of the remote "
                       f"frees and >= {PAIR_MIN_PER_S:,}/s). The system line is /proc/vmstat per second. Linux "
                       "counts no page zeroing; every page allocated for an anonymous fault is zeroed, so pgalloc "
                       "is the best proxy for zeroing. Columns, hints and every JSON key: docs/top.md.")
    p.add_argument("pids", nargs="*", type=_positive(int, 1), metavar="PID", help="processes to watch")
    p.add_argument("--interval", type=_positive(float, 0.05), default=1.0, metavar="SECONDS",
                   help="seconds between samples (default 1)")
    p.add_argument("--limit", type=_positive(int, 1), default=15, metavar="N",
                   help="without a PID: how many processes to list (default 15)")
    p.add_argument("--threads", action="store_true", help="a row per thread: CPU, switches/s, minor faults/s")
    p.add_argument("--once", action="store_true", help="two samples --interval apart, one plain-text table")
    p.add_argument("--json", action="store_true", help="one JSON object per line per sample (keys: docs/top.md)")
    p.add_argument("--count", type=_positive(int, 1), metavar="N", help="stop after N samples")
    p.add_argument("--no-smaps", dest="smaps", action="store_false",
                   help="RSS from /proc/PID/status only (no LazyFree): smaps_rollup walks the page tables "
                        "under the process's mmap lock, which a process of hundreds of GiB can feel")
    p.add_argument("--export-dir", default=procstat.EXPORT_DIR, metavar="DIR",
                   help=f"where the live export files are (default {procstat.EXPORT_DIR})")
    return p


def rounded(value):
    """value with its floats rounded to 3 decimals, for JSON that a person can read."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def to_json(value):
    return json.dumps(rounded(value), ensure_ascii=False) + "\n"


def write_line(text):
    sys.stdout.write(text)
    sys.stdout.flush()


def sleep_until(deadline):
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(left)


def run_stream(sampler, args, is_list):
    """--once, --json and the plain table on a non-terminal: printed sample by sample. 1 when every watched
    process has gone."""
    from .top_view import plain_list, plain_processes

    count = 1 if args.once else args.count
    printed = 0
    next_at = time.monotonic() + args.interval
    while count is None or printed < count:
        sleep_until(next_at)
        if args.once and not is_list:
            # Export rates need two publications: give a process that published once its interval to do so.
            export_ms = max((t.history.latest.interval_ms for t in sampler.live if t.history.latest), default=0)
            sampler.await_publication(time.monotonic() + min(5.0, 1.5 * export_ms / 1000))
        next_at = time.monotonic() + args.interval
        if is_list:
            data = sampler.sample()
            write_line(to_json(data) if args.json else plain_list(data))
        else:
            records, gone = sampler.sample()
            for t in gone:
                sys.stderr.write(f"{PROG}: {t.gone}\n")
            if args.json:
                write_line("".join(to_json(r) for r in records))
            elif records:
                write_line(plain_processes(records, [t for t in sampler.targets if t.gone]))
            if not sampler.live:
                sys.stderr.write(f"{PROG}: every watched process has exited\n")
                return 1
        printed += 1
        if not args.json and not args.once and (count is None or printed < count):
            write_line("\n")
    return 0


def quit_on_signal(signum, _frame):
    raise KeyboardInterrupt


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    global MISSING
    MISSING = "—" if "utf" in (getattr(sys.stdout, "encoding", "") or "").lower() else "-"
    # SIGTERM and SIGHUP end the view as q does, so the terminal is restored on the way out.
    saved = {sig: signal.signal(sig, quit_on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        if args.pids:
            pids = resolve_pids(args.pids, "/proc", lambda m: sys.stderr.write(m + "\n"))
            sampler = Watch(pids, export_dir=args.export_dir, smaps=args.smaps, threads=args.threads)
        else:
            sampler = ProcessList(args.limit, export_dir=args.export_dir)
        if args.once or args.json or not sys.stdout.isatty():
            return run_stream(sampler, args, not args.pids)
        from .top_view import run_live

        return run_live(sampler, args, not args.pids)
    except TopError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 1
    except ProcessGone as e:
        sys.stderr.write(f"{PROG}: the process went away while starting ({e})\n")
        return 1
    except NoAccess as e:
        sys.stderr.write(f"{PROG}: {e} (run as the process's user or as root)\n")
        return 1
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
