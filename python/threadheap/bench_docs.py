"""docs/results.md and docs/bench/: the published results of threadheap's benchmark suite, written from a run.

`threadheap bench --docs` runs the suite and then writes them; `threadheap bench --docs-from DIR` writes them
from a finished run (its folder or its results.json) without running anything. results.md is written whole
each time by report.md's renderer (bench_results.report_markdown), so the published tables are never edited
by hand. Each experiment's chart is copied from the run's folder into docs/bench/, or drawn from the run's
cells when the folder lacks it.

The charts the driver owns in docs/bench/ are the ones named by the comment on the first line of results.md.
A new write replaces them and deletes those of experiments the new run does not have; other files there
are left alone, and a results.md without that comment (one written by hand) is not overwritten. Writing the
same run twice gives the same files.
"""

import os
import re
import shutil
from pathlib import Path

from .bench_experiments import EXPERIMENTS, BenchError
from .bench_results import chart, load_result, report_markdown

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = "bench"  # the charts' folder, inside the docs folder
MARKER = "<!-- Written by threadheap bench"
OWNED = re.compile(r"Charts it owns in bench/: ([^>]*?) -->")


def default_docs_dir():
    """The source tree's docs/, where the published results live."""
    docs = REPO / "docs"
    if not docs.is_dir():
        raise BenchError(f"no docs folder at {docs} (give --docs-dir)")
    return docs


def find_run(path):
    """A finished run given as its folder or its results.json: (folder, result). Errors are one line."""
    path = Path(path)
    if not path.exists():
        raise BenchError(f"{path}: no such run folder")
    if path.is_dir():
        if not (path / "results.json").is_file():
            raise BenchError(f"{path} has no results.json (not a folder written by threadheap bench)")
        folder, file = path, path / "results.json"
    else:
        folder, file = path.parent, path
    result = load_result(file)
    try:
        meta = result["meta"]
        experiments = meta["config"]["experiments"]
        meta["machine"]["libraries"]
    except (KeyError, TypeError):
        raise BenchError(f"{file} lacks the run's description (meta): not a results.json of threadheap bench") \
            from None
    unknown = [e for e in experiments if e not in EXPERIMENTS]
    if unknown:
        raise BenchError(f"{file}: experiment '{unknown[0]}' is not one of threadheap bench's")
    if meta["config"].get("smoke"):
        raise BenchError(f"{file} is a --smoke run, whose numbers are not results")
    return folder, result


def slug(title):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def run_description(result):
    """One paragraph: what the run was (experiments, allocators, repetitions, lengths)."""
    config = result["meta"]["config"]
    experiments = config["experiments"]
    allocators = config.get("allocators") or list(result["meta"]["machine"].get("libraries", {}))
    parts = [f"{len(experiments)} experiment{'s' if len(experiments) != 1 else ''} "
             f"({', '.join(experiments)})",
             f"{len(allocators)} allocator{'s' if len(allocators) != 1 else ''} ({', '.join(allocators)})",
             f"{config.get('reps', '?')} repetitions with the allocators interleaved inside each"]
    given = [f"threads {','.join(map(str, config['threads']))}" if config.get("threads") else None,
             f"sizes {','.join(map(str, config['sizes']))}" if config.get("sizes") else None]
    given = [g for g in given if g]
    lengths = "the seeds' full run lengths" if config.get("full") else "the workloads' default run lengths"
    parts.append(lengths + (", " + " and ".join(given) if given else ", thread counts and sizes"))
    return "The run: " + "; ".join(parts) + "."


def intro(result):
    experiments = result["meta"]["config"]["experiments"]
    contents = " · ".join(f"[{EXPERIMENTS[e].title}](#{slug(EXPERIMENTS[e].title)})" for e in experiments)
    return [
        "Every table and chart of the latest benchmark run, each cell the median over the repetitions with "
        "its [min–max] range and its ratio to threadheap. This page and the charts in `docs/bench/` are "
        "written by the benchmark driver and never edited by hand: `build/bin/threadheap bench --docs` runs "
        "the default suite and rewrites them, and `build/bin/threadheap bench --docs-from "
        "bench-results/<timestamp>` rewrites them from a finished run.",
        run_description(result),
        "Experiments: " + contents + ".",
    ]


def owned_charts(results_md):
    """The chart names the existing results.md says the driver wrote; None when it was not written by the
    driver (no marker), [] when there is no results.md."""
    try:
        first = results_md.read_text().split("\n", 1)[0]
    except FileNotFoundError:
        return []
    except OSError as e:
        raise BenchError(f"cannot read {results_md}: {e.strerror}") from None
    if not first.startswith(MARKER):
        return None
    m = OWNED.search(first)
    # Only plain file names: a marker edited to name ../something must not make the driver delete it.
    return [n for n in (m.group(1).split() if m else []) if re.fullmatch(r"[\w.+-]+\.png", n)]


def check_docs_dir(docs_dir):
    """That the docs can be written in docs_dir; returns the charts the driver owns there."""
    docs_dir = Path(docs_dir)
    if not docs_dir.is_dir():
        raise BenchError(f"{docs_dir}: no such docs folder")
    owned = owned_charts(docs_dir / "results.md")
    if owned is None:
        raise BenchError(f"{docs_dir / 'results.md'} was not written by threadheap bench (its first line is not "
                         "the driver's comment); move it away first")
    return owned


def shown_path(folder):
    """The run's folder as the marker names it: relative to the source tree when inside it."""
    folder = Path(folder).resolve()
    try:
        return str(folder.relative_to(REPO))
    except ValueError:
        return str(folder)


def write_docs(run_folder, result, docs_dir):
    """Writes docs_dir/results.md and docs_dir/bench/<experiment>.png from one run; returns (results.md,
    charts written, stale charts deleted)."""
    docs_dir = Path(docs_dir)
    results_md = docs_dir / "results.md"
    before = check_docs_dir(docs_dir)
    chart_dir = docs_dir / CHART_DIR
    names = []
    try:
        chart_dir.mkdir(exist_ok=True)
        for name in result["meta"]["config"]["experiments"]:
            fname = f"{name}.png"
            tmp = chart_dir / f".{name}.tmp.png"  # .png: matplotlib takes the format from the name
            src = Path(run_folder) / fname
            if src.is_file():
                shutil.copyfile(src, tmp)
            elif not chart(EXPERIMENTS[name], result["cells"], tmp):
                continue  # no cell to draw
            os.replace(tmp, chart_dir / fname)
            names.append(fname)
        marker = (f"{MARKER} from {shown_path(run_folder)}/results.json; do not edit (see below). "
                  f"Charts it owns in {CHART_DIR}/: {' '.join(names)} -->")
        text = report_markdown(result, {n[:-len('.png')]: f"{CHART_DIR}/{n}" for n in names},
                               title="threadheap benchmark results", intro=intro(result))
        tmp = docs_dir / ".results.md.tmp"
        tmp.write_text(marker + "\n" + text)
        os.replace(tmp, results_md)
        stale = [n for n in before if n not in names and (chart_dir / n).is_file()]
        for n in stale:
            (chart_dir / n).unlink()
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        raise BenchError(f"cannot write the docs in {docs_dir}: {e.strerror}{where}") from None
    return results_md, names, stale
