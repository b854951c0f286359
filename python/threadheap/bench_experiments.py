"""The experiments of `threadheap bench`: what each workload measures and how its results are shown.

One table, EXPERIMENTS, describes every workload in bench/*.c: the fields that identify a cell, the metrics
it reports (and which way is better), the tables and the chart panels. The driver (bench.py) and the
reports (bench_results.py) both read it, and each metric says whether the run's summary (bench_summary.py)
counts it. Standard library only.
"""

from dataclasses import dataclass, field


class BenchError(Exception):
    """Bad input or a failed run: reported as one line `threadheap bench: ...`."""


# --------------------------------------------------------------------------------------------- experiments


@dataclass
class Metric:
    name: str
    label: str
    lower_is_better: bool
    # The summary's column that counts it, for a table metric: "time" (a time or a throughput) or "memory"
    # (RSS); None for the rest, which are derived from another metric of the same run or are not costs.
    summary: str = None


@dataclass
class Panel:
    """One chart row: metric against param x (None: bars per allocator), one subplot per facet value.
    With stack, bars per allocator split into those metrics (their sum is metric), and mark, when given,
    is drawn over each bar as a point (a part of the bar's time, e.g. the kernel's share)."""

    metric: str
    x: str = None
    facet: str = None
    where: dict = field(default_factory=dict)
    logx: bool = False
    logy: bool = False
    facet_order: list = None  # facet values in this order first, the rest sorted
    stack: list = None
    mark: str = None


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
    sizes: bool = False   # takes sizes (--sizes LIST unless size_arg says otherwise)
    size_arg: str = "--sizes"  # "--sizes": the list in one run; another option: one run per size, given there
    size_unit: str = "bytes"  # "bytes", or "MiB": the workload reads small numbers as MiB (see bench.sizes_for)
    os_variant: list = None  # extra args of a run without any allocator (an OS baseline), or None
    allocator_args: list = field(default_factory=list)  # args of the runs under each allocator
    layout: str = "rows"  # "rows": rows = params, columns = allocators; "seed": a table per allocator
    # A workload that links libthreadheap (its explicit heaps), run when it was built: once per repetition,
    # with no preload, on the same arguments as the others; its rows become allocators "th:<method>".
    linked: str = None
    linked_args: list = field(default_factory=list)  # its extra args (e.g. methods not measured elsewhere)

    def metric(self, name):
        for m in self.metrics:
            if m.name == name:
                return m
        raise KeyError(name)


def _m(name, label, lower=True, summary=None):
    return Metric(name, label, lower, summary)


EXPERIMENTS = {
    e.name: e
    for e in [
        Experiment(
            "contention", "contention", "Alloc/free pairs under contention (seed 000, seed 002)",
            "Threads share a pool of 2^20 alloc/free pairs of one size (by default a cell also stops after "
            "30 ms; --full runs every pair); time per pair over all threads (lower is better; with perfect "
            "scaling, two threads on two cores halve it). The os:mmap row does every pair "
            "with mmap/munmap. th:* rows, when bench/contention_heaps.c was built, are threadheap's own "
            "methods from a program linked with it: malloc, new, a shared th_heap (th:shared), a private "
            "th_heap per thread (th:private), and a private one created with TH_HEAP_NO_SERIALIZE "
            "(th:private-noserialize), as in the seed's tables.",
            ["size", "threads"], [_m("us_per_op", "µs per alloc/free pair", summary="time")], ["us_per_op"],
            [Panel("us_per_op", x="size", facet="threads", logx=True, logy=True)],
            threads="list", sizes=True, os_variant=["--method", "mmap"], allocator_args=["--method", "malloc"],
            layout="seed", linked="contention_heaps",
            # Its mmap method is the os:mmap row already.
            linked_args=["--methods", "malloc,new,heap_shared,heap_private,heap_private_noserialize"]),
        Experiment(
            "threads", "threads", "Scaling with threads, 1 KiB blocks (seed 002, figure 1)",
            "Each thread does the same number of 1 KiB alloc/free pairs; speed-up is the throughput over "
            "all threads against one thread of the same process (higher is better).",
            ["size", "threads"],
            [_m("seconds", "seconds", summary="time"), _m("mpairs_per_s", "Mpairs/s", False),
             _m("speedup", "speed-up", False)],
            ["seconds", "speedup"],
            [Panel("seconds", x="threads", logx=True), Panel("speedup", x="threads", logx=True)],
            threads="list", sizes=True),
        Experiment(
            "random", "random", "Random sizes over a window of live blocks (seed 004, heaptest)",
            "N threads, 1,000,000 operations each on a window of 1000 blocks of 1..2048 bytes (--sizes: other "
            "largest sizes, one run each): throughput, context switches per second (a locked heap makes "
            "threads sleep) and peak RSS.",
            ["threads", "max_size"],
            [_m("seconds", "seconds"), _m("mops_per_s", "Mops/s", False, summary="time"),
             _m("vcsw_per_s", "voluntary cs/s"), _m("ivcsw_per_s", "involuntary cs/s"),
             _m("peak_rss_kb", "peak RSS KiB", summary="memory")],
            ["mops_per_s", "vcsw_per_s", "ivcsw_per_s", "peak_rss_kb"],
            [Panel("mops_per_s", x="threads"), Panel("vcsw_per_s", x="threads"), Panel("peak_rss_kb", x="threads")],
            threads="each", default_threads=None, sizes=True, size_arg="--max-size"),
        Experiment(
            "large", "large", "Hidden costs of large blocks (seed 001)",
            "Blocks of 8-40 MiB, past glibc's largest mmap threshold (32 MiB): untouched alloc+free (what a "
            "timer around malloc and free sees); alloc + one write per page + free, split into allocation, "
            "first touch (page faults, the kernel zeroing each page) and free; and a reused buffer written "
            "each time (the floor). Costs per MiB; system = kernel time of the process, which on Linux "
            "includes the page zeroing that seed 001 found in another process.",
            ["mode", "size_mb"],
            [_m("total_us_per_mb", "total µs/MiB", summary="time"), _m("alloc_us_per_mb", "alloc µs/MiB"),
             _m("touch_us_per_mb", "first touch µs/MiB"), _m("free_us_per_mb", "free µs/MiB"),
             _m("sys_us_per_mb", "system µs/MiB"), _m("minflt_per_iter", "minor faults/iteration")],
            ["total_us_per_mb", "alloc_us_per_mb", "touch_us_per_mb", "free_us_per_mb", "sys_us_per_mb",
             "minflt_per_iter"],
            [Panel("total_us_per_mb", x="size_mb", facet="mode", logy=True,
                   facet_order=["untouched", "touched", "reused"]),
             Panel("total_us_per_mb", facet="size_mb", where={"mode": "touched"},
                   stack=["alloc_us_per_mb", "touch_us_per_mb", "free_us_per_mb"], mark="sys_us_per_mb")],
            sizes=True, size_unit="MiB"),
        Experiment(
            "touch", "touch", "Touching 256 MiB, one byte per page (seed 003)",
            "256 MiB from malloc (per allocator) and, as OS baselines, anonymous mmap, a mapped temporary "
            "file, a static array and mmap with MADV_HUGEPAGE: time and page faults.",
            ["size_mb"],
            [_m("ms", "ms", summary="time"), _m("minflt", "minor faults"), _m("majflt", "major faults"),
             _m("sys_ms", "system ms")],
            ["ms", "minflt", "sys_ms"],
            [Panel("ms"), Panel("minflt")],
            os_variant=["--methods", "mmap,file,static,huge"], allocator_args=["--methods", "malloc"]),
        Experiment(
            "xthread", "xthread", "Producer/consumer: every free is remote",
            "One thread allocates 16-1024 B blocks, another writes and frees them, 64 MiB live at all "
            "times: throughput, and the footprint above the live data (overhead = (peak RSS - empty RSS) / "
            "live - 1).",
            ["live_mb"],
            [_m("mblocks_per_s", "Mblocks/s", False, summary="time"), _m("overhead", "RSS overhead over live"),
             _m("peak_rss_kb", "peak RSS KiB"), _m("end_rss_kb", "RSS at end KiB", summary="memory")],
            ["mblocks_per_s", "overhead", "end_rss_kb"],
            [Panel("mblocks_per_s"), Panel("overhead")]),
        Experiment(
            "larson", "larson", "Server simulation (larson)",
            "Threads in rounds replace random blocks (16-512 B) in arrays that pass to other threads each "
            "round, so most frees are of blocks another, exited thread allocated: throughput and RSS.",
            ["threads"],
            [_m("mops_per_s", "Mops/s", False, summary="time"), _m("peak_rss_kb", "peak RSS KiB", summary="memory"),
             _m("end_rss_kb", "RSS at end KiB", summary="memory")],
            ["mops_per_s", "peak_rss_kb", "end_rss_kb"],
            [Panel("mops_per_s"), Panel("peak_rss_kb")],
            threads="each", default_threads=None),
        Experiment(
            "pairs", "pairs", "threadheap's speed targets: pairs",
            "single: one thread, ns per malloc+free pair. scaling: the speed-up of two threads over one, "
            "divided by the speed-up of an allocation-free loop of equal work in the same run "
            "(1.0 = scales as well as code that never allocates; higher is better).",
            ["mode", "size"],
            [_m("ns_per_pair", "ns per pair", summary="time"), _m("speedup", "2-thread speed-up", False),
             _m("ref_speedup", "reference speed-up", False), _m("scaling", "scaling ratio", False)],
            ["ns_per_pair", "scaling"],
            [Panel("ns_per_pair", x="size", facet="mode", logx=True),
             Panel("scaling", x="size", where={"mode": "scaling"}, logx=True)],
            sizes=True),
    ]
}

# Built-in allocators. threadheap+profile is threadheap's library with heap profiling on (THREADHEAP_PROFILE,
# a file per run); its row of the summary is what profiling costs. --allocators also takes NAME=PATH: any
# other library, preloaded like the peers.
ALLOCATORS = ["threadheap", "threadheap+profile", "glibc", "mimalloc", "jemalloc", "tcmalloc"]
PEER_SONAMES = {"mimalloc": "libmimalloc.so.2", "jemalloc": "libjemalloc.so.2",
                "tcmalloc": "libtcmalloc_minimal.so.4"}
PACKAGES = {"glibc": "libc6", "mimalloc": "libmimalloc2.0", "jemalloc": "libjemalloc2",
            "tcmalloc": "libtcmalloc-minimal4"}
BASELINE = "threadheap"
PROFILED = "threadheap+profile"
# Rows of an Experiment.linked workload are named LINKED_PREFIX + method; OS baselines "os:" + method.
LINKED_PREFIX = "th:"
OS_PREFIX = "os:"

