"""`threadheap profile --flame OUT.svg|OUT.png`: a flame graph of a profile's stacks, drawn with matplotlib.

The root ("all") is at the bottom; above each frame stand the functions it called, each as wide as the value
of the stacks that run through it, siblings in alphabetical order as flamegraph.pl has them (so that two
graphs of one program line up). A frame is labelled where its name fits, cut short with "…" where only part
of it does. In the SVG the labels stay text (svg.fonttype "none"), and each frame carries a <title> with its
full name, value and share, which a browser shows on hover.
"""

import io
import re
import zlib
from html import escape
from pathlib import Path

from .profile import fmt_value, percent

WIDTH_IN = 16        # at DPI, a 1600-pixel-wide PNG
DPI = 100
ROW_IN = 0.2         # one frame's height
MARGIN_IN = 0.15
TITLE_IN = 0.45
FONT_PT = 7.5
CHAR_EM = 0.62       # DejaVu Sans' average advance, a little over, for the browser's own font
MIN_FRAME_PX = 0.5   # narrower frames are left out (flamegraph.pl's --minwidth); their value stays in the caller


class Node:
    __slots__ = ("name", "value", "children")

    def __init__(self, name):
        self.name, self.value, self.children = name, 0, {}


def tree(stacks):
    """The call tree of [(frames innermost first, value)]; stacks of value <= 0 are left out."""
    root = Node("all")
    for frames, value in stacks:
        if value <= 0:
            continue
        root.value += value
        node = root
        for frame in reversed(frames):
            node = node.children.setdefault(frame.name, Node(frame.name))
            node.value += value
    return root


def layout(root, min_value):
    """[(node, x, depth)] of the frames at least min_value wide, parents before children."""
    out, todo = [], [(root, 0, 0)]
    while todo:
        node, x, depth = todo.pop()
        out.append((node, x, depth))
        for name in sorted(node.children):
            child = node.children[name]
            if child.value >= min_value:
                todo.append((child, x, depth + 1))
            x += child.value
    return out


def color(name):
    """A warm colour that depends only on the name, so that a function has one colour across graphs."""
    h = zlib.crc32(name.encode())
    return ((205 + (h & 0x3F) * 50 // 63) / 255, ((h >> 6) & 0xFF) * 200 // 255 / 255,
            ((h >> 14) & 0x3F) * 55 // 63 / 255)


def label(name, width_px):
    """The part of name that fits in width_px, or "" when under three characters would."""
    fits = int((width_px - 4) / (FONT_PT * CHAR_EM * DPI / 72))
    if fits < 3:
        return ""
    return name if len(name) <= fits else name[:fits - 1] + "…"


def draw(path, stacks, title, unit):
    """Writes the flame graph of [(frames, value)] to path (its suffix picks PNG or SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fmt = Path(path).suffix[1:].lower()
    root = tree(stacks)
    total = root.value
    plot_w_in = WIDTH_IN - 2 * MARGIN_IN
    px_per_unit = plot_w_in * DPI / total if total else 0
    frames = layout(root, MIN_FRAME_PX / px_per_unit) if total else []
    rows = max((d for _, _, d in frames), default=0) + 1 if total else 4  # an empty graph: room for a line
    height_in = rows * ROW_IN + TITLE_IN + 2 * MARGIN_IN
    tips = []
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig = plt.figure(figsize=(WIDTH_IN, height_in), dpi=DPI)
        ax = fig.add_axes((MARGIN_IN / WIDTH_IN, MARGIN_IN / height_in, plot_w_in / WIDTH_IN,
                           rows * ROW_IN / height_in))
        ax.set_xlim(0, total or 1)
        ax.set_ylim(0, rows)
        ax.set_axis_off()
        top = 1 - MARGIN_IN / height_in
        fig.text(MARGIN_IN / WIDTH_IN, top, f"threadheap profile: {title}, {fmt_value(total, unit)} in all"
                 .replace("$", r"\$"), fontsize=10, va="top")
        fig.text(1 - MARGIN_IN / WIDTH_IN, top, "width: share of the total; the callers below their callees"
                 + ("; hover a frame for its value" if fmt == "svg" else ""),
                 fontsize=8, va="top", ha="right", color="#555555")
        if not total:
            ax.text(0.5, rows / 2, "no stack has any of it: nothing to draw", ha="center", fontsize=10,
                    color="gray")
        for i, (node, x, depth) in enumerate(frames):
            rect = Rectangle((x, depth), node.value, 0.92, facecolor=color(node.name) if depth else "#c8c8c8",
                             edgecolor="white", linewidth=0.3)
            rect.set_gid(f"frame{i}")
            ax.add_artist(rect)  # not add_patch: the limits are set, and its update of them is slow
            tips.append(f"{node.name}: {fmt_value(node.value, unit)}, {percent(node.value, total):.1f}%")
            text = label(node.name, node.value * px_per_unit)
            if text:
                t = ax.text(x + 2 / px_per_unit, depth + 0.46, text.replace("$", r"\$"), va="center",
                            fontsize=FONT_PT)
                t.set_clip_path(rect)  # a browser's font may be wider than matplotlib's
        if fmt == "svg":
            buf = io.StringIO()
            fig.savefig(buf, format="svg")
            Path(path).write_text(with_titles(buf.getvalue(), tips), encoding="utf-8")
        else:
            fig.savefig(Path(path), dpi=DPI, format=fmt)
        plt.close(fig)


def with_titles(svg, tips):
    """The SVG with a <title> (a browser's tooltip) first inside each frame's group, <g id="frameN">."""
    def titled(m):
        return f"{m.group(0)}<title>{escape(tips[int(m.group(1))])}</title>"

    return re.sub(r'<g id="frame(\d+)">', titled, svg)
