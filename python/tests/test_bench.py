"""Tests of the `threadheap bench` driver: parsing (NAME=PATH allocators too), planning, the environment of a
run, aggregation, the run's summary, compare, outputs, the README tables, the published docs (docs/results.md
and its charts, from a fake results.json), runs over fake workloads (the explicit-heaps binary and
threadheap+profile included), and one end-to-end run of the real ones.

The end-to-end test needs the built workloads and library (TH_BUILD_DIR, default build/); outside CI it is
skipped when they are missing, in CI (CI set) it fails instead, so a broken build cannot pass unseen.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from threadheap import bench
from threadheap import bench_results as results
from threadheap import bench_docs, bench_summary
from threadheap.bench_experiments import EXPERIMENTS, BenchError

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TH_BUILD_DIR", REPO / "build"))


# ------------------------------------------------------------------------------------------------ parsing


def test_parse_count_suffixes():
    assert bench.parse_count("64") == 64
    assert bench.parse_count("4k") == 4096
    assert bench.parse_count("1M") == 1 << 20
    with pytest.raises(BenchError):
        bench.parse_count("12x")


def test_parse_int_list():
    assert bench.parse_int_list("1,2,4", "threads") == [1, 2, 4]
    assert bench.parse_int_list("16,1k", "sizes") == [16, 1024]
    for bad in ["", "1,,2", "a", "1,-2", "0", "1,2,"]:
        with pytest.raises(BenchError):
            bench.parse_int_list(bad, "threads")


def test_parse_name_list():
    assert bench.parse_name_list("glibc,threadheap,glibc", bench.ALLOCATORS, "allocator") == ["glibc", "threadheap"]
    with pytest.raises(BenchError, match="unknown allocator 'ptmalloc9'"):
        bench.parse_name_list("glibc,ptmalloc9", bench.ALLOCATORS, "allocator")
    with pytest.raises(BenchError, match="malformed allocator list"):
        bench.parse_name_list("glibc,", bench.ALLOCATORS, "allocator")


def test_parse_allocators_takes_name_equals_path(tmp_path):
    lib = tmp_path / "libsnmalloc.so"
    lib.write_text("")
    names, external = bench.parse_allocators(f"glibc, threadheap,snmalloc={lib},threadheap+profile,glibc")
    assert names == ["glibc", "threadheap", "snmalloc", "threadheap+profile"]
    assert external == {"snmalloc": lib}
    # The same item twice is one allocator; one name with two files is an error.
    assert bench.parse_allocators(f"snmalloc={lib},snmalloc={lib}") == (["snmalloc"], {"snmalloc": lib})
    other = tmp_path / "libother.so"
    other.write_text("")
    with pytest.raises(BenchError, match="given twice"):
        bench.parse_allocators(f"snmalloc={lib},snmalloc={other}")


def test_parse_allocators_missing_file(tmp_path):
    missing = tmp_path / "nothing" / "libsnmalloc.so"
    with pytest.raises(BenchError) as e:
        bench.parse_allocators(f"glibc,snmalloc={missing}")
    assert str(e.value) == f"allocator 'snmalloc': {missing} not found"
    with pytest.raises(BenchError, match="not found"):
        bench.parse_allocators(f"snmalloc={tmp_path}")  # a folder is not a library


@pytest.mark.parametrize("item", ["=/lib/x.so", "snm alloc=/lib/x.so", "a/b=/lib/x.so", "snmalloc=", "sn:m=/x",
                                  "é=/lib/x.so"])
def test_parse_allocators_malformed(item):
    with pytest.raises(BenchError, match="malformed allocator '"):
        bench.parse_allocators("glibc," + item)


def test_parse_allocators_reserved_and_unknown_names(tmp_path):
    lib = tmp_path / "lib.so"
    lib.write_text("")
    for name in ("os", "th"):  # the names of OS-baseline and linked-workload runs
        with pytest.raises(BenchError, match=f"allocator name '{name}' is reserved"):
            bench.parse_allocators(f"{name}={lib}")
    with pytest.raises(BenchError, match="unknown allocator 'snmalloc'.*NAME=PATH"):
        bench.parse_allocators("glibc,snmalloc")


def test_resolve_allocators_external_and_builtin_names(tmp_path):
    real = harmless_library()
    link = tmp_path / "libsnmalloc.so"
    link.symlink_to(real)
    cfg = config(["contention", "--lib", str(real), "--allocators", f"threadheap,threadheap+profile,snmalloc={link}"])
    libs = bench.resolve_allocators(cfg, warn=None)
    # The file the report names is the resolved one; threadheap+profile preloads threadheap's library.
    assert libs == {"threadheap": real.resolve(), "threadheap+profile": real.resolve(), "snmalloc": real.resolve()}
    # A built-in name with a path is accepted only for that allocator's own library.
    cfg = config(["contention", "--lib", str(real), "--allocators", f"threadheap={link},glibc"])
    assert bench.resolve_allocators(cfg, warn=None) == {"threadheap": real.resolve(), "glibc": None}
    other = tmp_path / "libother.so"
    other.write_text("")
    for name in ("threadheap", "glibc"):
        cfg = config(["contention", "--lib", str(real), "--allocators", f"{name}={other}"])
        with pytest.raises(BenchError, match=f"allocator '{name}': .* is not the built-in {name}'s library"):
            bench.resolve_allocators(cfg, warn=None)


def test_parse_output_ignores_other_lines():
    out = 'hello\n{"experiment":"contention","size":1,"threads":1,"us_per_op":0.5}\n\n'
    assert bench.parse_output(out) == [{"experiment": "contention", "size": 1, "threads": 1, "us_per_op": 0.5}]
    with pytest.raises(BenchError):
        bench.parse_output("{not json\n")


def test_normalize_row_names_os_and_linked_rows():
    r = bench.normalize_row({"experiment": "contention", "method": "mmap", "size": 8}, bench.OS_RUN)
    assert r["allocator"] == "os:mmap" and "method" not in r
    r = bench.normalize_row({"experiment": "contention", "method": "heap_private_noserialize", "size": 8},
                            bench.LINKED_RUN)
    assert r["allocator"] == "th:private-noserialize"
    r = bench.normalize_row({"experiment": "contention", "method": "new", "size": 8}, bench.LINKED_RUN)
    assert r["allocator"] == "th:new"
    r = bench.normalize_row({"experiment": "contention", "method": "malloc", "size": 8}, "glibc")
    assert r["allocator"] == "glibc"
    with pytest.raises(BenchError, match="without a \"method\""):
        bench.normalize_row({"experiment": "contention", "size": 8}, bench.LINKED_RUN)


def config(argv):
    return bench.make_config(bench.build_parser().parse_args(argv))


def test_plan_interleaves_and_rotates(tmp_path):
    cfg = config(["contention", "random", "--threads", "1,2", "--bin-dir", str(tmp_path)])
    groups = bench.plan_jobs(cfg, ["threadheap", "glibc"])
    # contention: one group (threads as a list) with the OS baseline; random: one group per thread count.
    assert [len(g) for g in groups] == [3, 2, 2]
    assert [j.allocator for j in groups[0]] == ["threadheap", "glibc", "os"]
    assert groups[0][0].args == ["--threads", "1,2", "--method", "malloc"]
    assert groups[0][2].args == ["--threads", "1,2", "--method", "mmap"]
    assert groups[1][0].args[-2:] == ["--threads", "1"]
    assert [j.allocator for j in bench.rotated(groups[0], 1)] == ["glibc", "os", "threadheap"]
    assert [j.allocator for j in bench.rotated(groups[0], 3)] == ["threadheap", "glibc", "os"]


def test_plan_runs_the_linked_workload_once_per_repetition_when_built(tmp_path, monkeypatch):
    cfg = config(["contention", "--smoke", "--bin-dir", str(tmp_path)])
    assert [j.allocator for j in bench.plan_jobs(cfg, ["threadheap", "glibc"])[0]] == ["threadheap", "glibc", "os"]
    (tmp_path / "contention_heaps").write_text("")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    group = bench.plan_jobs(cfg, ["threadheap", "glibc"])[0]
    assert [j.allocator for j in group] == ["threadheap", "glibc", "os", "th"]
    assert group[3].exe_name == "contention_heaps"
    # Both binaries get the same thread counts, so that their rows fill the same table cells.
    assert group[3].args == ["--smoke", "--threads", "1,2,3,4", "--methods",
                             "malloc,new,heap_shared,heap_private,heap_private_noserialize"]
    assert group[0].args == ["--smoke", "--threads", "1,2,3,4", "--method", "malloc"]
    assert group[0].exe_name == "contention"
    # Without threadheap among the allocators its methods are not run either.
    assert [j.allocator for j in bench.plan_jobs(cfg, ["glibc"])[0]] == ["glibc", "os"]


def test_plan_runs_threadheap_profile_as_an_allocator(tmp_path):
    (tmp_path / "contention_heaps").write_text("")
    cfg = config(["contention", "--smoke", "--bin-dir", str(tmp_path)])
    group = bench.plan_jobs(cfg, ["threadheap", "threadheap+profile", "glibc"])[0]
    # Its runs take the allocators' arguments; the linked workload and the OS baseline run once, unprofiled.
    assert [j.allocator for j in group] == ["threadheap", "threadheap+profile", "glibc", "os", "th"]
    assert group[1].args == group[0].args and group[1].exe_name == "contention"


def test_job_env_sets_the_profile_only_for_threadheap_profile(monkeypatch, tmp_path):
    monkeypatch.setenv("THREADHEAP_PROFILE", "/inherited.pb.gz")  # would profile every threadheap run
    monkeypatch.setenv("THREADHEAP_LEAKS", "1")
    monkeypatch.setenv("LD_PRELOAD", "/inherited.so")
    monkeypatch.setenv("THREADHEAP_PROFILE_RATE", "64K")
    lib, ext = tmp_path / "libthreadheap.so", tmp_path / "libsnmalloc.so"
    libs = {"threadheap": lib, "threadheap+profile": lib, "glibc": None, "snmalloc": ext}
    profile = tmp_path / "p" / "heap.pb.gz"
    envs = {a: bench.job_env(bench.Job("contention", a, []), libs, profile)
            for a in list(libs) + [bench.OS_RUN, bench.LINKED_RUN]}
    assert envs["threadheap+profile"]["THREADHEAP_PROFILE"] == str(profile)
    assert envs["threadheap+profile"]["LD_PRELOAD"] == str(lib)
    for a, env in envs.items():
        assert "THREADHEAP_LEAKS" not in env and env["THREADHEAP_PROFILE_RATE"] == "64K"
        if a != "threadheap+profile":
            assert "THREADHEAP_PROFILE" not in env
        assert env.get("LD_PRELOAD") == {"threadheap": str(lib), "threadheap+profile": str(lib),
                                         "snmalloc": str(ext)}.get(a)


def test_default_thread_counts(monkeypatch):
    # Up to twice the cores, and always the seed's 3 threads (random, larson: one process per count).
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert bench.default_thread_counts() == [1, 2, 3, 4]
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert bench.default_thread_counts() == [1, 2, 3, 4, 8, 16]
    cfg = config(["larson"])
    assert [j.args for g in bench.plan_jobs(cfg, ["glibc"]) for j in g] == \
        [["--threads", str(t)] for t in [1, 2, 3, 4, 8, 16]]


def test_sizes_for_large_are_mib():
    large, contention = EXPERIMENTS["large"], EXPERIMENTS["contention"]
    warnings = []
    sizes = [16, 1024, 8 << 20, 32 << 20]
    assert bench.sizes_for(contention, sizes, False) == sizes
    assert bench.sizes_for(large, sizes, False) == [8 << 20, 32 << 20]
    assert bench.sizes_for(large, [8, 16], True) == [8, 16]  # alone: plain numbers are MiB
    assert bench.sizes_for(large, [16, 1024], False, warnings.append) is None
    assert len(warnings) == 1 and "large" in warnings[0]
    assert bench.sizes_for(EXPERIMENTS["touch"], sizes, False) is None
    cfg = config(["contention", "large", "--sizes", "64,8m"])
    groups = bench.plan_jobs(cfg, ["glibc"])
    assert groups[0][0].args[:2] == ["--sizes", "64,8388608"]
    assert groups[1][0].args == ["--sizes", "8388608"]


def test_random_takes_sizes_as_its_largest_block():
    # Alone with sizes, random runs once per value and thread count, the size as --max-size.
    cfg = config(["random", "--threads", "2,4", "--sizes", "2k,64k"])
    assert [j.args for g in bench.plan_jobs(cfg, ["glibc"]) for j in g] == [
        ["--threads", "2", "--max-size", "2048"], ["--threads", "2", "--max-size", "65536"],
        ["--threads", "4", "--max-size", "2048"], ["--threads", "4", "--max-size", "65536"]]
    # Beside another experiment that takes sizes, the sizes are that one's, and random keeps its default.
    cfg = config(["contention", "random", "--threads", "4", "--sizes", "64"])
    groups = bench.plan_jobs(cfg, ["glibc"])
    assert groups[-1][0].args == ["--threads", "4"]


def test_command_line_is_recorded(monkeypatch):
    monkeypatch.delenv("TH_BENCH_COMMAND", raising=False)
    assert bench.command_line(["contention", "--sizes", "16,1k"]) == "threadheap bench contention --sizes 16,1k"
    monkeypatch.setenv("TH_BENCH_COMMAND", "make bench")
    assert bench.command_line([]) == "make bench"


# ------------------------------------------------------------------------------------------------ aggregation


def rows_fixture():
    rows = []
    for rep, (th, gl, priv) in enumerate([(1.0, 3.0, 0.5), (2.0, 6.0, 0.5), (4.0, 9.0, 2.0)]):
        rows.append({"experiment": "contention", "allocator": "threadheap", "size": 64, "threads": 2,
                     "us_per_op": th, "rep": rep})
        rows.append({"experiment": "contention", "allocator": "glibc", "size": 64, "threads": 2,
                     "us_per_op": gl, "rep": rep})
        rows.append({"experiment": "contention", "allocator": "th:private", "size": 64, "threads": 2,
                     "us_per_op": priv, "rep": rep})
    rows.append({"experiment": "xthread", "allocator": "threadheap", "live_mb": 64, "mblocks_per_s": 10.0,
                 "overhead": 0.1, "peak_rss_kb": 1000, "end_rss_kb": 10, "rep": 0})
    rows.append({"experiment": "xthread", "allocator": "glibc", "live_mb": 64, "mblocks_per_s": 5.0,
                 "overhead": 0.2, "peak_rss_kb": 2000, "end_rss_kb": 20, "rep": 0})
    return rows


def cell(cells, exp, alloc):
    return next(c for c in cells if c["experiment"] == exp and c["allocator"] == alloc)


def test_aggregate_median_range_ratio():
    cells = results.aggregate(rows_fixture())
    th = cell(cells, "contention", "threadheap")["metrics"]["us_per_op"]
    gl = cell(cells, "contention", "glibc")["metrics"]["us_per_op"]
    pr = cell(cells, "contention", "th:private")["metrics"]["us_per_op"]
    assert (th["median"], th["min"], th["max"], th["n"]) == (2.0, 1.0, 4.0, 3)
    assert (gl["median"], gl["min"], gl["max"]) == (6.0, 3.0, 9.0)
    assert th["ratio"] == 1.0 and gl["ratio"] == 3.0 and pr["ratio"] == 0.25
    assert cell(cells, "xthread", "glibc")["metrics"]["mblocks_per_s"]["ratio"] == 0.5
    assert results.baseline_of(cells) == "threadheap"


def test_aggregate_median_of_even_count():
    rows = [{"experiment": "xthread", "allocator": "glibc", "live_mb": 64, "mblocks_per_s": v, "rep": i}
            for i, v in enumerate([4.0, 1.0, 3.0, 10.0])]
    st = results.aggregate(rows)[0]["metrics"]["mblocks_per_s"]
    assert (st["median"], st["min"], st["max"], st["n"]) == (3.5, 1.0, 10.0, 4)


def test_aggregate_without_threadheap_uses_first_allocator():
    rows = [r for r in rows_fixture() if r["allocator"] not in ("threadheap", "th:private")]
    cells = results.aggregate(rows)
    assert results.baseline_of(cells) == "glibc"
    assert cell(cells, "contention", "glibc")["metrics"]["us_per_op"]["ratio"] == 1.0


def test_order_allocators():
    names = ["os:mmap", "glibc", "th:private", "tcmalloc", "threadheap", "th:shared", "mimalloc"]
    assert results.order_allocators(names) == ["threadheap", "th:private", "th:shared", "glibc", "mimalloc",
                                               "tcmalloc", "os:mmap"]


def test_order_allocators_places_profile_and_external_ones():
    names = ["os:mmap", "snmalloc", "glibc", "th:private", "threadheap+profile", "hoard", "threadheap"]
    assert results.order_allocators(names) == ["threadheap", "threadheap+profile", "th:private", "glibc", "hoard",
                                               "snmalloc", "os:mmap"]


def test_chart_styles_are_stable_across_charts():
    # Every chart of a run has the same external allocators: they run in every experiment, as the peers do.
    small = results.chart_styles(["glibc", "threadheap", "snmalloc", "hoard"])
    big = results.chart_styles(["threadheap", "threadheap+profile", "th:private", "th:shared", "glibc", "mimalloc",
                                "jemalloc", "tcmalloc", "hoard", "snmalloc", "os:mmap", "os:file"])
    colors, styles, markers = big
    for a in ("threadheap", "glibc", "snmalloc"):  # the same look whatever else the chart holds
        assert small[0][a] == colors[a] and small[1][a] == styles[a] and small[2][a] == markers[a]
    # threadheap+profile: threadheap's colour, its own line style; external ones: square markers, colours of
    # their own.
    assert colors["threadheap+profile"] == colors["threadheap"] and styles["threadheap+profile"] == "-."
    assert markers["snmalloc"] == markers["hoard"] == "s" and markers["glibc"] == "o"
    others = [a for a in colors if a != "threadheap+profile"]
    assert len({colors[a] for a in others}) == len(others)
    assert (styles["th:private"], styles["os:mmap"], styles["snmalloc"]) == ("--", ":", "-")


def test_tables_show_median_range_and_ratio():
    cells = results.aggregate(rows_fixture())
    tables = results.tables_for(EXPERIMENTS["contention"], cells, "us_per_op")
    # The seed's layout: one table per allocator, sizes down, threads across.
    assert [t[0].split(",")[0] for t in tables] == ["contention: threadheap", "contention: th:private",
                                                     "contention: glibc"]
    title, header, rows = tables[2]
    assert header == ["bytes", "2 threads"]
    assert rows == [["64", "6.00 [3.00–9.00] ×3.00"]]
    assert tables[1][2] == [["64", "0.500 [0.500–2.00] ×0.25"]]
    title, header, rows = results.tables_for(EXPERIMENTS["xthread"], cells, "mblocks_per_s")[0]
    assert header == ["live_mb", "threadheap", "glibc"] and rows[0][2] == "5.00 ×0.50"


# ------------------------------------------------------------------------------------------------ summary


def summary_rows():
    """Hand-made cells: a lower-is-better time, an inverted throughput, RSS, metrics that do not count and
    cells to skip."""
    def row(exp, alloc, **fields):
        return dict(experiment=exp, allocator=alloc, rep=0, **fields)

    return [
        # contention, us_per_op: glibc ×2 at 16 B, ×0.5 at 64 B; threadheap+profile ×1.02 and ×1.04.
        row("contention", "threadheap", size=16, threads=1, us_per_op=1.0),
        row("contention", "glibc", size=16, threads=1, us_per_op=2.0),
        row("contention", "threadheap+profile", size=16, threads=1, us_per_op=1.02),
        row("contention", "threadheap", size=64, threads=1, us_per_op=2.0),
        row("contention", "glibc", size=64, threads=1, us_per_op=1.0),
        row("contention", "threadheap+profile", size=64, threads=1, us_per_op=2.08),
        # Skipped: threadheap's value is zero at 256 B and missing at 1 KiB.
        row("contention", "threadheap", size=256, threads=1, us_per_op=0.0),
        row("contention", "glibc", size=256, threads=1, us_per_op=3.0),
        row("contention", "glibc", size=1024, threads=1, us_per_op=3.0),
        # th:* and os:* rows are not allocators of the summary.
        row("contention", "th:private", size=16, threads=1, us_per_op=0.5),
        row("contention", "os:mmap", size=16, threads=1, us_per_op=50.0),
        # xthread: throughput, higher is better: glibc's 4 against 10 is ×2.5 worse. end_rss_kb is memory;
        # overhead and peak_rss_kb (not a table metric there) do not count.
        row("xthread", "threadheap", live_mb=64, mblocks_per_s=10.0, overhead=0.1, peak_rss_kb=1000, end_rss_kb=100),
        row("xthread", "glibc", live_mb=64, mblocks_per_s=4.0, overhead=0.9, peak_rss_kb=9000, end_rss_kb=300),
        # random: context switches do not count; peak RSS does.
        row("random", "threadheap", threads=1, max_size=2048, seconds=1, mops_per_s=100.0, vcsw_per_s=1.0,
            ivcsw_per_s=1.0, peak_rss_kb=1000),
        row("random", "glibc", threads=1, max_size=2048, seconds=1, mops_per_s=100.0, vcsw_per_s=1000.0,
            ivcsw_per_s=1000.0, peak_rss_kb=1500),
    ]


def test_summary_arithmetic():
    summary = results.run_summary(results.aggregate(summary_rows()))
    assert [r["allocator"] for r in summary] == ["threadheap+profile", "glibc"]
    glibc = summary[1]
    t = glibc["time"]
    # contention ×2 and ×0.5, xthread ×2.5 (10 / 4, inverted), random ×1.0 (100 / 100).
    assert t["n"] == 4 and t["skipped"] == 2
    assert t["geomean"] == pytest.approx((2 * 0.5 * 2.5 * 1.0) ** 0.25)
    assert (t["min"], t["max"]) == (0.5, 2.5)
    assert t["worst"] == {"experiment": "xthread", "params": {"live_mb": 64}, "metric": "mblocks_per_s",
                          "ratio": 2.5}
    m = glibc["memory"]  # xthread end_rss_kb ×3, random peak_rss_kb ×1.5
    assert m["n"] == 2 and m["skipped"] == 0
    assert m["geomean"] == pytest.approx((3 * 1.5) ** 0.5) and m["worst"]["metric"] == "end_rss_kb"
    prof = summary[0]
    assert prof["time"]["n"] == 2 and prof["time"]["geomean"] == pytest.approx((1.02 * 1.04) ** 0.5)
    assert prof["memory"] == {"geomean": None, "n": 0, "skipped": 0}


def test_summary_text():
    cells = results.aggregate(summary_rows())
    summary = results.run_summary(cells)
    title, header, rows = bench_summary.summary_table(summary, "threadheap")
    assert header == ["allocator", "time ÷ threadheap", "cells", "worst cell", "memory ÷ threadheap", "cells"]
    assert rows[0] == ["threadheap+profile", "1.030 [1.020–1.040]", "2",
                       "contention size=64 threads=1 us_per_op ×1.04", "–", "0"]
    assert rows[1][1:4] == ["1.257 [0.500–2.500]", "4 (2 skipped)", "xthread live_mb=64 mblocks_per_s ×2.50"]
    line = bench_summary.profile_line(summary, "threadheap")
    assert line == ("threadheap+profile: heap profiling on at the default rate, time ÷ threadheap, geomean 1.030 "
                    "(1.020–1.040) over 2 cells; within the limit of 1.03 (at most 3% slower at the default rate)")
    assert "at THREADHEAP_PROFILE_RATE=64K" in bench_summary.profile_line(summary, "threadheap", "64K")
    assert "limit" not in bench_summary.profile_line(summary, "threadheap", "64K")
    slower = results.run_summary(results.aggregate([dict(r, us_per_op=r["us_per_op"] * 1.1)
                                                    if r["allocator"] == "threadheap+profile" else r
                                                    for r in summary_rows()]))
    assert "; over the limit of 1.03" in bench_summary.profile_line(slower, "threadheap")
    # Without threadheap+profile, or against another baseline, there is no profiling figure.
    assert bench_summary.profile_line(summary[1:], "threadheap") is None
    assert bench_summary.profile_line(summary, "glibc") is None
    text = bench_summary.counted_text()
    assert "time: contention us_per_op, threads seconds, random mops_per_s (inverted)" in text
    assert "memory: random peak_rss_kb, xthread end_rss_kb, larson peak_rss_kb, larson end_rss_kb" in text


# ------------------------------------------------------------------------------------------------ compare


def result_of(rows, experiments=("contention", "xthread")):
    cells = results.aggregate(rows)
    meta = {"started": "2026-01-01T00:00:00", "seconds": 12.0, "command": "make bench",
            "machine": {"cpu": "Test CPU 3000", "cores": 2, "kernel": "6.1.0", "glibc": "2.36", "memory_gib": 4.0,
                        "packages": {"libc6": "2.36-9"}, "libraries": {"threadheap": "/x/libthreadheap.so",
                                                                       "glibc": "(system malloc)"},
                        "versions": {"threadheap": "0.1 abc1234", "glibc": "2.36-9"}},
            "config": {"experiments": list(experiments), "reps": 3}}
    return {"meta": meta, "baseline": results.baseline_of(cells), "raw": rows, "cells": cells}


def test_compare_per_cell_ratio():
    a = result_of(rows_fixture())
    faster = [dict(r, us_per_op=r["us_per_op"] / 2) if r["experiment"] == "contention" else r for r in rows_fixture()]
    b = result_of(faster)
    out = results.compare(a, b)
    byk = {(r["experiment"], r["allocator"], r["metric"]): r for r in out}
    assert byk[("contention", "threadheap", "us_per_op")]["ratio"] == 0.5
    assert byk[("xthread", "glibc", "mblocks_per_s")]["ratio"] == 1.0
    # Only cells present in both runs.
    c = result_of([r for r in rows_fixture() if r["experiment"] == "xthread"])
    assert {r["experiment"] for r in results.compare(a, c)} == {"xthread"}


def test_compare_cli(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(result_of(rows_fixture())))
    b.write_text(json.dumps(result_of([dict(r, us_per_op=r["us_per_op"] * 2) if "us_per_op" in r else r
                                       for r in rows_fixture()])))
    assert bench.main(["--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "B/A" in out and "2.000" in out
    assert bench.main(["--compare", str(a), str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.startswith("threadheap bench: cannot read")


def test_compare_cli_with_profile_and_external_allocators(tmp_path, capsys):
    rows = summary_rows() + [dict(r, allocator="snmalloc") for r in summary_rows() if r["allocator"] == "glibc"]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(result_of(rows)))
    b.write_text(json.dumps(result_of([dict(r, us_per_op=r["us_per_op"] * 2) if "us_per_op" in r else r
                                       for r in rows])))
    assert bench.main(["--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"threadheap\+profile .*│ 64 .*│ 2\.000 ", out)
    assert re.search(r"snmalloc .*│ 16 .*│ 2\.000 ", out)


# ------------------------------------------------------------------------------------------------ outputs


def report_tables(report):
    """The markdown tables of report.md: {title: [rows as lists of cells]}."""
    tables, title = {}, None
    for line in report.splitlines():
        m = re.fullmatch(r"\*\*(.+)\*\*", line)
        if m:
            title = m.group(1)
            tables[title] = []
        elif line.startswith("#"):
            title = None  # a section's own tables (Machine, Allocators) have no title
        elif line.startswith("| ") and title is not None:
            tables[title].append([c.strip() for c in line.strip("|").split("|")])
    return {t: rows[1:] for t, rows in tables.items()}  # without the header row


def check_outputs_agree(out, experiments):
    """JSON, CSV, PNGs and report.md of one run hold the same cells with the same medians."""
    data = json.loads((out / "results.json").read_text())
    rows = results.read_csv(out / "results.csv")
    n_metrics = sum(len(c["metrics"]) for c in data["cells"])
    assert len(rows) == n_metrics > 0
    for c in data["cells"]:
        for name, st in c["metrics"].items():
            match = [r for r in rows if r["experiment"] == c["experiment"] and r["allocator"] == c["allocator"]
                     and r["metric"] == name and all(r[p] == str(v) for p, v in c["params"].items())]
            assert len(match) == 1
            assert float(match[0]["median"]) == pytest.approx(st["median"])
            assert float(match[0]["min"]) == pytest.approx(st["min"])
            assert float(match[0]["max"]) == pytest.approx(st["max"])
            assert int(match[0]["n"]) == st["n"]
    report = (out / "report.md").read_text()
    for e in experiments:
        png = out / f"{e}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({e}.png)" in report
    # Every contention cell is in its allocator's table of the report, with the JSON's median and range.
    tables = report_tables(report)
    for c in data["cells"]:
        if c["experiment"] != "contention":
            continue
        title = next(t for t in tables if t.startswith(f"contention: {c['allocator']},"))
        header_threads = sorted({x["params"]["threads"] for x in data["cells"] if x["experiment"] == "contention"})
        row = next(r for r in tables[title] if r[0] == str(c["params"]["size"]))
        assert row[1 + header_threads.index(c["params"]["threads"])] == results.fmt_stat(c["metrics"]["us_per_op"])
    assert "CPU" in report and "kernel" in report
    for a in data["meta"]["machine"]["libraries"]:
        assert f"| {a} |" in report
    return data, rows, report


def test_write_outputs_on_fixed_results(tmp_path):
    result = result_of(rows_fixture())
    charts = results.write_outputs(tmp_path, result)
    assert set(charts) == {"contention", "xthread"}
    data, csv_rows, report = check_outputs_agree(tmp_path, ["contention", "xthread"])
    assert "6.00 [3.00–9.00] ×3.00" in report
    assert "Test CPU 3000, 2 cores" in report and "threadheap 0.1 abc1234" in report
    assert data["cells"] == result["cells"]


def test_report_and_readme_open_with_the_summary(tmp_path):
    result = result_of(summary_rows(), ["contention", "xthread", "random"])
    result["summary"] = results.run_summary(result["cells"])
    result["meta"]["machine"]["libraries"].update({"threadheap+profile": "/x/libthreadheap.so",
                                                   "snmalloc": "/opt/lib/libsnmalloc.so.1"})
    result["meta"]["config"]["external"] = {"snmalloc": "/opt/libsnmalloc.so"}
    results.write_outputs(tmp_path, result)
    report = (tmp_path / "report.md").read_text()
    line = bench_summary.profile_line(result["summary"], "threadheap")
    title = bench_summary.summary_table(result["summary"], "threadheap")[0]
    # At the top: the profiling figure, then the table, before the machine.
    assert report.index(line) < report.index(title) < report.index("## Machine") < report.index("## Alloc/free")
    tables = report_tables(report)
    assert tables[title][0][:2] == ["threadheap+profile", "1.030 [1.020–1.040]"]
    assert tables[title][1][:3] == ["glibc", "1.257 [0.500–2.500]", "4 (2 skipped)"]
    assert "Counted: time: contention us_per_op" in report
    assert "| snmalloc | external (NAME=PATH) | `/opt/lib/libsnmalloc.so.1` |" in report
    assert "threadheap+profile is threadheap's library with heap profiling on" in report
    assert json.loads((tmp_path / "results.json").read_text())["summary"] == result["summary"]
    md = results.readme_markdown(result)
    assert line in md and report_tables(md)[title] == tables[title]
    # A results.json from before the summary: --readme computes it from the cells.
    del result["summary"]
    assert report_tables(results.readme_markdown(result))[title] == tables[title]


def test_machine_info_records_versions():
    info = results.machine_info({"glibc": None})
    assert info["cores"] == os.cpu_count() and info["kernel"]
    assert set(info["packages"]) == {"libc6", "libmimalloc2.0", "libjemalloc2", "libtcmalloc-minimal4"}
    assert info["versions"]["glibc"]  # the Debian package's version, else the C library's
    lib = harmless_library()
    info = results.machine_info({"threadheap": lib, "threadheap+profile": lib, "snmalloc": Path("/opt/libsn.so")})
    assert info["versions"]["threadheap+profile"] == info["versions"]["threadheap"]
    assert info["libraries"]["snmalloc"] == "/opt/libsn.so" and "snmalloc" not in info["versions"]


# ------------------------------------------------------------------------------------------------ readme


def test_readme_markdown_headline_tables(tmp_path):
    rows = rows_fixture()
    for rep, v in enumerate([0.2, 0.1, 0.3]):
        rows.append({"experiment": "contention", "allocator": "threadheap", "size": 64, "threads": 1,
                     "us_per_op": v, "rep": rep})
    for t, sp in [(1, 1.0), (2, 1.9)]:
        rows.append({"experiment": "threads", "allocator": "threadheap", "size": 1024, "threads": t,
                     "seconds": 1.0, "mpairs_per_s": 10 * sp, "speedup": sp, "rep": 0})
    for mode, total in [("untouched", 0.5), ("touched", 300.0), ("reused", 40.0)]:
        rows.append({"experiment": "large", "allocator": "threadheap", "mode": mode, "size_mb": 32,
                     "total_us_per_mb": total, "alloc_us_per_mb": 0.1, "touch_us_per_mb": total / 2,
                     "free_us_per_mb": 1.0, "sys_us_per_mb": 100.0, "minflt_per_iter": 8192.0, "rep": 0})
    result = result_of(rows, ["contention", "threads", "large", "xthread"])
    (tmp_path / "contention.png").write_bytes(b"\x89PNG")
    md = results.readme_markdown(result, tmp_path)
    assert "Command: `make bench`" in md and "Test CPU 3000" in md
    tables = report_tables(md)
    one = next(t for t in tables if t.startswith("contention:") and ", 1 thread " in t)
    two = next(t for t in tables if t.startswith("contention:") and ", 2 threads" in t)
    assert tables[one] == [["64", "0.200 ×1.00", "–", "–"]]
    assert tables[two] == [["64", "2.00 ×1.00", "0.500 ×0.25", "6.00 ×3.00"]]
    sp = next(t for t in tables if t.startswith("threads:"))
    assert tables[sp] == [["1", "1.00 ×1.00"], ["2", "1.90 ×1.00"]]
    lg = next(t for t in tables if t.startswith("large:"))
    assert tables[lg][0][:2] == ["threadheap", "0.500 ×1.00"] and tables[lg][1][0] == "reused buffer (threadheap)"
    assert "![contention](docs/bench/contention.png)" in md
    assert f"--docs-from {tmp_path} writes them to docs/bench/" in md
    assert "threads.png" not in md  # no such chart in the folder


def test_readme_leaves_out_linked_rows_that_repeat_an_os_baseline():
    rows = [{"experiment": "contention", "allocator": a, "size": 64, "threads": 1, "us_per_op": v, "rep": 0}
            for a, v in [("threadheap", 0.01), ("th:mmap", 5.0), ("os:mmap", 5.0), ("th:private", 0.02)]]
    tables = report_tables(results.readme_markdown(result_of(rows, ["contention"])))
    assert list(tables.values()) == [[["64", "0.0100 ×1.00", "0.0200 ×2.00", "5.00 ×500"]]]


def test_readme_cli(tmp_path, capsys):
    (tmp_path / "results.json").write_text(json.dumps(result_of(rows_fixture())))
    assert bench.main(["--readme", str(tmp_path)]) == 0
    assert "| bytes | threadheap | th:private | glibc |" in capsys.readouterr().out
    assert bench.main(["--readme", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.startswith("threadheap bench: cannot read")


# ------------------------------------------------------------------------------------------------ docs

PNG = b"\x89PNG\r\n\x1a\n"


def docs_run(tmp_path, experiments=("contention", "xthread", "random"), name="run"):
    """A finished run's folder: results.json of summary_rows() (threadheap+profile among them) and the
    contention chart only, so that the docs copy one chart and draw the others."""
    rows = [r for r in summary_rows() if r["experiment"] in experiments]
    result = result_of(rows, experiments)
    result["summary"] = results.run_summary(result["cells"])
    result["meta"]["machine"]["libraries"]["threadheap+profile"] = "/x/libthreadheap.so"
    run = tmp_path / name
    run.mkdir()
    (run / "results.json").write_text(json.dumps(result))
    if "contention" in experiments:
        (run / "contention.png").write_bytes(PNG + b"the run's own chart")
    docs = tmp_path / "docs"
    docs.mkdir(exist_ok=True)
    return run, docs, result


def image_links(md):
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)


def docs_files(docs):
    return {str(p.relative_to(docs)): p.read_bytes() for p in sorted(docs.rglob("*")) if p.is_file()}


def test_docs_from_writes_results_md_and_charts(tmp_path, capsys):
    run, docs, result = docs_run(tmp_path)
    assert bench.main(["--docs-from", str(run), "--docs-dir", str(docs)]) == 0
    assert capsys.readouterr().out == f"docs: {docs}/results.md and 3 charts in {docs}/bench/\n"
    md = (docs / "results.md").read_text()
    # The header: the command, the date, the machine, what the run was.
    assert md.startswith("<!-- Written by threadheap bench from ") and "\n# threadheap benchmark results\n" in md
    assert "Command: `make bench` (2026-01-01T00:00:00" in md
    assert "Test CPU 3000, 2 cores, 4.0 GiB, Linux 6.1.0, glibc 2.36" in md
    assert "The run: 3 experiments (contention, xthread, random); " in md
    # A section per experiment, with its chart and its tables as report.md has them.
    for e in ("contention", "xthread", "random"):
        title = EXPERIMENTS[e].title
        assert f"\n## {title}\n" in md and f"(#{bench_docs.slug(title)})" in md
        assert f"![{e}](bench/{e}.png)" in md
    assert sorted(image_links(md)) == ["bench/contention.png", "bench/random.png", "bench/xthread.png"]
    for link in image_links(md):
        assert (docs / link).read_bytes().startswith(PNG)
    assert (docs / "bench" / "contention.png").read_bytes() == PNG + b"the run's own chart"  # copied, not drawn
    tables = report_tables(md)
    report = results.report_markdown(result, {})
    assert tables == report_tables(report)
    # The summary against threadheap, its threadheap+profile row and the cost of profiling.
    title = bench_summary.summary_table(result["summary"], "threadheap")[0]
    assert tables[title][0][:2] == ["threadheap+profile", "1.030 [1.020–1.040]"]
    assert bench_summary.profile_line(result["summary"], "threadheap") in md
    assert sorted(p.name for p in (docs / "bench").iterdir()) == ["contention.png", "random.png", "xthread.png"]


def test_docs_rewrite_is_idempotent_and_drops_only_its_own_stale_charts(tmp_path, capsys):
    run, docs, _ = docs_run(tmp_path)
    (docs / "bench").mkdir()
    (docs / "bench" / "touch.png").write_bytes(PNG + b"by hand")  # an experiment's name, not the driver's file
    (docs / "bench" / "other.png").write_bytes(PNG)
    (docs / "design.md").write_text("# design\n")
    assert bench.main(["--docs-from", str(run / "results.json"), "--docs-dir", str(docs)]) == 0
    first = docs_files(docs)
    assert bench.main(["--docs-from", str(run), "--docs-dir", str(docs)]) == 0
    assert docs_files(docs) == first
    # A later run without xthread and random: their charts go, the files the driver did not write stay.
    run2, _, _ = docs_run(tmp_path, ("contention",), name="run2")
    capsys.readouterr()
    assert bench.main(["--docs-from", str(run2), "--docs-dir", str(docs)]) == 0
    assert capsys.readouterr().out.endswith(" (deleted, no longer in the run: xthread.png, random.png)\n")
    assert sorted(p.name for p in (docs / "bench").iterdir()) == ["contention.png", "other.png", "touch.png"]
    md = (docs / "results.md").read_text()
    assert image_links(md) == ["bench/contention.png"] and "## Producer/consumer" not in md
    assert (docs / "design.md").read_text() == "# design\n"


def test_docs_after_a_run(tmp_path, monkeypatch, capsys):
    argv = [a for a in fake_profiled_run(tmp_path, monkeypatch) if a != "--smoke"]
    docs = tmp_path / "docs"
    docs.mkdir()
    assert bench.main(argv + ["--docs", "--docs-dir", str(docs)]) == 0
    err = capsys.readouterr().err
    assert f"docs: {docs}/results.md and 1 chart in {docs}/bench/" in err
    md = (docs / "results.md").read_text()
    assert image_links(md) == ["bench/contention.png"]
    assert (docs / "bench" / "contention.png").read_bytes() == (tmp_path / "out" / "contention.png").read_bytes()
    assert "| threadheap+profile | 1.100 [1.100–1.100] | 2 |" in md
    assert "Command: `threadheap bench contention --allocators " in md


@pytest.mark.parametrize("argv, message", [
    (["--docs-from", "{tmp}/nothing"], "{tmp}/nothing: no such run folder"),
    (["--docs-from", "{tmp}/empty"], "{tmp}/empty has no results.json (not a folder written by threadheap bench)"),
    (["--docs-from", "{tmp}/empty/notes.txt"], "{tmp}/empty/notes.txt is not a results.json"),
    (["--docs-from", "{tmp}/run", "--docs-dir", "{tmp}/nodocs"], "{tmp}/nodocs: no such docs folder"),
    (["--docs-from", "{tmp}/run", "contention"], "--docs-from writes the docs of a finished run; experiment "
                                                 "'contention' is for a new run"),
    (["--docs-from", "{tmp}/run", "--reps", "2"], "--docs-from writes the docs of a finished run; --reps is for "
                                                  "a new run"),
    (["--docs-from", "{tmp}/run", "--readme", "{tmp}/run"], "--readme and --docs-from exclude each other"),
    (["--docs-from", "{tmp}/run", "--docs"], "--docs (run, then write the docs) and --docs-from exclude each other"),
    (["--docs", "--smoke"], "--docs publishes a run's results, and a --smoke run's numbers are not results"),
    (["--docs-dir", "{tmp}/docs"], "--docs-dir goes with --docs or --docs-from"),
])
def test_docs_mistakes_are_one_line_errors(argv, message, tmp_path, capsys):
    docs_run(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not json")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"threadheap bench: {message.replace('{tmp}', str(tmp_path))}\n"


def test_docs_leave_a_hand_written_results_md_alone(tmp_path, capsys, monkeypatch):
    run, docs, result = docs_run(tmp_path)
    (docs / "results.md").write_text("# Results, by hand\n")
    for argv in (["--docs-from", str(run), "--docs-dir", str(docs)], ["contention", "--docs", "--docs-dir", str(docs)]):
        assert bench.main(argv) == 2  # --docs: refused before the run starts
        assert capsys.readouterr().err == (f"threadheap bench: {docs}/results.md was not written by threadheap "
                                           "bench (its first line is not the driver's comment); move it away first\n")
    assert (docs / "results.md").read_text() == "# Results, by hand\n" and not (docs / "bench").exists()
    # A smoke run's folder, or an experiment this driver does not know, is refused too.
    for change, message in [(lambda r: r["meta"]["config"].update(smoke=True), "is a --smoke run"),
                            (lambda r: r["meta"]["config"]["experiments"].append("nosuch"),
                             "experiment 'nosuch' is not one of threadheap bench's")]:
        bad = json.loads(json.dumps(result))
        change(bad)
        (run / "results.json").write_text(json.dumps(bad))
        assert bench.main(["--docs-from", str(run), "--docs-dir", str(docs)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("threadheap bench: ") and message in err and err.count("\n") == 1


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("argv, message", [
    (["nosuch"], "unknown experiment 'nosuch'"),
    (["contention", "--allocators", "glibc,hoard"], "unknown allocator 'hoard'"),
    (["contention", "--allocators", ""], "malformed allocator list"),
    (["contention", "--threads", "1,x"], "malformed threads list"),
    (["contention", "--threads", "0"], "threads must be positive"),
    (["contention", "--sizes", ""], "malformed sizes list"),
    (["contention", "--sizes", "16,,32"], "malformed sizes list"),
    (["contention", "--reps", "zero"], "malformed --reps"),
    (["contention", "--reps", "0"], "--reps must be at least 1"),
    (["contention", "--full", "--smoke"], "exclude each other"),
    (["contention", "--allocators", "glibc,snmalloc=/nonexistent/libsnmalloc.so"],
     "allocator 'snmalloc': /nonexistent/libsnmalloc.so not found"),
    (["contention", "--allocators", "glibc,snm@lloc=/lib/x.so"], "malformed allocator 'snm@lloc=/lib/x.so'"),
])
def test_bad_input_is_one_line_error(argv, message, capsys, tmp_path):
    assert bench.main(argv + ["--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("threadheap bench: ") and message in err and err.count("\n") == 1


def test_usage_error_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["contention", "--no-such-option"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("threadheap bench: unrecognized arguments") and err.count("\n") == 1


def test_unwritable_output_folder(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert bench.main(["contention", "--smoke", "--allocators", "glibc", "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("threadheap bench: cannot write to output folder") and err.count("\n") == 1


def test_cli_dispatch_unknown_command(capsys):
    from threadheap import cli

    assert cli.main(["nosuch"]) == 2
    assert "unknown command" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ fake workloads

FAKE_CONTENTION = r"""#!/bin/sh
# A stand-in for bench/contention: 2.0 us/op under glibc, 1.0 with a preload, 50 for --method mmap.
echo "$LD_PRELOAD" >> "$FAKE_LOG.contention"
v=2.0; [ -n "$LD_PRELOAD" ] && v=1.0
m=malloc; case "$*" in *"--method mmap"*) m=mmap; v=50;; esac
for s in 16 64; do
  echo "{\"experiment\":\"contention\",\"method\":\"$m\",\"size\":$s,\"threads\":1,\"pairs\":1024,\"us_per_op\":$v}"
done
"""

FAKE_HEAPS = r"""#!/bin/sh
# A stand-in for bench/contention_heaps (links threadheap): one row per method of --methods and size; logs
# its preload and arguments.
echo "preload=[$LD_PRELOAD] args=[$*]" >> "$FAKE_LOG.heaps"
n=$(wc -l < "$FAKE_LOG.heaps")
methods=malloc,new,heap_shared,heap_private,heap_private_noserialize,mmap
while [ $# -gt 0 ]; do [ "$1" = --methods ] && methods=$2; shift; done
for m in $(echo "$methods" | tr , ' '); do
  for s in 16 64; do
    echo "{\"experiment\":\"contention\",\"method\":\"$m\",\"size\":$s,\"threads\":1,\"pairs\":1024,\"us_per_op\":0.$n}"
  done
done
"""


def harmless_library():
    """A real shared library whose preload changes nothing, to stand in for libthreadheap.so."""
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"):
        p = Path(d) / "libm.so.6"
        if p.exists():
            return p
    pytest.skip("no libm.so.6 to preload")


def test_linked_workload_rows_join_contention(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in [("contention", FAKE_CONTENTION), ("contention_heaps", FAKE_HEAPS)]:
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    log = tmp_path / "log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    out = tmp_path / "out"
    assert bench.main(["contention", "--smoke", "--allocators", "threadheap,glibc", "--lib", str(harmless_library()),
                       "--bin-dir", str(bindir), "--reps", "2", "--out", str(out)]) == 0
    # Once per repetition, with no preload, on the experiment's arguments (not --method).
    heaps_log = (tmp_path / "log.heaps").read_text().splitlines()
    assert len(heaps_log) == 2 and all(line.startswith("preload=[] args=[--smoke --threads ") and
                                       line.endswith(" --methods malloc,new,heap_shared,heap_private,"
                                                     "heap_private_noserialize]") for line in heaps_log)
    assert len((tmp_path / "log.contention").read_text().splitlines()) == 2 * 3  # threadheap, glibc, os
    data = json.loads((out / "results.json").read_text())
    allocs = {c["allocator"] for c in data["cells"]}
    # th:mmap is not asked for: os:mmap measures it.
    assert allocs == {"threadheap", "glibc", "os:mmap", "th:malloc", "th:new", "th:shared", "th:private",
                      "th:private-noserialize"}
    c = cell(data["cells"], "contention", "th:private-noserialize")
    st = c["metrics"]["us_per_op"]
    assert (st["min"], st["max"], st["n"]) == (0.1, 0.2, 2) and st["median"] == pytest.approx(0.15)
    assert st["ratio"] == pytest.approx(0.15)  # against threadheap's 1.0
    assert cell(data["cells"], "contention", "glibc")["metrics"]["us_per_op"]["ratio"] == 2.0
    check_outputs_agree(out, ["contention"])
    assert set(data["meta"]["experiment_seconds"]) == {"contention"}
    report = (out / "report.md").read_text()
    assert "**contention: th:private-noserialize, µs per alloc/free pair" in report
    md = results.readme_markdown(data, out)
    assert "| bytes | threadheap | th:malloc | th:new | th:shared | th:private | th:private-noserialize | glibc " \
           "| os:mmap |" in md


FAKE_PROFILED = r"""#!/bin/sh
# A stand-in for bench/contention that logs its preload and profile and, like libthreadheap, writes the
# profile at exit (unless FAKE_NO_PROFILE): 1.0 us/op with a preload, 1.1 when profiled, 2.0 under glibc.
echo "preload=[$LD_PRELOAD] profile=[$THREADHEAP_PROFILE]" >> "$FAKE_LOG"
v=1.0; [ -z "$LD_PRELOAD" ] && v=2.0
if [ -n "$THREADHEAP_PROFILE" ]; then v=1.1; [ -z "$FAKE_NO_PROFILE" ] && echo profile > "$THREADHEAP_PROFILE"; fi
m=malloc; case "$*" in *"--method mmap"*) m=mmap; v=50;; esac
for s in 16 64; do
  echo "{\"experiment\":\"contention\",\"method\":\"$m\",\"size\":$s,\"threads\":1,\"pairs\":1024,\"us_per_op\":$v}"
done
"""


def fake_profiled_run(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "contention").write_text(FAKE_PROFILED)
    (bindir / "contention").chmod(0o755)
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("THREADHEAP_PROFILE", str(tmp_path / "inherited.pb.gz"))  # not for the other runs
    lib = harmless_library()
    ext = tmp_path / "libsnmalloc.so"
    ext.symlink_to(lib)
    return ["contention", "--smoke", "--allocators", f"threadheap,threadheap+profile,glibc,snmalloc={ext}",
            "--lib", str(lib), "--bin-dir", str(bindir), "--reps", "2", "--out", str(tmp_path / "out")]


def test_threadheap_profile_and_external_allocator_run(tmp_path, monkeypatch, capsys):
    assert bench.main(fake_profiled_run(tmp_path, monkeypatch)) == 0
    lib = harmless_library().resolve()
    log = (tmp_path / "log").read_text().splitlines()
    assert len(log) == 2 * 5  # threadheap, threadheap+profile, glibc, snmalloc, os:mmap
    profiled = [line for line in log if "profile=[]" not in line]
    # Two runs profiled, each to a file of its own, with threadheap's library; the files are gone after.
    assert len(profiled) == 2 and all(line.startswith(f"preload=[{lib}] profile=[/") for line in profiled)
    paths = [Path(re.search(r"profile=\[(.*)\]", line).group(1)) for line in profiled]
    assert len(set(paths)) == 2 and not any(p.exists() or p.parent.exists() for p in paths)
    assert not (tmp_path / "inherited.pb.gz").exists()
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["meta"]["config"]["allocators"] == ["threadheap", "threadheap+profile", "glibc", "snmalloc"]
    assert data["meta"]["config"]["external"] == {"snmalloc": str(tmp_path / "libsnmalloc.so")}
    assert data["meta"]["machine"]["libraries"]["snmalloc"] == str(lib)  # the resolved file
    by = {r["allocator"]: r for r in data["summary"]}
    assert set(by) == {"threadheap+profile", "glibc", "snmalloc"}
    assert by["threadheap+profile"]["time"]["geomean"] == pytest.approx(1.1)
    assert by["threadheap+profile"]["time"]["n"] == 2
    assert by["glibc"]["time"]["geomean"] == pytest.approx(2.0) and by["snmalloc"]["time"]["geomean"] == 1.0
    out = capsys.readouterr().out
    assert out.index("contention: threadheap+profile,") < out.index("summary: each allocator ÷ threadheap")
    assert "threadheap+profile: heap profiling on at the default rate, time ÷ threadheap, geomean 1.100 " \
           "(1.100–1.100) over 2 cells; over the limit" in out
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"| snmalloc | external (NAME=PATH) | `{lib}` |" in report
    check_outputs_agree(tmp_path / "out", ["contention"])


def test_threadheap_profile_run_that_writes_no_profile_is_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_NO_PROFILE", "1")
    assert bench.main(fake_profiled_run(tmp_path, monkeypatch)) == 2
    err = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"threadheap bench: contention under threadheap\+profile: .* wrote no heap profile to "
                        r"/.*heap\.pb\.gz", err[-1])


def test_failing_workload_is_one_line_error(tmp_path, capsys):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "contention").write_text("#!/bin/sh\necho 'contention: out of luck' >&2\nexit 3\n")
    (bindir / "contention").chmod(0o755)
    assert bench.main(["contention", "--allocators", "glibc", "--bin-dir", str(bindir), "--out",
                       str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "threadheap bench: contention under glibc failed (exit 3): contention: out of luck"


# ------------------------------------------------------------------------------------------------ end to end


def test_end_to_end_contention_smoke(tmp_path):
    """`threadheap bench contention --smoke` with glibc and threadheap, through the build's launcher."""
    lib, bindir = BUILD / "libthreadheap.so", BUILD / "bin"
    if not (lib.exists() and (bindir / "contention").exists() and (bindir / "threadheap").exists()):
        msg = f"needs a build with {lib}, {bindir}/contention and {bindir}/threadheap"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("TH_LIB", "TH_BIN_DIR", "TH_BENCH_COMMAND")}
    proc = subprocess.run([str(bindir / "threadheap"), "bench", "contention", "--smoke",
                           "--allocators", "glibc,threadheap", "--reps", "2", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr
    data, rows, report = check_outputs_agree(out, ["contention"])
    allocs = {c["allocator"] for c in data["cells"]}
    assert {"glibc", "threadheap", "os:mmap"} <= allocs
    # th:* rows come only from the explicit-heaps workload, when it has been built.
    assert all(a.startswith("th:") for a in allocs - {"glibc", "threadheap", "os:mmap"})
    assert bool(allocs - {"glibc", "threadheap", "os:mmap"}) == (bindir / "contention_heaps").exists()
    assert data["baseline"] == "threadheap"
    assert data["meta"]["command"] == "threadheap bench contention --smoke --allocators glibc,threadheap --reps 2 " \
                                      f"--out {out}"
    assert all(c["metrics"]["us_per_op"]["n"] == 2 for c in data["cells"])
    # The seed's grid: 1 B..64 KiB by 1..4 threads (and more threads on a machine with more cores).
    grid = {(c["params"]["size"], c["params"]["threads"]) for c in data["cells"] if c["allocator"] == "glibc"}
    assert {(1 << i, t) for i in range(17) for t in range(1, 5)} <= grid
    # The raw rows are the workload's own lines, two repetitions of each cell under each allocator.
    assert len(data["raw"]) == 2 * len(data["cells"])
    assert "threadheap" in proc.stdout and "×" in proc.stdout
