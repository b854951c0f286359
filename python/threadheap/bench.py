"""`threadheap bench`: runs threadheap's benchmark workloads under each allocator and reports.

Each workload (bench/*.c, built into build/bin/) is a plain C program that calls malloc and prints one JSON
object per line. The driver runs it once per allocator, switching the allocator with LD_PRELOAD (glibc is
the run without a preload), repeats the whole set --reps times with the allocators interleaved inside each
repetition (so slow drift of a noisy machine hits all of them alike), and reduces every cell to its median
with the min-max range. Ratios are always allocator / threadheap on the medians.

The allocators: the built-in ones (ALLOCATORS), among them threadheap+profile, threadheap's library with
THREADHEAP_PROFILE set to a file of a temporary folder of its own for each run (checked to be written, then
deleted), whose row of the summary is what heap profiling costs; and any library given as NAME=PATH in
--allocators, preloaded like the peers. The summary (bench_summary.py) closes the console output.

Two kinds of rows are not an allocator under LD_PRELOAD: OS baselines ("os:mmap", "os:file", ...), a run of
the same workload that bypasses malloc, and threadheap's explicit heaps ("th:private", ...), from a workload
that links libthreadheap (Experiment.linked), run once per repetition when it has been built.

Outputs, in one folder: results.json (raw rows and aggregated cells), results.csv, one PNG chart per
experiment and report.md, which records the machine and embeds the charts and tables (bench_results.py).
`--compare A.json B.json` prints the per-cell ratio of two runs; `--readme DIR` prints the headline tables
of a run as markdown for the README. The published results, docs/results.md and its charts in docs/bench/
(bench_docs.py), are written by `--docs` after a run, or by `--docs-from DIR` from a finished one.

rich and matplotlib are imported inside the functions that use them, so the rest of the package (and the
parts of this module the tests call) work with the standard library alone.
"""

import argparse
import datetime as _dt
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .bench_docs import CHART_DIR, check_docs_dir, default_docs_dir, find_run, write_docs
from .bench_experiments import (ALLOCATORS, BASELINE, EXPERIMENTS, LINKED_PREFIX, OS_PREFIX, PACKAGES,
                                PEER_SONAMES, PROFILED, BenchError)
from .bench_results import (aggregate, baseline_of, compare, load_result, machine_info, print_compare,
                            print_summary, print_tables, readme_markdown, run_summary, write_outputs)

PROG = "threadheap bench"
REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


# ------------------------------------------------------------------------------------------------- parsing


def parse_count(text):
    """An integer with an optional k/m/g suffix (powers of 1024): '64', '4k', '1M'."""
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)\s*", text or "")
    if not m:
        raise BenchError(f"malformed number '{text}'")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def parse_int_list(text, what):
    """'1,2,4' -> [1, 2, 4]; every value positive."""
    items = [t for t in (text or "").split(",")]
    if not text or any(not t.strip() for t in items):
        raise BenchError(f"malformed {what} list '{text}'")
    try:
        values = [parse_count(t) for t in items]
    except BenchError:
        raise BenchError(f"malformed {what} list '{text}'") from None
    if any(v < 1 for v in values):
        raise BenchError(f"{what} must be positive in '{text}'")
    return values


def parse_name_list(text, known, what):
    items = [t.strip() for t in (text or "").split(",")]
    if not text or any(not t for t in items):
        raise BenchError(f"malformed {what} list '{text}'")
    for t in items:
        if t not in known:
            raise BenchError(f"unknown {what} '{t}' (known: {', '.join(known)})")
    return list(dict.fromkeys(items))


# The name of a NAME=PATH allocator. "os" and "th" name the runs of OS baselines and linked workloads (Job).
ALLOCATOR_NAME = re.compile(r"[A-Za-z0-9_.+-]+")
RESERVED_NAMES = ("os", "th")


def parse_allocators(text, known=ALLOCATORS):
    """--allocators: built-in names (those of known) and NAME=PATH items, a library to preload
    (snmalloc=/opt/libsnmalloc.so). Returns the names in order and {name: path as given} of the NAME=PATH
    items. A built-in name given with a path must be that allocator's own library: resolve_allocators checks
    it."""
    items = [t.strip() for t in (text or "").split(",")]
    if not text or any(not t for t in items):
        raise BenchError(f"malformed allocator list '{text}'")
    names, paths = [], {}
    for item in items:
        name, eq, path = (t.strip() for t in item.partition("="))
        if not eq:
            if name not in known:
                raise BenchError(f"unknown allocator '{name}' (known: {', '.join(known)}; or NAME=PATH "
                                 "to preload a library)")
        elif not ALLOCATOR_NAME.fullmatch(name) or not path:
            raise BenchError(f"malformed allocator '{item}' (NAME=PATH, NAME of letters, digits and _.+-)")
        elif name in RESERVED_NAMES:
            raise BenchError(f"allocator name '{name}' is reserved")
        elif not Path(path).is_file():
            raise BenchError(f"allocator '{name}': {path} not found")
        elif paths.get(name, path) != path:
            raise BenchError(f"allocator '{name}' given twice, as {paths[name]} and {path}")
        else:
            paths[name] = path
        names.append(name)
    return list(dict.fromkeys(names)), {k: Path(v) for k, v in paths.items()}


def parse_output(text):
    """The JSON lines a workload printed; other lines are ignored."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise BenchError(f"workload printed bad JSON: {line[:80]} ({e})") from None
    return rows


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, like every other error of the driver."""

    def error(self, message):
        sys.stderr.write(f"{PROG}: {message} (see {PROG} --help)\n")
        sys.exit(2)


def build_parser():
    p = _Parser(
        prog=PROG, description="Run threadheap's benchmarks under each allocator (switched with LD_PRELOAD).")
    p.add_argument("experiments", nargs="*", metavar="EXPERIMENT",
                   help="experiments to run (default: all): " + ", ".join(EXPERIMENTS))
    p.add_argument("--allocators", help="comma-separated, default: " + ",".join(ALLOCATORS) +
                   "; NAME=PATH preloads any other library under that name, e.g. snmalloc=/opt/libsnmalloc.so")
    p.add_argument("--threads", help="thread counts, e.g. 1,2,4 (experiments that take threads)")
    p.add_argument("--sizes", help="block sizes, e.g. 16,1k,64k for contention, threads and pairs; large takes "
                   "the values from 1m up (e.g. 8m,32m), or plain MiB counts when it runs alone; random, "
                   "when no other experiment takes sizes, runs once per value as its largest block size")
    p.add_argument("--reps", help="repetitions (default 3); each cell reports median, min-max")
    p.add_argument("--full", action="store_true", help="the seeds' full run lengths (much longer)")
    p.add_argument("--smoke", action="store_true", help="tiny runs, to check that everything works")
    p.add_argument("--out", help="output folder (default bench-results/<timestamp>)")
    p.add_argument("--lib", help="libthreadheap.so to preload (default build/libthreadheap.so)")
    p.add_argument("--bin-dir", help="folder of the workload binaries (default build/bin)")
    p.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                   help="compare two results.json: per-cell ratio B/A")
    p.add_argument("--readme", metavar="DIR",
                   help="print the headline tables of a finished run (its folder or results.json) as markdown "
                        "for the README, with the command and the machine")
    p.add_argument("--docs", action="store_true",
                   help="after the run, write the published results: docs/results.md (every table, the summary, "
                        "the machine) and the charts in docs/bench/")
    p.add_argument("--docs-from", metavar="DIR",
                   help="write docs/results.md and docs/bench/ from a finished run (its folder or results.json), "
                        "running nothing")
    p.add_argument("--docs-dir", metavar="DIR",
                   help="the docs folder for --docs and --docs-from (default: the source tree's docs/)")
    return p


@dataclass
class Config:
    experiments: list
    allocators: list
    threads: list
    sizes: list
    reps: int
    full: bool
    smoke: bool
    out: Path
    lib: Path
    bin_dir: Path
    explicit_allocators: bool
    external: dict = None  # name -> library as given, from --allocators NAME=PATH


def make_config(args):
    experiments = (parse_name_list(",".join(args.experiments), list(EXPERIMENTS), "experiment")
                   if args.experiments else list(EXPERIMENTS))
    allocators, external = (parse_allocators(args.allocators) if args.allocators is not None
                            else (list(ALLOCATORS), {}))
    threads = parse_int_list(args.threads, "threads") if args.threads is not None else None
    sizes = parse_int_list(args.sizes, "sizes") if args.sizes is not None else None
    try:
        reps = int(args.reps if args.reps is not None else 3)
    except ValueError:
        raise BenchError(f"malformed --reps '{args.reps}'") from None
    if reps < 1:
        raise BenchError("--reps must be at least 1")
    if args.full and args.smoke:
        raise BenchError("--full and --smoke exclude each other")
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("bench-results") / stamp
    lib = Path(args.lib or os.environ.get("TH_LIB") or REPO / "build" / "libthreadheap.so")
    bin_dir = Path(args.bin_dir or os.environ.get("TH_BIN_DIR") or
                   Path(os.environ.get("TH_BUILD_DIR", REPO / "build")) / "bin")
    return Config(experiments, allocators, threads, sizes, reps, args.full, args.smoke, out, lib, bin_dir,
                  args.allocators is not None, external)


# ------------------------------------------------------------------------------------------------ allocators


def find_peer(soname):
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=20).stdout
        for line in out.splitlines():
            parts = line.strip().split(" => ")
            if len(parts) == 2 and parts[0].split(" ")[0] == soname and "x86-64" in parts[0]:
                return Path(parts[1])
    except (OSError, subprocess.SubprocessError):
        pass
    for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"):
        p = Path(d) / soname
        if p.exists():
            return p
    return None


def resolve_allocators(cfg, warn):
    """name -> library to preload (None for glibc). Missing built-in ones are an error when asked for by
    name, else left out with a warning. A NAME=PATH library is preloaded as it is, unless NAME is built in:
    then PATH must be that allocator's library."""
    libs = {}
    external = cfg.external or {}
    for name in cfg.allocators:
        if name not in ALLOCATORS:
            libs[name] = external[name].resolve()
            continue
        path = None
        if name != "glibc":
            ours = name in (BASELINE, PROFILED)
            path = cfg.lib if ours else find_peer(PEER_SONAMES[name])
            if path is None or not Path(path).exists():
                what = str(path) if ours else PEER_SONAMES[name]
                hint = "build it with make" if ours else f"apt-get install {PACKAGES[name]}"
                if cfg.explicit_allocators:
                    raise BenchError(f"allocator '{name}' not found: {what} ({hint})")
                warn(f"{PROG}: leaving out {name}: {what} not found ({hint})")
                continue
            path = Path(path).resolve()
        if name in external and external[name].resolve() != path:
            raise BenchError(f"allocator '{name}': {external[name]} is not the built-in {name}'s library "
                             f"({path or 'none: the system malloc'}); give it another name")
        libs[name] = path
    if not libs:
        raise BenchError("no allocator to run")
    return libs


# ------------------------------------------------------------------------------------------------ running

# Job.allocator values that are not an allocator under LD_PRELOAD: the OS baseline run of a workload, and
# the run of an Experiment.linked workload (threadheap linked in, its explicit heaps).
OS_RUN = "os"
LINKED_RUN = "th"


@dataclass
class Job:
    experiment: str
    allocator: str   # an allocator name, OS_RUN or LINKED_RUN
    args: list
    binary: str = None  # default: the experiment's binary

    @property
    def exe_name(self):
        return self.binary or EXPERIMENTS[self.experiment].binary


def sizes_for(exp, sizes, alone, warn=None):
    """The --sizes values an experiment gets. Sizes are bytes, but large's blocks are MiB: it gets the values
    of 1 MiB and up (the workload reads those as bytes), or, when it is the only experiment that takes sizes,
    the whole list as it is (plain numbers are MiB there). random takes them, one run each, as its largest
    block size, and only when it is the one experiment that takes sizes. None: the workload's default."""
    if not exp.sizes or not sizes:
        return None
    if exp.size_arg != "--sizes":
        return sizes if alone else None  # one run per size (random's largest size): only when asked alone
    if exp.size_unit != "MiB" or alone:
        return sizes
    big = [s for s in sizes if s >= MIB]
    if not big and warn:
        warn(f"{PROG}: {exp.name}: no size of 1m or more in --sizes; it runs its default sizes (MiB)")
    return big or None


def plan_jobs(cfg, allocators, warn=None):
    """Every run of one repetition, allocators interleaved inside each group of identical arguments."""
    groups = []
    sized = [n for n in cfg.experiments if EXPERIMENTS[n].sizes]
    for name in cfg.experiments:
        exp = EXPERIMENTS[name]
        common = []
        if cfg.smoke:
            common.append("--smoke")
        if cfg.full:
            common.append("--full")
        sizes = sizes_for(exp, cfg.sizes, sized == [name], warn)
        if sizes and exp.size_arg == "--sizes":
            common += ["--sizes", ",".join(map(str, sizes))]
        variants = [common]
        linked = exp.linked and "threadheap" in allocators and (Path(cfg.bin_dir) / exp.linked).exists()
        # With a linked workload beside it, the thread counts are given to both, so that their rows match:
        # the seed's 1..4 and the default counts (up to twice the cores).
        threads = cfg.threads or (sorted(set(default_thread_counts()) | {1, 2, 3, 4}) if linked else None)
        if exp.threads == "list" and threads:
            variants = [common + ["--threads", ",".join(map(str, threads))]]
        elif exp.threads == "each":
            counts = cfg.threads or exp.default_threads or default_thread_counts()
            variants = [common + ["--threads", str(t)] for t in counts]
        if sizes and exp.size_arg != "--sizes":
            variants = [v + [exp.size_arg, str(s)] for v in variants for s in sizes]
        for v in variants:
            group = [Job(name, a, v + exp.allocator_args) for a in allocators]
            if exp.os_variant:
                group.append(Job(name, OS_RUN, v + exp.os_variant))
            if linked:
                group.append(Job(name, LINKED_RUN, v + exp.linked_args, binary=exp.linked))
            groups.append(group)
    return groups


def default_thread_counts():
    """Thread counts of the experiments run once per count: up to twice the cores, and always 1, 2, 3 (seed
    004's heaptest used three threads): 1,2,3,4 on two cores, 1,2,3,4,8,16 on eight."""
    n = os.cpu_count() or 1
    counts = {1, 2, 3} | set(range(1, min(2 * n, 4) + 1))
    t = 8
    while t <= 2 * n:
        counts.add(t)
        t *= 2
    return sorted(counts)


def rotated(group, rep):
    k = rep % len(group)
    return group[k:] + group[:k]


# Inherited variables that would turn heap profiling on in every threadheap run, not only threadheap+profile's.
PROFILE_VARS = ("THREADHEAP_PROFILE", "THREADHEAP_LEAKS")


def job_env(job, libs, profile=None):
    """The environment of one run: this process's without a preload or heap profiling of its own, plus the
    job's allocator preloaded and, for threadheap+profile, THREADHEAP_PROFILE=profile."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and k not in PROFILE_VARS}
    lib = libs.get(job.allocator)
    if lib is not None:
        env["LD_PRELOAD"] = str(lib)
    if job.allocator == PROFILED:
        env["THREADHEAP_PROFILE"] = str(profile)
    return env


def run_job(job, cfg, libs, timeout=900):
    if job.allocator != PROFILED:
        return run_process(job, cfg, libs, job_env(job, libs), timeout)
    # A folder of its own for each run, deleted with the profile (and a forked child's PATH.<pid>) after it.
    with tempfile.TemporaryDirectory(prefix="threadheap-bench-") as folder:
        profile = Path(folder) / "heap.pb.gz"
        rows = run_process(job, cfg, libs, job_env(job, libs, profile), timeout)
        if not profile.exists():
            # Else the row would be threadheap's without profiling, and the cost of profiling a false zero.
            raise BenchError(f"{job.experiment} under {PROFILED}: {libs[PROFILED]} wrote no heap profile to "
                             f"{profile}")
    return rows


def run_process(job, cfg, libs, env, timeout):
    exe = Path(cfg.bin_dir) / job.exe_name
    lib = libs.get(job.allocator)
    who = job.allocator if job.binary is None else job.binary
    try:
        proc = subprocess.run([str(exe)] + job.args, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{job.experiment} under {who} timed out after {timeout} s") from None
    except OSError as e:
        raise BenchError(f"cannot run {exe}: {e.strerror}") from None
    if "cannot be preloaded" in proc.stderr:
        # ld.so only warns and goes on with the system malloc: that run would silently measure glibc.
        raise BenchError(f"{lib} could not be preloaded: {proc.stderr.strip().splitlines()[0]}")
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise BenchError(f"{job.experiment} under {who} failed (exit {proc.returncode}): {tail}")
    rows = parse_output(proc.stdout)
    if not rows:
        raise BenchError(f"{job.experiment} under {who} printed no results")
    return [normalize_row(r, job.allocator) for r in rows]


def normalize_row(row, allocator):
    """Tags a workload row with its allocator. The OS baselines of an experiment and the methods of a linked
    workload become allocators of their own, 'os:<method>' and 'th:<method>', so that they sit in the same
    tables and charts as the allocators."""
    row = dict(row)
    method = row.pop("method", None)
    if allocator in (OS_RUN, LINKED_RUN):
        if not method:
            raise BenchError(f"{row.get('experiment')}: a {allocator} row without a \"method\" field")
        allocator = OS_PREFIX + str(method) if allocator == OS_RUN else LINKED_PREFIX + linked_name(method)
    row["allocator"] = allocator
    return row


def linked_name(method):
    """A linked workload's method as a row name: heap_private_noserialize -> private-noserialize."""
    method = str(method)
    if method.startswith("heap_"):
        method = method[len("heap_"):]
    return method.replace("_", "-")


def check_output_dir(out):
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise BenchError(f"cannot write to output folder {out}: {e.strerror}") from None


def run_all(cfg, libs, console=None, warn=None, timing=None):
    """Runs every job of every repetition; returns the raw rows (each with experiment, allocator, rep).
    timing, a dict, receives the wall-clock seconds spent in each experiment's runs."""
    groups = plan_jobs(cfg, list(libs), warn)
    for g in groups:
        exe = Path(cfg.bin_dir) / g[0].exe_name
        if not exe.exists():
            raise BenchError(f"workload not found: {exe} (build with make, or give --bin-dir)")
    total = cfg.reps * sum(len(g) for g in groups)
    rows = []
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    with Progress(TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("left"), TimeRemainingColumn(), console=console, transient=False) as progress:
        task = progress.add_task("starting", total=total)
        # Where the bar cannot redraw (output to a file or CI log), one line per experiment and repetition.
        plain = console is not None and not console.is_terminal
        done = 0
        for rep in range(cfg.reps):
            for name in cfg.experiments:
                runs = sum(len(g) for g in groups if g[0].experiment == name)
                if plain and runs:
                    console.print(f"{PROG}: rep {rep + 1}/{cfg.reps} {name}: {runs} runs ({done}/{total} done)",
                                  markup=False, highlight=False)
                done += runs
                for job in (j for g in groups if g[0].experiment == name for j in rotated(g, rep)):
                    what = job.binary or job.allocator
                    progress.update(task, description=f"rep {rep + 1}/{cfg.reps} {job.experiment} {what}")
                    t0 = time.monotonic()
                    for r in run_job(job, cfg, libs):
                        r["rep"] = rep
                        rows.append(r)
                    if timing is not None:
                        timing[name] = timing.get(name, 0.0) + time.monotonic() - t0
                    progress.advance(task)
    return rows


# ------------------------------------------------------------------------------------------------ main


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        check_modes(args)
        if args.compare:
            from rich.console import Console

            a, b = (load_result(p) for p in args.compare)
            rows = compare(a, b)
            if not rows:
                raise BenchError("the two runs have no cell in common")
            print_compare(rows, Console() if sys.stdout.isatty() else Console(width=1000), *args.compare)
            return 0
        if args.readme:
            path = Path(args.readme)
            result = load_result(path / "results.json" if path.is_dir() else path)
            sys.stdout.write(readme_markdown(result, path if path.is_dir() else path.parent))
            return 0
        if args.docs_from:
            folder, result = find_run(args.docs_from)
            md, charts, stale = write_docs(folder, result, docs_folder(args))
            sys.stdout.write(docs_written(md, charts, stale) + "\n")
            return 0
        return run_bench(args)
    except BenchError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130


# The options of a run, which --docs-from (a finished run) does not take.
RUN_OPTIONS = ("allocators", "threads", "sizes", "reps", "full", "smoke", "out", "lib", "bin_dir")


def check_modes(args):
    """--compare, --readme and --docs-from read finished runs and exclude each other; --docs goes with a
    run, and not a --smoke one, whose numbers are not results."""
    modes = [o for o, v in (("--compare", args.compare), ("--readme", args.readme), ("--docs-from", args.docs_from))
             if v]
    if len(modes) > 1:
        raise BenchError(f"{modes[0]} and {modes[1]} exclude each other")
    if args.docs and modes:
        raise BenchError(f"--docs (run, then write the docs) and {modes[0]} exclude each other")
    if args.docs_from:
        given = [o for o in RUN_OPTIONS if getattr(args, o) not in (None, False)]
        if args.experiments or given:
            what = f"--{given[0].replace('_', '-')}" if given else f"experiment '{args.experiments[0]}'"
            raise BenchError(f"--docs-from writes the docs of a finished run; {what} is for a new run")
    if args.docs and args.smoke:
        raise BenchError("--docs publishes a run's results, and a --smoke run's numbers are not results")
    if args.docs_dir and not (args.docs or args.docs_from):
        raise BenchError("--docs-dir goes with --docs or --docs-from")


def docs_folder(args):
    return Path(args.docs_dir) if args.docs_dir else default_docs_dir()


def docs_written(md, charts, stale):
    text = f"docs: {md} and {len(charts)} chart{'s' if len(charts) != 1 else ''} in {md.parent / CHART_DIR}/"
    return text + (f" (deleted, no longer in the run: {', '.join(stale)})" if stale else "")


def run_bench(args):
    from rich.console import Console

    cfg = make_config(args)
    docs = None
    if args.docs:
        # Checked before the run, not after minutes of it.
        docs = docs_folder(args)
        check_docs_dir(docs)
    # Tables are wide (median, range and ratio per allocator); when stdout is a file or pipe rich would
    # squeeze them into 80 columns, so give it room.
    console = Console() if sys.stdout.isatty() else Console(width=1000)
    err = Console(stderr=True)

    def warn(msg):
        err.print(msg, markup=False, highlight=False)

    check_output_dir(cfg.out)
    libs = resolve_allocators(cfg, warn)
    started = _dt.datetime.now()
    timing = {}
    rows = run_all(cfg, libs, console=err, warn=warn, timing=timing)
    cells = aggregate(rows)
    external = {k: str(v) for k, v in (cfg.external or {}).items() if k in libs}
    summary = run_summary(cells)
    result = {
        "meta": {"started": started.isoformat(timespec="seconds"),
                 "seconds": (_dt.datetime.now() - started).total_seconds(),
                 "experiment_seconds": {k: round(v, 1) for k, v in timing.items()},
                 "command": command_line(args.argv),
                 "machine": machine_info(libs),
                 "config": {"experiments": cfg.experiments, "allocators": list(libs), "threads": cfg.threads,
                            "sizes": cfg.sizes, "reps": cfg.reps, "full": cfg.full, "smoke": cfg.smoke,
                            "external": external,
                            "profile_rate": os.environ.get("THREADHEAP_PROFILE_RATE") if PROFILED in libs
                            else None}},
        "baseline": baseline_of(cells),
        "summary": summary,
        "raw": rows,
        "cells": cells,
    }
    print_tables(cells, console, cfg.experiments)
    print_summary(result, console)
    write_outputs(cfg.out, result)
    err.print(f"results: {cfg.out}/ (results.json, results.csv, report.md, charts)", markup=False, highlight=False)
    if docs is not None:
        err.print(docs_written(*write_docs(cfg.out, result, docs)), markup=False, highlight=False, soft_wrap=True)
    return 0


def command_line(argv):
    """The command that made a run: TH_BENCH_COMMAND when bench/run.sh says it was `make bench`, else
    `threadheap bench ARGS`."""
    given = os.environ.get("TH_BENCH_COMMAND")
    if given:
        return given
    return " ".join(["threadheap", "bench"] + [shlex.quote(a) for a in argv])
