"""`threadheap run [--stats] [--record FILE] [--profile [PATH]] -- PROGRAM ARGS...`: run an unmodified program
with threadheap preloaded, and tell the story of its memory at exit.

Standard library only (--record imports matplotlib when it draws, --profile protobuf when it reads). Without
--stats, --record or --profile the command replaces itself with the program (exec), so the exit status,
signals and the process id are the program's own. With any of them, it forks; the child execs the program
and the parent watches it:

  - every --record-interval (0.1 s) it samples the program's /proc files and threadheap's live export
    (docs/live-export.md, /dev/shm/threadheap.<pid>), waiting on a pidfd so that the program's exit ends the
    wait at once. The export is published every sampling interval unless THREADHEAP_STATS_INTERVAL is set;
  - with --stats the child sets THREADHEAP_STATS_PID to its own pid before the exec: only that process (not
    the children it starts, which inherit the environment) writes its counters at exit, into
    THREADHEAP_STATS_FILE. wait4 gives the resource usage of the program and of the children it waited for.
    run_stats.report prints on stderr where the time went (CPU, the allocator's system calls, first-touch
    faults priced by a calibration of this machine), where the memory went (at exit and at the sampled
    peak), who frees whose memory, and advice;
  - with --record, run_record.draw writes a picture of the samples;
  - with --profile, the child sets THREADHEAP_PROFILE before the exec, so that the library writes a heap
    profile at exit (docs/profile.md); the parent prints its largest stacks with `threadheap profile`'s
    printer (profile.py) and says where the file is.

The same counters without Python:

    LD_PRELOAD=/path/to/libthreadheap.so THREADHEAP_SHOW_STATS=1 PROGRAM ARGS...

The library is $TH_LIB (the `threadheap` launcher sets it: next to bin/ in a build tree, the installed copy
in an installed tree), else build/libthreadheap.so of the source tree this package sits in. docs/run.md is the
user's page.
"""

import os
import select
import shlex
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PROG = "threadheap run"
USAGE = (f"usage: {PROG} [--stats] [--record FILE.png|FILE.svg] [--record-interval SECONDS] [--profile [PATH]]"
         f" -- PROGRAM [ARGS...]\n       {PROG} --calibrate\n")
HELP = USAGE + """
Runs PROGRAM with threadheap preloaded (LD_PRELOAD, ahead of any preload already set) and exits with its
status; a program killed by a signal kills this command with the same signal.

  --stats           at exit, print on stderr where PROGRAM's time went (user and kernel CPU, the
                    allocator's own mmap/munmap/madvise time, minor page faults and their estimated cost),
                    where threadheap's memory went at exit and at the sampled peak, the top remote-free
                    pairs, threadheap's counters, and a line of advice when a cost is high (docs/run.md)
  --record FILE     sample PROGRAM while it runs and draw RSS (split by threadheap's attribution), minor
                    faults/s and context switches/s into FILE (.png or .svg; needs matplotlib)
  --record-interval SECONDS
                    sampling interval of --record and --stats (default 0.1)
  --profile [PATH]  have threadheap write a heap profile (pprof format) when PROGRAM exits, and print its
                    largest stacks by inuse_space, alloc_space and fresh_space on stderr. PATH is the file,
                    or a folder for threadheap-profile.<pid>.pb.gz (default: the current folder). Read
                    it with `threadheap profile` (docs/profile.md); needs the Python package protobuf
  --calibrate       measure this machine's cost of a minor page fault again (the touch workload, median of
                    3 runs) and save it; --stats otherwise measures it once, on first need, and reuses it
                    from $XDG_CACHE_HOME/threadheap/touch.json (~/.cache/threadheap/touch.json)

threadheap publishes its counters in /dev/shm/threadheap.<pid> for `threadheap top`: every second, or with
--stats/--record every sampling interval, unless THREADHEAP_STATS_INTERVAL is set. The library is $TH_LIB,
which the threadheap launcher sets.
"""

# Signals sent to a watching `threadheap run` that go on to the program. SIGINT and SIGQUIT from a terminal
# reach the program through its process group already, so the parent ignores them, as a shell does.
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# Signals that the program gets as they were when this command started. Python itself ignores SIGPIPE and
# SIGXFSZ, and an ignored signal stays ignored across exec, so they are put back before the exec.
RESTORED = FORWARDED + (signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ)
SAMPLE_INTERVAL_S = 0.1
MIN_INTERVAL_S = 0.01
# The live export's interval when the user has not set one: every second for `threadheap top`; while
# sampling, the sampling interval, so that the peak and the picture see each change.
EXPORT_INTERVAL_MS = "1000"


class RunError(Exception):
    """A one-line error for the user; .status is the exit status."""

    def __init__(self, message, status=2):
        super().__init__(message)
        self.status = status


@dataclass
class Options:
    stats: bool = False
    record: str = None
    interval: float = SAMPLE_INTERVAL_S
    calibrate: bool = False
    profile: str = None  # the profile's file, or a folder for threadheap-profile.<pid>.pb.gz
    command: list = None
    help: bool = False


def parse_interval(text):
    """Seconds, as a plain number ('0.1') or with a unit ('100ms', '0.5s')."""
    t = (text or "").strip().lower()
    scale = 1.0
    if t.endswith("ms"):
        t, scale = t[:-2], 1e-3
    elif t.endswith("s"):
        t = t[:-1]
    try:
        value = float(t) * scale
    except ValueError:
        raise RunError(f"malformed --record-interval '{text}' (seconds, e.g. 0.1 or 100ms)") from None
    if not value >= MIN_INTERVAL_S or value == float("inf"):
        raise RunError(f"--record-interval must be at least {MIN_INTERVAL_S} s, not '{text}'")
    return value


def check_record_path(path, option="--record"):
    """The error in a picture's FILE (--record's, or `threadheap profile --flame`'s), or None: a known suffix,
    a folder that exists and is writable."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".png", ".svg"):
        return f"{option} FILE must end in .png or .svg: '{path}'"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"{option}: no folder {folder}"
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return f"{option}: cannot write {path}: permission denied"
    if os.path.isdir(path):
        return f"{option}: {path} is a folder"
    return None


def parse_args(argv):
    """Options from the arguments; raises RunError on a malformed command line."""
    opts = Options()
    split = argv.index("--") if "--" in argv else len(argv)
    head = argv[:split]
    interval_given = False
    i = 0
    while i < len(head):
        a = head[i]
        name, eq, value = a.partition("=")
        if a in ("-h", "--help"):
            opts.help = True
            return opts
        if a == "--stats":
            opts.stats = True
        elif a == "--calibrate":
            opts.calibrate = True
        elif name in ("--record", "--record-interval"):
            if not eq:
                if i + 1 >= len(head) or head[i + 1].startswith("--"):
                    raise RunError(f"{name} needs a value" + (" (FILE.png or FILE.svg)" if name == "--record"
                                                              else " (seconds)"))
                value = head[i + 1]
                i += 1
            if name == "--record":
                if not value:
                    raise RunError("--record needs a file name")
                opts.record = value
            else:
                opts.interval = parse_interval(value)
                interval_given = True
        elif name == "--profile":
            if eq and not value:
                raise RunError("--profile= needs a path (or give --profile alone for the current folder)")
            if not eq:  # PATH is optional: a following word that is not an option is it
                value = "."
                if i + 1 < len(head) and not head[i + 1].startswith("-"):
                    value = head[i + 1]
                    i += 1
            opts.profile = os.path.abspath(value)  # the program may change its directory before it writes
        elif a.startswith("-"):
            raise RunError(f"unknown option '{a}' (see {PROG} --help)")
        else:
            raise RunError(f"missing '--' before the program '{a}' (see {PROG} --help)")
        i += 1
    if split == len(argv):
        if opts.calibrate and not (opts.stats or opts.record or interval_given or opts.profile):
            return opts
        raise RunError(f"missing '--' before the program (see {PROG} --help)")
    opts.command = argv[split + 1:]
    if not opts.command:
        raise RunError(f"no program after '--' (see {PROG} --help)")
    if interval_given and not (opts.record or opts.stats):
        raise RunError("--record-interval needs --record or --stats")
    if opts.record:
        problem = check_record_path(opts.record)
        if problem:
            raise RunError(problem)
    if opts.profile:
        folder = opts.profile if os.path.isdir(opts.profile) else os.path.dirname(opts.profile)
        if not os.path.isdir(folder):
            raise RunError(f"--profile: no folder {folder}")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise RunError(f"--profile: cannot write in {folder}: permission denied")
    return opts


def profile_path(target, pid):
    """Where the program with this pid writes its profile: target, or a file named after the pid in the
    folder target."""
    return os.path.join(target, f"threadheap-profile.{pid}.pb.gz") if os.path.isdir(target) else target


def file_stamp(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def find_library():
    """The path of libthreadheap.so to preload."""
    lib = os.environ.get("TH_LIB")
    if lib:
        if not os.path.isfile(lib):
            raise RunError(f"library not found: {lib} (from TH_LIB)", 1)
        return os.path.abspath(lib)
    source_build = Path(__file__).resolve().parents[2] / "build" / "libthreadheap.so"
    if source_build.is_file():
        return str(source_build)
    raise RunError("library not found: set TH_LIB to libthreadheap.so, or use the threadheap launcher", 1)


def find_program(name):
    """The program's path as execvp would find it, or RunError (status 127, as a shell says)."""
    if "/" in name:
        path = name
    else:
        path = shutil.which(name)
        if path is None:
            raise RunError(f"program not found: {name}", 127)
    if not os.path.isfile(path):
        raise RunError(f"program not found: {name}", 127)
    if not os.access(path, os.X_OK):
        raise RunError(f"program not executable: {name}", 126)
    return path


def preload_env(lib, extra=None, export_interval_ms=EXPORT_INTERVAL_MS):
    """The environment for the program: the library ahead of any existing LD_PRELOAD, and the live export on
    (every export_interval_ms, unless THREADHEAP_STATS_INTERVAL is set), so that `threadheap top` and the
    sampler see its counters."""
    env = dict(os.environ)
    old = env.get("LD_PRELOAD", "").strip()
    env["LD_PRELOAD"] = lib + (":" + old if old else "")
    env.setdefault("THREADHEAP_STATS_INTERVAL", export_interval_ms)
    env.update(extra or {})
    return env


def inherited_dispositions():
    """{signal: True if it was ignored when this process started}, for the signals in RESTORED."""
    ignored = {}
    for sig in RESTORED:
        # Python starts with SIGPIPE and SIGXFSZ ignored by itself; the others keep what was inherited.
        ignored[sig] = sig not in (signal.SIGPIPE, signal.SIGXFSZ) and signal.getsignal(sig) == signal.SIG_IGN
    return ignored


def restore_signals(ignored):
    for sig, ign in ignored.items():
        signal.signal(sig, signal.SIG_IGN if ign else signal.SIG_DFL)


def exit_like(status):
    """Exit the way the program did: its exit code, or the signal that killed it raised on ourselves."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the program has dumped core if it was to
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            os.kill(os.getpid(), sig)
        except (OSError, ValueError):
            pass
        return 128 + sig  # the signal did not kill us (SIGSTOP-like or not deliverable): what a shell says
    return os.WEXITSTATUS(status)


def start_program(program, command, env, ignored, stats_path, profile=None):
    """Forks and execs the program; returns its pid once the exec has happened (or the child has failed and
    exited 127), so that the first sample is of the program and not of this Python's copy. From the fork on,
    the FORWARDED signals this command gets go to the program."""
    ready_r, ready_w = os.pipe()  # close-on-exec: EOF at the exec
    pid = os.fork()
    if pid == 0:  # the child: name itself as the process that prints, then become the program
        try:
            os.close(ready_r)
            restore_signals(ignored)
            if stats_path:
                env = dict(env, THREADHEAP_SHOW_STATS="1", THREADHEAP_STATS_FILE=stats_path,
                           THREADHEAP_STATS_PID=str(os.getpid()))
            if profile:
                env = dict(env, THREADHEAP_PROFILE=profile_path(profile, os.getpid()))
            os.execve(program, command, env)
        except (OSError, ValueError) as e:
            os.write(2, f"{PROG}: cannot run {command[0]}: {getattr(e, 'strerror', None) or e}\n".encode())
        finally:
            os._exit(127)
    for sig in FORWARDED:
        if not ignored[sig]:
            signal.signal(sig, lambda s, _frame: os.kill(pid, s))
    os.close(ready_w)
    try:
        while os.read(ready_r, 1):
            pass
    finally:
        os.close(ready_r)
    return pid


def watch(pid, sampler, interval):
    """Samples the program every interval until it exits; returns wait4's (status, rusage). Waits on a
    pidfd, so the program's exit ends the wait at once; forwarded signals interrupt it and it goes on
    (PEP 475)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None  # an old kernel or Python: polling with wait4(WNOHANG) and sleeps
    try:
        next_at = time.monotonic()
        while True:
            if pidfd is None:
                done, status, rusage = os.wait4(pid, os.WNOHANG)
                if done:
                    return status, rusage
            if time.monotonic() >= next_at:
                sampler.sample()
                next_at += interval
                next_at = max(next_at, time.monotonic())  # after a stall, no burst of catch-up samples
            wait = max(next_at - time.monotonic(), 0)
            if pidfd is None:
                time.sleep(min(wait, 0.02))
            elif select.select([pidfd], [], [], wait)[0]:
                _, status, rusage = os.wait4(pid, 0)
                return status, rusage
    finally:
        if pidfd is not None:
            os.close(pidfd)


def run_watched(lib, opts, program, ignored):
    from . import run_stats

    stats_path = None
    if opts.stats:
        fd, stats_path = tempfile.mkstemp(prefix="threadheap-stats-")
        os.close(fd)
    # --profile alone samples nothing it shows: the live export keeps its usual interval.
    interval_ms = str(max(1, round(opts.interval * 1000))) if opts.stats or opts.record else EXPORT_INTERVAL_MS
    env = preload_env(lib, export_interval_ms=interval_ms)
    # A file named by the user may be there from before: only a changed one is this run's.
    before = file_stamp(opts.profile) if opts.profile and not os.path.isdir(opts.profile) else None
    try:
        for sig in (signal.SIGINT, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN)
        parent_rss = run_stats.own_rss()
        start = time.monotonic()
        pid = start_program(program, opts.command, env, ignored, stats_path, opts.profile)
        sampler = run_stats.Sampler(pid, start, keep=bool(opts.record))
        status, rusage = watch(pid, sampler, opts.interval)
        wall = time.monotonic() - start
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        text = ""
        if stats_path:
            with open(stats_path, encoding="utf-8", errors="replace") as f:
                text = f.read()
    finally:
        if stats_path:
            os.unlink(stats_path)
    if opts.stats:
        cal = run_stats.calibrate()
        sys.stderr.write(run_stats.report(opts.command, status, rusage, wall, run_stats.parse_counters(text),
                                          sampler, cal, env.get("THREADHEAP_STATS_INTERVAL", ""),
                                          run_stats.parse_exit_pairs(text), parent_rss))
    if opts.record:
        from . import run_record

        try:
            run_record.draw(opts.record, sampler.samples, opts.command, status, wall)
            sys.stderr.write(f"{PROG}: recorded {len(sampler.samples)} samples in {opts.record}\n")
        except Exception as e:  # the program's status stands; the drawing's failure is said in one line
            reason = " ".join(str(e).split())  # one line, whatever the exception's text
            sys.stderr.write(f"{PROG}: cannot draw {opts.record}: {type(e).__name__}: {reason}\n")
    if opts.profile:
        report_profile(profile_path(opts.profile, pid), before)
    return exit_like(status)


def report_profile(path, before):
    """Prints on stderr the largest stacks of the profile the program wrote, or one line saying why not."""
    from . import profile, profile_read

    if file_stamp(path) in (None, before):
        sys.stderr.write(f"{PROG}: no heap profile was written in {path} (the library writes it at exit; not "
                         f"when the program is killed)\n")
        return
    try:
        prof = profile_read.load(path)
    except profile_read.ProfileError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return
    sys.stderr.write(f"{PROG}: heap profile in {path}\n{profile.run_summary(prof)}"
                     f"(all of it: threadheap profile {shlex.quote(path)}; a flame graph: add --flame OUT.svg)\n")


def main(argv):
    try:
        opts = parse_args(list(argv))
        if opts.help:
            sys.stdout.write(HELP)
            return 0
        if opts.record:
            from . import run_record

            problem = run_record.check_matplotlib()
            if problem:
                raise RunError(f"--record needs matplotlib ({problem}); install it, e.g. pip install matplotlib")
        if opts.profile:
            from . import profile_read

            try:
                profile_read.schema()  # before the program runs: its profile could not be read
            except profile_read.ProfileError as e:
                raise RunError(f"--profile: {e}") from None
        if opts.calibrate:
            from . import run_stats

            cal = run_stats.calibrate(force=True)
            if cal.us_per_fault is None:
                raise RunError(f"not calibrated: {cal.error}", 1)
            sys.stderr.write(run_stats.calibration_line(cal) + "\n")
            if opts.command is None:
                return 0
        lib = find_library()
        program = find_program(opts.command[0])
    except RunError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return e.status
    ignored = inherited_dispositions()
    if not (opts.stats or opts.record or opts.profile):
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            restore_signals(ignored)
            os.execve(program, opts.command, preload_env(lib))
        except OSError as e:
            sys.stderr.write(f"{PROG}: cannot run {opts.command[0]}: {e.strerror}\n")
            return 126
    return run_watched(lib, opts, program, ignored)
