"""The `threadheap` command: dispatches to one module per subcommand.

Standard library only. Each subcommand's module is imported when it is chosen, so a subcommand that needs
third-party packages (bench: rich, matplotlib; profile: protobuf) costs nothing to the others.
"""

import sys

USAGE = """usage: threadheap COMMAND [ARGS...]
       threadheap --version

commands:
  bench    run the benchmark suite against glibc and the peer allocators (threadheap bench --help)
  profile  read a heap profile: threadheap profile FILE.pb.gz [--type TYPE] [--flame OUT.svg] [--diff OLD NEW]
  run      run a program with threadheap preloaded: threadheap run [--stats] [--record FILE.png]
           [--profile [PATH]] -- PROGRAM ARGS...
  top      what memory costs running processes, whatever their allocator: threadheap top [PID...] (--help)

man threadheap: every command, option and THREADHEAP_* variable.
"""

# name -> module under threadheap that has main(argv) -> int
COMMANDS = {"bench": "threadheap.bench", "profile": "threadheap.profile", "run": "threadheap.run",
            "top": "threadheap.top"}
# What `threadheap bench` imports beyond the standard library: Python package -> Debian package.
BENCH_NEEDS = {"rich": "python3-rich", "matplotlib": "python3-matplotlib"}


def version():
    """The library's th_version(). The version lives in the library alone (from include/threadheap.h), so the
    command reports the copy it preloads, $TH_LIB."""
    import ctypes
    import os

    from .run import RunError, find_library

    try:
        lib = find_library()
    except RunError as e:
        raise SystemExit(f"threadheap: {e}")
    # Loading the library runs its constructor, which reads THREADHEAP_* once: none of them (a profile, exit
    # statistics) is wanted for a version.
    for name in [n for n in os.environ if n.startswith("THREADHEAP_")]:
        del os.environ[name]
    th_version = ctypes.CDLL(lib).th_version
    th_version.restype = ctypes.c_char_p
    return th_version().decode()


def missing_for_bench(argv):
    """The one-line complaint when rich or matplotlib is missing, else None; --help needs neither."""
    import importlib.util

    if "-h" in argv or "--help" in argv:
        return None
    missing = [m for m in BENCH_NEEDS if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    noun = "package" if len(missing) == 1 else "packages"
    return (f"threadheap bench: needs the Python {noun} {' and '.join(missing)}: apt-get install "
            f"{' '.join(BENCH_NEEDS[m] for m in missing)}, or pip install {' '.join(missing)}\n")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0
    if argv[0] == "--version":
        print(f"threadheap {version()}")
        return 0
    name = argv[0]
    if name not in COMMANDS:
        sys.stderr.write(f"threadheap: unknown command '{name}'\n{USAGE}")
        return 2
    if name == "bench":
        problem = missing_for_bench(argv[1:])
        if problem:
            sys.stderr.write(problem)
            return 1
    import importlib

    module = importlib.import_module(COMMANDS[name])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
