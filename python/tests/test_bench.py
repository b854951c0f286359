"""Tests of the `threadheap bench` driver: parsing, aggregation, compare, outputs, and one end-to-end run.

The end-to-end test needs the built workloads and library (TH_BUILD_DIR, default build/); outside CI it is
skipped when they are missing, in CI (CI set) it fails instead, so a broken build cannot pass unseen.
"""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from threadheap import bench
from threadheap.bench import BenchError

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
    for bad in ["", "1,,2", "a", "1,-2", "0"]:
        with pytest.raises(BenchError):
            bench.parse_int_list(bad, "threads")


def test_parse_name_list():
    assert bench.parse_name_list("glibc,threadheap,glibc", bench.ALLOCATORS, "allocator") == ["glibc", "threadheap"]
    with pytest.raises(BenchError, match="unknown allocator 'ptmalloc9'"):
        bench.parse_name_list("glibc,ptmalloc9", bench.ALLOCATORS, "allocator")


def test_parse_output_ignores_other_lines():
    out = 'hello\n{"experiment":"contention","size":1,"threads":1,"us_per_op":0.5}\n\n'
    assert bench.parse_output(out) == [{"experiment": "contention", "size": 1, "threads": 1, "us_per_op": 0.5}]
    with pytest.raises(BenchError):
        bench.parse_output("{not json\n")


def test_normalize_row_makes_os_baselines_allocators():
    r = bench.normalize_row({"experiment": "contention", "method": "mmap", "size": 8}, "os")
    assert r["allocator"] == "os:mmap" and "method" not in r
    r = bench.normalize_row({"experiment": "contention", "method": "malloc", "size": 8}, "glibc")
    assert r["allocator"] == "glibc"


def test_plan_interleaves_and_rotates():
    cfg = bench.make_config(bench.build_parser().parse_args(["contention", "random", "--threads", "1,2"]))
    groups = bench.plan_jobs(cfg, ["threadheap", "glibc"])
    # contention: one group (threads as a list) with the OS baseline; random: one group per thread count.
    assert [len(g) for g in groups] == [3, 2, 2]
    assert [j.allocator for j in groups[0]] == ["threadheap", "glibc", "os"]
    assert groups[1][0].args[-2:] == ["--threads", "1"]
    assert [j.allocator for j in bench.rotated(groups[0], 1)] == ["glibc", "os", "threadheap"]


# ------------------------------------------------------------------------------------------------ aggregation


def rows_fixture():
    rows = []
    for rep, (th, gl) in enumerate([(1.0, 3.0), (2.0, 6.0), (4.0, 9.0)]):
        rows.append({"experiment": "contention", "allocator": "threadheap", "size": 64, "threads": 2,
                     "us_per_op": th, "rep": rep})
        rows.append({"experiment": "contention", "allocator": "glibc", "size": 64, "threads": 2,
                     "us_per_op": gl, "rep": rep})
    rows.append({"experiment": "xthread", "allocator": "threadheap", "live_mb": 64, "mblocks_per_s": 10.0,
                 "overhead": 0.1, "peak_rss_kb": 1000, "end_rss_kb": 10, "rep": 0})
    rows.append({"experiment": "xthread", "allocator": "glibc", "live_mb": 64, "mblocks_per_s": 5.0,
                 "overhead": 0.2, "peak_rss_kb": 2000, "end_rss_kb": 20, "rep": 0})
    return rows


def cell(cells, exp, alloc):
    return next(c for c in cells if c["experiment"] == exp and c["allocator"] == alloc)


def test_aggregate_median_range_ratio():
    cells = bench.aggregate(rows_fixture())
    th = cell(cells, "contention", "threadheap")["metrics"]["us_per_op"]
    gl = cell(cells, "contention", "glibc")["metrics"]["us_per_op"]
    assert (th["median"], th["min"], th["max"], th["n"]) == (2.0, 1.0, 4.0, 3)
    assert (gl["median"], gl["min"], gl["max"]) == (6.0, 3.0, 9.0)
    assert th["ratio"] == 1.0 and gl["ratio"] == 3.0
    assert cell(cells, "xthread", "glibc")["metrics"]["mblocks_per_s"]["ratio"] == 0.5
    assert bench.baseline_of(cells) == "threadheap"


def test_aggregate_without_threadheap_uses_first_allocator():
    rows = [r for r in rows_fixture() if r["allocator"] != "threadheap"]
    cells = bench.aggregate(rows)
    assert bench.baseline_of(cells) == "glibc"
    assert cell(cells, "contention", "glibc")["metrics"]["us_per_op"]["ratio"] == 1.0


def test_tables_show_median_range_and_ratio():
    cells = bench.aggregate(rows_fixture())
    tables = bench.tables_for(bench.EXPERIMENTS["contention"], cells, "us_per_op")
    assert len(tables) == 2  # seed layout: one table per allocator
    title, header, rows = tables[1]
    assert "glibc" in title and header == ["bytes", "2 threads"]
    assert rows == [["64", "6.00 [3.00–9.00] ×3.00"]]
    title, header, rows = bench.tables_for(bench.EXPERIMENTS["xthread"], cells, "mblocks_per_s")[0]
    assert header == ["live_mb", "threadheap", "glibc"] and rows[0][2].endswith("×0.50")


# ------------------------------------------------------------------------------------------------ compare


def result_of(rows):
    cells = bench.aggregate(rows)
    return {"meta": {}, "baseline": bench.baseline_of(cells), "raw": rows, "cells": cells}


def test_compare_per_cell_ratio():
    a = result_of(rows_fixture())
    faster = [dict(r, us_per_op=r["us_per_op"] / 2) if r["experiment"] == "contention" else r for r in rows_fixture()]
    b = result_of(faster)
    out = bench.compare(a, b)
    byk = {(r["experiment"], r["allocator"], r["metric"]): r for r in out}
    assert byk[("contention", "threadheap", "us_per_op")]["ratio"] == 0.5
    assert byk[("xthread", "glibc", "mblocks_per_s")]["ratio"] == 1.0


def test_compare_cli(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(result_of(rows_fixture())))
    b.write_text(json.dumps(result_of(rows_fixture())))
    assert bench.main(["--compare", str(a), str(b)]) == 0
    assert "B/A" in capsys.readouterr().out
    assert bench.main(["--compare", str(a), str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.startswith("threadheap bench: cannot read")


# ------------------------------------------------------------------------------------------------ outputs


def check_outputs_agree(out, experiments):
    data = json.loads((out / "results.json").read_text())
    rows = bench.read_csv(out / "results.csv")
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
    report = (out / "report.md").read_text()
    for e in experiments:
        png = out / f"{e}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({e}.png)" in report
    for a in {c["allocator"] for c in data["cells"]}:
        assert a in report
    assert "CPU" in report and "glibc" in report and "kernel" in report
    return data, rows, report


def test_write_outputs_on_fixed_results(tmp_path):
    rows = rows_fixture()
    cells = bench.aggregate(rows)
    result = {"meta": {"started": "2026-01-01T00:00:00", "seconds": 1.0, "command": "threadheap bench",
                       "machine": bench.machine_info({"threadheap": "/x/libthreadheap.so", "glibc": None}),
                       "config": {"experiments": ["contention", "xthread"], "reps": 3}},
              "baseline": bench.baseline_of(cells), "raw": rows, "cells": cells}
    charts = bench.write_outputs(tmp_path, result)
    assert set(charts) == {"contention", "xthread"}
    data, csv_rows, report = check_outputs_agree(tmp_path, ["contention", "xthread"])
    assert "6.00 [3.00–9.00] ×3.00" in report


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("argv, message", [
    (["nosuch"], "unknown experiment 'nosuch'"),
    (["contention", "--allocators", "glibc,hoard"], "unknown allocator 'hoard'"),
    (["contention", "--threads", "1,x"], "malformed threads list"),
    (["contention", "--sizes", ""], "malformed sizes list"),
    (["contention", "--reps", "zero"], "malformed --reps"),
])
def test_bad_input_is_one_line_error(argv, message, capsys, tmp_path):
    assert bench.main(argv + ["--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("threadheap bench: ") and message in err and err.count("\n") == 1


def test_unwritable_output_folder(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert bench.main(["contention", "--smoke", "--allocators", "glibc", "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("threadheap bench: cannot write to output folder")


def test_cli_dispatch_unknown_command(capsys):
    from threadheap import cli

    assert cli.main(["nosuch"]) == 2
    assert "unknown command" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ end to end


def test_end_to_end_contention_smoke(tmp_path):
    lib, bindir = BUILD / "libthreadheap.so", BUILD / "bin"
    if not (lib.exists() and (bindir / "contention").exists()):
        msg = f"needs a build with {lib} and {bindir}/contention"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), TH_LIB=str(lib), TH_BIN_DIR=str(bindir))
    proc = subprocess.run([sys.executable, "-m", "threadheap", "bench", "contention", "--smoke",
                           "--allocators", "glibc,threadheap", "--reps", "2", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr
    data, rows, report = check_outputs_agree(out, ["contention"])
    assert {c["allocator"] for c in data["cells"]} == {"glibc", "threadheap", "os:mmap"}
    assert data["baseline"] == "threadheap"
    assert all(c["metrics"]["us_per_op"]["n"] == 2 for c in data["cells"])
    # The raw rows are the workload's own lines, two repetitions of each cell under each allocator.
    assert len(data["raw"]) == 2 * len(data["cells"])
    assert "threadheap" in proc.stdout and "×" in proc.stdout
