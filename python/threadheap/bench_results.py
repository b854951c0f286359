"""Results of `threadheap bench`: aggregation into cells, tables, charts, report.md, --compare and --readme.

A cell is one (experiment, allocator, parameters) with every metric reduced over the repetitions to its
median, min, max and n, plus the ratio of its median to the baseline allocator's (threadheap) median. The
run's summary (bench_summary.py: each allocator against threadheap over all cells) follows the tables on the
console and opens report.md and the --readme output.
matplotlib and rich are imported inside the functions that draw or print, so everything else here works
with the standard library alone.
"""

import csv
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
from pathlib import Path

from .bench_experiments import (ALLOCATORS, BASELINE, EXPERIMENTS, LINKED_PREFIX, OS_PREFIX, PACKAGES, PROFILED,
                                BenchError)
from .bench_summary import counted_text, profile_line, summarize, summary_table

REPO = Path(__file__).resolve().parents[2]


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
    """threadheap and threadheap+profile, threadheap's explicit-heap methods (th:*), the other allocators in
    ALLOCATORS order, the external ones (--allocators NAME=PATH) by name, then the OS baselines (os:*); th:*
    and os:* keep the order in which they first appear."""
    names = list(dict.fromkeys(names))
    linked = [n for n in names if n.startswith(LINKED_PREFIX)]
    os_rows = [n for n in names if n.startswith(OS_PREFIX)]
    known = [a for a in ALLOCATORS if a in names]
    head = [a for a in known if a in (BASELINE, PROFILED)]
    external = sorted(n for n in names if is_external(n))
    return head + linked + [a for a in known if a not in head] + external + os_rows


def is_external(name):
    """An allocator given as NAME=PATH: neither built in nor a th:* or os:* row."""
    return name not in ALLOCATORS and not name.startswith((LINKED_PREFIX, OS_PREFIX))


def run_summary(cells):
    """The summary of a run (bench_summary.py): its allocators under LD_PRELOAD (and glibc) against the
    baseline, in table order."""
    names = order_allocators(c["allocator"] for c in cells)
    return summarize(cells, baseline_of(cells), [a for a in names if not a.startswith((LINKED_PREFIX, OS_PREFIX))])


def summary_of(result):
    """The summary results.json holds or, in a file from before it had one, the one its cells give."""
    return result["summary"] if "summary" in result else run_summary(result["cells"])


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
    return f"{v:#.3g}"  # 0.500, 0.0123: three significant digits, zeros kept


def fmt_stat(st, with_range=True, with_ratio=True):
    if not st:
        return "–"
    s = fmt(st["median"])
    if with_range and st.get("n", 1) > 1:
        s += f" [{fmt(st['min'])}–{fmt(st['max'])}]"
    if with_ratio and st.get("ratio") is not None:
        s += " " + fmt_ratio(st["ratio"])
    return s


def fmt_ratio(r):
    """×0.85, ×3.20, ×26.3, ×816: two decimals where they matter, fewer for big ratios."""
    return f"×{r:.2f}" if r < 10 else f"×{r:.1f}" if r < 100 else f"×{r:,.0f}"


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
    for name in experiments or EXPERIMENTS:
        exp = EXPERIMENTS[name]
        for metric in exp.table_metrics:
            for title, header, rows in tables_for(exp, cells, metric):
                print_table(console, title, header, rows)


def print_table(console, title, header, rows):
    from rich.table import Table
    from rich.text import Text

    # Text, not markup strings: "[min–max]" must print as it is, not be read as a style tag.
    t = Table(title=Text(title), title_justify="left")
    for i, h in enumerate(header):
        t.add_column(Text(h), justify="left" if i == 0 else "right", no_wrap=True)
    for r in rows:
        t.add_row(*(Text(c) for c in r))
    console.print(t)


def print_summary(result, console):
    """The summary table, then the heap-profiling line when the run has threadheap+profile."""
    summary = summary_of(result)
    if not summary:
        return
    print_table(console, *summary_table(summary, result["baseline"]))
    line = profile_line(summary, result["baseline"], result["meta"]["config"].get("profile_rate"))
    if line:
        console.print(line, markup=False, highlight=False)


def summary_markdown(result):
    """The summary for report.md and --readme: the heap-profiling line, the table and what it counts."""
    summary = summary_of(result)
    if not summary:
        return []
    line = profile_line(summary, result["baseline"], result.get("meta", {}).get("config", {}).get("profile_rate"))
    title, header, rows = summary_table(summary, result["baseline"])
    return ([f"{line}.", ""] if line else []) + [f"**{title}**", "", markdown_table(header, rows), "",
                                                      counted_text(), ""]


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
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["memory_gib"] = round(int(line.split()[1]) / (1 << 20), 1)
                break
    except (OSError, ValueError, IndexError):
        pass
    for name, pkg in PACKAGES.items():
        info["packages"][pkg] = dpkg_version(pkg)
    info["threadheap_version"] = header_version()
    info["threadheap_commit"] = git_commit()
    info["libraries"] = {k: (str(v) if v else "(system malloc)") for k, v in (libs or {}).items()}
    # One version string per allocator: the Debian package's for glibc and the peers, the header's and the
    # commit's for threadheap and threadheap+profile; none for an external library.
    info["versions"] = {}
    for name in (libs or {}):
        if name in (BASELINE, PROFILED):
            info["versions"][name] = " ".join(v for v in (info["threadheap_version"], info["threadheap_commit"]) if v)
        elif name in PACKAGES:
            info["versions"][name] = info["packages"][PACKAGES[name]] or (info["glibc"] if name == "glibc" else None)
    return info


def git_commit():
    """The source tree's commit, '+changes' when it has uncommitted changes; None outside git. Read-only:
    --no-optional-locks keeps git status from refreshing the index."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=20)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "--no-optional-locks", "-C", str(REPO), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True, timeout=20)
        return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


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
    from matplotlib.ticker import FuncFormatter

    mine = [c for c in cells if c["experiment"] == exp.name]
    if not mine:
        return False
    panels = []
    for p in exp.panels:
        sel = [c for c in mine if p.metric in c["metrics"] and all(c["params"].get(k) == v for k, v in p.where.items())]
        if not sel:
            continue
        facets = sorted({c["params"].get(p.facet) for c in sel}, key=_sort_key) if p.facet else [None]
        if p.facet_order:
            facets = [f for f in p.facet_order if f in facets] + [f for f in facets if f not in p.facet_order]
        panels.append((p, sel, facets))
    if not panels:
        return False
    # Facets wrap at three columns (four make a 2 x 2 grid), so a chart stays readable at README width.
    # Panels without facets (one subplot each) share rows instead.
    slots = []  # (row, col, panel, cells, facet value)
    if all(len(f) == 1 for _, _, f in panels):
        ncols = _wrap(len(panels))
        slots = [(i // ncols, i % ncols, p, sel, f[0]) for i, (p, sel, f) in enumerate(panels)]
    else:
        ncols = max(_wrap(len(f)) for _, _, f in panels)
        for p, sel, facets in panels:
            first = slots[-1][0] + 1 if slots else 0
            slots += [(first + i // ncols, i % ncols, p, sel, fv) for i, fv in enumerate(facets)]
    nrows = slots[-1][0] + 1
    # Constrained layout makes room for the titles and for the legend outside the plots (matplotlib 3.7+).
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols + 1.8, 3.2 * nrows + 0.4), squeeze=False,
                             layout="constrained")
    used = {(r, c) for r, c, *_ in slots}
    facets_of = {id(p): facets for p, _, facets in panels}
    for r in range(nrows):
        for c in range(ncols):
            if (r, c) not in used:
                axes[r][c].axis("off")
    allocs = order_allocators(c["allocator"] for c in mine)
    colors, styles, markers = chart_styles(allocs)
    for row, col, p, sel, fv in slots:
        m = exp.metric(p.metric)
        ax = axes[row][col]
        fsel = [c for c in sel if p.facet is None or c["params"].get(p.facet) == fv]
        if p.stack:
            _stacked_bars(ax, exp, p, fsel, allocs, legend=fv == facets_of[id(p)][0])
        elif p.x:
            for a in allocs:
                pts = sorted(((c["params"][p.x], c["metrics"][p.metric]) for c in fsel if c["allocator"] == a),
                             key=lambda t: _sort_key(t[0]))
                if not pts:
                    continue
                xs = [t[0] for t in pts]
                ys = [t[1]["median"] for t in pts]
                lo = [t[1]["median"] - t[1]["min"] for t in pts]
                hi = [t[1]["max"] - t[1]["median"] for t in pts]
                ax.errorbar(xs, ys, yerr=[lo, hi], label=a, color=colors[a], ls=styles[a], marker=markers[a], ms=3,
                            capsize=2, lw=1.2)
            ax.set_xlabel(p.x)
            if p.logx:
                ax.set_xscale("log", base=2)
                if p.x == "size":
                    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _bytes_label(v)))
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
                           yerr=[[st["median"] - st["min"]], [st["max"] - st["median"]]], capsize=2,
                           hatch="//" if a == PROFILED else None)
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))])
            ax.set_xticklabels([", ".join(f"{q}={v}" for q, v in zip(exp.params, k)) for k in keys], fontsize=8)
        if p.logy:
            ax.set_yscale("log")
        ax.set_ylabel(m.label)
        ax.set_title(f"{p.facet}={fv}" if p.facet else m.label, fontsize=9)
        ax.grid(True, alpha=0.3)
    # One legend for the figure, right of the plots, from the subplot that has the most allocators (stacked
    # bars carry their own legend of parts).
    line_axes = [axes[r][c] for r, c, p, *_ in slots if not p.stack] or [axes[0][0]]
    handles, labels = max((ax.get_legend_handles_labels() for ax in line_axes), key=lambda hl: len(hl[1]))
    fig.legend(handles, labels, loc="outside right center", fontsize=8)
    fig.suptitle(exp.title, fontsize=11)
    fig.savefig(path, dpi=90, pil_kwargs={"optimize": True})  # small enough to commit for the README
    plt.close(fig)
    return True


def chart_styles(allocs):
    """Colour, line style and marker per row, the same in every chart of a run. The allocators of ALLOCATORS
    have fixed colours, threadheap+profile threadheap's own (dash-dotted lines, hatched bars); external
    allocators (square markers) take the next colours, by name (they run in every experiment, so every chart
    of a run has the same ones); th:* (dashed) and os:* rows (dotted) those after. Ten colours from tab10,
    then tab20's light ones."""
    from matplotlib import colormaps

    ordered = order_allocators(allocs)
    slots = [a for a in ALLOCATORS if a != PROFILED] + [a for a in ordered if is_external(a)]
    slots += [a for a in ordered if a not in slots and a != PROFILED]
    tab10, tab20 = colormaps["tab10"], colormaps["tab20"]
    colors = {a: tab10(i) if i < 10 else tab20((2 * (i - 10) + 1) % 20) for i, a in enumerate(slots)}
    colors[PROFILED] = colors[BASELINE]
    styles = {a: "-." if a == PROFILED else "--" if a.startswith(LINKED_PREFIX) else
              ":" if a.startswith(OS_PREFIX) else "-" for a in ordered}
    markers = {a: "s" if is_external(a) else "o" for a in ordered}
    return colors, styles, markers


def _stacked_bars(ax, exp, p, cells, allocs, legend=True):
    """One bar per allocator split into the metrics of p.stack, with p.mark as a black point."""
    present = [a for a in allocs if any(c["allocator"] == a for c in cells)]
    bottoms = [0.0] * len(present)
    for k, metric in enumerate(p.stack):
        vals = []
        for a in present:
            c = next(c for c in cells if c["allocator"] == a)
            vals.append(c["metrics"].get(metric, {}).get("median", 0.0))
        ax.bar(range(len(present)), vals, 0.7, bottom=bottoms, color=f"C{k}", alpha=0.75,
               label=exp.metric(metric).label)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    if p.mark:
        marks = [next(c for c in cells if c["allocator"] == a)["metrics"].get(p.mark, {}).get("median")
                 for a in present]
        ax.plot([i for i, v in enumerate(marks) if v is not None], [v for v in marks if v is not None], "ko",
                ms=4, label=exp.metric(p.mark).label)
    ax.set_xticks(range(len(present)))
    ax.set_xticklabels(present, rotation=30, ha="right", fontsize=8)
    if legend:
        ax.legend(fontsize=6)


def _wrap(n):
    return n if n <= 3 else 2 if n == 4 else 3


def _bytes_label(v):
    for unit, shift in (("M", 20), ("K", 10)):
        if v >= 1 << shift and v % (1 << shift) == 0:
            return f"{int(v) >> shift}{unit}"
    return f"{v:g}"


def machine_line(meta):
    """One line that says where and how a run was made: command, date, CPU, cores, kernel, versions."""
    m = meta.get("machine", {})
    versions = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items() if v)
    mem = f", {m['memory_gib']} GiB" if m.get("memory_gib") else ""
    return (f"Command: `{meta.get('command', '')}` ({meta.get('started', '')}, {meta.get('seconds', 0):.0f} s, "
            f"{meta.get('config', {}).get('reps', '?')} repetitions). Machine: {m.get('cpu')}, {m.get('cores')} "
            f"cores{mem}, Linux {m.get('kernel')}, glibc {m.get('glibc')}. Allocators: {versions}.")


def legend(result):
    meta = result["meta"]
    text = (f"Each cell: median over {meta['config']['reps']} repetition(s), [min–max], and ×ratio = this "
            f"row's median / {result['baseline']}'s. Allocators were interleaved within each repetition. "
            "os:* rows are OS baselines run without any allocator under test; th:* rows are threadheap's "
            "explicit heaps, from a workload linked with libthreadheap.")
    if PROFILED in meta.get("machine", {}).get("libraries", {}):
        text += (f" {PROFILED} is threadheap's library with heap profiling on (THREADHEAP_PROFILE, a file per "
                 "run, deleted after it).")
    return text


def report_markdown(result, charts, title="threadheap benchmark report", intro=()):
    """The full report of a run as markdown: title, intro paragraphs, the run's line, summary, machine,
    allocators, then each experiment's description, chart and tables. charts: experiment -> the chart's link
    (a path relative to where the markdown is written). report.md and docs/results.md (bench_docs.py)."""
    meta, cells = result["meta"], result["cells"]
    m = meta["machine"]
    libs = m.get("libraries", {})
    summary = summary_markdown(result)
    lines = [f"# {title}", ""]
    for paragraph in intro:
        lines += [paragraph, ""]
    lines += [machine_line(meta), ""]
    if summary:
        lines += ["## Summary", ""] + summary
    lines += ["## Machine", "",
              markdown_table(["what", "value"], [
                  ["CPU", str(m["cpu"])], ["cores", str(m["cores"])],
                  ["memory", f"{m['memory_gib']} GiB" if m.get("memory_gib") else "unknown"],
                  ["kernel", str(m["kernel"])], ["glibc", str(m["glibc"])], ["python", str(m.get("python"))]]
                  + [[f"package {k}", str(v)] for k, v in m["packages"].items()]), "",
              "## Allocators", "",
              markdown_table(["allocator", "version", "library"],
                             [[k, m.get("versions", {}).get(k) or ("external (NAME=PATH)" if is_external(k) else "–"),
                               f"`{v}`"] for k, v in libs.items()]),
              "", legend(result), ""]
    if meta.get("experiment_seconds"):
        lines += ["Wall-clock time of each experiment's runs: " +
                  ", ".join(f"{k} {v:.0f} s" for k, v in meta["experiment_seconds"].items()) + ".", ""]
    for name in meta["config"]["experiments"]:
        exp = EXPERIMENTS[name]
        lines += [f"## {exp.title}", "", exp.description, ""]
        if name in charts:
            lines += [f"![{name}]({charts[name]})", ""]
        for metric in exp.table_metrics:
            for table_title, header, rows in tables_for(exp, cells, metric):
                lines += [f"**{table_title}**", "", markdown_table(header, rows), ""]
    return "\n".join(lines) + "\n"


def write_report(path, result, charts):
    path.write_text(report_markdown(result, charts))


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



# ------------------------------------------------------------------------------------------------ readme

# The block sizes of the README's contention tables: the seeds' small, medium and 32-64 KiB cliff sizes.
README_SIZES = [16, 256, 1024, 4096, 16384, 32768, 65536]
README_CHARTS = ["contention", "threads"]


def _find(cells, exp, alloc, **params):
    for c in cells:
        if c["experiment"] == exp and c["allocator"] == alloc and \
                all(c["params"].get(k) == v for k, v in params.items()):
            return c
    return None


def _short(st, scale=1.0):
    """'0.021 ×1.40': the median (times scale) and the ratio to threadheap, without the range."""
    if not st:
        return "–"
    s = fmt(st["median"] * scale)
    return s + (" " + fmt_ratio(st["ratio"]) if st.get("ratio") is not None else "")


def _values(cells, exp, param):
    return sorted({c["params"].get(param) for c in cells if c["experiment"] == exp}, key=_sort_key)


def readme_tables(result):
    """The headline tables of a run: a list of (title, header, rows), one or more per experiment present."""
    cells = result["cells"]
    present = {c["experiment"] for c in cells}
    out = []

    def allocs(exp):
        # A th:<method> that repeats an OS baseline (th:mmap beside os:mmap) is left out of the short tables.
        names = order_allocators(c["allocator"] for c in cells if c["experiment"] == exp)
        return [a for a in names if not (a.startswith(LINKED_PREFIX) and
                                         OS_PREFIX + a[len(LINKED_PREFIX):] in names)]

    if "contention" in present:
        threads = _values(cells, "contention", "threads")
        sizes = [s for s in _values(cells, "contention", "size") if s in README_SIZES] or \
            _values(cells, "contention", "size")
        for t in sorted({threads[0], threads[-1]}):
            out.append((f"contention: µs per alloc/free pair over all threads, {t} thread{'s' if t > 1 else ''} "
                        "(lower is better)", ["bytes"] + allocs("contention"),
                        [[str(s)] + [_short((_find(cells, "contention", a, size=s, threads=t) or {})
                                            .get("metrics", {}).get("us_per_op")) for a in allocs("contention")]
                         for s in sizes]))
    if "threads" in present:
        sizes = _values(cells, "threads", "size")
        size = 1024 if 1024 in sizes else sizes[0]
        out.append((f"threads: speed-up over one thread, {size} B blocks (higher is better)",
                    ["threads"] + allocs("threads"),
                    [[str(t)] + [_short((_find(cells, "threads", a, size=size, threads=t) or {})
                                        .get("metrics", {}).get("speedup")) for a in allocs("threads")]
                     for t in _values(cells, "threads", "threads")]))
    if "random" in present:
        threads = _values(cells, "random", "threads")
        t = 3 if 3 in threads else threads[-1]
        out.append((f"random: {t} threads, random sizes (seed 004's heaptest)",
                    ["allocator", "Mops/s", "voluntary cs/s", "involuntary cs/s", "peak RSS MiB"],
                    [[a] + [_short(((_find(cells, "random", a, threads=t) or {}).get("metrics", {})).get(k), sc)
                            for k, sc in (("mops_per_s", 1), ("vcsw_per_s", 1), ("ivcsw_per_s", 1),
                                          ("peak_rss_kb", 1 / 1024))]
                     for a in allocs("random")]))
    if "large" in present:
        sizes = _values(cells, "large", "size_mb")
        mb = 32 if 32 in sizes else sizes[-1]
        keys = [("alloc_us_per_mb", "alloc"), ("touch_us_per_mb", "first touch"), ("free_us_per_mb", "free"),
                ("sys_us_per_mb", "kernel"), ("total_us_per_mb", "total"), ("minflt_per_iter", "faults/iter")]
        rows = []
        for a in allocs("large"):
            naive = (_find(cells, "large", a, mode="untouched", size_mb=mb) or {}).get("metrics", {})
            touched = (_find(cells, "large", a, mode="touched", size_mb=mb) or {}).get("metrics", {})
            rows.append([a, _short(naive.get("total_us_per_mb"))] + [_short(touched.get(k)) for k, _ in keys])
        base = result.get("baseline", "threadheap")
        reused = (_find(cells, "large", base, mode="reused", size_mb=mb) or {}).get("metrics", {})
        rows.append([f"reused buffer ({base})", "–"] + [fmt(reused[k]["median"]) if k in reused else "–"
                                                        for k, _ in keys])
        out.append((f"large: {mb} MiB blocks, µs per MiB (lower is better); untouched = what a timer around "
                    "malloc+free sees, the rest split the cost of a block that is written",
                    ["allocator", "untouched"] + [label for _, label in keys], rows))
    for exp, title, keys in [
        ("touch", "touch: writing one byte per page of 256 MiB", [("ms", "ms", 1), ("minflt", "minor faults", 1),
                                                                  ("sys_ms", "kernel ms", 1)]),
        ("xthread", "xthread: producer/consumer, every free remote", [
            ("mblocks_per_s", "Mblocks/s", 1), ("overhead", "RSS over live data", 1),
            ("peak_rss_kb", "peak RSS MiB", 1 / 1024)]),
        ("larson", "larson: server simulation", [("mops_per_s", "Mops/s", 1), ("peak_rss_kb", "peak RSS MiB", 1 / 1024),
                                                 ("end_rss_kb", "RSS at end MiB", 1 / 1024)]),
    ]:
        if exp not in present:
            continue
        pexp = EXPERIMENTS[exp]
        where = {}
        if "threads" in pexp.params:
            where["threads"] = _values(cells, exp, "threads")[-1]
            title += f", {where['threads']} threads"
        rows = []
        for a in allocs(exp):
            for c in cells:
                if c["experiment"] == exp and c["allocator"] == a and \
                        all(c["params"].get(k) == v for k, v in where.items()):
                    rows.append([a] + [_short(c["metrics"].get(k), sc) for k, _, sc in keys])
        out.append((title, ["allocator"] + [label for _, label, _ in keys], rows))
    return out


def readme_markdown(result, folder=None):
    """Markdown for the README: the run's command and machine, the headline tables and links to the charts
    that `threadheap bench --docs-from` puts in docs/bench/."""
    meta = result.get("meta", {})
    charts = [c for c in README_CHARTS if folder is not None and (Path(folder) / f"{c}.png").exists()]
    lines = []
    if charts:
        lines += [f"<!-- charts: threadheap bench --docs-from {folder} writes them to docs/bench/, with "
                  "docs/results.md -->", ""]
    lines += [machine_line(meta), "",
              f"Each cell: the median over the repetitions, ×ratio to {result.get('baseline', 'threadheap')}. "
              "th:* are threadheap's explicit heaps (a program linked with it), os:* the OS baselines. The full "
              "tables, with min–max, are in the run's report.md.", ""]
    lines += summary_markdown(result)
    for title, header, rows in readme_tables(result):
        lines += [f"**{title}**", "", markdown_table(header, rows), ""]
    for c in charts:
        lines += [f"![{c}](docs/bench/{c}.png)", ""]
    return "\n".join(lines)
