"""Reading a heap profile for `threadheap profile`: load() parses a pprof file (a gzipped protobuf
perftools.profiles.Profile, as src/profile.c writes it) and returns its stacks symbolised for this machine.

The Python classes come from proto/profile.proto, compiled once by protoc (grpcio-tools' own, which matches
the protobuf package it was installed with, else a protoc on PATH) into
$XDG_CACHE_HOME/threadheap/profile_pb2-<key>/, where the key hashes the .proto and the protobuf version: an
edited schema or an upgraded protobuf gets a fresh compilation. The .proto sits at the same place relative to
this package in the source tree (proto/) and in an installed tree (share/threadheap/proto/). The .deb
recommends Debian's python3-protobuf and protobuf-compiler, whose protoc matches that protobuf.

Symbolisation, per location (a call site: return address - 1):
  - when the mapping's file is on this machine with the build id the profile recorded, addr2line (binutils)
    names the function, the functions inlined into it and file:line, all the addresses of one file in one
    call. Its names come from the symbol table and debug information, which see static functions too;
  - else the function names the library found with dladdr (demangled by c++filt, in one call);
  - else the mapping's file and the offset in it, `libfoo.so+0x1a2b`, which stays the same from run to run.
Missing tools are said in Profile.notes, and the frames fall back as above.
"""

import gzip
import hashlib
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from .run_stats import cache_dir

PROTO = Path(__file__).resolve().parents[2] / "proto" / "profile.proto"
# An installed tree (share/threadheap/) reads profiles with the system's protobuf and protoc; a source tree
# (it has the CMakeLists.txt) with the project's venv.
if (PROTO.parents[1] / "CMakeLists.txt").is_file():
    INSTALL_HINT = "pip install protobuf grpcio-tools (bench/venv.sh puts them in the project's .venv)"
else:
    INSTALL_HINT = "apt-get install python3-protobuf protobuf-compiler, or pip install protobuf grpcio-tools"
TOOL_TIMEOUT_S = 300


class ProfileError(Exception):
    """A one-line error for the user; .status is the exit status (2: the command line, 1: the rest)."""

    def __init__(self, message, status=1):
        super().__init__(message)
        self.status = status


class NotAProfile(Exception):
    """The parsed message breaks the format's rules (a reference to nothing, a missing part): why, in words."""


@dataclass(frozen=True)
class Frame:
    name: str       # the function, demangled; else "FILE+0xOFFSET", else "0xADDRESS"
    where: str = ""  # "file.c:12" when known


@dataclass
class Profile:
    path: str
    types: list          # [(type, unit)], in the file's order
    default_type: str
    period: int
    period_unit: str
    comments: list
    time_nanos: int
    duration_nanos: int
    # (Frame, ...) innermost first -> [value per type]. Samples whose frames read the same are summed.
    stacks: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)  # what symbolisation could not do, one line each

    def type_names(self):
        return [t for t, _ in self.types]

    def unit(self, type_name):
        return dict(self.types)[type_name]

    def values(self, type_name):
        """{frames: value} of one sample type."""
        i = self.type_names().index(type_name)
        return {frames: values[i] for frames, values in self.stacks.items()}


# ------------------------------------------------------------------------------------------------ the schema

_schema = None


def schema():
    """The module compiled from proto/profile.proto (Profile, Sample, ... classes); ProfileError when
    protobuf or a protoc is missing."""
    global _schema
    if _schema is None:
        _schema = load_schema(PROTO, cache_dir())
    return _schema


def load_schema(proto, cache):
    try:
        import google.protobuf
    except ImportError:
        raise ProfileError(f"reading profiles needs the Python package protobuf: {INSTALL_HINT}") from None
    try:
        source = proto.read_bytes()
    except OSError as e:
        raise ProfileError(f"cannot read the profile schema {proto}: {e.strerror}") from None
    key = hashlib.sha256(source + google.protobuf.__version__.encode()).hexdigest()[:16]
    folder = Path(cache) / f"profile_pb2-{key}"
    if (folder / "profile_pb2.py").is_file():
        return import_generated(folder / "profile_pb2.py")
    # Compiled into a new folder, then renamed into place: a concurrent first use never sees half a file,
    # and the loser of a race keeps its own copy. A cache that cannot be written costs a compilation per run.
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=folder.parent, prefix=".tmp-")
    except OSError:
        tmp = tempfile.mkdtemp(prefix="threadheap-proto-")
    try:
        compile_schema(proto, tmp)
        try:
            os.rename(tmp, folder)
            tmp = None
        except OSError:
            pass
        return import_generated(Path(tmp or folder) / "profile_pb2.py")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def compile_schema(proto, out_dir):
    if importlib.util.find_spec("grpc_tools") is not None:
        cmd = [sys.executable, "-m", "grpc_tools.protoc"]
    elif shutil.which("protoc"):
        cmd = ["protoc"]
    else:
        raise ProfileError(f"reading profiles needs protoc once, to compile {proto.name}: {INSTALL_HINT}")
    try:
        proc = subprocess.run(cmd + [f"-I{proto.parent}", f"--python_out={out_dir}", str(proto)],
                              capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        raise ProfileError(f"cannot run {cmd[-1]}: {e}") from None
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[0]
        raise ProfileError(f"{cmd[-1]} cannot compile {proto}: {reason}")


def import_generated(path):
    spec = importlib.util.spec_from_file_location("threadheap_profile_pb2", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # generated code checks the runtime's version in its own ways (VersionError, ...)
        import google.protobuf

        reason = " ".join(str(e).split())
        raise ProfileError(f"{path} does not load with protobuf {google.protobuf.__version__} "
                           f"({type(e).__name__}: {reason}); pip install --upgrade protobuf grpcio-tools") from None
    return module


# ------------------------------------------------------------------------------------------------ loading


def load(path):
    """The Profile in a pprof file (gzipped or not), symbolised; ProfileError if it cannot be read or is not
    a profile."""
    pb = schema()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ProfileError(f"cannot read {path}: {e.strerror}") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise ProfileError(f"{path}: not a pprof profile (broken gzip data: {e})") from None
    from google.protobuf.message import DecodeError

    try:
        msg = pb.Profile.FromString(data)
    except DecodeError as e:
        raise ProfileError(f"{path}: not a pprof profile ({e})") from None
    try:
        return build(path, msg)
    except NotAProfile as e:
        raise ProfileError(f"{path}: not a pprof profile ({e})") from None


def build(path, msg):
    """The Profile of a parsed message; NotAProfile when it breaks the format's rules."""
    strings = msg.string_table

    def s(i):
        if not 0 <= i < len(strings):
            raise NotAProfile(f"string index {i} out of range")
        return strings[i]

    if not msg.sample_type:
        raise NotAProfile("no sample types")
    if strings and strings[0] != "":
        raise NotAProfile("its string table does not start with \"\"")
    types = [(s(t.type), s(t.unit)) for t in msg.sample_type]
    default = s(msg.default_sample_type) or types[-1][0]  # pprof's rule: the last type, unless one is named
    prof = Profile(path, types, default, msg.period, s(msg.period_type.unit), [s(c) for c in msg.comment],
                   msg.time_nanos, msg.duration_nanos)
    frames = symbolize(msg, s, prof.notes)
    for sample in msg.sample:
        if len(sample.value) != len(types):
            raise NotAProfile(f"a sample has {len(sample.value)} values for {len(types)} sample types")
        stack = []
        for loc in sample.location_id:
            if loc not in frames:
                raise NotAProfile(f"a sample names location {loc}, which is not there")
            stack.extend(frames[loc])
        total = prof.stacks.setdefault(tuple(stack), [0] * len(types))
        for i, v in enumerate(sample.value):
            total[i] += v
    return prof


# ------------------------------------------------------------------------------------------------ symbols


def symbolize(msg, s, notes):
    """{location id: (Frame, ...)}, innermost (inlined) first; NotAProfile for a reference to nothing."""
    functions = {f.id: f for f in msg.function}
    mappings = {m.id: m for m in msg.mapping}
    demangled = demangle({s(f.name) for f in msg.function}, notes)
    fallback = {}
    by_file = defaultdict(list)  # file -> [(location id, address in the file's ELF address space)]
    for loc in msg.location:
        m = mappings.get(loc.mapping_id)
        offset = loc.address - m.memory_start + m.file_offset if m is not None else -1
        if offset < 0:  # no mapping (or an address below it): the address is all there is
            fallback[loc.id] = f"0x{loc.address:x}"
            continue
        path = s(m.filename)
        fallback[loc.id] = f"{os.path.basename(path) or '?'}+0x{offset:x}"
        address = elf_address(path, s(m.build_id), offset)
        if address is not None:
            by_file[path].append((loc.id, address))
    if by_file and not shutil.which("addr2line"):
        notes.append("addr2line not found (binutils): no file:line, and only the names the library found")
        by_file = {}
    resolved = {}
    for path, items in by_file.items():
        for (loc_id, _), found in zip(items, addr2line(path, [a for _, a in items], notes)):
            resolved[loc_id] = found
    result = {}
    for loc in msg.location:
        if resolved.get(loc.id):
            result[loc.id] = resolved[loc.id]
            continue
        named = []
        for line in loc.line:
            if line.function_id not in functions:
                raise NotAProfile(f"location {loc.id} names function {line.function_id}, which is not there")
            f = functions[line.function_id]
            where = os.path.basename(s(f.filename))
            named.append(Frame(demangled[s(f.name)], f"{where}:{line.line}" if where and line.line > 0 else where))
        result[loc.id] = tuple(named) or (Frame(fallback[loc.id]),)
    return result


def demangle(names, notes):
    """{name: demangled name} through one run of c++filt; names are kept as they are without it."""
    result = {n: n for n in names}
    mangled = sorted(n for n in names if n.startswith(("_Z", "_R")))
    if not mangled:
        return result
    if not shutil.which("c++filt"):
        notes.append("c++filt not found (binutils): C++ names are shown mangled")
        return result
    try:
        proc = subprocess.run(["c++filt"], input="\n".join(mangled) + "\n", capture_output=True, text=True,
                              timeout=TOOL_TIMEOUT_S)
        out = proc.stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        out = []
    if len(out) != len(mangled):
        notes.append("c++filt failed: C++ names are shown mangled")
        return result
    result.update(zip(mangled, out))
    return result


ADDRESS_LINE = re.compile(r"0x[0-9a-f]+$")


def addr2line(path, addresses, notes):
    """For each address in the ELF file at path, (Frame, ...) (inlined functions first), or () when addr2line
    does not know the function. One run of `addr2line -a -f -i -C` for all of them."""
    try:
        proc = subprocess.run(["addr2line", "-a", "-f", "-i", "-C", "-e", path],
                              input="".join(f"0x{a:x}\n" for a in addresses), capture_output=True, text=True,
                              timeout=TOOL_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as e:
        notes.append(f"addr2line failed on {path}: {e}")
        return [()] * len(addresses)
    # -a starts each address's answer with the address; then (function, file:line) pairs follow, the
    # inlined function first. A function name never looks like 0x<hex>.
    groups = []
    lines = proc.stdout.splitlines()
    i = 0
    while i < len(lines):
        if ADDRESS_LINE.match(lines[i]):
            groups.append([])
            i += 1
        elif groups and i + 1 < len(lines):
            function, where = lines[i], lines[i + 1]
            if function != "??":
                groups[-1].append(Frame(function, short_where(where)))
            i += 2
        else:
            break
    if len(groups) != len(addresses):
        notes.append(f"addr2line gave an answer that cannot be read for {path}")
        return [()] * len(addresses)
    return [tuple(g) for g in groups]


def short_where(text):
    """'/src/a/table.c:12 (discriminator 3)' -> 'table.c:12'; '??:0' -> ''."""
    text = text.split(" (discriminator")[0]
    file, _, line = text.rpartition(":")
    if not file or file == "??":
        return ""
    return f"{os.path.basename(file)}:{line}" if line.isdigit() and line != "0" else os.path.basename(file)


@lru_cache(maxsize=None)
def elf_info(path):
    """(GNU build id in hex or "", [(p_offset, p_vaddr, p_filesz) of each PT_LOAD]) of an ELF file, or None
    when it is not here or not ELF."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2):
                return None
            is64, end = head[4] == 2, "<" if head[5] == 1 else ">"
            if is64:
                phoff, = struct.unpack_from(end + "Q", head, 32)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
            else:
                phoff, = struct.unpack_from(end + "I", head, 28)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 42)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            loads, note_segments = [], []
            for i in range(phnum):
                at = i * phentsize
                if is64:
                    p_type, _, off, vaddr, _, filesz, _, align = struct.unpack_from(end + "IIQQQQQQ", table, at)
                else:
                    p_type, off, vaddr, _, filesz, _, _, align = struct.unpack_from(end + "8I", table, at)
                if p_type == 1:  # PT_LOAD
                    loads.append((off, vaddr, filesz))
                elif p_type == 4:  # PT_NOTE
                    note_segments.append((off, filesz, align))
            build_id = ""
            for off, size, align in note_segments:
                f.seek(off)
                build_id = gnu_build_id(f.read(size), end, 8 if align == 8 else 4)
                if build_id:
                    break
    except (OSError, struct.error):
        return None
    return build_id, loads


def gnu_build_id(notes, end, align):
    pos = 0
    while pos + 12 <= len(notes):
        namesz, descsz, kind = struct.unpack_from(end + "III", notes, pos)
        pos += 12
        name = notes[pos:pos + namesz]
        pos += -(-namesz // align) * align
        desc = notes[pos:pos + descsz]
        pos += -(-descsz // align) * align
        if kind == 3 and name == b"GNU\0":  # NT_GNU_BUILD_ID
            return desc.hex()
    return ""


def elf_address(path, build_id, offset):
    """The address in the ELF file's own address space (what addr2line takes) of a file offset, or None when
    the file is not here, is another build than the profile's, or the offset is in no loaded segment."""
    info = elf_info(path)
    if info is None:
        return None
    file_build_id, loads = info
    if build_id and build_id.lower() != file_build_id:
        return None
    for off, vaddr, filesz in loads:
        if off <= offset < off + filesz:
            return offset - off + vaddr
    return None
