#!/usr/bin/env python3
"""Heap profiles against the truth: test_profile.py BUILD_BIN_DIR LIBTHREADHEAP.

Runs tests/prog_profile (linked with threadheap), prog_profile_cpp (preloaded) and reads every profile
written with `go tool pprof` (Debian's golang-go). Accuracy: at THREADHEAP_PROFILE_RATE=64K, the live bytes
of three call sites holding 60/30/10% of 256 MiB are within 5 percentage points of the truth, a site whose
blocks were all freed is absent from inuse_space and present in alloc_space; with one thread, and with
8 allocating threads whose freed site's blocks two other threads free.

When profiles are written: every THREADHEAP_PROFILE_INTERVAL (PATH.1, .2, .3, in order, each holding what
the program held when it appeared), on SIGUSR2 (raised, and sent by the test) and not when the program has
SIGUSR2 of its own, th_profile_dump from a thread while four others allocate, and its errors. Estimates are
checked within 5 standard deviations of a sampled estimate, sqrt(rate x truth)."""
import datetime
import errno
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

BIN, LIB = sys.argv[1], sys.argv[2]
GO = "/usr/bin/go" if os.path.exists("/usr/bin/go") else shutil.which("go")
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


RATE = 64 << 10


def run(args, env_extra, **kw):
    env = dict(os.environ, THREADHEAP_PROFILE_RATE="64K")
    env.update(env_extra)
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=240, **kw)


def pprof_top(binary, profile, sample_index):
    """{function: flat bytes or objects} of `go tool pprof -top`; None if pprof cannot read the file."""
    r = subprocess.run([GO, "tool", "pprof", "-top", "-nodecount=200", "-unit=B", "-sample_index=" + sample_index,
                        binary, profile], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        print(r.stderr)
        return None
    flat = {}
    for line in r.stdout.splitlines():
        m = re.match(r"\s*(\d+)B?\s+[\d.]+%\s+[\d.]+%\s+\d+B?\s+[\d.]+%\s+(\S+)", line)
        if m:
            flat[m.group(2)] = flat.get(m.group(2), 0) + int(m.group(1))
    return flat


def accuracy(tmp, threads):
    prog = os.path.join(BIN, "prog_profile")
    dump = os.path.join(tmp, f"acc{threads}.pb.gz")
    r = run([prog, "accuracy", str(threads)], {"THREADHEAP_PROFILE": dump + ".exit", "PROFILE_DUMP": dump})
    check(r.returncode == 0, f"accuracy {threads} threads: the program runs (rc {r.returncode}) {r.stderr[-300:]}")
    truth = {}
    for line in r.stdout.splitlines():
        kind, site, n = line.split()
        truth[(kind, site)] = int(n)
    inuse = pprof_top(prog, dump, "inuse_space")
    alloc = pprof_top(prog, dump, "alloc_space")
    check(inuse is not None and alloc is not None, f"accuracy {threads}: go tool pprof reads the dump")
    check(pprof_top(prog, dump + ".exit", "inuse_space") is not None, f"accuracy {threads}: and the profile at exit")
    if inuse is None or alloc is None:
        return
    live_truth = sum(n for (k, _), n in truth.items() if k == "truth")
    est_total = sum(inuse.get(s, 0) for s in ("site_sixty", "site_thirty", "site_ten"))
    for site in ("site_sixty", "site_thirty", "site_ten"):
        true_pct = 100.0 * truth[("truth", site)] / live_truth
        est_pct = 100.0 * inuse.get(site, 0) / est_total if est_total else 0
        check(abs(est_pct - true_pct) <= 5.0,
              f"accuracy {threads}: {site} inuse {est_pct:.1f}% against {true_pct:.1f}% (within 5 points)")
    check(abs(est_total - live_truth) <= 0.1 * live_truth,
          f"accuracy {threads}: live estimate {est_total / 2**20:.1f} MiB against {live_truth / 2**20:.1f} MiB (within 10%)")
    check(inuse.get("site_freed", 0) == 0, f"accuracy {threads}: site_freed absent from inuse_space")
    freed_true = truth[("allocated", "site_freed")]
    freed_est = alloc.get("site_freed", 0)
    check(abs(freed_est - freed_true) <= 0.1 * freed_true,
          f"accuracy {threads}: site_freed alloc_space {freed_est / 2**20:.1f} MiB against {freed_true / 2**20:.1f} MiB")


def patterns(tmp):
    """Pairs (each block freed at once) and batches (200 allocated, then freed), alternating: the sampler's
    split of a page's budget between its list and its free count adapts to each, and alloc_space stays true."""
    prog = os.path.join(BIN, "prog_profile")
    dump = os.path.join(tmp, "patterns.pb.gz")
    r = run([prog, "patterns"], {"THREADHEAP_PROFILE": dump + ".exit",
                                 "PROFILE_DUMP": dump})
    check(r.returncode == 0, "patterns: runs, blocks intact" + tail(r.returncode, r.stdout, r.stderr))
    truth = {site: int(n) for _, site, n in (line.split() for line in r.stdout.splitlines())}
    alloc = pprof_top(prog, dump, "alloc_space") or {}
    for site in ("site_pairs", "site_batch"):
        est = alloc.get(site, 0)
        check(site in truth and close_to(est, truth[site]),
              f"patterns: {site} alloc_space {est / 2**20:.1f} MiB against {truth.get(site, 0) / 2**20:.1f} MiB")


def many_threads(tmp):
    """100 threads sample at once: past the 64 that get libunwind's fast path, the others step through their
    frames; every sample still names the site, and alloc_space is true."""
    prog = os.path.join(BIN, "prog_profile")
    dump = os.path.join(tmp, "many.pb.gz")
    r = run([prog, "many_threads"], {"THREADHEAP_PROFILE": dump + ".exit", "PROFILE_DUMP": dump})
    check(r.returncode == 0, "many threads: runs" + tail(r.returncode, r.stdout, r.stderr))
    truth = {site: int(n) for _, site, n in (line.split() for line in r.stdout.splitlines())}
    alloc = pprof_top(prog, dump, "alloc_space") or {}
    est, true = alloc.get("site_many", 0), truth.get("site_many", 0)
    check(true > 0 and close_to(est, true),
          f"many threads: site_many alloc_space {est / 2**20:.1f} MiB against {true / 2**20:.1f} MiB")
    others = sum(v for k, v in alloc.items() if k != "site_many")
    check(others <= 0.01 * est, f"many threads: {others / 2**20:.1f} MiB sampled elsewhere (stacks of both unwinders)")


def aligned(tmp):
    """Aligned blocks that were sampled (an explicit heap's, and ones of about 1 MiB from posix_memalign) are
    handed out inside a huge block: their usable size, realloc and free take them as the block they are."""
    prog = os.path.join(BIN, "prog_profile")
    dump = os.path.join(tmp, "aligned.pb.gz")
    r = run([prog, "aligned"], {"THREADHEAP_PROFILE": dump + ".exit", "PROFILE_DUMP": dump})
    check(r.returncode == 0, "aligned: usable size, realloc and free of sampled aligned blocks" +
          tail(r.returncode, r.stdout, r.stderr))
    truth = {site: int(n) for _, site, n in (line.split() for line in r.stdout.splitlines())}
    alloc = pprof_top(prog, dump, "alloc_space") or {}
    inuse = pprof_top(prog, dump, "inuse_space") or {}
    est, true = alloc.get("site_aligned", 0), truth.get("site_aligned", 0)
    # Each sampled block is counted at its request plus alignment room, up to 4 KiB more than asked.
    check(true > 0 and close_to(est, true, slack=4000 * 4096),
          f"aligned: site_aligned alloc_space {est / 2**20:.1f} MiB against {true / 2**20:.1f} MiB")
    check(inuse.get("site_aligned", 0) == 0, f"aligned: nothing left in inuse_space ({inuse.get('site_aligned', 0)} B)")
    # Blocks of 2-6 KiB aligned to 1-4 KiB, each freed at once: the sampler sees every one of them.
    est, true = alloc.get("site_aligned_pairs", 0), truth.get("site_aligned_pairs", 0)
    check(true > 0 and close_to(est, true),
          f"aligned: site_aligned_pairs alloc_space {est / 2**20:.1f} MiB against {true / 2**20:.1f} MiB")


def tiny(tmp):
    """Every block sampled (rate 1 byte): blocks of 0-15 bytes, from malloc and from an explicit heap, each keep
    16 usable bytes of their own (a sampled malloc(0) once ended where its sample's header did, at the next
    block)."""
    prog = os.path.join(BIN, "prog_profile")
    dump = os.path.join(tmp, "tiny.pb.gz")
    r = run([prog, "tiny"], {"THREADHEAP_PROFILE": dump + ".exit", "PROFILE_DUMP": dump,
                             "THREADHEAP_PROFILE_RATE": "1"})
    check(r.returncode == 0, "tiny: sampled blocks of 0-15 bytes hold 16 bytes each" + tail(r.returncode, r.stdout, r.stderr))
    objects = (pprof_top(prog, dump, "alloc_objects") or {}).get("site_tiny", 0)
    check(objects == 3000, f"tiny: every one of the 3,000 blocks sampled ({objects})")


def many_stacks(tmp):
    """262,144 distinct stacks, more than the first stack table holds: the later tables take them, and none is
    lost to the overflow stack (every block is sampled at weight 1, so alloc_space is exact)."""
    prog = os.path.join(BIN, "prog_profile")
    dump = os.path.join(tmp, "stacks.pb.gz")
    r = run([prog, "many_stacks"], {"THREADHEAP_PROFILE": dump + ".exit", "PROFILE_DUMP": dump})
    check(r.returncode == 0, "many stacks: runs" + tail(r.returncode, r.stdout, r.stderr))
    truth = {site: int(n) for _, site, n in (line.split() for line in r.stdout.splitlines())}
    est, true = (pprof_top(prog, dump, "alloc_space") or {}).get("site_deep", 0), truth.get("site_deep", 0)
    check(true > 0 and abs(est - true) <= true // 1000,
          f"many stacks: site_deep alloc_space {est / 2**30:.2f} GiB against {true / 2**30:.2f} GiB")


def explicit_heaps(tmp):
    """Blocks of explicit heaps are sampled: a serialized heap fed by 4 threads, a no-serialize heap (small,
    aligned and 4 MiB blocks), blocks freed one by one, and a capped heap destroyed whole, whose blocks leave
    the live set with it."""
    prog = os.path.join(BIN, "prog_profile")
    dump = os.path.join(tmp, "explicit.pb.gz")
    r = run([prog, "explicit"], {"THREADHEAP_PROFILE": dump + ".exit", "PROFILE_DUMP": dump})
    check(r.returncode == 0, "explicit heaps: runs, blocks intact" + tail(r.returncode, r.stdout, r.stderr))
    truth = {(kind, site): int(n) for kind, site, n in (line.split() for line in r.stdout.splitlines())}
    inuse = pprof_top(prog, dump, "inuse_space") or {}
    alloc = pprof_top(prog, dump, "alloc_space") or {}
    fresh = pprof_top(prog, dump, "fresh_space") or {}
    for site in ("site_shared", "site_own"):
        est, true = inuse.get(site, 0), truth.get(("truth", site), 0)
        check(true > 0 and close_to(est, true),
              f"explicit heaps: {site} inuse_space {est / 2**20:.1f} MiB against {true / 2**20:.1f} MiB")
    for site in ("site_heap_freed", "site_destroyed"):
        est, true = alloc.get(site, 0), truth.get(("allocated", site), 0)
        check(true > 0 and close_to(est, true),
              f"explicit heaps: {site} alloc_space {est / 2**20:.1f} MiB against {true / 2**20:.1f} MiB")
        check(inuse.get(site, 0) == 0, f"explicit heaps: {site} absent from inuse_space ({inuse.get(site, 0)} B)")
    check(fresh.get("site_destroyed", 0) > 8 << 20, "explicit heaps: fresh_space names the first heap's site")


def leaks(tmp):
    # prog_profile_static links the static library: threadheap's frames must be left out there too.
    for prog, leaky, tidy, preload in (("prog_profile", "leaky", "tidy", False),
                                       ("prog_profile_static", "leaky", "tidy", False),
                                       ("prog_profile_cpp", "leaky_new", "tidy_new", True)):
        if not os.path.exists(os.path.join(BIN, prog)):
            continue
        env = {"THREADHEAP_LEAKS": "1"}
        if preload:
            env["LD_PRELOAD"] = LIB
        r = run([os.path.join(BIN, prog)] + (["leak"] if not preload else []), env)
        report = r.stderr
        check(r.returncode == 0, f"leaks {prog}: runs")
        named = [re.sub(r"\(.*", "", n) for n in re.findall(r"#\d+ 0x[0-9a-f]+ ([A-Za-z_][\w:]*(?:\(\))?)\+", report)]
        check(leaky in named, f"leaks {prog}: the report names {leaky}")
        check(tidy not in named, f"leaks {prog}: and not {tidy}")
        # The leaking function's frame carries its file:line (the programs are built with -g; libdw reads it).
        src = prog.replace("_static", "") + (".cpp" if preload else ".c")
        check(re.search(rf"#\d+ 0x[0-9a-f]+ {re.escape(leaky)}(?:\(\))?\+0x[0-9a-f]+ \S*{src}:\d+ ", report),
              f"leaks {prog}: {leaky}'s frame names {src}:line")
        innermost = re.search(r"#0 0x[0-9a-f]+ ([\w:]+)", report)
        check(innermost and innermost.group(1) == leaky,
              f"leaks {prog}: the innermost frame is {leaky}, not threadheap's ({innermost and innermost.group(1)})")
        first = re.search(r"leak of ~([\d.]+) (MiB|KiB)", report)
        mib = float(first.group(1)) / (1 if first.group(2) == "MiB" else 1024) if first else 0
        check(20 <= mib <= 28, f"leaks {prog}: largest leak ~{mib:.1f} MiB (24 MiB kept)")


def others(tmp):
    prog = os.path.join(BIN, "prog_profile")
    path = os.path.join(tmp, "fork.pb.gz")
    r = run([prog, "fork"], {"THREADHEAP_PROFILE": path})
    m = re.search(r"child (\d+)", r.stdout)
    check(r.returncode == 0 and m is not None, "fork: parent and child run")
    if m:
        child = pprof_top(prog, f"{path}.{m.group(1)}", "inuse_space")
        parent = pprof_top(prog, path, "inuse_space")
        check(child is not None and child.get("child_site", 0) > 8 << 20, "fork: the child's own profile holds child_site")
        check(parent is not None and parent.get("child_site", 0) == 0, "fork: the parent's does not")
    dump = os.path.join(tmp, "dl.pb.gz")
    r = run([prog, "dlopen", os.path.join(BIN, "libprog_profile_dl.so")],
            {"THREADHEAP_PROFILE": dump + ".exit", "PROFILE_DUMP": dump})
    top = pprof_top(prog, dump, "inuse_space")
    check(r.returncode == 0 and top is not None and top.get("dl_alloc", 0) > 8 << 20,
          "dlopen: a dlopen'ed library's allocations are in the profile")
    dump = os.path.join(tmp, "te.pb.gz")
    r = run([prog, "thread_exit"], {"THREADHEAP_PROFILE": dump + ".exit", "PROFILE_DUMP": dump})
    top = pprof_top(prog, dump, "inuse_space")
    check(r.returncode == 0 and top is not None and top.get("exiting_site", 0) > 8 << 20,
          "thread exit: an exited thread's live blocks stay in the profile")
    fresh = pprof_top(prog, dump, "fresh_space")
    check(fresh is not None and fresh.get("exiting_site", 0) > 8 << 20, "thread exit: fresh_space names the site")


def tail(rc, out, err):
    """What a failed run said, for its check's line; nothing when it exited 0."""
    return "" if rc == 0 else f" (rc {rc}) {out[-300:]}{err[-300:]}"


def close_to(estimate, truth, slack=0):
    """Is a sampled estimate of `truth` bytes within 5 of its standard deviations, sqrt(rate x truth) for blocks
    much smaller than the rate (each sampled block stands for about `rate` bytes)?"""
    return abs(estimate - truth) <= 5 * math.sqrt(RATE * max(truth, 0)) + slack


def pprof_time(binary, profile):
    """The profile's time_nanos, in seconds, from `go tool pprof -raw`; None if unreadable."""
    r = subprocess.run([GO, "tool", "pprof", "-raw", binary, profile], capture_output=True, text=True, timeout=120)
    m = re.search(r"^Time: (\S+ \S+?)(?:\.(\d+))? ([+-]\d{4}) ", r.stdout, re.M)
    if r.returncode != 0 or m is None:
        return None
    t = datetime.datetime.strptime(m.group(1) + " " + m.group(3), "%Y-%m-%d %H:%M:%S %z").timestamp()
    return t + (int(m.group(2)) / 10 ** len(m.group(2)) if m.group(2) else 0)


def numbered(folder, base):
    """The n of every file BASE.<n> in folder, sorted; other files that start with BASE. are reported as -1."""
    ns = []
    for f in os.listdir(folder):
        if f.startswith(base + "."):
            suffix = f[len(base) + 1:]
            ns.append(int(suffix) if suffix.isdigit() else -1)
    return sorted(ns)


def interval(tmp):
    """THREADHEAP_PROFILE_INTERVAL=1: the program holds 16 MiB more at site_grow after each PATH.<n> appears."""
    prog = os.path.join(BIN, "prog_profile")
    path = os.path.join(tmp, "iv.pb.gz")
    start = time.monotonic()
    r = run([prog, "interval"], {"THREADHEAP_PROFILE": path, "THREADHEAP_PROFILE_INTERVAL": "1"})
    took = time.monotonic() - start
    check(r.returncode == 0, f"interval: runs ({took:.1f} s)" + tail(r.returncode, r.stdout, r.stderr))
    truth = {int(n): int(b) for n, b in re.findall(r"^file (\d+) live (\d+)$", r.stdout, re.M)}
    ns = numbered(tmp, "iv.pb.gz")
    check(ns[:3] == [1, 2, 3] and ns == list(range(1, len(ns) + 1)),
          f"interval: the files are PATH.1, PATH.2, PATH.3, numbered from 1 without a gap (PATH.<n>: {ns})")
    if r.returncode != 0 or sorted(truth) != [1, 2, 3]:
        return
    est, times = {}, {}
    for n in (1, 2, 3):
        top = pprof_top(prog, f"{path}.{n}", "inuse_space")
        times[n] = pprof_time(prog, f"{path}.{n}")
        check(top is not None and times[n] is not None, f"interval: go tool pprof reads PATH.{n}")
        est[n] = (top or {}).get("site_grow", 0)
        check(close_to(est[n], truth[n]),
              f"interval: PATH.{n} site_grow inuse {est[n] / 2**20:.1f} MiB against {truth[n] / 2**20:.1f} MiB")
    for n in (2, 3):
        grew, true_grew = est[n] - est[n - 1], truth[n] - truth[n - 1]
        # The program grows 16 MiB right after seeing PATH.<n-1>, in milliseconds: less means it stalled > 1 s.
        check(true_grew >= 15 << 20, f"interval: the program held 16 MiB more at PATH.{n} than at PATH.{n - 1} "
              f"({true_grew / 2**20:.1f} MiB)")
        check(grew > 0 and close_to(grew, true_grew),
              f"interval: site_grow grew {grew / 2**20:+.1f} MiB from PATH.{n - 1} to PATH.{n} "
              f"(truth {true_grew / 2**20:+.1f} MiB)")
        gap = (times[n] or 0) - (times[n - 1] or 0)
        # Written at the first slow path past the deadline, 1 s after the previous one began.
        check(gap >= 0.5, f"interval: PATH.{n} written {gap:.2f} s after PATH.{n - 1} (interval 1 s)")
    final = int(re.search(r"^exit live (\d+)$", r.stdout, re.M).group(1))
    top = pprof_top(prog, path, "inuse_space")
    check(top is not None and close_to(top.get("site_grow", 0), final),
          f"interval: the profile at exit holds site_grow's {final / 2**20:.1f} MiB")


def signals(tmp):
    """THREADHEAP_PROFILE_SIGNAL=1: PATH.1 on a SIGUSR2 the program raises, PATH.2 on one the test sends; and a
    program with SIGUSR2 of its own (its handler from before threadheap's constructor or from main, or SIG_IGN
    inherited) keeps it, and no profile is written."""
    prog = os.path.join(BIN, "prog_profile")
    path = os.path.join(tmp, "sg.pb.gz")
    env = dict(os.environ, THREADHEAP_PROFILE_RATE="64K", THREADHEAP_PROFILE=path, THREADHEAP_PROFILE_SIGNAL="1")
    p = subprocess.Popen([prog, "signal"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    timer = threading.Timer(120, p.kill)
    timer.start()
    out = ""
    for line in iter(p.stdout.readline, ""):
        out += line
        if line.startswith("ready"):
            os.kill(p.pid, signal.SIGUSR2)
    rc = p.wait()
    timer.cancel()
    err = p.stderr.read()
    check(rc == 0, "signal: runs" + tail(rc, out, err))
    truth = {int(n): int(b) for n, b in re.findall(r"^file (\d+) live (\d+)", out, re.M)}
    needed = re.search(r"^file 1 live \d+ churned (\d+)$", out, re.M)
    ns = numbered(tmp, "sg.pb.gz")
    check(ns == [1, 2], f"signal: two signals wrote PATH.1 and PATH.2 ({ns})")
    if rc != 0 or sorted(truth) != [1, 2] or needed is None:
        return
    est = {}
    for n, how in ((1, "raised"), (2, "sent by the test")):
        top = pprof_top(prog, f"{path}.{n}", "inuse_space")
        est[n] = (top or {}).get("site_signal", 0)
        check(top is not None and close_to(est[n], truth[n]),
              f"signal: PATH.{n} ({how}) site_signal inuse {est[n] / 2**20:.1f} MiB "
              f"against {truth[n] / 2**20:.1f} MiB")
    check(est[2] > est[1], "signal: PATH.2 holds more than PATH.1")
    needed = int(needed.group(1))
    for how in ("preinit", "main", "ignore"):
        own = os.path.join(tmp, f"own_{how}.pb.gz")
        r = run([prog, "signal_own", how], {"THREADHEAP_PROFILE": own, "THREADHEAP_PROFILE_SIGNAL": "1",
                                            "THREADHEAP_VERBOSE": "1", "PROFILE_USR2": how},
                preexec_fn=(lambda: signal.signal(signal.SIGUSR2, signal.SIG_IGN)) if how == "ignore" else None)
        m = re.search(r"handled (\d+) churned (\d+) kept (\d) dumped (\d)", r.stdout)
        check(r.returncode == 0 and m is not None,
              f"signal, own {how}: runs" + tail(r.returncode, r.stdout, r.stderr))
        if m is None:
            continue
        handled, churned, kept = int(m.group(1)), int(m.group(2)), m.group(3) == "1"
        check(kept and handled == (0 if how == "ignore" else 3),
              f"signal, own {how}: the program's disposition stayed, its handler ran {handled} times of 3")
        check(numbered(tmp, f"own_{how}.pb.gz") == [] and m.group(4) == "0",
              f"signal, own {how}: no PATH.<n> after {churned / 2**20:.0f} MiB allocated since the signals "
              f"({churned / max(needed, 1):.0f} times what a dump took above)")
        check(churned >= 8 * needed, f"signal, own {how}: that is at least 8 times")
        if how != "main":  # main's handler replaces threadheap's, installed at start
            check("SIGUSR2 has a handler of the program's" in r.stderr,
                  f"signal, own {how}: THREADHEAP_VERBOSE says why")


def dump_threads(tmp):
    """th_profile_dump 20 times while four threads churn rings of checked blocks at site_worker."""
    prog = os.path.join(BIN, "prog_profile")
    base = os.path.join(tmp, "dt.pb.gz")
    start = time.monotonic()
    r = run([prog, "dump_threads"], {"THREADHEAP_PROFILE": base + ".exit", "PROFILE_DUMP": base})
    took = time.monotonic() - start
    dumps = re.findall(r"^dump (\d+) rc (-?\d+) errno (\d+) fifo (\d) copied (\d) live (\d+) (\d+) during (\d+)$",
                       r.stdout, re.M)
    check(r.returncode == 0 and re.search(r"^corrupt 0 ", r.stdout, re.M) is not None,
          f"dump threads: exits 0 ({took:.1f} s), every block intact" + tail(r.returncode, r.stdout, r.stderr))
    check(len(dumps) == 20 and all(d[1] == "0" for d in dumps), f"dump threads: 20 dumps returned 0 ({len(dumps)})")
    fifo_during = [int(d[7]) for d in dumps if d[3] == "1"]
    check(len(fifo_during) == 10 and min(fifo_during) >= 4 * 256 and all(d[4] == "1" for d in dumps if d[3] == "1"),
          f"dump threads: the threads allocated during the FIFO dumps ({fifo_during} blocks)")
    last_alloc = 0
    bad = []
    for d, _, _, _, _, live0, live1, _ in dumps:
        inuse = pprof_top(prog, f"{base}.{d}", "inuse_space")
        alloc = pprof_top(prog, f"{base}.{d}", "alloc_space")
        if inuse is None or alloc is None:
            bad.append(f"{d}: unreadable")
            continue
        live0, live1 = int(live0), int(live1)
        est = inuse.get("site_worker", 0)
        if not close_to(est, (live0 + live1) / 2, abs(live1 - live0) + (1 << 20)):
            bad.append(f"{d}: site_worker inuse {est / 2**20:.1f} MiB against {live0 / 2**20:.1f} MiB")
        if alloc.get("site_worker", 0) < last_alloc:
            bad.append(f"{d}: alloc_space fell")
        last_alloc = alloc.get("site_worker", 0)
    check(len(dumps) == 20 and not bad, f"dump threads: go tool pprof reads every dump; each holds site_worker's "
          f"16 MiB, alloc_space never falls {bad}")


def dump_errors(tmp):
    """th_profile_dump: -1 and ENOTSUP with profiling off; -1 and the errno of the path it cannot create, with
    nothing written; and a good dump after the failures (no lock left behind, no file descriptor)."""
    prog = os.path.join(BIN, "prog_profile")
    folder = os.path.join(tmp, "errors")
    os.makedirs(os.path.join(folder, "adir"))
    with open(os.path.join(folder, "afile"), "w") as f:
        f.write("keep\n")
    cases = {}
    for on in ("off", "on"):
        env = {k: v for k, v in os.environ.items() if k not in ("THREADHEAP_PROFILE", "THREADHEAP_LEAKS")}
        if on == "on":
            env["THREADHEAP_PROFILE"] = folder + ".exit"
        env.update(THREADHEAP_PROFILE_RATE="64K", PROFILE_DUMP=folder)
        r = subprocess.run([prog, "dump_errors", on], env=env, capture_output=True, text=True, timeout=240)
        check(r.returncode == 0, f"dump errors {on}: runs" + tail(r.returncode, r.stdout, r.stderr))
        for name, rc, e in re.findall(r"^case (\S+) rc (-?\d+) errno (\d+)$", r.stdout, re.M):
            cases[name] = (int(rc), int(e))
        fds = re.search(r"^fds (\d+) (\d+)$", r.stdout, re.M)
        check(fds is not None and fds.group(1) == fds.group(2), f"dump errors {on}: no file descriptor left open")
    for name, want in (("off", errno.ENOTSUP), ("null", errno.EINVAL), ("empty", errno.EINVAL),
                       ("missing_dir", errno.ENOENT), ("directory", errno.EISDIR), ("not_a_dir", errno.ENOTDIR)):
        got = cases.get(name)
        check(got == (-1, want), f"dump errors: {name} returns -1, errno {errno.errorcode[want]} "
              f"(got {got and (got[0], errno.errorcode.get(got[1], got[1]))})")
    with open(os.path.join(folder, "afile")) as f:
        kept = f.read() == "keep\n"
    left = sorted(os.listdir(folder))
    check(left == ["adir", "afile", "good.pb.gz"] and os.listdir(os.path.join(folder, "adir")) == [] and kept,
          f"dump errors: the failures wrote nothing ({left})")
    top = pprof_top(prog, os.path.join(folder, "good.pb.gz"), "alloc_space")
    check(cases.get("good") == (0, 0) and top is not None,
          "dump errors: a good dump after them works, and pprof reads it")


def not_a_library(tmp, soname):
    """A folder for LD_LIBRARY_PATH whose file named soname is not a library, so that dlopen of it fails."""
    folder = os.path.join(tmp, "bogus-" + soname)
    os.makedirs(folder)
    with open(os.path.join(folder, soname), "w") as f:
        f.write("not a library\n")
    return folder


def no_writer(tmp):
    """Without zlib (a libz.so.1 that is not a library, found first on LD_LIBRARY_PATH): one line at start
    naming the libraries, the program runs, th_profile_dump returns -1 with ELIBACC, and nothing is written."""
    prog = os.path.join(BIN, "prog_profile")
    bogus, folder = not_a_library(tmp, "libz.so.1"), os.path.join(tmp, "nowriter")
    os.makedirs(folder)
    env = {k: v for k, v in os.environ.items() if k != "THREADHEAP_LEAKS"}
    env.update(THREADHEAP_PROFILE=os.path.join(folder, "exit.pb.gz"), THREADHEAP_PROFILE_RATE="64K",
               PROFILE_DUMP=folder, LD_LIBRARY_PATH=bogus)
    r = subprocess.run([prog, "dump_errors", "on"], env=env, capture_output=True, text=True, timeout=240)
    check(r.returncode == 0, "no writer: the program runs" + tail(r.returncode, r.stdout, r.stderr))
    lines = r.stderr.splitlines()
    check(len(lines) == 1 and lines[0].startswith("threadheap: heap profiles need libz.so.1 and libprotobuf-c.so.1")
          and "none will be written" in lines[0], f"no writer: one line on stderr says why ({lines})")
    good = re.search(r"^case good rc (-?\d+) errno (\d+)$", r.stdout, re.M)
    check(good is not None and (int(good.group(1)), int(good.group(2))) == (-1, errno.ELIBACC),
          f"no writer: th_profile_dump returns -1, errno ELIBACC ({good and good.groups()})")
    check(os.listdir(folder) == [], f"no writer: nothing written ({os.listdir(folder)})")


def no_unwinder(tmp):
    """libunwind is opened only when profiling starts: a preloaded process that does not profile maps neither it
    nor liblzma, and one that profiles maps it. Without it (a libunwind.so.8 that is not a library, found first
    on LD_LIBRARY_PATH), profiling says so in one line and stays off: the program runs and no profile is
    written."""
    bogus, folder = not_a_library(tmp, "libunwind.so.8"), os.path.join(tmp, "nounwinder")
    os.makedirs(folder)
    base = {k: v for k, v in os.environ.items() if not k.startswith("THREADHEAP_")}
    base["LD_PRELOAD"] = LIB

    def maps(extra):
        r = subprocess.run(["cat", "/proc/self/maps"], env=dict(base, **extra), capture_output=True, text=True,
                           timeout=60)
        return r, sorted({os.path.basename(line.split()[-1]) for line in r.stdout.splitlines() if ".so" in line})

    r, off = maps({})
    check(r.returncode == 0 and any("libthreadheap" in m for m in off)
          and not any("libunwind" in m or "liblzma" in m for m in off),
          f"no unwinder: a process that does not profile maps no libunwind ({off})")
    r, on = maps({"THREADHEAP_PROFILE": os.path.join(folder, "on.pb.gz")})
    check(r.returncode == 0 and any("libunwind" in m for m in on),
          f"no unwinder: a process that profiles maps libunwind ({on})")
    os.remove(os.path.join(folder, "on.pb.gz"))
    r, _ = maps({"THREADHEAP_PROFILE": os.path.join(folder, "exit.pb.gz"), "LD_LIBRARY_PATH": bogus})
    lines = r.stderr.splitlines()
    check(r.returncode == 0, "no unwinder: the program runs" + tail(r.returncode, r.stdout, r.stderr))
    check(len(lines) == 1 and lines[0].startswith("threadheap: heap profiles need libunwind.so.8 (")
          and lines[0].endswith("); profiling is off"), f"no unwinder: one line on stderr says why ({lines})")
    check(os.listdir(folder) == [], f"no unwinder: nothing written ({os.listdir(folder)})")


def main():
    if GO is None:
        print("test_profile: go (Debian's golang-go) is needed to read the profiles")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        accuracy(tmp, 0)
        accuracy(tmp, 8)
        patterns(tmp)
        many_threads(tmp)
        explicit_heaps(tmp)
        many_stacks(tmp)
        aligned(tmp)
        tiny(tmp)
        leaks(tmp)
        others(tmp)
        interval(tmp)
        signals(tmp)
        dump_threads(tmp)
        dump_errors(tmp)
        no_writer(tmp)
        no_unwinder(tmp)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
