"""`threadheap profile FILE.pb.gz` and `threadheap profile --diff OLD NEW`: what a heap profile says, as text
or as a flame graph.

A profile is what threadheap writes with THREADHEAP_PROFILE (docs/profile.md): pprof's format, one sample per
call stack, each with seven values (alloc_objects, alloc_space, inuse_objects, inuse_space, peak_objects,
peak_space, fresh_space) that are already estimates of the true totals. profile_read.py parses and
symbolises it; this module prints the largest stacks of one type and a pprof-like table of functions (flat:
the function is the innermost frame; cum: it is anywhere in the stack), or, with --diff, the stacks that grew
from OLD to NEW, matched by their function names. --flame draws the same numbers (profile_flame.py).

Standard library only; the protobuf package is imported by profile_read when a file is read, matplotlib by
profile_flame when drawing.
"""

import argparse
import os
import sys
import time
from collections import defaultdict

from . import profile_read
from .profile_read import ProfileError
from .run_stats import human_bytes

PROG = "threadheap profile"
DEFAULT_TOP = 10
DEFAULT_FRAMES = 6
NAME_COLUMN_MAX = 48  # names with a file:line are padded to align it, up to this width


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is a ProfileError: one line, status 2."""

    def error(self, message):
        raise ProfileError(f"{message} (see {PROG} --help)", 2)


def positive_int(text):
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole number: '{text}'")
    return n


def build_parser():
    p = Parser(prog=PROG, description="What a threadheap heap profile (pprof format, THREADHEAP_PROFILE) says: "
               "the largest call stacks of one sample type, the functions they run through, or what grew "
               "between two profiles; see docs/profile.md.")
    p.add_argument("file", nargs="?", metavar="FILE.pb.gz", help="the profile to read")
    p.add_argument("--type", help="the sample type to show (default: the file's default, inuse_space); "
                   "alloc_objects, alloc_space, inuse_objects, inuse_space, peak_objects, peak_space, "
                   "fresh_space")
    p.add_argument("--top", type=positive_int, default=DEFAULT_TOP, metavar="N",
                   help=f"how many stacks and functions to print (default {DEFAULT_TOP})")
    p.add_argument("--frames", type=positive_int, default=DEFAULT_FRAMES, metavar="N",
                   help=f"frames printed per stack, innermost first (default {DEFAULT_FRAMES})")
    p.add_argument("--flame", metavar="OUT.svg|OUT.png",
                   help="also draw a flame graph of the type (with --diff: of the growth); needs matplotlib")
    p.add_argument("--diff", nargs=2, metavar=("OLD", "NEW"),
                   help="the stacks that grew from OLD to NEW (NEW - OLD), largest growth first")
    return p


# ------------------------------------------------------------------------------------------------ numbers


def fmt_value(v, unit, sign=False):
    if unit == "bytes":
        text = human_bytes(v)
    else:
        text = f"{v:,}" + ("" if unit == "count" else f" {unit}")
    return ("+" if sign and v > 0 else "") + text


def stacks(n):
    return f"{n} stack" + ("" if n == 1 else "s")


def percent(part, whole):
    return 100.0 * part / whole if whole else 0.0


def choose_type(profiles, wanted):
    """The sample type to show: wanted, or the first profile's default; ProfileError (status 2) listing the
    valid ones when wanted is not in every profile."""
    valid = [t for t in profiles[0].type_names() if all(t in p.type_names() for p in profiles[1:])]
    name = wanted or profiles[0].default_type
    if name not in valid:
        where = "this profile" if len(profiles) == 1 else "both profiles"
        raise ProfileError(f"no sample type '{name}' in {where}; valid: {', '.join(valid)}", 2)
    return name


# ------------------------------------------------------------------------------------------------ text


def stack_lines(frames, max_frames, indent="      "):
    shown = frames[:max_frames]
    width = min(max((len(f.name) for f in shown if f.where), default=0), NAME_COLUMN_MAX)
    lines = [f"{indent}{f.name:<{width}}  {f.where}".rstrip() for f in shown]
    if len(frames) > max_frames:
        more = len(frames) - max_frames
        lines.append(f"{indent}... {more} more frame{'s' if more > 1 else ''}")
    if not frames:
        lines.append(f"{indent}(no frames)")
    return lines


def header(prof, type_name):
    values = prof.values(type_name)
    total = sum(values.values())
    nonzero = sum(1 for v in values.values() if v)
    return [f"{prof.path}: {type_name} {fmt_value(total, prof.unit(type_name))} in {stacks(nonzero)}"] + about(prof)


def about(prof):
    """Indented lines: how the profile was taken, its sample types, and what symbolisation could not do."""
    parts = []
    if prof.period:
        parts.append(f"sampled every {fmt_value(prof.period, prof.period_unit)}")
    if prof.time_nanos:
        written = "written " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(prof.time_nanos / 1e9))
        if prof.duration_nanos:
            written += f", {prof.duration_nanos / 1e9:.1f} s after profiling began"
        parts.append(written)
    lines = ["  " + "; ".join(texts) for texts in (parts, prof.comments) if texts]
    lines.append("  sample types: " + " ".join(prof.type_names()) + " (--type)")
    lines += [f"  note: {n}" for n in prof.notes]
    return lines


def top_stacks(prof, type_name, top, max_frames):
    """Lines: the top stacks of one type, largest first, with their share of the total."""
    values = prof.values(type_name)
    unit = prof.unit(type_name)
    total = sum(values.values())
    ranked = sorted(((v, frames) for frames, v in values.items() if v > 0),
                    key=lambda vf: (-vf[0], [f.name for f in vf[1]]))
    if not ranked:
        return [f"no stack has any {type_name}"]
    lines = [f"top {min(top, len(ranked))} of {stacks(len(ranked))} by {type_name}, innermost frame first:"]
    for rank, (v, frames) in enumerate(ranked[:top], 1):
        lines.append(f"#{rank:<3} {fmt_value(v, unit):>10} {percent(v, total):6.1f}%")
        lines += stack_lines(frames, max_frames)
    return lines


def function_table(prof, type_name, top):
    """Lines: pprof's -top for one type. flat: the function is the innermost frame; cum: it is in the stack
    (counted once per stack, however often it recurses)."""
    values = prof.values(type_name)
    unit = prof.unit(type_name)
    total = sum(values.values())
    flat, cum = defaultdict(int), defaultdict(int)
    for frames, v in values.items():
        if frames:
            flat[frames[0].name] += v
        for name in {f.name for f in frames}:
            cum[name] += v
    rows = sorted(cum, key=lambda n: (-flat[n], -cum[n], n))[:top]
    lines = [f"functions by {type_name} (flat: innermost frame; cum: anywhere in the stack):",
             f"{'flat':>11} {'flat%':>6} {'cum':>11} {'cum%':>6}  function"]
    for n in rows:
        lines.append(f"{fmt_value(flat[n], unit):>11} {percent(flat[n], total):5.1f}% "
                     f"{fmt_value(cum[n], unit):>11} {percent(cum[n], total):5.1f}%  {n}")
    return lines


def report(prof, type_name, top=DEFAULT_TOP, max_frames=DEFAULT_FRAMES, functions=True):
    lines = header(prof, type_name) + [""] + top_stacks(prof, type_name, top, max_frames)
    if functions and any(prof.values(type_name).values()):
        lines += [""] + function_table(prof, type_name, top)
    return "\n".join(lines) + "\n"


def run_summary(prof, types=("inuse_space", "alloc_space", "fresh_space"), top=3, max_frames=4):
    """What `threadheap run --profile` prints at exit: a few stacks of each of a few types."""
    lines = about(prof)
    for type_name in types:
        if type_name in prof.type_names():
            total = sum(prof.values(type_name).values())
            lines += ["", f"{type_name}, {fmt_value(total, prof.unit(type_name))} in all:"]
            lines += top_stacks(prof, type_name, top, max_frames)
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ diff


def growth(old, new, type_name):
    """[(growth, old value, new value, frames)] per stack matched by its function names, largest growth
    first. Location ids, addresses and line numbers may differ between the two files; the names do not."""
    totals = defaultdict(lambda: [0, 0])  # names -> [old, new]
    shown = {}  # names -> (side, value, frames): the frames printed, with their file:line
    for side, prof in enumerate((old, new)):
        for frames, v in prof.values(type_name).items():
            names = tuple(f.name for f in frames)
            totals[names][side] += v
            # The largest of the samples that read the same, the newer file's first.
            if names not in shown or (side, v) > shown[names][:2]:
                shown[names] = (side, v, frames)
    rows = [(b - a, a, b, shown[names][2]) for names, (a, b) in totals.items()]
    return sorted(rows, key=lambda r: (-r[0], [f.name for f in r[3]]))


def diff_report(old, new, type_name, rows, top, max_frames):
    unit = old.unit(type_name)
    before, after = sum(r[1] for r in rows), sum(r[2] for r in rows)
    grew = [r for r in rows if r[0] > 0]
    shrank = [r for r in rows if r[0] < 0]
    grown = sum(r[0] for r in grew)
    lines = [f"{type_name}: {fmt_value(before, unit)} in {old.path}, {fmt_value(after, unit)} in {new.path} "
             f"({fmt_value(after - before, unit, sign=True)})"]
    lines += [f"  note: {n}" for n in dict.fromkeys(old.notes + new.notes)]
    lines.append("")
    if not grew:
        lines.append(f"no stack grew in {type_name}")
    else:
        lines.append(f"top {min(top, len(grew))} of {stacks(len(grew))} that grew, largest growth first "
                     f"(% of all growth; old -> new), innermost frame first:")
        for rank, (g, a, b, frames) in enumerate(grew[:top], 1):
            lines.append(f"#{rank:<3} {fmt_value(g, unit, sign=True):>11} {percent(g, grown):6.1f}%   "
                         f"{fmt_value(a, unit)} -> {fmt_value(b, unit)}" + ("   new stack" if a == 0 else ""))
            lines += stack_lines(frames, max_frames)
    lines.append("")
    same = len(rows) - len(grew) - len(shrank)
    lines.append(f"{stacks(len(grew))} grew by {fmt_value(grown, unit)} in all; {len(shrank)} shrank by "
                 f"{fmt_value(-sum(r[0] for r in shrank), unit)}; {same} did not change")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ main


def main(argv):
    try:
        args = build_parser().parse_args(list(argv))
        if bool(args.file) == bool(args.diff):
            raise ProfileError(f"give one profile, or --diff OLD NEW (see {PROG} --help)", 2)
        if args.flame:
            from .run import check_record_path
            from .run_record import check_matplotlib

            problem = check_record_path(args.flame, "--flame")
            if problem:
                raise ProfileError(problem, 2)
            problem = check_matplotlib()
            if problem:
                raise ProfileError(f"--flame needs matplotlib ({problem}); install it, e.g. pip install matplotlib")
        paths = args.diff or [args.file]
        for path in paths:
            if not os.path.isfile(path):
                raise ProfileError(f"no such file: {path}", 2)
        profiles = [profile_read.load(p) for p in paths]
        type_name = choose_type(profiles, args.type)
        if args.diff:
            rows = growth(profiles[0], profiles[1], type_name)
            sys.stdout.write(diff_report(profiles[0], profiles[1], type_name, rows, args.top, args.frames))
            drawn = [(frames, g) for g, _, _, frames in rows if g > 0]
            title = f"{type_name} growth, {paths[0]} -> {paths[1]}"
        else:
            sys.stdout.write(report(profiles[0], type_name, args.top, args.frames))
            drawn = list(profiles[0].values(type_name).items())
            title = f"{type_name} of {paths[0]}"
        if args.flame:
            from .profile_flame import draw

            try:
                draw(args.flame, drawn, title, profiles[0].unit(type_name))
            except Exception as e:  # the report is out; the drawing's failure is said in one line
                reason = " ".join(str(e).split())
                raise ProfileError(f"cannot draw {args.flame}: {type(e).__name__}: {reason}") from None
            sys.stderr.write(f"{PROG}: flame graph in {args.flame}\n")
    except ProfileError as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return e.status
    except BrokenPipeError:  # `| head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
