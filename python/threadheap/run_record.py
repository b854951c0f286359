"""`threadheap run --record FILE.png|FILE.svg`: the picture of a run, drawn at exit from the Sampler's samples.

Three panels over the seconds since the program started: RSS, split by threadheap's attribution when the
live export was there (in use, free in pages, empty pages, cached, metadata, and the rest of RSS in two: the
anonymous memory that is not threadheap's, which is the program's own mappings and stacks, and the
file-backed and shared part, its code and libraries), each publication drawn at the time the library wrote it
(attribution_series), else by /proc/PID/status's anonymous and file-backed parts; the RSS line is /proc's,
at each sample; minor page faults per second; voluntary and
involuntary context switches per second, summed over the program's threads. matplotlib (Agg backend) is
imported only here, when drawing.
"""

import bisect
import os
import shlex
from pathlib import Path

from .procstat import rest_of_rss
from .run_stats import ATTRIBUTION, ATTRIBUTION_LABELS, MIB, how_it_ended

FORMATS = (".png", ".svg")
FIGSIZE = (11, 8.5)   # inches; at DPI, a 1100 x 850 PNG
DPI = 100
COLORS = {"in_use": "#1f77b4", "free_in_pages": "#ff7f0e", "empty_pages": "#ffbb78", "cached": "#2ca02c",
          "metadata": "#9467bd", "other": "#c7c7c7", "other_file": "#e8e8e8", "anon": "#1f77b4", "file": "#aec7e8"}


def check_matplotlib():
    """None if matplotlib can be imported, else the reason (for the one-line error before the program runs)."""
    try:
        import matplotlib  # noqa: F401  (pyplot, the slow import, waits for the drawing)
    except Exception as e:  # an ImportError, or a broken install raising something else
        return f"{type(e).__name__}: {e}"
    return None


def machine_line():
    u = os.uname()
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = ", " + line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{u.nodename}: {u.sysname} {u.release} {u.machine}, {os.cpu_count()} cores{cpu}"


def rates(samples, field):
    """(edges, per-second rates): the rate of each interval between consecutive samples, for ax.stairs. A
    counter that went down (a thread exited and took its switches out of the sum) counts as no change."""
    edges, values = [], []
    for a, b in zip(samples, samples[1:]):
        dt = b.t - a.t
        if dt <= 0:
            continue
        if not edges or edges[-1] != a.t:
            if edges:  # a gap (a skipped sample): no value over it
                values.append(float("nan"))
            edges.append(a.t)
        edges.append(b.t)
        values.append(max(getattr(b, field) - getattr(a, field), 0) / dt)
    return edges, values


def publications(samples):
    """The samples that read a publication of the live export (with its time)."""
    return [s for s in samples if s.parts is not None and s.published is not None]


def attribution_series(samples):
    """(times, stacks, rest_anon, rest_file): threadheap's attribution at each of its publications, for a
    stack plot.

    The library publishes on its slow paths, at most once an interval, so a sample reads a publication written
    up to an interval before it, or longer when the program made no slow-path call meanwhile; drawn at the
    sample's time it would stand beside an RSS read later. Each publication is drawn once, at the time it was
    written (Sample.published); the samples before the first one add points with nothing attributed, their RSS
    all rest. stacks: a list per ATTRIBUTION name, in bytes. The rest is RSS at that time (interpolated
    between the samples on either side) less threadheap's total, in two parts: rest_anon, the anonymous RSS
    (RssAnon) less threadheap's total, which is all anonymous: memory the program mapped itself (a
    language runtime's object heap, thread stacks); rest_file, the file-backed and shared RSS (code, libraries,
    shared memory). Neither below 0. No point after the last publication: what the library held since is not
    known."""
    times, stacks, rest_anon, rest_file = [], [[] for _ in ATTRIBUTION], [], []
    seen = None
    published = publications(samples)
    first = min((s.published for s in published), default=None)
    for s in samples:
        if first is not None and s.t >= first:
            break
        times.append(s.t)
        for stack in stacks:
            stack.append(0)
        anon, file_ = rest_of_rss(s.rss, s.rss_anon, 0)
        rest_anon.append(anon)
        rest_file.append(file_)
    for s in sorted(published, key=lambda s: s.published):
        if s.published == seen:
            continue  # the same publication, read again by a later sample
        seen = s.published
        times.append(s.published)
        for stack, k in zip(stacks, ATTRIBUTION):
            stack.append(s.parts[k])
        anon, file_ = rest_of_rss(rss_at(samples, s.published), rss_at(samples, s.published, "rss_anon"), s.held)
        rest_anon.append(anon)
        rest_file.append(file_)
    return times, stacks, rest_anon, rest_file


def rest_parts(samples, rest_anon, rest_file):
    """[(label, values, colour)] of the rest of RSS for the stack plot: the anonymous and file-backed parts,
    or one part when no sample read RssAnon (Linux before 4.5 has none), which would have called all of it
    file-backed."""
    if any(s.rss_anon for s in samples):
        return [("rest of RSS, anonymous: not threadheap's\n(the program's own mappings, stacks)", rest_anon,
                 COLORS["other"]),
                ("rest of RSS, file-backed and shared\n(code, libraries)", rest_file, COLORS["other_file"])]
    return [("rest of RSS (not threadheap's; no RssAnon\nto split it)", [a + f for a, f in zip(rest_anon, rest_file)],
             COLORS["other"])]


def export_gap_note(samples):
    """A line for the RSS panel when the last publication is older than two sampling intervals at the last
    sample (the program made no slow-path call since, or stopped publishing): why the stack ends early. None
    otherwise, or without an export."""
    published = publications(samples)
    if not published or len(samples) < 2:
        return None
    steps = sorted(b.t - a.t for a, b in zip(samples, samples[1:]))
    last = max(s.published for s in published)
    if samples[-1].t - last <= 2 * steps[len(steps) // 2]:
        return None
    return f"no publication after {last:.2f} s (threadheap publishes on its slow paths): /proc's RSS alone after it"


def rss_at(samples, t, field="rss"):
    """/proc's RSS at time t (or another of the samples' fields: rss_anon), interpolated linearly between the
    samples around it (the nearest outside).
    samples in time order, as the Sampler keeps them: a binary search, so that an hour's recording with a
    publication per sample does not take a pass over every sample per publication."""
    i = bisect.bisect_left(samples, t, key=lambda s: s.t)  # samples[i] is the first at or after t
    if i == len(samples):
        return getattr(samples[-1], field)
    b = samples[i]
    if i == 0 or b.t == t:
        return getattr(b, field)
    a = samples[i - 1]
    va, vb = getattr(a, field), getattr(b, field)
    return va + (vb - va) * (t - a.t) / (b.t - a.t)


def draw(path, samples, command, status, wall):
    """Writes the picture to path (its suffix picks PNG or SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_mem, ax_flt, ax_cs) = plt.subplots(3, 1, figsize=FIGSIZE, sharex=True,
                                                gridspec_kw={"height_ratios": [2, 1, 1]})
    title = f"threadheap run: {shlex.join(command)}"
    if len(title) > 110:
        title = title[:107] + "..."
    title = title.replace("$", r"\$")  # not mathtext
    fig.suptitle(f"{title}\n{how_it_ended(status)} after {wall:.2f} s; {machine_line()}", fontsize=10)
    t = [s.t for s in samples]

    if publications(samples):
        times, stacks, rest_anon, rest_file = attribution_series(samples)
        rest = rest_parts(samples, rest_anon, rest_file)
        labels = [ATTRIBUTION_LABELS[k] for k in ATTRIBUTION] + [label for label, _, _ in rest]
        ax_mem.stackplot(times, *[[v / MIB for v in stack] for stack in stacks + [part for _, part, _ in rest]],
                         labels=labels, alpha=0.9,
                         colors=[COLORS[k] for k in ATTRIBUTION] + [colour for _, _, colour in rest])
        title = "RSS by threadheap's attribution (live export), each publication at the time it was written"
        note = export_gap_note(samples)
        ax_mem.set_title(title + (f"\n{note}" if note else ""), fontsize=9)
    elif not any(s.rss_anon for s in samples):  # no RssAnon (Linux before 4.5): the RSS whole
        ax_mem.stackplot(t, [s.rss / MIB for s in samples], labels=["RSS (no RssAnon to split it)"],
                         colors=[COLORS["file"]], alpha=0.9)
        ax_mem.set_title("RSS (/proc/PID/status; no live export from threadheap)", fontsize=9)
    else:
        parts = [rest_of_rss(s.rss, s.rss_anon, 0) for s in samples]
        anon = [a / MIB for a, _ in parts]
        file_ = [f / MIB for _, f in parts]
        ax_mem.stackplot(t, anon, file_, labels=["anonymous", "file-backed and shared"],
                         colors=[COLORS["anon"], COLORS["file"]], alpha=0.9)
        ax_mem.set_title("RSS (/proc/PID/status; no live export from threadheap)", fontsize=9)
    ax_mem.plot(t, [s.rss / MIB for s in samples], color="black", linewidth=0.8, label="RSS",
                marker="." if len(samples) < 50 else None, markersize=3)
    ax_mem.set_ylabel("MiB")
    ax_mem.set_ylim(bottom=0)
    ax_mem.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)

    edges, values = rates(samples, "minflt")
    if values:
        ax_flt.stairs(values, edges, color="#d62728")
    ax_flt.set_ylabel("minor faults/s")
    ax_flt.set_ylim(bottom=0)
    ax_flt.set_title("minor page faults per second", fontsize=9)

    for field in ("voluntary", "involuntary"):
        edges, values = rates(samples, field)
        if values:
            ax_cs.stairs(values, edges, label=field)
    ax_cs.set_ylabel("switches/s")
    ax_cs.set_ylim(bottom=0)
    ax_cs.set_title("context switches per second, all threads", fontsize=9)
    if len(samples) >= 2:
        ax_cs.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    ax_cs.set_xlabel("seconds since start")
    for ax in (ax_mem, ax_flt, ax_cs):
        ax.grid(alpha=0.3)
        ax.set_xlim(0, max(wall, t[-1] if t else 0, 1e-3))
    if len(samples) < 2:
        ax_flt.text(0.5, 0.5, "the program ended before a second sample", transform=ax_flt.transAxes,
                    ha="center", va="center", fontsize=9, color="gray")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(Path(path), dpi=DPI, format=Path(path).suffix[1:].lower())
    plt.close(fig)
