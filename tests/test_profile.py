#!/usr/bin/env python3
"""Heap profiles against the truth: test_profile.py BUILD_BIN_DIR LIBTHREADHEAP.

Runs tests/prog_profile (linked with threadheap), prog_profile_cpp (preloaded) and reads every profile
written with `go tool pprof` (Debian's golang-go). Accuracy: at THREADHEAP_PROFILE_RATE=64K, the live bytes
of three call sites holding 60/30/10% of 256 MiB are within 5 percentage points of the truth, a site whose
blocks were all freed is absent from inuse_space and present in alloc_space; with one thread, and with
8 allocating threads whose freed site's blocks two other threads free."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

BIN, LIB = sys.argv[1], sys.argv[2]
GO = "/usr/bin/go" if os.path.exists("/usr/bin/go") else shutil.which("go")
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(args, env_extra, **kw):
    env = dict(os.environ, THREADHEAP_PROFILE_RATE="64K", **env_extra)
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


def leaks(tmp):
    for prog, leaky, tidy, preload in (("prog_profile", "leaky", "tidy", False),
                                       ("prog_profile_cpp", "leaky_new", "tidy_new", True)):
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
        src = prog + (".cpp" if preload else ".c")
        check(re.search(rf"#\d+ 0x[0-9a-f]+ {re.escape(leaky)}(?:\(\))?\+0x[0-9a-f]+ \S*{src}:\d+ ", report),
              f"leaks {prog}: {leaky}'s frame names {src}:line")
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


def main():
    if GO is None:
        print("test_profile: go (Debian's golang-go) is needed to read the profiles")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        accuracy(tmp, 0)
        accuracy(tmp, 8)
        leaks(tmp)
        others(tmp)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
