"""`threadheap run [--stats] -- PROGRAM ARGS...`: run an unmodified program with threadheap preloaded.

Standard library only. Without --stats the command replaces itself with the program (exec), so the exit
status, signals and the process id are the program's own. With --stats it forks, and the child sets
THREADHEAP_STATS_PID to its own pid before it execs the program: only that process (not the children it
starts, which inherit the environment) writes its counters at exit, into THREADHEAP_STATS_FILE. The parent
waits with wait4, which also gives the resource usage of the program and of the children it waited for, and
prints both on stderr. The same effect without Python:

    LD_PRELOAD=/path/to/libthreadheap.so THREADHEAP_SHOW_STATS=1 PROGRAM ARGS...

The library is $TH_LIB (the `threadheap` launcher sets it: next to bin/ in a build tree, the installed copy
in an installed tree), else build/libthreadheap.so of the source tree this package sits in.
"""

import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from itertools import zip_longest
from pathlib import Path

PROG = "threadheap run"
USAGE = f"usage: {PROG} [--stats] -- PROGRAM [ARGS...]\n"
HELP = USAGE + """
Runs PROGRAM with threadheap preloaded (LD_PRELOAD, ahead of any preload already set) and exits with its
status; a program killed by a signal kills this command with the same signal.

  --stats   at exit, print on stderr threadheap's counters for PROGRAM (not for its children) beside the
            process's page faults, context switches, CPU time and peak RSS

The library is $TH_LIB, which the threadheap launcher sets.
"""

# Counters of th_stats_t that are bytes (the others are counts).
BYTE_COUNTERS = {"committed", "committed_peak", "mapped", "cached", "purged_bytes"}
# Signals sent to `threadheap run --stats` that go on to the program. SIGINT and SIGQUIT from a terminal
# reach the program through its process group already, so the parent ignores them, as a shell does.
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# Signals that the program gets as they were when this command started. Python itself ignores SIGPIPE and
# SIGXFSZ, and an ignored signal stays ignored across exec, so they are put back before the exec.
RESTORED = FORWARDED + (signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ)


class RunError(Exception):
    """A one-line error for the user; .status is the exit status."""

    def __init__(self, message, status=2):
        super().__init__(message)
        self.status = status


def parse_args(argv):
    """(stats, command) from the arguments; raises RunError on a malformed command line."""
    if "--" not in argv:
        if any(a in ("-h", "--help") for a in argv):
            return None, None
        raise RunError("missing '--' before the program: " + USAGE.strip())
    split = argv.index("--")
    stats = False
    for a in argv[:split]:
        if a in ("-h", "--help"):
            return None, None
        if a == "--stats":
            stats = True
        else:
            raise RunError(f"unknown option '{a}': " + USAGE.strip())
    command = argv[split + 1:]
    if not command:
        raise RunError("no program after '--': " + USAGE.strip())
    return stats, command


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


def preload_env(lib, extra=None):
    """The environment for the program: the library ahead of any existing LD_PRELOAD, and the live export on
    (every second, unless THREADHEAP_STATS_INTERVAL is set), so that `threadheap top` sees its counters."""
    env = dict(os.environ)
    old = env.get("LD_PRELOAD", "").strip()
    env["LD_PRELOAD"] = lib + (":" + old if old else "")
    env.setdefault("THREADHEAP_STATS_INTERVAL", "1000")
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


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def parse_counters(text):
    """{name: value} from th_stats_print lines ("threadheap: committed 12345")."""
    counters = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "threadheap:" and parts[2].isdigit():
            counters[parts[1]] = int(parts[2])
    return counters


def report(command, status, rusage, seconds, counters):
    """The --stats report: the process's symptoms on the left, threadheap's counters on the right."""
    if os.WIFSIGNALED(status):
        how = f"was killed by signal {os.WTERMSIG(status)} ({signal.Signals(os.WTERMSIG(status)).name})"
    else:
        how = f"exited with status {os.WEXITSTATUS(status)}"
    left = [
        ("minor page faults", f"{rusage.ru_minflt}"),
        ("major page faults", f"{rusage.ru_majflt}"),
        ("voluntary switches", f"{rusage.ru_nvcsw}"),
        ("involuntary switches", f"{rusage.ru_nivcsw}"),
        ("user CPU", f"{rusage.ru_utime:.3f} s"),
        ("system CPU", f"{rusage.ru_stime:.3f} s"),
        ("peak RSS", human_bytes(rusage.ru_maxrss * 1024)),
    ]
    right = [(k, human_bytes(v) if k in BYTE_COUNTERS else str(v)) for k, v in counters.items()]
    if not right:
        right = [("(no counters: the program ended without exit", ""),
                 (" handlers (a signal, _exit: dash does),", ""),
                 (" or threadheap was not loaded in it)", "")]
    lines = [f"{PROG}: {shlex.join(command)} {how} after {seconds:.3f} s",
             f"  {'process (wait4 rusage)':<34}   threadheap (this process only)"]
    for (ln, lv), (rn, rv) in zip_longest(left, right, fillvalue=("", "")):
        lines.append(f"  {ln:<21}{lv:>13}   {rn:<17}{rv:>12}".rstrip())
    sys.stderr.write("\n".join(lines) + "\n")


def run_with_stats(lib, command, program, ignored):
    fd, stats_path = tempfile.mkstemp(prefix="threadheap-stats-")
    os.close(fd)
    try:
        for sig in (signal.SIGINT, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN)
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child: name itself as the process that prints, then become the program
            try:
                restore_signals(ignored)
                env = preload_env(lib, {"THREADHEAP_SHOW_STATS": "1", "THREADHEAP_STATS_FILE": stats_path,
                                        "THREADHEAP_STATS_PID": str(os.getpid())})
                os.execve(program, command, env)
            except OSError as e:
                os.write(2, f"{PROG}: cannot run {command[0]}: {e.strerror}\n".encode())
            os._exit(127)
        for sig in FORWARDED:
            if not ignored[sig]:
                signal.signal(sig, lambda s, _frame: os.kill(pid, s))
        _, status, rusage = os.wait4(pid, 0)  # retried after a forwarded signal (PEP 475)
        seconds = time.monotonic() - start
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        with open(stats_path, encoding="utf-8", errors="replace") as f:
            counters = parse_counters(f.read())
    finally:
        os.unlink(stats_path)
    report(command, status, rusage, seconds, counters)
    return exit_like(status)


def main(argv):
    try:
        stats, command = parse_args(list(argv))
        if command is None:
            sys.stdout.write(HELP)
            return 0
        lib = find_library()
        program = find_program(command[0])
    except RunError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return e.status
    ignored = inherited_dispositions()
    if not stats:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            restore_signals(ignored)
            os.execve(program, command, preload_env(lib))
        except OSError as e:
            sys.stderr.write(f"{PROG}: cannot run {command[0]}: {e.strerror}\n")
            return 126
    return run_with_stats(lib, command, program, ignored)
