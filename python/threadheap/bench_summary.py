"""The summary of a `threadheap bench` run: each allocator against threadheap over the whole run.

For every allocator under LD_PRELOAD (not the th:* and os:* rows, which only some experiments have), the
geometric mean over all cells of the cell's ratio to the baseline (threadheap), with its range, the number of
cells and the worst cell, in two columns that are never mixed:

  - time: the table metrics marked summary="time" in bench_experiments.py, times and throughputs; a
    throughput's ratio is inverted, so that above 1 always means worse than threadheap;
  - memory: the table metrics marked "memory", the RSS ones.

Metrics derived from another of the same run are not counted, so that no run counts twice: speed-ups and the
scaling ratio (each allocator against itself), the parts of large's total, touch's kernel time, fault and
context-switch counts, and xthread's RSS overhead (a difference, near zero). A cell whose baseline median is
missing or zero, or whose own is zero, is skipped and counted as skipped. Every cell weighs the same, so an
experiment with many cells (contention) weighs more.

The threadheap+profile row is the cost of heap profiling: threadheap's library with THREADHEAP_PROFILE set.
Standard library only.
"""

import math

from .bench_experiments import BASELINE, EXPERIMENTS, PROFILED

KINDS = ("time", "memory")
# The requirement on heap profiling: at the default rate, `make bench`'s time geomean rises by at most 3%.
PROFILE_LIMIT = 1.03


def counted_metrics(exp, kind):
    return [n for n in exp.table_metrics if exp.metric(n).summary == kind]


def cell_ratios(cells, allocator, kind):
    """[(ratio, cell, metric)] of allocator's cells that kind counts, each ratio turned so that above 1 is
    worse than the baseline; and the number of cells skipped. Uses the ratio aggregation put in each cell."""
    out, skipped = [], 0
    for c in cells:
        exp = EXPERIMENTS.get(c["experiment"])
        if c["allocator"] != allocator or exp is None:
            continue
        for name in counted_metrics(exp, kind):
            st = c["metrics"].get(name)
            if st is None:
                continue
            r = st.get("ratio")
            if not r or r < 0:  # None: the baseline's median missing or zero; 0: this cell's is zero
                skipped += 1
                continue
            out.append((r if exp.metric(name).lower_is_better else 1 / r, c, name))
    return out, skipped


def geomean_stats(ratios, skipped):
    if not ratios:
        return {"geomean": None, "n": 0, "skipped": skipped}
    worst, c, metric = max(ratios, key=lambda t: t[0])
    return {"geomean": math.exp(math.fsum(math.log(r) for r, _, _ in ratios) / len(ratios)),
            "min": min(r for r, _, _ in ratios), "max": worst, "n": len(ratios), "skipped": skipped,
            "worst": {"experiment": c["experiment"], "params": c["params"], "metric": metric, "ratio": worst}}


def summarize(cells, base, allocators):
    """One row per allocator other than base, in the given order: {"allocator", "time", "memory"}."""
    return [dict(allocator=a, **{k: geomean_stats(*cell_ratios(cells, a, k)) for k in KINDS})
            for a in allocators if a != base]


# ------------------------------------------------------------------------------------------------ text


def _geomean(st):
    if not st or st.get("geomean") is None:
        return "–"
    return f"{st['geomean']:.3f} [{st['min']:.3f}–{st['max']:.3f}]"


def _count(st):
    if not st:
        return "0"
    return f"{st['n']}" + (f" ({st['skipped']} skipped)" if st.get("skipped") else "")


def _worst(st):
    w = (st or {}).get("worst")
    if not w:
        return "–"
    params = " ".join(f"{k}={v}" for k, v in w["params"].items())
    return f"{w['experiment']} {params} {w['metric']} ×{w['ratio']:.2f}"


def summary_table(summary, base):
    """The summary as (title, header, rows) of strings."""
    title = (f"summary: each allocator ÷ {base}, geometric mean over every cell [min–max] (above 1 = worse "
             f"than {base}; time: times and inverted throughputs; memory: RSS)")
    header = ["allocator", f"time ÷ {base}", "cells", "worst cell", f"memory ÷ {base}", "cells"]
    rows = [[r["allocator"], _geomean(r["time"]), _count(r["time"]), _worst(r["time"]), _geomean(r["memory"]),
             _count(r["memory"])] for r in summary]
    return title, header, rows


def profile_line(summary, base, rate=None):
    """What heap profiling cost, in one sentence, from the threadheap+profile row; None without one."""
    row = next((r for r in summary if r["allocator"] == PROFILED), None)
    if base != BASELINE or row is None or row["time"]["geomean"] is None:
        return None
    t = row["time"]
    line = (f"{PROFILED}: heap profiling on at {f'THREADHEAP_PROFILE_RATE={rate}' if rate else 'the default rate'}, "
            f"time ÷ {base}, geomean {t['geomean']:.3f} ({t['min']:.3f}–{t['max']:.3f}) over {t['n']} cells")
    if not rate:
        verdict = "within" if t["geomean"] <= PROFILE_LIMIT else "over"
        line += f"; {verdict} the limit of {PROFILE_LIMIT:.2f} (at most 3% slower at the default rate)"
    return line


def counted_text():
    """Which metrics the summary counts, from the experiments' table."""
    parts = []
    for kind in KINDS:
        names = [f"{e.name} {n}" + ("" if e.metric(n).lower_is_better else " (inverted)")
                 for e in EXPERIMENTS.values() for n in counted_metrics(e, kind)]
        parts.append(f"{kind}: {', '.join(names)}")
    return ("Counted: " + "; ".join(parts) + ". Not counted, being derived from these or not a cost: speed-ups, "
            "scaling, parts of a total, fault and context-switch counts, RSS overhead. Cells whose baseline "
            "value is missing or zero are skipped.")
