"""What `threadheap run --stats` prints at exit (report) and what `--stats` and `--record` sample while the
program runs (Sampler). Standard library only; docs/run.md says how each number is computed.

The story has four parts: where the time went (wall, CPU, the allocator's own system calls, first-touch page
faults priced by a calibration of this machine), where the memory went (threadheap's RSS attribution at exit
and at the sampled peak), who frees whose memory (remote-free pairs), and one line of advice per cost that
passes its threshold.

The fault price is the median of FAULT_CALIBRATION_RUNS runs of the `touch` workload (bench/touch.c, its
mmap method: a fresh anonymous mapping written once per page), cached in $XDG_CACHE_HOME/threadheap/touch.json
(else ~/.cache/threadheap/touch.json) and measured again when the kernel or the host changes.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from . import procstat

PROG = "threadheap run"
REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20

# threadheap's RSS attribution: the parts of its resident memory, in the order the at-exit table prints them.
ATTRIBUTION = ("in_use", "free_in_pages", "empty_pages", "cached", "metadata")
ATTRIBUTION_LABELS = {"in_use": "in use by the program", "free_in_pages": "free in pages in use",
                      "empty_pages": "empty pages", "cached": "cached", "metadata": "metadata"}
# Counters that are bytes (the at-exit counters table shows them in KiB/MiB); the rest are counts.
BYTE_COUNTERS = {"committed", "committed_peak", "mapped", "cached", "purged_bytes", "in_use", "free_in_pages",
                 "empty_pages", "metadata", "purged", "in_use_peak"}

# Advice. A line is printed for a cost that passes both its share and its floor; the floors keep a short
# program (whose start-up alone takes a few hundred faults) from being advised about nothing.
FAULT_ADVICE_SHARE = 0.20        # estimated CPU in first-touch faults, over the wall time
FAULT_ADVICE_FLOOR_S = 0.05
OS_CALL_ADVICE_SHARE = 0.05      # time in the allocator's own mmap/munmap/madvise calls, over the wall time
OS_CALL_ADVICE_FLOOR_S = 0.01
HELD_ADVICE_SHARE = 0.50         # free in pages + empty pages + cached at exit, over in_use at exit
HELD_ADVICE_FLOOR = 64 * MIB

# Calibration: runs of the touch workload (each maps and writes 256 MiB, ~0.15 s); the median is kept.
FAULT_CALIBRATION_RUNS = 3
CALIBRATION_TIMEOUT_S = 60
REMOTE_PAIRS_SHOWN = 5
# wait4's maxrss above this command's RSS at the fork by more than this is the program's own peak.
PEAK_RSS_MARGIN = 2 * MIB

_COUNTER_LINE = re.compile(r"threadheap: ([a-z][a-z0-9_]*) +(\d+)")
_PAIR_LINE = re.compile(r"threadheap: +(\d+) frees into (\d+) +(\d+)")


# ------------------------------------------------------------------------------------------------ sampling


@dataclass
class Sample:
    t: float             # seconds since the program was started
    rss: int             # bytes (VmRSS of /proc/PID/status)
    rss_anon: int        # RssAnon
    hwm: int             # VmHWM: the program's peak RSS so far (its own: the mm is new at the exec)
    minflt: int          # whole process, exited threads included (/proc/PID/stat)
    voluntary: int       # context switches, summed over the live threads (/proc/PID/task/*/status)
    involuntary: int
    parts: dict = None   # ATTRIBUTION name -> bytes from the live export's last publication, None without one
    purged: int = None   # the export's `purged`: mapped, not resident
    pairs: list = None   # procstat.RemotePair of that publication
    published: float = None  # when the library wrote that publication, seconds since the start: up to an
    #                          interval (or more, between slow paths) before t, when /proc was read

    @property
    def held(self):
        """threadheap's resident total (the sum of the attribution), None without an export."""
        return sum(self.parts.values()) if self.parts is not None else None


def _read_text(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def own_rss():
    """This process's VmRSS in bytes, None if unreadable."""
    try:
        return procstat.parse_status(_read_text("/proc/self/status")).get("VmRSS")
    except OSError:
        return None


class Sampler:
    """Reads the running program's /proc files and live export. Keeps the sample with the highest threadheap
    resident total (peak_export), the one with the highest RSS (peak_rss), the last remote-free pairs seen and,
    with keep=True (--record), every sample."""

    def __init__(self, pid, start, keep=False, proc="/proc", export_dir=procstat.EXPORT_DIR):
        self.pid, self.start, self.keep = pid, start, keep
        self.start_wall = time.time() - (time.monotonic() - start)  # the start on the export's clock
        self.proc, self.export_dir = proc, export_dir
        self.samples = []
        self.peak_export = self.peak_rss = None
        self.hwm = 0       # the highest VmHWM seen
        self.pairs = []
        self._start_ticks = None

    def read_proc(self):
        """(Sample without export, start ticks) from stat, status and each task's status; OSError or
        ValueError when the process is gone or a zombie (or its files are not readable)."""
        base = f"{self.proc}/{self.pid}"
        when = time.monotonic()
        _, fields = procstat.parse_stat(_read_text(f"{base}/stat"))
        if procstat.stat_field(fields, 3) in ("Z", "X"):
            raise ValueError("zombie")
        status = procstat.parse_status(_read_text(f"{base}/status"))
        vol = invol = 0
        for tid in os.listdir(f"{base}/task"):
            try:
                t = procstat.parse_status(_read_text(f"{base}/task/{tid}/status"))
            except OSError:
                continue  # the thread exited meanwhile
            vol += t.get("voluntary_ctxt_switches", 0)
            invol += t.get("nonvoluntary_ctxt_switches", 0)
        sample = Sample(when - self.start, status.get("VmRSS", 0), status.get("RssAnon", 0), status.get("VmHWM", 0),
                        int(procstat.stat_field(fields, 10)), vol, invol)
        return sample, int(procstat.stat_field(fields, 22))

    def sample(self):
        """One sample, or None when the process is gone (or its pid is someone else's)."""
        try:
            s, start_ticks = self.read_proc()
        except (OSError, ValueError, IndexError):
            return None
        if self._start_ticks is None:
            self._start_ticks = start_ticks
        elif start_ticks != self._start_ticks:
            return None
        export = procstat.read_export(self.pid, directory=self.export_dir, proc=self.proc, start_ticks=start_ticks)
        if export is not None and all(k in export.counters for k in ATTRIBUTION):
            s.parts = {k: export.counters[k] for k in ATTRIBUTION}
            s.purged = export.counters.get("purged")
            s.pairs = export.pairs
            s.published = export.time_ns / 1e9 - self.start_wall
            if export.pairs:
                self.pairs = export.pairs
            if self.peak_export is None or s.held > self.peak_export.held:
                self.peak_export = s
        if self.peak_rss is None or s.rss > self.peak_rss.rss:
            self.peak_rss = s
        self.hwm = max(self.hwm, s.hwm)
        if self.keep:
            self.samples.append(s)
        return s


# ------------------------------------------------------------------------------------------------ counters


def parse_counters(text):
    """{name: value} from the at-exit counters file: only its "threadheap: <name> <integer>" lines (the table
    at its top and the remote-free lines are skipped)."""
    counters = {}
    for line in text.splitlines():
        m = _COUNTER_LINE.fullmatch(line.strip())
        if m:
            counters[m.group(1)] = int(m.group(2))
    return counters


def parse_exit_pairs(text):
    """The at-exit file's remote-free lines ("threadheap:   1234 frees into 1235   99"), as RemotePairs
    without names: used when no publication of the live export had any."""
    pairs = []
    for line in text.splitlines():
        m = _PAIR_LINE.fullmatch(line.strip())
        if m:
            frees = int(m.group(3))
            pairs.append(procstat.RemotePair(int(m.group(1)), int(m.group(2)), "", "", 0, frees))
    return pairs


# ------------------------------------------------------------------------------------------------ calibration


class CalibrationError(Exception):
    """The fault price could not be measured (the message says why, for "not calibrated (...)")."""


@dataclass
class Calibration:
    us_per_fault: float = None  # None: not calibrated
    path: Path = None           # the cache file
    fresh: bool = False         # measured by this command (not read from the file)
    runs: list = None           # the runs' µs per fault
    binary: str = None
    error: str = None           # why not calibrated, or why the result was not saved


def cache_dir():
    """$XDG_CACHE_HOME/threadheap, else ~/.cache/threadheap (XDG: a relative XDG_CACHE_HOME is ignored)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "threadheap"


def cache_file():
    """The fault calibration: cache_dir()/touch.json."""
    return cache_dir() / "touch.json"


def touch_binary():
    """The touch workload, found as `threadheap bench` finds its workloads: $TH_BIN_DIR, else
    $TH_BUILD_DIR/bin, else build/bin of the source tree."""
    bin_dir = os.environ.get("TH_BIN_DIR") or os.path.join(os.environ.get("TH_BUILD_DIR") or REPO / "build", "bin")
    return Path(bin_dir) / "touch"


def machine_key():
    """What a calibration depends on: the file is measured again when one of these differs."""
    u = os.uname()
    return {"host": u.nodename, "kernel": u.release, "arch": u.machine, "cpus": os.cpu_count()}


def measure_fault_cost(binary, runs=FAULT_CALIBRATION_RUNS):
    """µs per minor fault of each run of `touch --methods mmap` (its own timer around one write per page of
    a fresh 256 MiB mapping, over its minor faults). The workload runs without any preload."""
    if not os.access(binary, os.X_OK):
        raise CalibrationError(f"no touch workload at {binary}; TH_BIN_DIR names its folder")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    values = []
    for _ in range(runs):
        try:
            proc = subprocess.run([str(binary), "--methods", "mmap"], capture_output=True, text=True, env=env,
                                  timeout=CALIBRATION_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as e:
            raise CalibrationError(f"cannot run {binary}: {e}") from None
        row = None
        for line in proc.stdout.splitlines():
            try:
                row = json.loads(line)
                break
            except json.JSONDecodeError:
                continue
        if proc.returncode != 0:
            raise CalibrationError(f"{binary} failed (exit {proc.returncode})")
        if not isinstance(row, dict):
            raise CalibrationError(f"{binary} printed no result")
        try:
            ms, minflt = float(row["ms"]), int(row["minflt"])
        except (KeyError, TypeError, ValueError):
            raise CalibrationError(f"{binary} printed no ms and minflt") from None
        if minflt <= 0 or ms <= 0:
            raise CalibrationError(f"{binary} measured no faults")
        values.append(ms * 1000 / minflt)
    return values


def load_calibration(path):
    """The cached price if the file is valid and was measured on this machine and kernel, else None."""
    try:
        data = json.loads(path.read_text())
        us = float(data["us_per_fault"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not 0 < us < float("inf") or data.get("machine") != machine_key():
        return None
    return Calibration(us, path, False, data.get("runs"), data.get("binary"))


def calibrate(force=False, binary=None, path=None):
    """The µs per minor fault: from the cache file, or measured now and saved there (force: always measured).
    Never raises: a Calibration with us_per_fault None and .error says why there is no price."""
    path = path or cache_file()
    if not force:
        cached = load_calibration(path)
        if cached is not None:
            return cached
    binary = binary or touch_binary()
    try:
        runs = measure_fault_cost(binary)
    except CalibrationError as e:
        return Calibration(None, path, error=str(e), binary=str(binary))
    us = sorted(runs)[len(runs) // 2]
    result = Calibration(us, path, True, runs, str(binary))
    data = {"us_per_fault": round(us, 4), "runs": [round(r, 4) for r in runs], "method": "mmap",
            "size_mb": 256, "binary": str(binary), "machine": machine_key(),
            "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)  # a reader never sees half a file
    except OSError as e:
        result.error = f"not saved: {e.strerror or e}"
        try:
            tmp.unlink()
        except OSError:
            pass
    return result


# ------------------------------------------------------------------------------------------------ formatting


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def human_seconds(s):
    if s == 0:
        return "0 s"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 0.001:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e3:.3f} ms"


def share(part, whole):
    return f"{100 * part / whole:.1f}% of wall" if whole > 0 else ""


def counter_text(name, value):
    if name in BYTE_COUNTERS or name.endswith("_bytes"):
        return human_bytes(value)
    if name.endswith("_ns"):
        return human_seconds(value / 1e9)
    return str(value)


def how_it_ended(status):
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "?"
        return f"was killed by signal {sig} ({name})"
    return f"exited with status {os.WEXITSTATUS(status)}"


# ------------------------------------------------------------------------------------------------ the story


@dataclass
class Facts:
    """The numbers the advice is decided on."""
    wall: float
    fault_s: float = None    # estimated CPU in minor faults, None when not calibrated
    os_call_s: float = None  # None without threadheap's counters
    os_calls: int = 0
    counters: dict = None


def advice(f):
    """One line per cost over its threshold (FAULT_ADVICE_*, OS_CALL_ADVICE_*, HELD_ADVICE_*), with its
    numbers; [] when nothing calls for it."""
    lines = []
    c = f.counters or {}
    if f.fault_s is not None and f.fault_s > FAULT_ADVICE_FLOOR_S and f.fault_s > FAULT_ADVICE_SHARE * f.wall:
        lines.append(f"first-touch faults cost ~{f.fault_s:.2f} s of {f.wall:.2f} s: reuse large buffers or keep "
                     f"them (THREADHEAP_PURGE_DELAY)")
    if f.os_call_s is not None and f.os_call_s > OS_CALL_ADVICE_FLOOR_S and \
            f.os_call_s > OS_CALL_ADVICE_SHARE * f.wall:
        lines.append(f"the allocator's {f.os_calls} mmap/munmap/madvise calls took {f.os_call_s:.2f} s of "
                     f"{f.wall:.2f} s ({c.get('os_maps', 0)} maps, {c.get('os_unmaps', 0)} unmaps, "
                     f"{c.get('os_purges', 0)} purges): keep memory longer (THREADHEAP_PURGE_DELAY, "
                     f"THREADHEAP_CACHE_MAX)")
    if all(k in c for k in ATTRIBUTION):
        held = c["free_in_pages"] + c["empty_pages"] + c["cached"]
        if held > HELD_ADVICE_FLOOR and held > HELD_ADVICE_SHARE * c["in_use"]:
            what = (f"threadheap held {human_bytes(held)} unused at exit beside {human_bytes(c['in_use'])} in use "
                    f"(free in pages {human_bytes(c['free_in_pages'])}, empty pages {human_bytes(c['empty_pages'])}, "
                    f"cached {human_bytes(c['cached'])})")
            if c["free_in_pages"] >= c["empty_pages"] + c["cached"]:
                waiting = c.get("segments_waiting", 0)
                if waiting:  # a thread exited with blocks still out: its pages wait for a live thread
                    lines.append(f"{what}: mostly free blocks in pages of exited threads' heaps ({waiting} "
                                 f"segments waiting to be adopted by a thread that allocates)")
                else:
                    lines.append(f"{what}: mostly free blocks in pages still in use (fragmentation): keep "
                                 f"long-lived blocks apart from short-lived ones (an explicit th_heap for either)")
            else:
                lines.append(f"{what}: return it sooner (a shorter THREADHEAP_PURGE_DELAY"
                             + (", a smaller THREADHEAP_CACHE_MAX)" if c["cached"] > c["empty_pages"] else ")"))
    return lines


def _rows(rows):
    """'  label  value  note' lines, the values right-aligned in one column."""
    return [f"  {label:<30}{value:>12}  {note}".rstrip() for label, value, note in rows]


def peak_rss_row(rusage, sampler, parent_rss):
    """wait4's maxrss is the highest RSS the child process ever had, and before its exec the child was a copy
    of this Python (the kernel keeps the maximum across the exec). A maxrss above this process's RSS at the
    fork (plus PEAK_RSS_MARGIN) is the program's; one below is only an upper bound, shown beside the
    program's own VmHWM as last sampled, a lower bound."""
    maxrss = rusage.ru_maxrss * 1024
    sampled = sampler.hwm if sampler is not None else 0
    if parent_rss is None or maxrss > parent_rss + PEAK_RSS_MARGIN or sampled >= maxrss:
        return ("peak RSS", human_bytes(maxrss), "")
    note = "wait4's, which counts this command's Python before the exec"
    if sampled:
        note += f"; {human_bytes(sampled)} sampled (VmHWM)"
    return ("peak RSS", "≤ " + human_bytes(maxrss), note)


def time_section(rusage, wall, counters, cal, sampler=None, parent_rss=None):
    """The 'time' lines and the Facts for the advice."""
    facts = Facts(wall, counters=counters)
    rows = [("wall", human_seconds(wall), ""),
            ("user CPU", human_seconds(rusage.ru_utime), share(rusage.ru_utime, wall)),
            ("system CPU", human_seconds(rusage.ru_stime), share(rusage.ru_stime, wall) + ", in the kernel")]
    if "os_call_ns" in counters:
        facts.os_call_s, facts.os_calls = counters["os_call_ns"] / 1e9, counters.get("os_calls", 0)
        rows.append(("allocator's OS calls", human_seconds(facts.os_call_s),
                     f"{share(facts.os_call_s, wall)}: {facts.os_calls} mmap/munmap/madvise calls, all threads"))
    else:
        rows.append(("allocator's OS calls", "?", "(no threadheap counters)"))
    rows.append(("minor page faults", str(rusage.ru_minflt), ""))
    if cal.us_per_fault is not None:
        # Faults are CPU time of the program's own threads: an estimate above its CPU time (a price
        # measured on a busier machine) is capped there.
        estimate = rusage.ru_minflt * cal.us_per_fault / 1e6
        cpu = rusage.ru_utime + rusage.ru_stime
        facts.fault_s = min(estimate, cpu)
        capped = ", capped at the CPU time" if estimate > cpu else ""
        note = "measured now, saved in" if cal.fresh and not cal.error else "calibration:"
        rows.append(("  their cost, estimated", "~" + human_seconds(facts.fault_s),
                     f"{share(facts.fault_s, wall)}: {cal.us_per_fault:.2f} µs per fault{capped}"))
        rows.append(("", "", f"{note} {cal.path}" + (f" ({cal.error})" if cal.error else "")))
    else:
        rows.append(("  their cost", "?", f"not calibrated ({cal.error})"))
    rows += [("major page faults", str(rusage.ru_majflt), ""), ("voluntary switches", str(rusage.ru_nvcsw), ""),
             ("involuntary switches", str(rusage.ru_nivcsw), "")]
    rows.append(peak_rss_row(rusage, sampler, parent_rss))
    return ["time (wait4's rusage: the program and the children it waited for)"] + _rows(rows), facts


def memory_section(counters, sampler, export_interval):
    """threadheap's RSS attribution at exit (the counters file) and at the sampled peak (the live export)."""
    have_exit = all(k in counters for k in ATTRIBUTION)
    peak = sampler.peak_export if sampler else None
    if not have_exit and peak is None:
        return ["memory: no threadheap counters (the program ended without exit handlers: a signal, _exit, "
                "as dash does; or threadheap was not loaded in it)"]

    if peak is None and have_exit and not any(counters.get(k) for k in ATTRIBUTION + ("purged",)):
        return [f"memory: threadheap held nothing at exit ({counters.get('allocs', 0)} allocations)"]

    def cell(value):
        return human_bytes(value) if value is not None else "-"

    rows = [(ATTRIBUTION_LABELS[k], counters.get(k), peak.parts[k] if peak else None) for k in ATTRIBUTION]
    rows.append(("resident, total", sum(counters[k] for k in ATTRIBUTION) if have_exit else None,
                 peak.held if peak else None))
    rows.append(("mapped, not resident", counters.get("purged"), peak.purged if peak else None))
    # The peak column is the publication with the highest total, dated when the library wrote it; /proc's
    # RSS beside it was read when the sampler found it, up to an interval later.
    head = f"  {'':<30}{'at exit':>12}"
    if peak:
        published = peak.published if peak.published is not None else peak.t
        late = f"{peak.t:.2f}" != f"{published:.2f}"
        rows.append((f"process RSS (/proc) at {peak.t:.2f} s" if late else "process RSS (/proc)", None, peak.rss))
        if peak.rss_anon:  # RssAnon: Linux 4.5 and later
            anon, file_ = procstat.rest_of_rss(peak.rss, peak.rss_anon, peak.held)
            rows.append(("  anonymous, not threadheap's", None, anon))
            rows.append(("  file-backed and shared", None, file_))
        head += f"{f'at peak ({published:.2f} s)':>22}"
    lines = ["memory (threadheap's attribution of its resident bytes)", head]
    for label, at_exit, at_peak in rows:
        lines.append((f"  {label:<30}{cell(at_exit):>12}" + (f"{cell(at_peak):>22}" if peak else "")).rstrip())
    if peak is None:
        why = ("THREADHEAP_STATS_INTERVAL=0" if export_interval in ("0", "") else
               "the program ended before its first publication")
        lines.append(f"  no peak: no live export was read ({why})")
    # committed_peak follows every change, so a peak between two publications still shows there.
    committed_peak = counters.get("committed_peak")
    if peak is not None and committed_peak and committed_peak > peak.held:
        lines.append(f"  committed at its highest: {human_bytes(committed_peak)} (committed_peak, counted at "
                     "every change)")
    top = sampler.peak_rss if sampler else None
    if peak is not None and top is not None and top is not peak:
        lines.append(f"  highest sampled RSS: {human_bytes(top.rss)} at {top.t:.2f} s")
    return lines


def pairs_section(pairs):
    if not pairs:
        return []
    lines = ["remote frees (freeing thread -> owning thread, since start)"]
    for p in pairs[:REMOTE_PAIRS_SHOWN]:
        src = f"{p.from_tid} {p.from_name}".strip()
        dst = "exited threads" if p.to_tid == 0 else f"{p.to_tid} {p.to_name}".strip()
        lines.append(f"  {src:<24} -> {dst:<24}{p.frees_total:>14} frees")
    return lines


def counters_section(counters, columns=3):
    """Every counter of the at-exit file, as today's report listed them, in a grid."""
    if not counters:
        return []
    width = max(len(k) for k in counters) + 1
    cells = [f"{k:<{width}}{counter_text(k, v):>10}" for k, v in counters.items()]
    rows = -(-len(cells) // columns)
    lines = ["counters at exit (th_stats_t)"]
    for r in range(rows):
        lines.append("  " + "   ".join(c for c in cells[r::rows]).rstrip())
    return lines


def report(command, status, rusage, wall, counters, sampler, cal, export_interval, exit_pairs=(), parent_rss=None):
    """The --stats block, as text."""
    out = [f"{PROG}: {shlex.join(command)} {how_it_ended(status)} after {wall:.3f} s"]
    time_lines, facts = time_section(rusage, wall, counters, cal, sampler, parent_rss)
    out += time_lines
    out += memory_section(counters, sampler, export_interval)
    out += pairs_section((sampler.pairs if sampler else None) or list(exit_pairs))
    out += counters_section(counters)
    out += [f"advice: {a}" for a in advice(facts)]
    return "\n".join(out) + "\n"


def calibration_line(cal):
    """What `threadheap run --calibrate` prints."""
    if cal.us_per_fault is None:
        return f"{PROG}: not calibrated: {cal.error}"
    runs = ", ".join(f"{r:.2f}" for r in cal.runs or [])
    saved = f"saved in {cal.path}" if not cal.error else cal.error
    return (f"{PROG}: {cal.us_per_fault:.2f} µs per minor fault (median of {runs} µs: {cal.binary} --methods "
            f"mmap, 256 MiB), {saved}")

