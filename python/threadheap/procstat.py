"""Where `threadheap top` gets its numbers: /proc for any process, and threadheap's live export file.

Standard library only. Every function takes the root of /proc (`proc`) and the folder of the export files
(`directory`) as parameters, so the tests can run them on trees of their own.

/proc, per process (read_process):
  stat                  minor and major faults (fields 10, 12), user and system time in clock ticks (14, 15),
                        threads (20), start time (22, to tell a reused pid); process-wide: exited threads
                        are included
  status                VmRSS, RssAnon, RssFile + RssShmem (the fallback split), Tgid
  smaps_rollup          Rss, Anonymous, LazyFree: exact, but the kernel walks the page tables under the
                        process's mmap lock to make it (read_process(smaps=False) skips it); readable only
                        by the process's owner or root, else the status fallback is used
  task/TID/stat, status per thread: name, CPU, minor faults, voluntary_ctxt_switches, nonvoluntary_ctxt_switches
                        (/proc/PID/status has the main thread's switches only: the process's are the sum)
  cmdline, comm         the command
  maps                  whether libthreadheap is loaded (threadheap_loaded, once per process)
System-wide: /proc/vmstat (read_vmstat) and, for the process list, every /proc/PID/stat (list_processes).

The live export (read_export) is specified in docs/live-export.md: /dev/shm/threadheap.<pid>, a 64-byte
header, C counters of 32 bytes, P remote-free pairs of 56 bytes, all little-endian, read under a seqlock.
"""

import errno
import os
import stat as _stat
import struct
import time
from dataclasses import dataclass, field

EXPORT_DIR = "/dev/shm"
EXPORT_PREFIX = "threadheap."
EXPORT_MAGIC = b"THSTATS1"
EXPORT_VERSION = 1
# magic, version, size, sequence, pid, time ns, interval ms, counters C, pairs P, start ns
EXPORT_HEADER = struct.Struct("<8sIIQQQQIIQ")
EXPORT_COUNTER = struct.Struct("<24sQ")
# freeing tid, owning tid, freeing name, owning name, frees in the last interval, frees since start
EXPORT_PAIR = struct.Struct("<II16s16sQQ")
# A file bigger than this is not an export (a version-1 writer has a few dozen counters and pairs).
EXPORT_MAX_SIZE = 1 << 20
# The seqlock: a writer holds the sequence odd for microseconds; one stopped mid-write (SIGSTOP, a debugger)
# holds it for as long as it is stopped, so the reader gives up after about EXPORT_RETRIES milliseconds.
EXPORT_RETRIES = 20

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class ProcessGone(Exception):
    """The process does not exist (any more), or is a zombie."""


class NoAccess(Exception):
    """The process exists but this user may not read what is needed; the message names the file."""


@dataclass
class ThreadSample:
    tid: int
    name: str
    utime: int          # clock ticks
    stime: int
    minflt: int
    voluntary: int      # context switches since the thread started
    involuntary: int


@dataclass
class ProcessSample:
    pid: int
    when: float         # time.monotonic() of the read
    name: str           # comm
    command: str        # the command line, or [comm] for a kernel thread
    start_ticks: int    # stat field 22: with the pid, names the process (pids are reused)
    utime: int          # clock ticks, whole process
    stime: int
    minflt: int
    majflt: int
    num_threads: int
    rss: int            # bytes
    rss_anon: int
    rss_file: int       # file-backed and shared memory (RssFile + RssShmem, or Rss - Anonymous)
    lazyfree: int       # None without smaps_rollup
    rss_source: str     # "smaps_rollup" or "status"
    threads: dict = field(default_factory=dict)   # tid -> ThreadSample

    @property
    def voluntary(self):
        return sum(t.voluntary for t in self.threads.values())

    @property
    def involuntary(self):
        return sum(t.involuntary for t in self.threads.values())


@dataclass
class RemotePair:
    from_tid: int
    to_tid: int
    from_name: str
    to_name: str
    frees_interval: int  # frees in the writer's last interval
    frees_total: int     # since the export started


@dataclass
class Export:
    pid: int
    sequence: int
    time_ns: int        # last publication, CLOCK_REALTIME
    interval_ms: int
    start_ns: int
    counters: dict      # name -> value, every name in the file (the caller picks those it knows)
    pairs: list         # RemotePair, largest frees_total first


# ------------------------------------------------------------------------------------------------ /proc


def _read(path):
    """A /proc file's text. ProcessGone when it (or its process) is gone, NoAccess when not allowed."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        raise ProcessGone(path) from None
    except PermissionError:
        raise NoAccess(f"cannot read {path}: permission denied") from None
    except OSError as e:
        if e.errno == errno.ESRCH:  # the process exited between open and read
            raise ProcessGone(path) from None
        raise


def parse_stat(text):
    """(comm, [fields from 3 on]) of a /proc/PID/stat line; fields[i] is the man page's field i + 3."""
    open_paren, close_paren = text.index("("), text.rindex(")")  # comm may hold spaces and parentheses
    return text[open_paren + 1:close_paren], text[close_paren + 2:].split()


def stat_field(fields, number):
    """Field `number` of proc(5)'s /proc/PID/stat numbering (1-based, pid is 1) from parse_stat's list."""
    return fields[number - 3]


def parse_status(text):
    """{key: value} of /proc/PID/status; "kB" values become bytes (int), numbers ints, the rest strings."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            out[key] = int(parts[0]) * 1024
        elif len(parts) == 1 and parts[0].isdigit():
            out[key] = int(parts[0])
        else:
            out[key] = value.strip()
    return out


def parse_smaps_rollup(text):
    """{key: bytes} of /proc/PID/smaps_rollup (its first line, the address range, is skipped)."""
    return {k: v for k, v in parse_status(text).items() if isinstance(v, int)}


def read_thread(task_dir, tid):
    """One thread's ThreadSample, or None if it exited meanwhile."""
    try:
        name, fields = parse_stat(_read(f"{task_dir}/{tid}/stat"))
        status = parse_status(_read(f"{task_dir}/{tid}/status"))
    except ProcessGone:
        return None
    return ThreadSample(tid, name, int(stat_field(fields, 14)), int(stat_field(fields, 15)),
                        int(stat_field(fields, 10)), status.get("voluntary_ctxt_switches", 0),
                        status.get("nonvoluntary_ctxt_switches", 0))


def read_process(pid, proc="/proc", smaps=True):
    """A ProcessSample of pid. Raises ProcessGone (no such process, or a zombie) or NoAccess (stat or status
    not readable); an unreadable smaps_rollup only means the status fallback."""
    base = f"{proc}/{pid}"
    when = time.monotonic()
    name, fields = parse_stat(_read(f"{base}/stat"))
    if stat_field(fields, 3) in ("Z", "X"):
        raise ProcessGone(base)
    status = parse_status(_read(f"{base}/status"))
    rss = status.get("VmRSS", 0)
    anon = status.get("RssAnon", 0)
    file_ = status.get("RssFile", 0) + status.get("RssShmem", 0)
    lazyfree, source = None, "status"
    if smaps:
        try:
            rollup = parse_smaps_rollup(_read(f"{base}/smaps_rollup"))
        except (NoAccess, ProcessGone, OSError):
            rollup = {}  # another user's process (or a kernel thread): the status numbers stand
        if "Rss" in rollup:
            rss = rollup["Rss"]
            anon = rollup.get("Anonymous", anon)
            file_ = max(rss - anon, 0)
            lazyfree = rollup.get("LazyFree")
            source = "smaps_rollup"
    try:
        cmdline = _read(f"{base}/cmdline")
    except (ProcessGone, NoAccess):
        cmdline = ""
    command = " ".join(a for a in cmdline.split("\0") if a) or f"[{name}]"
    threads = {}
    try:
        tids = os.listdir(f"{base}/task")
    except FileNotFoundError:
        raise ProcessGone(base) from None
    except PermissionError:
        raise NoAccess(f"cannot list {base}/task: permission denied") from None
    for entry in tids:
        if entry.isdigit():
            t = read_thread(f"{base}/task", int(entry))
            if t is not None:
                threads[t.tid] = t
    return ProcessSample(pid, when, name, command, int(stat_field(fields, 22)), int(stat_field(fields, 14)),
                         int(stat_field(fields, 15)), int(stat_field(fields, 10)), int(stat_field(fields, 12)),
                         int(stat_field(fields, 20)), rss, anon, file_, lazyfree, source, threads)


def thread_group(pid, proc="/proc"):
    """The process (Tgid) that pid belongs to: pid itself, or the process of which pid is a thread."""
    return parse_status(_read(f"{proc}/{pid}/status")).get("Tgid", pid)


def process_alive(pid, start_ticks=None, proc="/proc"):
    """Whether pid is a live process (not a zombie) and, given start_ticks, still the same process."""
    try:
        _, fields = parse_stat(_read(f"{proc}/{pid}/stat"))
    except (ProcessGone, NoAccess, ValueError):
        return False
    if stat_field(fields, 3) in ("Z", "X"):
        return False
    return start_ticks is None or int(stat_field(fields, 22)) == start_ticks


_boot_times = {}


def process_start_ns(start_ticks, proc="/proc"):
    """A process's start as ns since the epoch, from its start_ticks and the boot time (1 s precision)."""
    if proc not in _boot_times:
        # Read once: /proc/stat is costly to make on machines with many CPUs and interrupts.
        _boot_times[proc] = next((int(line.split()[1]) for line in _read(f"{proc}/stat").splitlines()
                                  if line.startswith("btime ")), None)
    btime = _boot_times[proc]
    return None if btime is None else (btime * CLOCK_TICKS + start_ticks) * 10**9 // CLOCK_TICKS


def threadheap_loaded(pid, proc="/proc"):
    """True if libthreadheap is mapped into pid, False if not, None if its maps cannot be read."""
    try:
        return "libthreadheap" in _read(f"{proc}/{pid}/maps")
    except (ProcessGone, NoAccess, OSError):
        return None


def rest_of_rss(rss, rss_anon, held):
    """(anonymous, file-backed): the RSS that threadheap's resident total `held` does not cover, in two parts
    that add up to it. threadheap's memory is all anonymous, so the anonymous part is RssAnon less `held`: what
    the program mapped itself (a runtime's own heap, thread stacks); the file-backed and shared part is the
    rest (code, libraries). Neither below 0: RssAnon and the publication of `held` are read at different
    moments. A kernel without RssAnon (before Linux 4.5) reads 0 for it, and callers then keep the sum whole."""
    anon = min(rss_anon or 0, rss)
    return max(anon - held, 0), max(rss - max(anon, held), 0)


def read_vmstat(proc="/proc"):
    """{counter: value} of /proc/vmstat."""
    out = {}
    for line in _read(f"{proc}/vmstat").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


@dataclass
class ProcessRow:
    """One process of the list (no pid given): what one read of /proc/PID/stat tells."""
    pid: int
    name: str
    rss: int
    threads: int
    cpu_ticks: int
    start_ticks: int


def list_processes(proc="/proc"):
    """Every user-space process (those with memory: kernel threads have none), one stat read each."""
    rows = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            name, fields = parse_stat(_read(f"{proc}/{entry}/stat"))
            rss = int(stat_field(fields, 24)) * PAGE_SIZE
        except (ProcessGone, NoAccess, ValueError, IndexError):
            continue
        if rss == 0 or stat_field(fields, 3) in ("Z", "X"):
            continue
        rows.append(ProcessRow(int(entry), name, rss, int(stat_field(fields, 20)),
                               int(stat_field(fields, 14)) + int(stat_field(fields, 15)),
                               int(stat_field(fields, 22))))
    return rows


def command_line(pid, proc="/proc"):
    """pid's command line joined by spaces, "" if unreadable or empty."""
    try:
        return " ".join(a for a in _read(f"{proc}/{pid}/cmdline").split("\0") if a)
    except (ProcessGone, NoAccess):
        return ""


# ------------------------------------------------------------------------------------------------ live export


class ExportInvalid(Exception):
    """The bytes are not a version-1 export (the message says why)."""


def _name(raw):
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


def parse_export(data):
    """An Export from the bytes of one consistent read; ExportInvalid if they are not one."""
    if len(data) < EXPORT_HEADER.size:
        raise ExportInvalid(f"{len(data)} bytes, shorter than the header")
    magic, version, size, seq, pid, time_ns, interval_ms, ncounters, npairs, start_ns = \
        EXPORT_HEADER.unpack_from(data)
    if magic != EXPORT_MAGIC:
        raise ExportInvalid(f"magic {magic!r}")
    if version != EXPORT_VERSION:
        raise ExportInvalid(f"layout version {version}")
    need = EXPORT_HEADER.size + EXPORT_COUNTER.size * ncounters + EXPORT_PAIR.size * npairs
    if size < need or size > EXPORT_MAX_SIZE:
        raise ExportInvalid(f"size {size} for {ncounters} counters and {npairs} pairs")
    if len(data) < need:
        raise ExportInvalid(f"truncated: {len(data)} of {need} bytes")
    counters = {}
    off = EXPORT_HEADER.size
    for _ in range(ncounters):
        raw, value = EXPORT_COUNTER.unpack_from(data, off)
        off += EXPORT_COUNTER.size
        counters.setdefault(_name(raw), value)
    pairs = []
    for _ in range(npairs):
        from_tid, to_tid, from_name, to_name, interval, total = EXPORT_PAIR.unpack_from(data, off)
        off += EXPORT_PAIR.size
        pairs.append(RemotePair(from_tid, to_tid, _name(from_name), _name(to_name), interval, total))
    return Export(pid, seq, time_ns, interval_ms, start_ns, counters, pairs)


def export_path(pid, directory=EXPORT_DIR):
    return os.path.join(directory, f"{EXPORT_PREFIX}{pid}")


def _read_consistent(fd):
    """The file's bytes from one moment when the writer was not writing, or None if it stayed busy."""
    for attempt in range(EXPORT_RETRIES):
        if attempt:
            time.sleep(0.001)
        head = os.pread(fd, EXPORT_HEADER.size, 0)
        if len(head) < EXPORT_HEADER.size:
            raise ExportInvalid(f"{len(head)} bytes, shorter than the header")
        magic, version, size = struct.unpack_from("<8sII", head)
        if magic != EXPORT_MAGIC:
            raise ExportInvalid(f"magic {magic!r}")
        if version != EXPORT_VERSION:
            raise ExportInvalid(f"layout version {version}")
        if size < EXPORT_HEADER.size or size > EXPORT_MAX_SIZE:
            raise ExportInvalid(f"size {size}")
        seq = struct.unpack_from("<Q", head, 16)[0]
        if seq & 1:
            continue
        data = os.pread(fd, size, 0)
        again = os.pread(fd, 8, 16)
        if len(data) >= 24 and struct.unpack_from("<Q", data, 16)[0] == seq and again == data[16:24]:
            return data
    return None


def read_export(pid, directory=EXPORT_DIR, proc="/proc", start_ticks=None):
    """The live export of pid, or None when there is none to trust: no file, not a regular file, not
    version 1 (magic, version, size), truncated, busy through every retry (sequence odd or changing), or
    stale (the pid inside is not the one in the name, the pid is not alive, or the export started before
    the process did: a file left by a dead process whose pid was reused). start_ticks, when known, saves a
    read of /proc/PID/stat."""
    path = export_path(pid, directory)
    try:
        # O_NONBLOCK: a FIFO planted under the name must not block the open; it is refused just below.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # absent, a symlink, or another user's (mode 0600)
    try:
        if not _stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = _read_consistent(fd)
        if data is None:
            return None
        export = parse_export(data)
    except (ExportInvalid, OSError, struct.error):
        return None
    finally:
        os.close(fd)
    if export.pid != pid:
        return None
    if start_ticks is None:
        try:
            _, fields = parse_stat(_read(f"{proc}/{pid}/stat"))
        except (ProcessGone, NoAccess, ValueError):
            return None
        if stat_field(fields, 3) in ("Z", "X"):
            return None
        start_ticks = int(stat_field(fields, 22))
    elif not process_alive(pid, start_ticks, proc):
        return None
    try:
        started = process_start_ns(start_ticks, proc)
    except (ProcessGone, NoAccess):
        started = None
    if started is not None and export.start_ns and export.start_ns < started - 2 * 10**9:
        return None  # written by an earlier process of the same pid (start times have 1 s precision)
    return export


def export_pids(directory=EXPORT_DIR):
    """The pids that have a file named like an export in directory (not yet checked: see read_export)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [int(n[len(EXPORT_PREFIX):]) for n in names
            if n.startswith(EXPORT_PREFIX) and n[len(EXPORT_PREFIX):].isdigit()]
