"""The `threadheap` command: dispatches to one module per subcommand.

Standard library only. Each subcommand's module is imported when it is chosen, so a subcommand that needs
third-party packages (bench: rich, matplotlib; profile: protobuf) costs nothing to the others.
"""

import sys

USAGE = """usage: threadheap COMMAND [ARGS...]

commands:
  bench    run the benchmark suite against glibc and the peer allocators (threadheap bench --help)
  profile  read a heap profile: threadheap profile FILE.pb.gz [--type TYPE] [--flame OUT.svg] [--diff OLD NEW]
  run      run a program with threadheap preloaded: threadheap run [--stats] [--record FILE.png]
           [--profile [PATH]] -- PROGRAM ARGS...
  top      what memory costs running processes, whatever their allocator: threadheap top [PID...] (--help)
"""

# name -> module under threadheap that has main(argv) -> int
COMMANDS = {"bench": "threadheap.bench", "profile": "threadheap.profile", "run": "threadheap.run",
            "top": "threadheap.top"}


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0
    name = argv[0]
    if name not in COMMANDS:
        sys.stderr.write(f"threadheap: unknown command '{name}'\n{USAGE}")
        return 2
    import importlib

    module = importlib.import_module(COMMANDS[name])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
