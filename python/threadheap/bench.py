"""`threadheap bench`: runs threadheap's benchmark workloads under each allocator and reports.

Each workload (bench/*.c, built into build/bin/) is a plain C program that calls malloc and prints one JSON
object per line. The driver runs it once per allocator, switching the allocator with LD_PRELOAD (glibc is
the run without a preload), repeats the whole set --reps times with the allocators interleaved inside each
repetition (so slow drift of a noisy machine hits all of them alike), and reduces every cell to its median
with the min-max range. Ratios are always allocator / threadheap on the medians.

Outputs, in one folder: results.json (raw rows and aggregated cells), results.csv, one PNG chart per
experiment and report.md, which records the machine and embeds the charts and tables.

rich and matplotlib are imported inside the functions that use them, so the rest of the package (and the
parts of this module the tests call) work with the standard library alone.
"""

import argparse
import csv
import datetime as _dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

PROG = "threadheap bench"
REPO = Path(__file__).resolve().parents[2]


class BenchError(Exception):
    """Bad input or a failed run: reported as one line `threadheap bench: ...`."""


# --------------------------------------------------------------------------------------------- experiments


@dataclass
class Metric:
    name: str
    label: str
    lower_is_better: bool


@dataclass
class Panel:
    """One chart row: metric against param x (None: bars per allocator), one subplot per facet value."""

    metric: str
    x: str = None
    facet: str = None
    where: dict = field(default_factory=dict)
    logx: bool = False
    logy: bool = False


@dataclass
class Experiment:
    name: str
    binary: str
    title: str
    description: str
    params: list          # fields that identify a cell (besides the allocator)
    metrics: list         # Metric
    table_metrics: list   # metric names shown as tables
    panels: list          # Panel
    threads: str = None   # "list": --threads LIST; "each": one process per thread count; None: not taken
    default_threads: list = None
    sizes: bool = False   # takes --sizes LIST
    os_variant: list = None  # extra args of a run without any allocator (an OS baseline), or None
    allocator_args: list = field(default_factory=list)  # args of the runs under each allocator
    layout: str = "rows"  # "rows": rows = params, columns = allocators; "seed": a table per allocator

    def metric(self, name):
        for m in self.metrics:
            if m.name == name:
                return m
        raise KeyError(name)


def _m(name, label, lower=True):
    return Metric(name, label, lower)


EXPERIMENTS = {
    e.name: e
    for e in [
        Experiment(
            "contention", "contention", "Alloc/free pairs under contention (seed 000, seed 002)",
            "Threads share a fixed amount of alloc/free pairs of one size; time per pair over all threads "
            "(lower is better; with perfect scaling two threads halve it). The os:mmap row does every pair "
            "with mmap/munmap.",
            ["size", "threads"], [_m("us_per_op", "µs per alloc/free pair")], ["us_per_op"],
            [Panel("us_per_op", x="size", facet="threads", logx=True, logy=True)],
            threads="list", sizes=True, os_variant=["--method", "mmap"], allocator_args=["--method", "malloc"],
            layout="seed"),
        Experiment(
            "threads", "threads", "Scaling with threads, 1 KiB blocks (seed 002, figure 1)",
            "Each thread does the same number of 1 KiB alloc/free pairs; speed-up is the throughput over "
            "all threads against one thread of the same process (higher is better).",
            ["size", "threads"],
            [_m("seconds", "seconds"), _m("mpairs_per_s", "Mpairs/s", False), _m("speedup", "speed-up", False)],
            ["seconds", "speedup"],
            [Panel("seconds", x="threads", logx=True), Panel("speedup", x="threads", logx=True)],
            threads="list", sizes=True),
        Experiment(
            "random", "random", "Random sizes over a window of live blocks (seed 004, heaptest)",
            "N threads, 1,000,000 operations each on a window of 1000 blocks of 1..2048 bytes: throughput, "
            "context switches per second (a locked heap makes threads sleep) and peak RSS.",
            ["threads", "max_size"],
            [_m("seconds", "seconds"), _m("mops_per_s", "Mops/s", False), _m("vcsw_per_s", "voluntary cs/s"),
             _m("ivcsw_per_s", "involuntary cs/s"), _m("peak_rss_kb", "peak RSS KiB")],
            ["mops_per_s", "vcsw_per_s", "ivcsw_per_s", "peak_rss_kb"],
            [Panel("mops_per_s", x="threads"), Panel("vcsw_per_s", x="threads"), Panel("peak_rss_kb", x="threads")],
            threads="each", default_threads=None),
        Experiment(
            "large", "large", "Hidden costs of large blocks (seed 001)",
            "Blocks of 8-40 MiB: untouched alloc+free; alloc + one write per page + free; and a reused "
            "buffer written each time (the floor). Costs per MiB; sys = kernel time of the process.",
            ["mode", "size_mb"],
            [_m("total_us_per_mb", "total µs/MiB"), _m("alloc_us_per_mb", "alloc µs/MiB"),
             _m("touch_us_per_mb", "first touch µs/MiB"), _m("free_us_per_mb", "free µs/MiB"),
             _m("sys_us_per_mb", "system µs/MiB"), _m("minflt_per_iter", "minor faults/iteration")],
            ["total_us_per_mb", "alloc_us_per_mb", "touch_us_per_mb", "free_us_per_mb", "sys_us_per_mb",
             "minflt_per_iter"],
            [Panel("total_us_per_mb", x="size_mb", facet="mode", logy=True),
             Panel("minflt_per_iter", x="size_mb", facet="mode")],
            sizes=True),
        Experiment(
            "touch", "touch", "Touching 256 MiB, one byte per page (seed 003)",
            "256 MiB from malloc (per allocator) and, as OS baselines, anonymous mmap, a mapped temporary "
            "file, a static array and mmap with MADV_HUGEPAGE: time and page faults.",
            ["size_mb"],
            [_m("ms", "ms"), _m("minflt", "minor faults"), _m("majflt", "major faults"), _m("sys_ms", "system ms")],
            ["ms", "minflt", "sys_ms"],
            [Panel("ms"), Panel("minflt")],
            os_variant=["--methods", "mmap,file,static,huge"], allocator_args=["--methods", "malloc"]),
        Experiment(
            "xthread", "xthread", "Producer/consumer: every free is remote",
            "One thread allocates 16-1024 B blocks, another writes and frees them, 64 MiB live at all "
            "times: throughput, and the footprint above the live data (overhead = (peak RSS - empty RSS) / "
            "live - 1).",
            ["live_mb"],
            [_m("mblocks_per_s", "Mblocks/s", False), _m("overhead", "RSS overhead over live"),
             _m("peak_rss_kb", "peak RSS KiB"), _m("end_rss_kb", "RSS at end KiB")],
            ["mblocks_per_s", "overhead", "end_rss_kb"],
            [Panel("mblocks_per_s"), Panel("overhead")]),
        Experiment(
            "larson", "larson", "Server simulation (larson)",
            "Threads in rounds replace random blocks (16-512 B) in arrays that pass to other threads each "
            "round, so most frees are of blocks another, exited thread allocated: throughput and RSS.",
            ["threads"],
            [_m("mops_per_s", "Mops/s", False), _m("peak_rss_kb", "peak RSS KiB"), _m("end_rss_kb", "RSS at end KiB")],
            ["mops_per_s", "peak_rss_kb", "end_rss_kb"],
            [Panel("mops_per_s"), Panel("peak_rss_kb")],
            threads="each", default_threads=None),
        Experiment(
            "pairs", "pairs", "threadheap's speed targets: pairs",
            "single: one thread, ns per malloc+free pair. scaling: the speed-up of two threads over one, "
            "divided by the speed-up of an allocation-free loop of equal work in the same run "
            "(1.0 = scales as well as code that never allocates; higher is better).",
            ["mode", "size"],
            [_m("ns_per_pair", "ns per pair"), _m("speedup", "2-thread speed-up", False),
             _m("ref_speedup", "reference speed-up", False), _m("scaling", "scaling ratio", False)],
            ["ns_per_pair", "scaling"],
            [Panel("ns_per_pair", x="size", facet="mode", logx=True),
             Panel("scaling", x="size", where={"mode": "scaling"}, logx=True)],
            sizes=True),
    ]
}

ALLOCATORS = ["threadheap", "glibc", "mimalloc", "jemalloc", "tcmalloc"]
PEER_SONAMES = {"mimalloc": "libmimalloc.so.2", "jemalloc": "libjemalloc.so.2",
                "tcmalloc": "libtcmalloc_minimal.so.4"}
PACKAGES = {"glibc": "libc6", "mimalloc": "libmimalloc2.0", "jemalloc": "libjemalloc2",
            "tcmalloc": "libtcmalloc-minimal4"}
BASELINE = "threadheap"


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


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG, description="Run threadheap's benchmarks under each allocator (switched with LD_PRELOAD).")
    p.add_argument("experiments", nargs="*", metavar="EXPERIMENT",
                   help="experiments to run (default: all): " + ", ".join(EXPERIMENTS))
    p.add_argument("--allocators", help="comma-separated, default: " + ",".join(ALLOCATORS))
    p.add_argument("--threads", help="thread counts, e.g. 1,2,4 (experiments that take threads)")
    p.add_argument("--sizes", help="block sizes, e.g. 16,1k,64k (MiB for large)")
    p.add_argument("--reps", default="3", help="repetitions (default 3); each cell reports median, min-max")
    p.add_argument("--full", action="store_true", help="the seeds' full run lengths (much longer)")
    p.add_argument("--smoke", action="store_true", help="tiny runs, to check that everything works")
    p.add_argument("--out", help="output folder (default bench-results/<timestamp>)")
    p.add_argument("--lib", help="libthreadheap.so to preload (default build/libthreadheap.so)")
    p.add_argument("--bin-dir", help="folder of the workload binaries (default build/bin)")
    p.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"),
                   help="compare two results.json: per-cell ratio B/A")
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


def make_config(args):
    experiments = (parse_name_list(",".join(args.experiments), list(EXPERIMENTS), "experiment")
                   if args.experiments else list(EXPERIMENTS))
    allocators = (parse_name_list(args.allocators, ALLOCATORS, "allocator") if args.allocators is not None
                  else list(ALLOCATORS))
    threads = parse_int_list(args.threads, "threads") if args.threads is not None else None
    sizes = parse_int_list(args.sizes, "sizes") if args.sizes is not None else None
    try:
        reps = int(args.reps)
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
                  args.allocators is not None)


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
    """name -> library to preload (None for glibc). Missing ones are an error when asked for by name, else
    left out with a warning."""
    libs = {}
    for name in cfg.allocators:
        if name == "glibc":
            libs[name] = None
            continue
        path = cfg.lib if name == "threadheap" else find_peer(PEER_SONAMES[name])
        if path is None or not Path(path).exists():
            what = str(path) if name == "threadheap" else PEER_SONAMES[name]
            hint = "build it with make" if name == "threadheap" else f"apt-get install {PACKAGES[name]}"
            if cfg.explicit_allocators:
                raise BenchError(f"allocator '{name}' not found: {what} ({hint})")
            warn(f"{PROG}: leaving out {name}: {what} not found ({hint})")
            continue
        libs[name] = Path(path).resolve()
    if not libs:
        raise BenchError("no allocator to run")
    return libs


# ------------------------------------------------------------------------------------------------ running


@dataclass
class Job:
    experiment: str
    allocator: str   # an allocator name, or "os" for a run without any allocator under test
    args: list


def plan_jobs(cfg, allocators):
    """Every run of one repetition, allocators interleaved inside each group of identical arguments."""
    groups = []
    for name in cfg.experiments:
        exp = EXPERIMENTS[name]
        common = []
        if cfg.smoke:
            common.append("--smoke")
        if cfg.full:
            common.append("--full")
        if exp.sizes and cfg.sizes:
            common += ["--sizes", ",".join(map(str, cfg.sizes))]
        variants = [common]
        if exp.threads == "list" and cfg.threads:
            variants = [common + ["--threads", ",".join(map(str, cfg.threads))]]
        elif exp.threads == "each":
            counts = cfg.threads or exp.default_threads or default_thread_counts()
            variants = [common + ["--threads", str(t)] for t in counts]
        for v in variants:
            group = [Job(name, a, v + exp.allocator_args) for a in allocators]
            if exp.os_variant:
                group.append(Job(name, "os", v + exp.os_variant))
            groups.append(group)
    return groups


def default_thread_counts():
    n = os.cpu_count() or 1
    return list(range(1, min(2 * n, 8) + 1)) if n <= 4 else [1, 2, n // 2, n, 2 * n]


def rotated(group, rep):
    k = rep % len(group)
    return group[k:] + group[:k]


def run_job(job, cfg, libs, timeout=900):
    exe = cfg.bin_dir / EXPERIMENTS[job.experiment].binary
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    lib = libs.get(job.allocator)
    if lib is not None:
        env["LD_PRELOAD"] = str(lib)
    try:
        proc = subprocess.run([str(exe)] + job.args, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{job.experiment} under {job.allocator} timed out after {timeout} s") from None
    except OSError as e:
        raise BenchError(f"cannot run {exe}: {e.strerror}") from None
    if "cannot be preloaded" in proc.stderr:
        # ld.so only warns and goes on with the system malloc: that run would silently measure glibc.
        raise BenchError(f"{lib} could not be preloaded: {proc.stderr.strip().splitlines()[0]}")
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise BenchError(f"{job.experiment} under {job.allocator} failed (exit {proc.returncode}): {tail}")
    rows = parse_output(proc.stdout)
    if not rows:
        raise BenchError(f"{job.experiment} under {job.allocator} printed no results")
    return [normalize_row(r, job.allocator) for r in rows]


def normalize_row(row, allocator):
    """Tags a workload row with its allocator. The OS baselines of an experiment become allocators of
    their own, 'os:<method>', so that they sit in the same tables and charts as the allocators."""
    row = dict(row)
    method = row.pop("method", None)
    if allocator == "os":
        allocator = f"os:{method}"
    row["allocator"] = allocator
    return row


def check_output_dir(out):
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise BenchError(f"cannot write to output folder {out}: {e.strerror}") from None


def run_all(cfg, libs, console=None):
    """Runs every job of every repetition; returns the raw rows (each with experiment, allocator, rep)."""
    groups = plan_jobs(cfg, list(libs))
    for g in groups:
        exe = cfg.bin_dir / EXPERIMENTS[g[0].experiment].binary
        if not exe.exists():
            raise BenchError(f"workload not found: {exe} (build with make, or give --bin-dir)")
    total = cfg.reps * sum(len(g) for g in groups)
    rows = []
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description:<36}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task("starting", total=total)
        for rep in range(cfg.reps):
            for group in groups:
                for job in rotated(group, rep):
                    progress.update(task, description=f"rep {rep + 1}/{cfg.reps} {job.experiment} {job.allocator}")
                    for r in run_job(job, cfg, libs):
                        r["rep"] = rep
                        rows.append(r)
                    progress.advance(task)
    return rows


# ------------------------------------------------------------------------------------------------ aggregation


def cell_key(exp, row):
    return tuple(row.get(p) for p in exp.params)


def aggregate(rows):
    """Raw rows -> cells: one per (experiment, allocator, params), each metric as median/min/max/n, and the
    ratio of its median to the baseline's (threadheap, or the first allocator when threadheap is absent)."""
    groups = {}
    for r in rows:
        exp = EXPERIMENTS.get(r.get("experiment"))
        if exp is None:
            continue
        key = (exp.name, r["allocator"], cell_key(exp, r))
        groups.setdefault(key, []).append(r)
    cells = []
    for (name, alloc, key), rs in groups.items():
        exp = EXPERIMENTS[name]
        metrics = {}
        for m in exp.metrics:
            vals = [float(r[m.name]) for r in rs if isinstance(r.get(m.name), (int, float))]
            if vals:
                metrics[m.name] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
                                   "n": len(vals)}
        cells.append({"experiment": name, "allocator": alloc, "params": dict(zip(exp.params, key)),
                      "metrics": metrics})
    add_ratios(cells)
    return cells


def baseline_of(cells):
    allocs = [c["allocator"] for c in cells]
    if BASELINE in allocs:
        return BASELINE
    return order_allocators(allocs)[0] if allocs else BASELINE


def add_ratios(cells):
    base = baseline_of(cells)
    index = {(c["experiment"], _pkey(c["params"])): c for c in cells if c["allocator"] == base}
    for c in cells:
        ref = index.get((c["experiment"], _pkey(c["params"])))
        for name, st in c["metrics"].items():
            b = ref["metrics"].get(name, {}).get("median") if ref else None
            st["ratio"] = (st["median"] / b) if b not in (None, 0) else None
    return base


def _pkey(params):
    return tuple(sorted((k, str(v)) for k, v in params.items()))


def order_allocators(names):
    names = list(dict.fromkeys(names))
    known = [a for a in ALLOCATORS if a in names]
    return known + sorted(n for n in names if n not in ALLOCATORS)


# ------------------------------------------------------------------------------------------------ formatting


def fmt(v):
    if v is None:
        return "–"
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def fmt_stat(st, with_range=True, with_ratio=True):
    if not st:
        return "–"
    s = fmt(st["median"])
    if with_range and st.get("n", 1) > 1:
        s += f" [{fmt(st['min'])}–{fmt(st['max'])}]"
    if with_ratio and st.get("ratio") is not None:
        s += f" ×{st['ratio']:.2f}"
    return s


def _sort_key(v):
    return (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))


def tables_for(exp, cells, metric):
    """The tables of one metric: a list of (title, header, rows) of strings."""
    mine = [c for c in cells if c["experiment"] == exp.name and metric in c["metrics"]]
    if not mine:
        return []
    m = exp.metric(metric)
    base = baseline_of([c for c in cells if c["experiment"] == exp.name])
    better = "lower" if m.lower_is_better else "higher"
    allocs = order_allocators(c["allocator"] for c in mine)
    if exp.layout == "seed":
        # As the seed prints them: one table per allocator, block size down, thread count across.
        out = []
        threads = sorted({c["params"]["threads"] for c in mine}, key=_sort_key)
        sizes = sorted({c["params"]["size"] for c in mine}, key=_sort_key)
        for a in allocs:
            idx = {(c["params"]["size"], c["params"]["threads"]): c for c in mine if c["allocator"] == a}
            header = ["bytes"] + [f"{t} thread{'s' if t != 1 else ''}" for t in threads]
            rows = [[str(s)] + [fmt_stat(idx.get((s, t), {}).get("metrics", {}).get(metric)) for t in threads]
                    for s in sizes]
            out.append((f"{exp.name}: {a}, {m.label} ({better} is better; ×ratio to {base})", header, rows))
        return out
    keys = sorted({tuple(c["params"][p] for p in exp.params) for c in mine},
                  key=lambda k: tuple(_sort_key(v) for v in k))
    idx = {(c["allocator"], tuple(c["params"][p] for p in exp.params)): c for c in mine}
    header = list(exp.params) + allocs
    rows = [[str(v) for v in k] + [fmt_stat(idx.get((a, k), {}).get("metrics", {}).get(metric)) for a in allocs]
            for k in keys]
    return [(f"{exp.name}: {m.label} ({better} is better; median [min–max] ×ratio to {base})", header, rows)]


def print_tables(cells, console, experiments=None):
    from rich.table import Table
    from rich.text import Text

    # Text, not markup strings: "[min–max]" must print as it is, not be read as a style tag.
    for name in experiments or EXPERIMENTS:
        exp = EXPERIMENTS[name]
        for metric in exp.table_metrics:
            for title, header, rows in tables_for(exp, cells, metric):
                t = Table(title=Text(title), title_justify="left")
                for i, h in enumerate(header):
                    t.add_column(Text(h), justify="left" if i == 0 else "right", no_wrap=True)
                for r in rows:
                    t.add_row(*(Text(c) for c in r))
                console.print(t)


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ outputs


def machine_info(libs=None):
    info = {"cpu": "unknown", "cores": os.cpu_count(), "kernel": platform.release(),
            "glibc": platform.libc_ver()[1] or "unknown", "python": platform.python_version(), "packages": {}}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    for name, pkg in PACKAGES.items():
        info["packages"][pkg] = dpkg_version(pkg)
    info["threadheap_version"] = header_version()
    info["libraries"] = {k: (str(v) if v else "(system malloc)") for k, v in (libs or {}).items()}
    return info


def dpkg_version(pkg):
    if not shutil.which("dpkg-query"):
        return None
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True, timeout=20)
        return r.stdout.strip() or None if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def header_version():
    try:
        text = (REPO / "include" / "threadheap.h").read_text()
        major = re.search(r"TH_VERSION_MAJOR\s+(\d+)", text).group(1)
        minor = re.search(r"TH_VERSION_MINOR\s+(\d+)", text).group(1)
        return f"{major}.{minor}"
    except (OSError, AttributeError):
        return None


def write_json(path, result):
    path.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")


def write_csv(path, cells):
    params = []
    for c in cells:
        for p in c["params"]:
            if p not in params:
                params.append(p)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["experiment", "allocator"] + params + ["metric", "median", "min", "max", "n", "ratio"])
        for c in cells:
            for name, st in c["metrics"].items():
                w.writerow([c["experiment"], c["allocator"]] + [c["params"].get(p, "") for p in params] +
                           [name, repr(st["median"]), repr(st["min"]), repr(st["max"]), st["n"],
                            "" if st.get("ratio") is None else repr(st["ratio"])])


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def chart(exp, cells, path):
    """One PNG per experiment: a row of subplots per panel, a line (or bar) per allocator with the min-max
    range as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [c for c in cells if c["experiment"] == exp.name]
    if not mine:
        return False
    panels = []
    for p in exp.panels:
        sel = [c for c in mine if p.metric in c["metrics"] and all(c["params"].get(k) == v for k, v in p.where.items())]
        if not sel:
            continue
        facets = sorted({c["params"].get(p.facet) for c in sel}, key=_sort_key) if p.facet else [None]
        panels.append((p, sel, facets))
    if not panels:
        return False
    ncols = max(len(f) for _, _, f in panels)
    fig, axes = plt.subplots(len(panels), ncols, figsize=(4.2 * ncols + 1, 3.4 * len(panels)), squeeze=False)
    allocs = order_allocators(c["allocator"] for c in mine)
    colors = {a: f"C{i}" for i, a in enumerate(allocs)}
    for row, (p, sel, facets) in enumerate(panels):
        m = exp.metric(p.metric)
        for col in range(ncols):
            ax = axes[row][col]
            if col >= len(facets):
                ax.axis("off")
                continue
            fv = facets[col]
            fsel = [c for c in sel if p.facet is None or c["params"].get(p.facet) == fv]
            if p.x:
                for a in allocs:
                    pts = sorted(((c["params"][p.x], c["metrics"][p.metric]) for c in fsel if c["allocator"] == a),
                                 key=lambda t: _sort_key(t[0]))
                    if not pts:
                        continue
                    xs = [t[0] for t in pts]
                    ys = [t[1]["median"] for t in pts]
                    lo = [t[1]["median"] - t[1]["min"] for t in pts]
                    hi = [t[1]["max"] - t[1]["median"] for t in pts]
                    ax.errorbar(xs, ys, yerr=[lo, hi], label=a, color=colors[a], marker="o", ms=3, capsize=2, lw=1.2)
                ax.set_xlabel(p.x)
                if p.logx:
                    ax.set_xscale("log", base=2)
            else:
                # Bars: one group per distinct params tuple, one bar per allocator.
                keys = sorted({tuple(c["params"].get(k) for k in exp.params) for c in fsel},
                              key=lambda k: tuple(_sort_key(v) for v in k))
                width = 0.8 / max(1, len(allocs))
                for i, a in enumerate(allocs):
                    for j, k in enumerate(keys):
                        st = next((c["metrics"][p.metric] for c in fsel if c["allocator"] == a and
                                   tuple(c["params"].get(q) for q in exp.params) == k), None)
                        if st is None:
                            continue
                        ax.bar(j + i * width, st["median"], width, color=colors[a], label=a if j == 0 else None,
                               yerr=[[st["median"] - st["min"]], [st["max"] - st["median"]]], capsize=2)
                ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))])
                ax.set_xticklabels([", ".join(f"{q}={v}" for q, v in zip(exp.params, k)) for k in keys], fontsize=8)
            if p.logy:
                ax.set_yscale("log")
            ax.set_ylabel(m.label)
            ax.set_title(f"{p.facet}={fv}" if p.facet else m.label, fontsize=9)
            ax.grid(True, alpha=0.3)
            if row == 0 and col == 0:
                ax.legend(fontsize=7)
    fig.suptitle(exp.title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def write_report(path, result, charts):
    meta, cells = result["meta"], result["cells"]
    lines = ["# threadheap benchmark report", "",
             f"Run {meta.get('started', '')}, {meta.get('seconds', 0):.0f} s: `{meta.get('command', '')}`", "",
             "## Machine", "",
             markdown_table(["what", "value"], [
                 ["CPU", str(meta["machine"]["cpu"])], ["cores", str(meta["machine"]["cores"])],
                 ["kernel", str(meta["machine"]["kernel"])], ["glibc", str(meta["machine"]["glibc"])],
                 ["threadheap", str(meta["machine"].get("threadheap_version"))]]
                 + [[f"package {k}", str(v)] for k, v in meta["machine"]["packages"].items()]), "",
             "## Allocators", "",
             markdown_table(["allocator", "library"], [[k, f"`{v}`"] for k, v in meta["machine"]["libraries"].items()]),
             "",
             f"Each cell: median over {meta['config']['reps']} repetition(s), [min–max], and ×ratio = this "
             f"allocator's median / {result['baseline']}'s. Allocators were interleaved within each repetition. "
             "os:* rows are OS baselines run without any allocator under test.", ""]
    for name in meta["config"]["experiments"]:
        exp = EXPERIMENTS[name]
        lines += [f"## {exp.title}", "", exp.description, ""]
        if name in charts:
            lines += [f"![{name}]({charts[name]})", ""]
        for metric in exp.table_metrics:
            for title, header, rows in tables_for(exp, cells, metric):
                lines += [f"**{title}**", "", markdown_table(header, rows), ""]
    path.write_text("\n".join(lines) + "\n")


def write_outputs(out, result):
    """results.json, results.csv, <experiment>.png and report.md in out; returns the chart file names."""
    write_json(out / "results.json", result)
    write_csv(out / "results.csv", result["cells"])
    charts = {}
    for name in result["meta"]["config"]["experiments"]:
        fname = f"{name}.png"
        if chart(EXPERIMENTS[name], result["cells"], out / fname):
            charts[name] = fname
    write_report(out / "report.md", result, charts)
    return charts


# ------------------------------------------------------------------------------------------------ compare


def load_result(path):
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise BenchError(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError:
        raise BenchError(f"{path} is not a results.json") from None
    if not isinstance(data, dict) or "cells" not in data:
        raise BenchError(f"{path} is not a results.json")
    return data


def compare(a, b):
    """Cells present in both runs: (experiment, allocator, params, metric, median A, median B, B/A)."""
    index = {(c["experiment"], c["allocator"], _pkey(c["params"])): c for c in a["cells"]}
    out = []
    for c in b["cells"]:
        ca = index.get((c["experiment"], c["allocator"], _pkey(c["params"])))
        if ca is None:
            continue
        for name, st in c["metrics"].items():
            sa = ca["metrics"].get(name)
            if sa is None:
                continue
            ratio = st["median"] / sa["median"] if sa["median"] else None
            out.append({"experiment": c["experiment"], "allocator": c["allocator"], "params": c["params"],
                        "metric": name, "a": sa["median"], "b": st["median"], "ratio": ratio})
    return out


def print_compare(rows, console, a_name, b_name):
    from rich.table import Table
    from rich.text import Text

    for name in EXPERIMENTS:
        mine = [r for r in rows if r["experiment"] == name]
        if not mine:
            continue
        exp = EXPERIMENTS[name]
        t = Table(title=Text(f"{name}: B/A ({b_name} / {a_name})"), title_justify="left")
        for h in ["allocator"] + exp.params + ["metric", "A", "B", "B/A", "better"]:
            t.add_column(h, no_wrap=True)
        for r in mine:
            lower = exp.metric(r["metric"]).lower_is_better if r["metric"] in [m.name for m in exp.metrics] else True
            if r["ratio"] is None or r["ratio"] == 1:
                better = "="
            else:
                better = "B" if (r["ratio"] < 1) == lower else "A"
            t.add_row(r["allocator"], *[str(r["params"].get(p, "")) for p in exp.params], r["metric"], fmt(r["a"]),
                      fmt(r["b"]), "–" if r["ratio"] is None else f"{r['ratio']:.3f}", better)
        console.print(t)


# ------------------------------------------------------------------------------------------------ main


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.compare:
            from rich.console import Console

            a, b = (load_result(p) for p in args.compare)
            rows = compare(a, b)
            if not rows:
                raise BenchError("the two runs have no cell in common")
            print_compare(rows, Console() if sys.stdout.isatty() else Console(width=1000), *args.compare)
            return 0
        return run_bench(args)
    except BenchError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130


def run_bench(args):
    from rich.console import Console

    cfg = make_config(args)
    # Tables are wide (median, range and ratio per allocator); when stdout is a file or pipe rich would
    # squeeze them into 80 columns, so give it room.
    console = Console() if sys.stdout.isatty() else Console(width=1000)
    err = Console(stderr=True)
    check_output_dir(cfg.out)
    libs = resolve_allocators(cfg, lambda msg: err.print(msg, markup=False, highlight=False))
    started = _dt.datetime.now()
    rows = run_all(cfg, libs, console=err)
    cells = aggregate(rows)
    result = {
        "meta": {"started": started.isoformat(timespec="seconds"),
                 "seconds": (_dt.datetime.now() - started).total_seconds(),
                 "command": "threadheap bench " + " ".join(argv_quote(sys.argv[2:] if _invoked_as_cli() else [])),
                 "machine": machine_info(libs),
                 "config": {"experiments": cfg.experiments, "allocators": list(libs), "threads": cfg.threads,
                            "sizes": cfg.sizes, "reps": cfg.reps, "full": cfg.full, "smoke": cfg.smoke}},
        "baseline": baseline_of(cells),
        "raw": rows,
        "cells": cells,
    }
    print_tables(cells, console, cfg.experiments)
    write_outputs(cfg.out, result)
    err.print(f"results: {cfg.out}/ (results.json, results.csv, report.md, charts)", markup=False, highlight=False)
    return 0


def _invoked_as_cli():
    return len(sys.argv) > 1 and sys.argv[1] == "bench"


def argv_quote(args):
    import shlex

    return [shlex.quote(a) for a in args]
