"""How `threadheap top` shows its records: plain text (--once, or stdout not a terminal) and the live view.

The records are the dicts that top.py makes (the same that --json prints); nothing here reads /proc. The
plain text is the standard library's; the live view imports rich inside run_live, so --once and --json work
without it.
"""

import os
import signal
import sys
import time
from datetime import datetime

from . import top
from .procstat import rest_of_rss
from .top import PROG, human_bytes, percent_text, rate_text

# The smallest terminal the live view draws in; below it, it says so instead.
MIN_WIDTH, MIN_HEIGHT = 60, 8
BAR_WIDTH = 50
PAIRS_SHOWN = 5

# The RSS attribution bar: record key, legend label, plain-text character, rich colour. The rest of the RSS,
# which the export does not account for, in two: the anonymous part (RssAnon less threadheap's resident total,
# all of it anonymous: memory the program mapped itself, a runtime's own heap, thread stacks) and the
# file-backed and shared part (code, libraries); one part where RssAnon was not read. Purged memory is
# mapped but not resident, so it is drawn after the resident parts.
BAR_PARTS = (("in_use_bytes", "in use", "#", "green"),
             ("free_in_pages_bytes", "free in pages", "=", "yellow"),
             ("empty_pages_bytes", "empty pages", "-", "dark_orange"),
             ("cached_bytes", "cached", "c", "cyan"),
             ("metadata_bytes", "metadata", "m", "magenta"),
             ("rest_anon", "rest of RSS: anonymous, not threadheap's", ".", "grey50"),
             ("rest_file", "file-backed", ",", "grey70"),
             ("rest", "rest of RSS", ".", "grey50"),  # no RssAnon read (Linux before 4.5)
             ("purged_bytes", "purged (not resident)", "~", "blue"))

# Most telling first: a narrow terminal crops the table from the right (major faults and LazyFree last).
PROCESS_HEADERS = ("PID", "COMMAND", "RSS", "ANON", "FILE", "MINFLT/s", "VCSW/s", "ICSW/s", "USR%", "SYS%", "THR",
                   "TH", "MAJFLT/s", "LAZYFREE")
THREAD_HEADERS = ("TID", "NAME", "CPU%", "VCSW/s", "ICSW/s", "MINFLT/s")
LIST_HEADERS = ("PID", "COMMAND", "RSS", "THR", "CPU%", "TH")
COMMAND_WIDTH = 28


# ------------------------------------------------------------------------------------------------ cells


def shorten(text, width):
    return text if len(text) <= width else text[:width - 1] + "…"


def threadheap_mark(r):
    """The TH column: "export" (live export read), "lib" (libthreadheap mapped), "?" (maps unreadable)."""
    if r["threadheap"] is not None:
        return "export"
    return {True: "lib", False: "", None: "?"}[r["threadheap_loaded"]]


def process_cells(r):
    return (str(r["pid"]), shorten(r["command"], COMMAND_WIDTH), human_bytes(r["rss_bytes"]),
            human_bytes(r["rss_anon_bytes"]), human_bytes(r["rss_file_bytes"]), rate_text(r["minor_faults_per_s"]),
            rate_text(r["voluntary_switches_per_s"]), rate_text(r["involuntary_switches_per_s"]),
            percent_text(r["cpu_user_percent"]), percent_text(r["cpu_system_percent"]), str(r["threads"]),
            threadheap_mark(r), rate_text(r["major_faults_per_s"]), human_bytes(r["lazyfree_bytes"]))


def gone_cells(t):
    return (str(t.pid), shorten(t.prev.command, COMMAND_WIDTH), "exited") + ("",) * (len(PROCESS_HEADERS) - 3)


def thread_cells(t):
    return (str(t["tid"]), t["name"], percent_text(t["cpu_percent"]), rate_text(t["voluntary_switches_per_s"]),
            rate_text(t["involuntary_switches_per_s"]), rate_text(t["minor_faults_per_s"]))


def list_cells(p):
    return (str(p["pid"]), shorten(p["command"], 40), human_bytes(p["rss_bytes"]), str(p["threads"]),
            percent_text(p["cpu_percent"]), "*" if p["threadheap_export"] else "")


def system_line(s):
    if s["pgfault_per_s"] is None:
        return "system: (sampling)"
    return (f"system: {rate_text(s['pgfault_per_s'])} faults/s, {rate_text(s['pgmajfault_per_s'])} major/s, "
            f"pgalloc {rate_text(s['pgalloc_per_s'])} pages/s ({human_bytes(s['pgalloc_bytes_per_s'])}/s, the "
            f"proxy for zeroing), pgfree {rate_text(s['pgfree_per_s'])}/s, "
            f"THP faults {rate_text(s['thp_fault_alloc_per_s'])}/s")


def threadheap_line(th):
    """The live export's rates in one line."""
    os_time = th["os_call_seconds_per_s"]
    avg = th["os_call_us_avg"]
    bytes_rate = (lambda v: top.MISSING if v is None else human_bytes(v) + "/s")
    return (f"threadheap: allocs {rate_text(th['allocs_per_s'])}/s, frees {rate_text(th['frees_per_s'])}/s, "
            f"remote frees {rate_text(th['remote_frees_per_s'])}/s, OS calls {rate_text(th['os_calls_per_s'])}/s "
            f"taking {top.MISSING if os_time is None else f'{os_time * 1e3:.2f} ms'}/s"
            f"{'' if avg is None else f' ({avg:,.1f} µs each)'}, fresh {bytes_rate(th['fresh_bytes_per_s'])}, "
            f"reused {bytes_rate(th['reused_bytes_per_s'])}  (published {th['published_age_s']:.1f} s ago, "
            f"every {th['interval_ms']} ms)")


def bar_parts(r):
    """[(label, bytes, char, colour)] of the RSS attribution bar, the parts the export has."""
    th = r["threadheap"]
    resident = sum(th[k] or 0 for k, *_ in BAR_PARTS[:5])
    anon, file_ = rest_of_rss(r["rss_bytes"], r.get("rss_anon_bytes"), resident)
    if r.get("rss_anon_bytes"):
        rest = {"rest_anon": anon, "rest_file": file_, "rest": None}
    else:  # no RssAnon read: splitting would call all of the rest file-backed
        rest = {"rest_anon": None, "rest_file": None, "rest": anon + file_}
    parts = []
    for key, label, char, colour in BAR_PARTS:
        value = rest[key] if key in rest else th[key]
        if value is not None:
            parts.append((label, value, char, colour))
    return parts


def bar_runs(parts, width):
    """The number of characters of each part, adding up to width (cumulative rounding)."""
    total = sum(v for _, v, _, _ in parts) or 1
    runs, cum, drawn = [], 0, 0
    for _, v, _, _ in parts:
        cum += v
        end = round(cum * width / total)
        runs.append(end - drawn)
        drawn = end
    return runs


def pair_lines(th):
    lines = []
    for p in th["remote_pairs"][:PAIRS_SHOWN]:
        lines.append(f"remote frees: {top.thread_label(p['from_name'], p['from_tid'])} → "
                     f"{top.thread_label(p['to_name'], p['to_tid'])} {rate_text(p['frees_per_s'])}/s "
                     f"({p['frees_total']:,} in all)")
    return lines


# ------------------------------------------------------------------------------------------------ plain text


def plain_table(headers, rows, left=(1,)):
    """Columns padded to their widest cell; columns in `left` aligned left, the others right."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    out = []
    for row in (headers, *rows):
        cells = [str(c).ljust(w) if i in left else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        out.append("  ".join(cells).rstrip())
    return out


def plain_heading(data_time, interval):
    stamp = datetime.fromtimestamp(data_time).strftime("%Y-%m-%d %H:%M:%S")
    return f"threadheap top  {stamp}  sample {interval:.2f} s"


def plain_processes(records, gone):
    lines = [plain_heading(records[0]["time"], records[0]["interval_s"]), system_line(records[0]["system"]), ""]
    lines += plain_table(PROCESS_HEADERS, [process_cells(r) for r in records] + [gone_cells(t) for t in gone])
    for r in records:
        detail = []
        th = r["threadheap"]
        if th is not None:
            detail.append(threadheap_line(th))
            parts = bar_parts(r)
            runs = bar_runs(parts, BAR_WIDTH)
            detail.append("RSS [" + "".join(c * n for (_, _, c, _), n in zip(parts, runs)) + "] "
                          + human_bytes(r["rss_bytes"]))
            detail.append("    " + "  ".join(f"{c} {label} {human_bytes(v)}" for label, v, c, _ in parts))
            detail += pair_lines(th)
        if r["per_thread"]:
            detail += plain_table(THREAD_HEADERS, [thread_cells(t) for t in r["per_thread"]])
        detail += [f"hint: {h}" for h in r["hints"]]
        if detail:
            lines += ["", f"{r['pid']} {shorten(r['command'], 100)}"] + ["  " + d for d in detail]
    return "\n".join(lines) + "\n"


def plain_list(data):
    procs = data["processes"]
    lines = [plain_heading(data["time"], data["interval_s"]), system_line(data["system"]), ""]
    lines += plain_table(LIST_HEADERS, [list_cells(p) for p in procs])
    if any(p["threadheap_export"] for p in procs):
        lines += ["", "* publishes threadheap's live export: threadheap top PID shows its counters"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ live view


def _rich_table(headers, rows, left=(1,), styles=None):
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for i, h in enumerate(headers):
        # Numbers are never cut: only the text columns (the command) give up width on a narrow terminal.
        width = max([len(str(h))] + [len(str(row[i])) for row in rows]) if i not in left else 8
        table.add_column(h, justify="left" if i in left else "right", no_wrap=True,
                         overflow="ellipsis", ratio=1 if i in left else None, min_width=width)
    for k, row in enumerate(rows):
        table.add_row(*(Text(str(c)) for c in row), style=(styles[k] if styles else None))
    return table


def render_processes(records, targets, args):
    from rich.console import Group
    from rich.text import Text

    gone = [t for t in targets if t.gone]
    records = [r for r in records if r["pid"] not in {t.pid for t in gone}]
    if not records and not gone:
        return Text(f"{PROG}: sampling every {args.interval:g} s…")
    head = Text(f"threadheap top · {datetime.now():%H:%M:%S} · every {args.interval:g} s · q or Ctrl-C quits",
                style="bold")
    items = [head, Text(system_line(records[0]["system"]) if records else "", style="grey70"), Text("")]
    items.append(_rich_table(PROCESS_HEADERS, [process_cells(r) for r in records] + [gone_cells(t) for t in gone],
                             styles=[None] * len(records) + ["dim red"] * len(gone)))
    for r in records:
        th = r["threadheap"]
        if th is None and not r["per_thread"] and not r["hints"]:
            continue
        items += [Text(""), Text(f"{r['pid']} {shorten(r['command'], 100)}", style="bold")]
        if th is not None:
            items.append(Text("  " + threadheap_line(th)))
            parts = bar_parts(r)
            bar = Text("  RSS ")
            for (label, v, char, colour), n in zip(parts, bar_runs(parts, BAR_WIDTH)):
                bar.append(("░" if label.startswith("purged") else "█") * n, style=colour)
            bar.append(" " + human_bytes(r["rss_bytes"]))
            items.append(bar)
            legend = Text("      ")
            for label, v, char, colour in parts:
                legend.append("■ ", style=colour)
                legend.append(f"{label} {human_bytes(v)}  ")
            items.append(legend)
            items += [Text("  " + line) for line in pair_lines(th)]
        if r["per_thread"]:
            items.append(_rich_table(THREAD_HEADERS, [thread_cells(t) for t in r["per_thread"]]))
        items += [Text(f"  hint: {h}", style="bold yellow") for h in r["hints"]]
    for t in gone:
        items.append(Text(f"{t.gone}", style="red"))
    return Group(*items)


def render_list(data, args):
    from rich.console import Group
    from rich.text import Text

    if data is None:
        return Text(f"{PROG}: sampling every {args.interval:g} s…")
    head = Text(f"threadheap top · {datetime.now():%H:%M:%S} · the {args.limit} largest processes by RSS · "
                "q or Ctrl-C quits", style="bold")
    items = [head, Text(system_line(data["system"]), style="grey70"), Text(""),
             _rich_table(LIST_HEADERS, [list_cells(p) for p in data["processes"]],
                         styles=["bold green" if p["threadheap_export"] else None for p in data["processes"]])]
    if any(p["threadheap_export"] for p in data["processes"]):
        items += [Text(""), Text("* publishes threadheap's live export: threadheap top PID shows its counters")]
    return Group(*items)


class _Keys:
    """The terminal in cbreak mode (keys come one by one, Ctrl-C still interrupts), restored at exit."""

    def __init__(self):
        self.fd, self.saved = None, None

    def __enter__(self):
        try:
            import termios
            import tty

            if sys.stdin.isatty():
                self.fd = sys.stdin.fileno()
                self.saved = termios.tcgetattr(self.fd)
                tty.setcbreak(self.fd)
        except (ImportError, OSError):
            self.fd = None
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            import termios

            try:
                termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)
            except (OSError, termios.error):
                pass  # the terminal is gone (SIGHUP)

    def wait(self, deadline, resized):
        """Until deadline: "q" when q is pressed, "resize" when the terminal changed size, else None."""
        while True:
            left = deadline - time.monotonic()
            if resized[0]:
                resized[0] = False
                return "resize"
            if left <= 0:
                return None
            step = min(left, 0.1)
            if self.fd is None:
                time.sleep(step)
                continue
            ready, _, _ = select_read(self.fd, step)
            if ready:
                try:
                    keys = os.read(self.fd, 64)
                except OSError:
                    keys = b""
                if b"q" in keys or b"Q" in keys:
                    return "q"


def select_read(fd, timeout):
    import select

    try:
        return select.select([fd], [], [], timeout)
    except (OSError, ValueError):
        time.sleep(timeout)
        return [], [], []


def run_live(sampler, args, is_list):
    """The view that redraws in place; returns the exit status (1 when every watched process has gone)."""
    try:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text
    except ImportError:
        sys.stderr.write(f"{PROG}: the live view needs the Python package rich (pip install rich, or run "
                         "bench/venv.sh); --once and --json work without it\n")
        return 1
    # rich prefers COLUMNS and LINES to the terminal's size when they are set, and a shell that exports them
    # (or a parent that set them) would freeze the view at that size through every resize.
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
    console = Console(highlight=False)
    resized = [False]
    saved = signal.signal(signal.SIGWINCH, lambda *_: resized.__setitem__(0, True))
    try:
        return _live_loop(sampler, args, is_list, console, resized, Live, Text)
    except OSError:
        # The terminal went away (SIGHUP, then EIO on the last redraw): nobody is left to tell.
        return 0
    finally:
        signal.signal(signal.SIGWINCH, saved)


def _live_loop(sampler, args, is_list, console, resized, Live, Text):
    last = [None]

    def view():
        width, height = console.size
        if width < MIN_WIDTH or height < MIN_HEIGHT:
            return Text(f"terminal too small ({width}x{height}): {PROG} needs {MIN_WIDTH}x{MIN_HEIGHT}",
                        style="bold red")
        if is_list:
            return render_list(last[0], args)
        return render_processes(last[0] or [], sampler.targets, args)

    shown = 0
    status = 0
    with _Keys() as keys, Live(view(), console=console, screen=True, auto_refresh=False,
                               redirect_stdout=False, redirect_stderr=False) as live:
        next_at = time.monotonic() + args.interval
        while args.count is None or shown < args.count:
            what = keys.wait(next_at, resized)
            if what == "q":
                break
            if what == "resize":
                live.update(view(), refresh=True)
                continue
            next_at = time.monotonic() + args.interval
            if is_list:
                last[0] = sampler.sample()
            else:
                records, _ = sampler.sample()
                if records:
                    last[0] = records
            live.update(view(), refresh=True)
            shown += 1
            if not is_list and not sampler.live:
                status = 1
                break
    if not is_list:
        for t in sampler.targets:
            if t.gone:
                sys.stderr.write(f"{PROG}: {t.gone}\n")
        if status:
            sys.stderr.write(f"{PROG}: every watched process has exited\n")
    return status
