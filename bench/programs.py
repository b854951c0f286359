#!/usr/bin/env python3
"""Real programs from Debian packages, run with each allocator preloaded: timed, or checked.

Standard library only (and the allocator-list parser of python/threadheap/bench.py). The programs are
unmodified; the allocator under test is switched with LD_PRELOAD (glibc is the run without a preload). Every
run starts in a fresh empty folder, its stdout goes to a file whose SHA-256 is compared across allocators, so
a wrong result is never timed as a fast one.

    python3 bench/programs.py                    # 5 repetitions, markdown table of medians
    python3 bench/programs.py --reps 1 --scale 1 # a quick look
    python3 bench/programs.py --check            # the CTest check: glibc vs threadheap, same output

    python3 bench/programs.py --allocators glibc,threadheap,secure=/tmp/secure/libthreadheap.so
                                                 # any other library, preloaded under a name of its own

Timing: within each repetition every program runs once per allocator, the allocators interleaved (so slow
drift of a noisy machine hits all of them alike), in a rotated order. Two tables: the median wall-clock
seconds and the median peak RSS (GNU time's: the largest process of the program's tree), each with the
min-max range and each allocator's median divided by the reference's (threadheap, or --ref; above 1: the
reference is faster or leaner), and the geometric mean of those ratios.

--check runs each program plain and with threadheap preloaded and fails on a different stdout, a non-zero
exit status, a "threadheap:" message on stderr, or a preloaded run in which threadheap's exit statistics
(THREADHEAP_STATS_FILE) never appeared, which would mean the preload did not take. A program that is not
installed fails the check when the environment has CI set (.ci/run sets it); elsewhere it is reported as
SKIPPED and the exit status is 77, which CTest shows as a skipped test.
"""

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
from threadheap.bench import BenchError, parse_allocators  # noqa: E402 (the driver's NAME=PATH grammar)
PEER_DIR = "/usr/lib/x86_64-linux-gnu"
# name -> library to preload (None: glibc, no preload); threadheap's comes from --lib
PEERS = {
    "mimalloc": f"{PEER_DIR}/libmimalloc.so.2",
    "jemalloc": f"{PEER_DIR}/libjemalloc.so.2",
    "tcmalloc": f"{PEER_DIR}/libtcmalloc_minimal.so.4",
}
ALLOCATORS = ["glibc", "threadheap", "mimalloc", "jemalloc", "tcmalloc"]
SKIP = 77  # CTest's SKIP_RETURN_CODE for this test


@dataclass
class Program:
    """One real program. setup(inputs, scale) writes its input files and returns the argv; the command runs
    in a fresh empty folder with env added to a clean environment."""
    name: str
    package: str          # the Debian package that has it
    needs: tuple          # executables that must be on PATH
    setup: object
    env: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------- the programs

PYTHON_THREADS = r"""
import hashlib, sys, threading
n = int(sys.argv[1])
out = [None] * 8
def work(i):
    d, parts = {}, []
    for k in range(n):
        d[("%d-%d" % (i, k)) * (k % 5 + 1)] = [k] * (k % 9)
        if k % 3 == 0:
            parts.append(repr(d.popitem()))
    out[i] = hashlib.sha256("".join(parts).encode()).hexdigest()
ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
for t in ts: t.start()
for t in ts: t.join()
print("\n".join(out))
"""


def setup_python(inputs, scale):
    # Debian's interpreter itself: a python3 on PATH may be a shim (pyenv) that runs shell scripts first,
    # and those would be timed too.
    exe = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"
    return [exe, "-c", PYTHON_THREADS, str(40000 * scale)]


def setup_sqlite(inputs, scale):
    rows = 100000 * scale
    sql = inputs / "sqlite.sql"
    sql.write_text(f"""
PRAGMA journal_mode = OFF;
PRAGMA synchronous = OFF;
CREATE TABLE t(id INTEGER PRIMARY KEY, a INTEGER, b TEXT);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {rows})
INSERT INTO t SELECT x, (x * 7919) % 1000, printf('%08x-%s', (x * 2654435761) % 4294967296, hex(x)) FROM c;
CREATE INDEX t_b ON t(b);
SELECT count(*), sum(a), count(DISTINCT b) FROM t;
SELECT a, count(*), sum(length(b)) FROM t GROUP BY a ORDER BY 3 DESC, 1 LIMIT 5;
SELECT b FROM t ORDER BY b DESC LIMIT 3;
SELECT group_concat(id) FROM (SELECT id FROM t WHERE b LIKE '00%' ORDER BY id LIMIT 20);
UPDATE t SET b = b || '-x' WHERE a < 100;
SELECT sum(length(b)) FROM t;
""")
    return ["sh", "-c", 'exec sqlite3 db.sqlite < "$0"', str(sql)]


PERL_SCRIPT = r"""
my $n = shift;
my %h;
for my $i (1 .. $n) { $h{"key$i" x (1 + $i % 4)} = [($i) x ($i % 7)]; }
my @k = sort { scalar(@{$h{$a}}) <=> scalar(@{$h{$b}}) or $a cmp $b } keys %h;
my $s = join(",", @k[0 .. 9]);
my $sum = 0;
for my $k (@k) { my $t = join(":", @{$h{$k}}); $t =~ s/(\d)(\d)/$2$1/g; $sum += unpack("%32C*", $t); }
delete $h{$_} for @k[0 .. $#k / 2];
print scalar(keys %h), " $sum\n$s\n";
"""


def setup_perl(inputs, scale):
    return ["perl", "-e", PERL_SCRIPT, str(100000 * scale)]


def setup_gxx(inputs, scale):
    """A translation unit that makes g++ instantiate a few hundred class and function templates."""
    n = 10 * scale
    parts = ["#include <map>", "#include <string>", "#include <vector>", "#include <variant>",
             "#include <tuple>", "#include <functional>", "#include <algorithm>", "#include <memory>",
             "#include <unordered_map>", "#include <sstream>", "",
             "template <int N> struct Fib { static constexpr long v = Fib<N - 1>::v + Fib<N - 2>::v; };",
             "template <> struct Fib<1> { static constexpr long v = 1; };",
             "template <> struct Fib<0> { static constexpr long v = 0; };",
             "template <int N, typename T> struct Node {",
             "  std::map<std::string, std::vector<std::tuple<T, int, std::string>>> m;",
             "  std::unordered_map<long, std::variant<T, std::string, std::vector<T>>> u;",
             "  std::function<T(T)> f = [](T x) { return x + T(N); };",
             "  long run() {",
             "    std::ostringstream os;",
             "    for (int i = 0; i < N; i++) { m[std::to_string(i)].emplace_back(T(i), i, os.str()); u[i] = T(i); }",
             "    long s = Fib<N % 40 + 2>::v;",
             "    for (auto &kv : m) { std::sort(kv.second.begin(), kv.second.end()); s += (long)kv.second.size(); }",
             "    for (auto &kv : u) s += std::visit([](auto &&v) { return (long)sizeof(v); }, kv.second);",
             "    return s + (long)f(T(1));",
             "  }",
             "};", ""]
    types = ["int", "long", "double", "float", "short", "unsigned", "char", "long long"]
    calls = []
    for i in range(n):
        parts.append(f"long use{i}() {{ auto p = std::make_unique<Node<{i + 3}, {types[i % len(types)]}>>(); "
                     f"return p->run(); }}")
        calls.append(f"use{i}()")
    parts.append("long all() { return " + " + ".join(calls) + "; }")
    src = inputs / "templates.cpp"
    src.write_text("\n".join(parts) + "\n")
    return ["g++", "-std=c++17", "-O1", "-S", "-frandom-seed=1", "-o", "-", str(src)]


def write_lines(path, count, seed):
    """count pseudo-random text lines, made here (not by the allocator under test)."""
    x = seed
    with open(path, "w") as f:
        chunk = []
        for i in range(count):
            x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            chunk.append(f"{x >> 40:08x} {i} {'abcdefghij'[x % 10] * (x >> 60)}\n")
            if len(chunk) == 10000:
                f.write("".join(chunk))
                chunk = []
        f.write("".join(chunk))


def setup_sort(inputs, scale):
    path = inputs / "sort.txt"
    if not path.exists():
        write_lines(path, 300000 * scale, 11)
    return ["sort", "--parallel=2", "-S", "64M", "-k1,1", "-k2,2n", str(path)]


def setup_xz(inputs, scale):
    path = inputs / "xz.txt"
    if not path.exists():
        write_lines(path, 150000 * scale, 5)
    return ["xz", "-T2", "-3", "--block-size=1MiB", "-c", str(path)]


GIT_SCRIPT = r"""
set -e
cp -r "$1/." .
git init -q
git add -A
git commit -q -m one
for f in $(ls | head -300); do echo "change $f" >> "$f"; done
git mv f1.txt moved.txt
git commit -q -a -m two
git rev-parse HEAD HEAD~1
git diff --stat HEAD~1 | tail -1
git log --format='%H %s' | wc -l
git grep -c change | wc -l
git gc -q
git count-objects -v | grep -E '^(count|in-pack|packs):'
git fsck --no-progress --no-dangling && echo fsck ok
"""


def setup_git(inputs, scale):
    src = inputs / "git-tree"
    if not src.exists():
        src.mkdir()
        for i in range(600 * scale):
            (src / f"f{i}.txt").write_text("".join(f"line {j} of file {i}\n" for j in range(i % 50 + 1)))
    return ["bash", "-c", GIT_SCRIPT, "bash", str(src)]


GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_AUTHOR_DATE": "@1700000000 +0000",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org",
           "GIT_COMMITTER_DATE": "@1700000000 +0000", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_PAGER": "cat"}

PROGRAMS = [
    Program("python3 threads", "python3", ("python3",), setup_python, {"PYTHONMALLOC": "malloc"}),
    Program("sqlite3", "sqlite3", ("sqlite3", "sh"), setup_sqlite),
    Program("perl", "perl", ("perl",), setup_perl),
    Program("g++ templates", "g++", ("g++",), setup_gxx),
    Program("sort --parallel", "coreutils", ("sort",), setup_sort),
    Program("xz -T2", "xz-utils", ("xz",), setup_xz),
    Program("git", "git", ("git", "bash", "cp"), setup_git, GIT_ENV),
]


# ------------------------------------------------------------------------------------------------ running


def base_env(extra):
    """A clean environment: no inherited preload or threadheap option, a fixed locale."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("THREADHEAP_") and k != "LD_PRELOAD"}
    env.update({"LC_ALL": "C", "LANG": "C", "TZ": "UTC"})
    env.update(extra)
    return env


# GNU time, in the Debian package of that name: the peak RSS of a program started from this script has to be
# taken by a small process that forks it. A process forked from Python keeps Python's peak as its own across
# exec (Linux carries the old mm's high-water mark into ru_maxrss), and this script's peak (about 39 MiB)
# would hide every smaller program's.
GNU_TIME = "/usr/bin/time"


def run_once(prog, argv, lib, workdir, extra_env=None, peak=False):
    """(seconds, exit status, sha256 of stdout, stderr text, peak RSS in KiB or None) of one run in a fresh
    folder under workdir. With peak, the program runs under GNU time, whose %M is wait4's: the largest of the
    program and the descendants it waited for."""
    cwd = Path(tempfile.mkdtemp(dir=workdir))
    env = base_env(prog.env)
    env["HOME"] = str(cwd)
    if lib:
        env["LD_PRELOAD"] = lib
    env.update(extra_env or {})
    out_path = cwd.parent / (cwd.name + ".out")
    peak_path = cwd.parent / (cwd.name + ".peak")
    if peak:
        # GNU time gets the preload too (it inherits the environment); it only forks, waits and writes a line.
        argv = [GNU_TIME, "-f", "%M", "-o", str(peak_path), *argv]
    with open(out_path, "wb") as out:
        start = time.perf_counter()
        p = subprocess.run(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        seconds = time.perf_counter() - start
    digest = hashlib.sha256(out_path.read_bytes()).hexdigest()
    out_path.unlink()
    peak_kib = None
    if peak:
        lines = peak_path.read_text().split() if peak_path.exists() else []
        peak_kib = int(lines[-1]) if lines and lines[-1].isdigit() else None
        peak_path.unlink(missing_ok=True)
    shutil.rmtree(cwd, ignore_errors=True)
    return seconds, p.returncode, digest, p.stderr.decode(errors="replace"), peak_kib


def missing_tools(prog):
    return [c for c in prog.needs if shutil.which(c) is None]


def default_lib():
    lib = os.environ.get("TH_LIB") or str(REPO / "build" / "libthreadheap.so")
    return lib


def check(programs, lib, scale, workdir):
    """glibc vs threadheap: same stdout, exit 0, no threadheap message, threadheap really loaded."""
    failed, skipped = [], []
    in_ci = bool(os.environ.get("CI"))
    for prog in programs:
        missing = missing_tools(prog)
        if missing:
            what = f"{prog.name}: {', '.join(missing)} not installed (Debian package {prog.package})"
            if in_ci:
                print(f"FAIL {what}")
                failed.append(prog.name)
            else:
                print(f"SKIPPED {what}")
                skipped.append(prog.name)
            continue
        inputs = Path(tempfile.mkdtemp(dir=workdir))
        argv = prog.setup(inputs, scale)
        t1, rc1, out1, err1, _ = run_once(prog, argv, None, workdir)
        stats = inputs / "threadheap-stats"
        # Every process of the run writes its counters at exit (the last one wins): proof of the preload.
        t2, rc2, out2, err2, _ = run_once(prog, argv, lib, workdir,
                                       {"THREADHEAP_SHOW_STATS": "1", "THREADHEAP_STATS_FILE": str(stats)})
        problems = []
        if rc1 != 0:
            problems.append(f"exit {rc1} without threadheap: {err1.strip()[:300]}")
        if rc2 != rc1:
            problems.append(f"exit {rc2} with threadheap, {rc1} without: {err2.strip()[:300]}")
        if out1 != out2:
            problems.append("stdout differs from glibc's")
        if "threadheap:" in err2:
            problems.append("threadheap message: " + err2[err2.index("threadheap:"):][:300])
        if not stats.exists() or "threadheap: committed_peak" not in stats.read_text():
            problems.append("threadheap was not loaded (no exit statistics)")
        if problems:
            print(f"FAIL {prog.name}: " + "; ".join(problems))
            failed.append(prog.name)
        else:
            print(f"ok   {prog.name}: same output and exit status ({t1:.2f} s glibc, {t2:.2f} s threadheap)")
        shutil.rmtree(inputs, ignore_errors=True)
    print(f"{len(programs) - len(failed) - len(skipped)} passed, {len(failed)} failed, {len(skipped)} skipped")
    if failed:
        return 1
    return SKIP if skipped else 0


def fmt_cell(values, ref, digits):
    med = statistics.median(values)
    cell = f"{med:.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"
    if ref is not None:
        cell += f" ×{med / ref:.2f}"
    return cell


def print_table(title, progs, usable, values, ref_name, digits, bad):
    """One markdown table: a row per program, a cell per allocator (median, min-max, × the reference's
    median), and the geometric mean of each allocator's ratios to the reference."""
    print(f"{title}\n")
    print("| program | " + " | ".join(usable) + " |")
    print("|---|" + "---:|" * len(usable))
    ratios = {a: [] for a in usable}
    for p in progs:
        ref_values = values.get((p.name, ref_name))
        ref = statistics.median(ref_values) if ref_values else None
        cells = []
        for a in usable:
            v = values[(p.name, a)]
            cells.append(fmt_cell(v, None if a == ref_name else ref, digits) +
                         (" (wrong output)" if (p.name, a) in bad else ""))
            if ref and (p.name, a) not in bad:
                ratios[a].append(statistics.median(v) / ref)
        print(f"| {p.name} | " + " | ".join(cells) + " |")
    means = [f"×{statistics.geometric_mean(ratios[a]):.3f}" if ratios[a] else "-" for a in usable]
    print(f"| geometric mean | " + " | ".join(means) + " |\n")


def bench(programs, allocators, libs, ref_name, scale, reps, workdir):
    usable = [a for a in allocators if libs[a] is None or os.path.isfile(libs[a])]
    for a in allocators:
        if a not in usable:
            print(f"note: {a} skipped, {libs[a]} not found", file=sys.stderr)
    if not os.access(GNU_TIME, os.X_OK):
        print(f"programs.py: {GNU_TIME} not found, which measures each run's peak RSS (apt-get install time)",
              file=sys.stderr)
        return 2
    if ref_name not in usable:
        print(f"programs.py: the reference {ref_name} is not among the allocators run", file=sys.stderr)
        return 2
    progs = []
    for prog in programs:
        missing = missing_tools(prog)
        if missing:
            print(f"note: {prog.name} skipped, {', '.join(missing)} not installed (package {prog.package})",
                  file=sys.stderr)
        else:
            progs.append(prog)
    inputs = Path(tempfile.mkdtemp(dir=workdir))
    argvs = {p.name: p.setup(inputs, scale) for p in progs}
    times = {(p.name, a): [] for p in progs for a in usable}
    peaks = {(p.name, a): [] for p in progs for a in usable}
    reference = {}
    bad = set()
    for rep in range(reps):
        for p in progs:
            order = usable[rep % len(usable):] + usable[:rep % len(usable)]
            for a in order:
                seconds, rc, digest, err, peak_kib = run_once(p, argvs[p.name], libs[a], workdir, peak=True)
                if peak_kib is None:
                    bad.add((p.name, a))
                    print(f"warning: {p.name} with {a}: no peak RSS from {GNU_TIME}", file=sys.stderr)
                    peak_kib = 0
                ref = reference.setdefault(p.name, digest)
                if rc != 0 or digest != ref:
                    bad.add((p.name, a))
                    print(f"warning: {p.name} with {a}: exit {rc}, output "
                          f"{'same' if digest == ref else 'DIFFERENT'}: {err.strip()[:200]}", file=sys.stderr)
                times[(p.name, a)].append(seconds)
                peaks[(p.name, a)].append(peak_kib / 1024)
                print(f"rep {rep + 1}/{reps} {p.name:<16} {a:<10} {seconds:7.3f} s {peak_kib / 1024:8.1f} MiB",
                      file=sys.stderr)
    shutil.rmtree(inputs, ignore_errors=True)

    what = f"median of {reps} (min–max); ×: the allocator's median / {ref_name}'s"
    print(f"Scale {scale}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}. Libraries: " +
          ", ".join(f"{a} {libs[a] or 'none (the system malloc)'}" for a in usable) + ".\n")
    print_table(f"Wall-clock seconds, {what}.", progs, usable, times, ref_name, 3, bad)
    print_table(f"Peak RSS in MiB, {what}.", progs, usable, peaks, ref_name, 1, bad)
    return 1 if bad else 0


def allocator_libs(text, lib):
    """--allocators: the built-in names and NAME=PATH items (threadheap bench's grammar), each with the
    library to preload (None: glibc). Raises BenchError."""
    names, external = parse_allocators(text, known=ALLOCATORS)
    builtin = {"glibc": None, "threadheap": lib, **PEERS}
    return names, {name: str(external[name].resolve()) if name in external else builtin[name] for name in names}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare glibc and threadheap outputs (the test)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions (default 5)")
    ap.add_argument("--scale", type=int, default=None,
                    help="input size factor (default 2 for timing, 1 for --check)")
    ap.add_argument("--lib", default=default_lib(), help="libthreadheap.so (default $TH_LIB or build/)")
    ap.add_argument("--programs", help="comma-separated subset, by the start of their names")
    ap.add_argument("--allocators", default=",".join(ALLOCATORS),
                    help="comma-separated: built-in names, or NAME=PATH to preload another library")
    ap.add_argument("--ref", default="threadheap", help="the allocator the ratios divide by (default threadheap)")
    args = ap.parse_args(argv)
    if not os.path.isfile(args.lib):
        print(f"programs.py: library not found: {args.lib}", file=sys.stderr)
        return 2
    lib = os.path.abspath(args.lib)
    programs = PROGRAMS
    if args.programs:
        wanted = [w.strip() for w in args.programs.split(",")]
        programs = [p for p in PROGRAMS if any(p.name.startswith(w) for w in wanted)]
    try:
        allocators, libs = allocator_libs(args.allocators, lib)
    except BenchError as e:
        print(f"programs.py: {e}", file=sys.stderr)
        return 2
    if not programs or args.reps < 1:
        print(f"programs.py: nothing to run ({len(programs)} programs, {args.reps} repetitions)", file=sys.stderr)
        return 2
    workdir = tempfile.mkdtemp(prefix="threadheap-programs-")
    try:
        if args.check:
            return check(programs, lib, args.scale or 1, workdir)
        return bench(programs, allocators, libs, args.ref, args.scale or 2, args.reps, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
