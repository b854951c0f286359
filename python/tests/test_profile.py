"""Tests of `threadheap profile`, on profiles made here with the classes compiled from proto/profile.proto, in
threadheap's layout (seven sample types, inuse_space by default): the top stacks' order and shares, --type and
its error, the functions' flat and cum, C++ names demangled, --diff's growth matched across files whose ids
differ, the flame graph as a real SVG (parsed, its labels and tooltips read) and PNG, one-line errors for bad
arguments and for files that are not profiles, the schema's compilation cache, and symbolisation against an
ELF file written here (addr2line names what the profile does not; another build or a missing file falls back
to file+offset).

Needs the protobuf and grpcio-tools packages (bench/venv.sh), and binutils (c++filt, addr2line), which
building threadheap needs anyway.
"""

import gzip
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import namedtuple
from pathlib import Path

import pytest

from threadheap import profile, profile_read, run, run_stats

pytest.importorskip("google.protobuf")

REPO = Path(__file__).resolve().parents[2]
KIB, MIB = 1 << 10, 1 << 20
TYPES = [("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"),
         ("inuse_space", "bytes"), ("peak_objects", "count"), ("peak_space", "bytes"), ("fresh_space", "bytes")]

# A frame of a made-up sample: a location in mapping number `mapping` (an index into the profile's mappings)
# at `address`, with the library's dladdr name when it found one.
At = namedtuple("At", "mapping address name", defaults=(None,))
Mapping = namedtuple("Mapping", "filename build_id start limit offset")


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    """The compiled schema goes to a cache of the tests' own, not the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


def write_profile(path, samples, default="inuse_space", mappings=(), first_id=1, id_step=1, gz=True, times=(0, 0)):
    """A profile as threadheap writes it, of samples [(frames innermost first, {type: value})]: a frame is a
    function name (a location whose Line names it) or an At. Ids start at first_id and go up by id_step, in
    the order frames are first seen, so that two files can number the same functions differently. times:
    (time_nanos, duration_nanos)."""
    pb = profile_read.schema()
    p = pb.Profile()
    strings = {"": 0}

    def s(text):
        return strings.setdefault(text, len(strings))

    def next_id(table):
        return first_id + id_step * len(table)

    for t, u in TYPES:
        p.sample_type.add(type=s(t), unit=s(u))
    p.default_sample_type = s(default)
    p.period_type.type, p.period_type.unit, p.period = s("space"), s("bytes"), 512 * KIB
    p.time_nanos, p.duration_nanos = times
    p.comment.extend([s("threadheap 0.1 heap profile"),
                      s("sampling rate 524288 bytes; values are estimates of the true totals")])
    mapping_ids = []
    for m in mappings:
        mapping_ids.append(next_id(mapping_ids))
        p.mapping.add(id=mapping_ids[-1], memory_start=m.start, memory_limit=m.limit, file_offset=m.offset,
                      filename=s(m.filename), build_id=s(m.build_id), has_functions=True)
    functions, locations = {}, {}

    def function_id(name):
        if name not in functions:
            functions[name] = next_id(functions)
            p.function.add(id=functions[name], name=s(name), system_name=s(name))
        return functions[name]

    for frames, values in samples:
        ids = []
        for frame in frames:
            if frame not in locations:
                locations[frame] = next_id(locations)
                if isinstance(frame, At):
                    loc = p.location.add(id=locations[frame], mapping_id=mapping_ids[frame.mapping],
                                         address=frame.address)
                    if frame.name:
                        loc.line.add(function_id=function_id(frame.name))
                else:
                    loc = p.location.add(id=locations[frame], address=0x5000 + 16 * len(locations))
                    loc.line.add(function_id=function_id(frame))
            ids.append(locations[frame])
        p.sample.add(location_id=ids, value=[values.get(t, 0) for t, _ in TYPES])
    p.string_table.extend(sorted(strings, key=strings.get))
    data = p.SerializeToString()
    Path(path).write_bytes(gzip.compress(data) if gz else data)
    return str(path)


GROW = ("_ZN5cache4growEm", "_ZN5cache3putEPKcm", "handle_request", "worker_main", "start_thread")
PARSE = ("parse_json", "handle_request", "worker_main", "start_thread")
CONFIG = ("load_config", "main")
SESSION = ("session_new", "accept_loop", "main")

OLD = [(GROW, {"inuse_space": 6 * MIB, "alloc_space": 8 * MIB, "fresh_space": 6 * MIB, "inuse_objects": 6}),
       (PARSE, {"inuse_space": 1 * MIB, "alloc_space": 40 * MIB, "fresh_space": 2 * MIB, "inuse_objects": 1000}),
       (CONFIG, {"inuse_space": 512 * KIB, "alloc_space": 512 * KIB, "inuse_objects": 4})]
# Ten minutes later: the cache grew by 24 MiB, a new stack holds 3 MiB, the parser let go of half its memory
# and the configuration did not change.
NEW = [(CONFIG, {"inuse_space": 512 * KIB, "alloc_space": 512 * KIB}),
       (SESSION, {"inuse_space": 3 * MIB, "alloc_space": 3 * MIB}),
       (PARSE, {"inuse_space": 512 * KIB, "alloc_space": 80 * MIB}),
       (GROW, {"inuse_space": 30 * MIB, "alloc_space": 40 * MIB})]


def run_profile(argv, capsys):
    status = profile.main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def ranked(out):
    """[(value text, percent text, first frame)] of the #N blocks of a report."""
    lines = out.splitlines()
    rows = []
    for i, line in enumerate(lines):
        m = re.match(r"#\d+\s+(.+?)\s+(\S+%)", line)
        if m:
            rows.append((m[1], m[2], lines[i + 1].strip()))
    return rows


# ------------------------------------------------------------------------------------------------ the top


def test_top_orders_stacks_and_gives_their_share(tmp_path, capsys):
    path = write_profile(tmp_path / "p.pb.gz", OLD)
    status, out, err = run_profile([path], capsys)
    assert status == 0 and err == ""
    assert out.splitlines()[0] == f"{path}: inuse_space 7.5 MiB in 3 stacks"
    assert out.splitlines()[1] == "  sampled every 512.0 KiB"
    assert out.splitlines()[2] == ("  threadheap 0.1 heap profile; sampling rate 524288 bytes; values are estimates "
                                   "of the true totals")
    assert out.splitlines()[3] == ("  sample types: alloc_objects alloc_space inuse_objects inuse_space peak_objects "
                                   "peak_space fresh_space (--type)")
    written = 1_700_000_000
    path = write_profile(tmp_path / "t.pb.gz", OLD, times=(written * 10**9, 600 * 10**9))
    _, out, _ = run_profile([path], capsys)
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(written))
    assert out.splitlines()[1] == f"  sampled every 512.0 KiB; written {when}, 600.0 s after profiling began"
    assert ranked(out) == [("6.0 MiB", "80.0%", "cache::grow(unsigned long)"),
                           ("1.0 MiB", "13.3%", "parse_json"), ("512.0 KiB", "6.7%", "load_config")]
    # The frames of the first stack, innermost first, demangled by c++filt.
    block = out.split("#1 ")[1].split("#2 ")[0].splitlines()[1:]
    assert [line.strip() for line in block] == ["cache::grow(unsigned long)", "cache::put(char const*, unsigned long)",
                                                "handle_request", "worker_main", "start_thread"]


def test_frames_and_top_limit_what_is_printed(tmp_path, capsys):
    path = write_profile(tmp_path / "p.pb.gz", OLD)
    status, out, _ = run_profile([path, "--top", "2", "--frames", "2"], capsys)
    assert status == 0
    assert "top 2 of 3 stacks by inuse_space" in out and len(ranked(out)) == 2
    assert "      ... 3 more frames" in out and "      ... 2 more frames" in out
    assert "worker_main" not in out.split("functions by")[0]
    _, out, _ = run_profile([path, "--top", "1", "--frames", "4"], capsys)
    assert "      ... 1 more frame\n" in out


def test_type_selects_the_values(tmp_path, capsys):
    path = write_profile(tmp_path / "p.pb.gz", OLD)
    _, out, _ = run_profile([path, "--type", "alloc_space"], capsys)
    assert [r[:2] for r in ranked(out)] == [("40.0 MiB", "82.5%"), ("8.0 MiB", "16.5%"), ("512.0 KiB", "1.0%")]
    assert ranked(out)[0][2] == "parse_json"
    _, out, _ = run_profile([path, "--type", "fresh_space"], capsys)
    assert out.splitlines()[0].endswith("fresh_space 8.0 MiB in 2 stacks")  # load_config made none
    assert [r[2] for r in ranked(out)] == ["cache::grow(unsigned long)", "parse_json"]
    _, out, _ = run_profile([path, "--type", "inuse_objects"], capsys)
    assert ranked(out)[0][:2] == ("1,000", "99.0%")
    # Without --type: the file's default_sample_type.
    path = write_profile(tmp_path / "q.pb.gz", OLD, default="alloc_space")
    _, out, _ = run_profile([path], capsys)
    assert "alloc_space 48.5 MiB" in out.splitlines()[0]


def test_bad_type_lists_the_valid_ones(tmp_path, capsys):
    path = write_profile(tmp_path / "p.pb.gz", OLD)
    status, out, err = run_profile([path, "--type", "inuse_bytes"], capsys)
    assert status == 2 and out == ""
    assert err == ("threadheap profile: no sample type 'inuse_bytes' in this profile; valid: alloc_objects, "
                   "alloc_space, inuse_objects, inuse_space, peak_objects, peak_space, fresh_space\n")


FUNCTION_ROW = re.compile(r"\s*(\S+ \S+)\s+(\S+%)\s+(\S+ \S+)\s+(\S+%)  (.+)$")


def test_functions_flat_and_cum(tmp_path, capsys):
    recursive = (("walk", "walk", "walk", "main"), {"inuse_space": 2 * MIB})
    path = write_profile(tmp_path / "p.pb.gz", OLD + [recursive])
    _, out, _ = run_profile([path], capsys)
    table = out.split("functions by inuse_space")[1].splitlines()[2:]
    rows = [FUNCTION_ROW.match(line).groups() for line in table]
    by_name = {r[4]: r[:4] for r in rows}
    assert rows[0] == ("6.0 MiB", "63.2%", "6.0 MiB", "63.2%", "cache::grow(unsigned long)")  # by flat first
    assert rows[1][4] == "walk" and by_name["walk"] == ("2.0 MiB", "21.1%", "2.0 MiB", "21.1%")  # once a stack
    assert by_name["handle_request"] == ("0 B", "0.0%", "7.0 MiB", "73.7%")
    assert by_name["main"] == ("0 B", "0.0%", "2.5 MiB", "26.3%")


def test_the_printer_of_run(tmp_path):
    prof = profile_read.load(write_profile(tmp_path / "p.pb.gz", OLD))
    text = profile.run_summary(prof)
    sections = [line for line in text.splitlines() if line.endswith(" in all:")]
    assert sections == ["inuse_space, 7.5 MiB in all:", "alloc_space, 48.5 MiB in all:",
                        "fresh_space, 8.0 MiB in all:"]
    assert "top 3 of 3 stacks by alloc_space" in text and "functions by" not in text


def test_run_reports_the_profile_its_program_wrote(tmp_path, capsys):
    path = write_profile(tmp_path / "threadheap-profile.42.pb.gz", OLD)
    run.report_profile(path, None)
    err = capsys.readouterr().err
    assert err.startswith(f"threadheap run: heap profile in {path}\n")
    assert "inuse_space, 7.5 MiB in all:" in err
    assert ranked(err)[0] == ("6.0 MiB", "80.0%", "cache::grow(unsigned long)")
    assert len(ranked(err)) == 3 + 3 + 2  # load_config took no fresh memory
    assert err.endswith(f"(all of it: threadheap profile {path}; a flame graph: add --flame OUT.svg)\n")
    # A file from before the run, untouched, is not this run's; neither is a missing one.
    run.report_profile(path, run.file_stamp(path))
    run.report_profile(str(tmp_path / "missing.pb.gz"), None)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"threadheap run: no heap profile was written in {p} (the library writes it at exit; not "
                     "when the program is killed)" for p in (path, tmp_path / "missing.pb.gz")]
    (tmp_path / "junk").write_text("junk")
    run.report_profile(str(tmp_path / "junk"), None)
    err = capsys.readouterr().err
    assert err.startswith(f"threadheap run: {tmp_path / 'junk'}: not a pprof profile") and err.count("\n") == 1


def test_run_profile_passes_the_path_and_reports(tmp_path):
    canned = write_profile(tmp_path / "canned.pb.gz", OLD)
    folder = tmp_path / "out"
    folder.mkdir()
    # The program is a stand-in for one under the library's profiler: it writes the profile where
    # THREADHEAP_PROFILE says. Any library does for the preload; libc is harmless.
    with open("/proc/self/maps") as f:
        libc = next(line.split()[-1] for line in f if "/libc.so" in line or "/libc-" in line)
    script = f'cp {canned} "$THREADHEAP_PROFILE"; echo "$$ $THREADHEAP_PROFILE"; exit 3'
    proc = cli(["run", "--profile", str(folder), "--", "sh", "-c", script], {"TH_LIB": libc})
    assert proc.returncode == 3  # the program's status
    pid, said = proc.stdout.split()
    assert said == str(folder / f"threadheap-profile.{pid}.pb.gz") and Path(said).is_file()
    assert proc.stderr.startswith(f"threadheap run: heap profile in {said}\n")
    assert ranked(proc.stderr)[0] == ("6.0 MiB", "80.0%", "cache::grow(unsigned long)")
    # A named file that the program leaves alone is not reported as its profile.
    proc = cli(["run", "--profile", canned, "--", "true"], {"TH_LIB": libc})
    assert proc.returncode == 0 and proc.stderr.startswith(f"threadheap run: no heap profile was written in {canned}")


# ------------------------------------------------------------------------------------------------ diff


def test_diff_ranks_growth_and_matches_stacks_by_names(tmp_path, capsys):
    old = write_profile(tmp_path / "old.pb.gz", OLD)
    # Other ids (100, 107, ...), another order of samples and functions: only the names match.
    new = write_profile(tmp_path / "new.pb.gz", NEW, first_id=100, id_step=7)
    status, out, err = run_profile(["--diff", old, new], capsys)
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"inuse_space: 7.5 MiB in {old}, 34.0 MiB in {new} (+26.5 MiB)"
    blocks = [line.split() for line in lines if line.startswith("#")]
    assert blocks[0][1:] == ["+24.0", "MiB", "88.9%", "6.0", "MiB", "->", "30.0", "MiB"]
    assert blocks[1][1:] == ["+3.0", "MiB", "11.1%", "0", "B", "->", "3.0", "MiB", "new", "stack"]
    assert [r[2] for r in ranked(out)] == ["cache::grow(unsigned long)", "session_new"]
    assert lines[-1] == "2 stacks grew by 27.0 MiB in all; 1 shrank by 512.0 KiB; 1 did not change"


def test_diff_by_type_and_nothing_grew(tmp_path, capsys):
    old = write_profile(tmp_path / "old.pb.gz", OLD)
    new = write_profile(tmp_path / "new.pb.gz", NEW, first_id=50)
    _, out, _ = run_profile(["--diff", old, new, "--type", "alloc_space"], capsys)
    assert [b.split()[1] for b in out.splitlines() if b.startswith("#")] == ["+40.0", "+32.0", "+3.0"]
    _, out, _ = run_profile(["--diff", new, new], capsys)
    assert "no stack grew in inuse_space" in out and out.splitlines()[-1].endswith("0 shrank by 0 B; 4 did not change")


# ------------------------------------------------------------------------------------------------ flame graph


def svg_texts(path):
    root = ET.parse(path).getroot()  # raises on malformed XML
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    return texts, titles


def test_flame_svg_names_the_top_functions(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = write_profile(tmp_path / "p.pb.gz", NEW)
    out_svg = tmp_path / "flame.svg"
    status, out, err = run_profile([path, "--flame", str(out_svg)], capsys)
    assert status == 0 and err == f"threadheap profile: flame graph in {out_svg}\n"
    assert ranked(out)  # the text report is printed too
    texts, titles = svg_texts(out_svg)
    for name in ("all", "start_thread", "worker_main", "handle_request", "cache::grow(unsigned long)", "main",
                 "session_new"):
        assert name in texts, name
    assert titles[0] == "all: 34.0 MiB, 100.0%"
    assert "cache::grow(unsigned long): 30.0 MiB, 88.2%" in titles
    assert "load_config: 512.0 KiB, 1.5%" in titles  # too narrow for a label, but there on hover
    assert "load_config" not in texts


def test_flame_png_and_flame_of_a_diff(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    old = write_profile(tmp_path / "old.pb.gz", OLD)
    new = write_profile(tmp_path / "new.pb.gz", NEW, first_id=9)
    out_png = tmp_path / "flame.png"
    assert run_profile([new, "--flame", str(out_png)], capsys)[0] == 0
    data = out_png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24])[0] == 1600
    out_svg = tmp_path / "growth.svg"
    assert run_profile(["--diff", old, new, "--flame", str(out_svg)], capsys)[0] == 0
    texts, titles = svg_texts(out_svg)
    assert titles[0] == "all: 27.0 MiB, 100.0%"  # what grew; what shrank or stayed is not drawn
    assert "session_new" in texts and not any(t.startswith(("load_config", "parse_json")) for t in titles)


def test_flame_of_nothing(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = write_profile(tmp_path / "p.pb.gz", [(CONFIG, {"alloc_space": MIB})])
    out_svg = tmp_path / "empty.svg"
    status, out, _ = run_profile([path, "--flame", str(out_svg)], capsys)
    assert status == 0 and "no stack has any inuse_space" in out
    texts, _ = svg_texts(out_svg)
    assert "no stack has any of it: nothing to draw" in texts


# ------------------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("argv, message", [
    ([], "give one profile, or --diff OLD NEW"),
    (["{p}", "--diff", "{p}", "{p}"], "give one profile, or --diff OLD NEW"),
    (["--diff", "{p}"], "argument --diff: expected 2 arguments"),
    (["{p}", "--top", "0"], "argument --top: not a positive whole number: '0'"),
    (["{p}", "--frames", "x"], "argument --frames: not a positive whole number: 'x'"),
    (["{p}", "--bogus"], "unrecognized arguments: --bogus"),
    (["{p}", "--flame", "out.txt"], "--flame FILE must end in .png or .svg: 'out.txt'"),
    (["{p}", "--flame", "/nonexistent-folder/f.svg"], "--flame: no folder /nonexistent-folder"),
    (["/nonexistent-folder/p.pb.gz"], "no such file: /nonexistent-folder/p.pb.gz"),
    (["--diff", "{p}", "{q}", "--type", "peak_space"], "no sample type 'peak_space' in both profiles; valid: "),
])
def test_bad_arguments_are_one_line(argv, message, tmp_path, capsys):
    p = write_profile(tmp_path / "p.pb.gz", OLD)
    q = tmp_path / "q.pb.gz"
    write_profile(q, OLD)
    # q has lost its peak types (a profile of another version): --diff takes only types both files have.
    prof = profile_read.schema().Profile.FromString(gzip.decompress(q.read_bytes()))
    del prof.sample_type[4:6]
    for sample in prof.sample:
        del sample.value[4:6]
    q.write_bytes(gzip.compress(prof.SerializeToString()))
    status, out, err = run_profile([a.format(p=p, q=q) for a in argv], capsys)
    assert status == 2 and out == ""
    assert err.startswith(f"threadheap profile: {message}") and err.count("\n") == 1, err


def test_files_that_are_not_profiles(tmp_path, capsys):
    cases = {"text": b"hello, this is not a profile\n", "empty": b"", "gzip": gzip.compress(b"\x0a\x05hello"),
             "broken-gzip": gzip.compress(b"x" * 100)[:20], "random": bytes(range(256)) * 4}
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        status, out, err = run_profile([str(path)], capsys)
        assert status == 1 and out == "", name
        assert err.startswith(f"threadheap profile: {path}: not a pprof profile (") and err.count("\n") == 1, err
    # References to nothing: a sample naming a location that is not there.
    pb = profile_read.schema()
    bad = pb.Profile(string_table=["", "inuse_space", "bytes"])
    bad.sample_type.add(type=1, unit=2)
    bad.sample.add(location_id=[7], value=[1])
    (tmp_path / "dangling").write_bytes(bad.SerializeToString())
    status, _, err = run_profile([str(tmp_path / "dangling")], capsys)
    assert status == 1 and err.endswith("not a pprof profile (a sample names location 7, which is not there)\n")


def test_uncompressed_profiles_are_read_too(tmp_path, capsys):
    path = write_profile(tmp_path / "p.pb", OLD, gz=False)
    status, out, _ = run_profile([path], capsys)
    assert status == 0 and ranked(out)[0][:2] == ("6.0 MiB", "80.0%")


def cli(args, extra_env=None):
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    env.update(extra_env or {})
    proc = subprocess.run([sys.executable, "-m", "threadheap"] + args, capture_output=True, text=True, env=env,
                          timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_command_line(tmp_path):
    assert "profile  read a heap profile" in cli(["--help"]).stdout
    path = write_profile(tmp_path / "p.pb.gz", OLD)
    proc = cli(["profile", path, "--top", "1"])
    assert proc.returncode == 0 and "#1 " in proc.stdout and "#2 " not in proc.stdout


def test_without_protobuf_one_line_says_what_to_install(tmp_path, no_protobuf_pythonpath):
    path = tmp_path / "p.pb.gz"
    path.write_bytes(b"")
    proc = cli(["profile", str(path)], {"PYTHONPATH": no_protobuf_pythonpath})
    assert proc.returncode == 1
    assert proc.stderr == ("threadheap profile: reading profiles needs the Python package protobuf: pip install "
                           "protobuf grpcio-tools (bench/venv.sh puts them in the project's .venv)\n")


# ------------------------------------------------------------------------------------------------ the schema


def test_schema_is_compiled_once_into_the_cache(tmp_path):
    module = profile_read.load_schema(profile_read.PROTO, tmp_path)
    [folder] = tmp_path.iterdir()
    assert folder.name.startswith("profile_pb2-") and (folder / "profile_pb2.py").is_file()
    stamp = (folder / "profile_pb2.py").stat().st_mtime_ns
    again = profile_read.load_schema(profile_read.PROTO, tmp_path)
    assert (folder / "profile_pb2.py").stat().st_mtime_ns == stamp and list(tmp_path.iterdir()) == [folder]
    assert again.Profile.DESCRIPTOR.full_name == module.Profile.DESCRIPTOR.full_name == "perftools.profiles.Profile"
    # An edited .proto (or another protobuf version) is another key.
    edited = tmp_path / "edited" / "profile.proto"
    edited.parent.mkdir()
    edited.write_text(profile_read.PROTO.read_text() + "\n// edited\n")
    profile_read.load_schema(edited, tmp_path)
    assert len([f for f in tmp_path.iterdir() if f.name.startswith("profile_pb2-")]) == 2


def test_schema_without_a_writable_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    module = profile_read.load_schema(profile_read.PROTO, blocker / "threadheap")
    assert module.Profile.DESCRIPTOR.full_name == "perftools.profiles.Profile"
    assert list(scratch.iterdir()) == []  # compiled in a temporary folder, removed once imported


@pytest.fixture
def no_grpc_tools(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "grpc_tools" else real(name, *a))


def test_schema_with_the_protoc_on_path(tmp_path, no_grpc_tools):
    if not shutil.which("protoc"):
        pytest.skip("no protoc on PATH")
    module = profile_read.load_schema(profile_read.PROTO, tmp_path)
    assert module.Profile(period=7).period == 7


def test_schema_without_any_protoc(tmp_path, no_grpc_tools, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(profile_read.ProfileError) as e:
        profile_read.load_schema(profile_read.PROTO, tmp_path)
    assert str(e.value) == ("reading profiles needs protoc once, to compile profile.proto: pip install protobuf "
                            "grpcio-tools (bench/venv.sh puts them in the project's .venv)")


def test_schema_location_is_the_same_in_the_source_and_installed_trees():
    # Installed: share/threadheap/python/threadheap/profile_read.py and share/threadheap/proto/profile.proto.
    assert profile_read.PROTO == Path(profile_read.__file__).resolve().parents[2] / "proto" / "profile.proto"
    assert profile_read.PROTO.is_file() and run_stats.cache_dir().name == "threadheap"


# ------------------------------------------------------------------------------------------------ symbols


def write_elf(path, symbols, build_id, base=0x400000):
    """A minimal x86-64 executable for addr2line: one PT_LOAD of the whole file at base (so that file offsets
    and addresses differ, as in a non-PIE program), a .text at file offset 0x1000, the (name, offset in .text)
    symbols as global functions of 32 bytes in .symtab, and a GNU build-id note."""
    text_off, text_size, note_off = 0x1000, 0x1000, 0x200
    note = struct.pack("<III", 4, len(build_id), 3) + b"GNU\0" + build_id
    strtab, syms = b"\0", b"\0" * 24
    for name, off in symbols:
        syms += struct.pack("<IBBHQQ", len(strtab), 0x12, 0, 2, base + text_off + off, 32)  # FUNC, GLOBAL, .text
        strtab += name.encode() + b"\0"
    names = [b"", b".note.gnu.build-id", b".text", b".symtab", b".strtab", b".shstrtab"]
    shstrtab = b"\0".join(names) + b"\0"
    name_at = [shstrtab.index(n + b"\0") if n else 0 for n in names]
    sym_off = text_off + text_size
    str_off = sym_off + len(syms)
    shs_off = str_off + len(strtab)
    sh_off = (shs_off + len(shstrtab) + 7) & ~7
    end = sh_off + 6 * 64

    def shdr(i, kind, flags, addr, off, size, link=0, info=0, align=1, entsize=0):
        return struct.pack("<IIQQQQIIQQ", name_at[i], kind, flags, addr, off, size, link, info, align, entsize)

    sections = (b"\0" * 64 + shdr(1, 7, 2, base + note_off, note_off, len(note), align=4)
                + shdr(2, 1, 6, base + text_off, text_off, text_size, align=16)
                + shdr(3, 2, 0, 0, sym_off, len(syms), link=4, info=1, align=8, entsize=24)
                + shdr(4, 3, 0, 0, str_off, len(strtab)) + shdr(5, 3, 0, 0, shs_off, len(shstrtab)))
    image = bytearray(end)
    image[0:64] = (b"\x7fELF\x02\x01\x01" + b"\0" * 9
                   + struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, base + text_off, 64, sh_off, 0, 64, 56, 2, 64, 6, 5))
    image[64:176] = (struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, end, end, 0x1000)
                     + struct.pack("<IIQQQQQQ", 4, 4, note_off, base + note_off, base + note_off, len(note),
                                   len(note), 4))
    image[note_off:note_off + len(note)] = note
    image[sym_off:str_off] = syms
    image[str_off:shs_off] = strtab
    image[shs_off:shs_off + len(shstrtab)] = shstrtab
    image[sh_off:end] = sections
    Path(path).write_bytes(bytes(image))


BUILD_ID = bytes(range(1, 21))


def test_elf_info_reads_the_build_id_and_segments(tmp_path):
    write_elf(tmp_path / "prog", [("f", 0)], BUILD_ID)
    build_id, loads = profile_read.elf_info(str(tmp_path / "prog"))
    assert build_id == BUILD_ID.hex() and loads[0][:2] == (0, 0x400000)
    assert profile_read.elf_address(str(tmp_path / "prog"), BUILD_ID.hex().upper(), 0x1010) == 0x401010
    assert profile_read.elf_address(str(tmp_path / "prog"), "00" * 20, 0x1010) is None  # another build
    assert profile_read.elf_address(str(tmp_path / "prog"), "", 0x1010) == 0x401010  # none recorded: trusted
    assert profile_read.elf_info(str(tmp_path / "missing")) is None
    (tmp_path / "text").write_text("not ELF")
    assert profile_read.elf_info(str(tmp_path / "text")) is None


def test_symbolised_on_this_machine(tmp_path, capsys):
    prog = tmp_path / "server"
    write_elf(prog, [("grow_table", 0x10), ("_ZN5cache4growEm", 0x40), ("main", 0x100)], BUILD_ID)
    start = 0x7F00_0000_0000  # where it was mapped in the profiled process; file offset 0x1000 is there
    mappings = [Mapping(str(prog), BUILD_ID.hex(), start, start + 0x2000, 0x1000),
                Mapping(str(tmp_path / "gone.so"), "ab" * 20, 0x7F10_0000_0000, 0x7F10_0001_0000, 0),
                Mapping(str(prog), "cd" * 20, 0x7F20_0000_0000, 0x7F20_0000_2000, 0x1000)]  # another build
    stack = (At(0, start + 0x14),                      # grow_table, which dladdr did not see (a static)
             At(0, start + 0x44, "cache_grow_wrong"),  # addr2line knows better than the recorded name
             At(1, 0x7F10_0000_0abc, "from_the_library"),  # the file is not here: the recorded name
             At(1, 0x7F10_0000_0123),                  # nor any name: file+offset
             At(2, 0x7F20_0000_0110),                  # another build of the file: file+offset
             At(0, start + 0x105))                     # main
    path = write_profile(tmp_path / "p.pb.gz", [(stack, {"inuse_space": MIB})], mappings=mappings)
    status, out, _ = run_profile([path, "--frames", "10"], capsys)
    assert status == 0
    frames = [line.strip() for line in out.split("#1 ")[1].split("\n\n")[0].splitlines()[1:]]
    assert frames == ["grow_table", "cache::grow(unsigned long)", "from_the_library", "gone.so+0x123",
                      "server+0x1110", "main"]


def test_without_binutils_the_recorded_names_stay(tmp_path, capsys, monkeypatch):
    prog = tmp_path / "server"
    write_elf(prog, [("grow_table", 0x10)], BUILD_ID)
    mappings = [Mapping(str(prog), BUILD_ID.hex(), 0x10000, 0x12000, 0x1000)]
    stack = (At(0, 0x10014), At(0, 0x10024, "_ZN5cache4growEm"))
    path = write_profile(tmp_path / "p.pb.gz", [(stack, {"inuse_space": MIB})], mappings=mappings)
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    status, out, _ = run_profile([path], capsys)
    assert status == 0
    assert "  note: c++filt not found (binutils): C++ names are shown mangled" in out
    assert "  note: addr2line not found (binutils): no file:line, and only the names the library found" in out
    frames = [line.strip() for line in out.split("#1 ")[1].split("\n\n")[0].splitlines()[1:]]
    assert frames == ["server+0x1014", "_ZN5cache4growEm"]
