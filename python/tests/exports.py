"""Live export files for the tests (test_top, test_run), written as docs/live-export.md lays them out."""

import struct
import time
from pathlib import Path


def export_bytes(pid, counters, pairs=(), seq=2, magic=b"THSTATS1", version=1, time_ns=None, start_ns=None,
                 interval_ms=1000, size=None):
    now = time.time_ns()
    body = b"".join(struct.pack("<24sQ", name.encode(), value) for name, value in counters.items())
    body += b"".join(struct.pack("<II16s16sQQ", f, t, fn.encode(), tn.encode(), last, total)
                     for f, t, fn, tn, last, total in pairs)
    header = struct.pack("<8sIIQQQQIIQ", magic, version, size if size is not None else 64 + len(body), seq, pid,
                         now if time_ns is None else time_ns, interval_ms, len(counters), len(pairs),
                         now if start_ns is None else start_ns)
    return header + body


def write_export(directory, pid, counters, **kw):
    path = Path(directory) / f"threadheap.{pid}"
    path.write_bytes(export_bytes(pid, counters, **kw))
    return path
