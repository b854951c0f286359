#!/usr/bin/env python3
"""test_server.py LIB [--seconds S]: memcached under load with threadheap preloaded.

Standard library only. Starts memcached itself (4 worker threads, loopback, a free port; `-u nobody` when
run as root, as in CI), checks in /proc/PID/maps that libthreadheap is mapped in the server, then drives it
for S seconds (default 10) from 8 client threads, each on its own connection: sets of values of random
size between 1 byte and 100 KiB (log-uniform, so small and large blocks both occur), gets, multi-gets,
deletes and appends of its own keys, verifying every value read back against what the thread stored.
Then it checks zero errors, that the server's own `stats` agree with the traffic, stops the server with
SIGTERM and checks that it exits cleanly with no "threadheap:" message.

Without memcached installed it fails when CI is set in the environment (.ci/run sets it) and otherwise
exits 77, which CTest reports as skipped.
"""

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

SKIP = 77
THREADS = 8
KEYS_PER_THREAD = 300
MAX_VALUE = 100 * 1024


class Client:
    """The memcached text protocol over one connection."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.rfile = self.sock.makefile("rb")

    def close(self):
        self.rfile.close()
        self.sock.close()

    def line(self):
        text = self.rfile.readline()
        if not text.endswith(b"\r\n"):
            raise IOError(f"connection closed or truncated reply: {text[:80]!r}")
        return text[:-2]

    def store(self, verb, key, value):
        self.sock.sendall(b"%s %s 0 0 %d\r\n%s\r\n" % (verb, key, len(value), value))
        return self.line()

    def get(self, *keys):
        """{key: value} for the keys the server has."""
        self.sock.sendall(b"get " + b" ".join(keys) + b"\r\n")
        found = {}
        while True:
            head = self.line()
            if head == b"END":
                return found
            parts = head.split()
            if len(parts) != 4 or parts[0] != b"VALUE":
                raise IOError(f"unexpected reply to get: {head[:80]!r}")
            data = self.rfile.read(int(parts[3]) + 2)
            if len(data) != int(parts[3]) + 2 or not data.endswith(b"\r\n"):
                raise IOError("truncated value")
            found[parts[1]] = data[:-2]

    def delete(self, key):
        self.sock.sendall(b"delete " + key + b"\r\n")
        return self.line()

    def stats(self):
        self.sock.sendall(b"stats\r\n")
        out = {}
        while True:
            head = self.line()
            if head == b"END":
                return out
            _, name, value = head.decode().split(" ", 2)
            out[name] = value


def random_value(rng):
    size = min(MAX_VALUE, int(2 ** rng.uniform(0, 16.65)))  # 1 B .. 100 KiB, log-uniform
    return rng.randbytes(size)


def load(port, tid, deadline, result):
    """One client thread: its own keys, a model of what the server must hold, every read verified."""
    rng = random.Random(tid * 7919 + 1)
    model = {}
    keys = [b"t%d-k%d" % (tid, i) for i in range(KEYS_PER_THREAD)]
    ops = errors = 0
    first_error = None

    def error(text):
        nonlocal errors, first_error
        errors += 1
        if first_error is None:
            first_error = text

    try:
        client = Client(port)
        while time.monotonic() < deadline:
            key = rng.choice(keys)
            r = rng.random()
            if r < 0.45:
                value = random_value(rng)
                if client.store(b"set", key, value) == b"STORED":
                    model[key] = value
                else:
                    error(f"set {key!r} not stored")
            elif r < 0.80:
                got = client.get(key)
                if got.get(key) != model.get(key):
                    error(f"get {key!r}: {len(got.get(key) or b'')} bytes, expected {len(model.get(key) or b'')}")
            elif r < 0.90:
                batch = rng.sample(keys, 10)
                got = client.get(*batch)
                for k in batch:
                    if got.get(k) != model.get(k):
                        error(f"multi-get {k!r} wrong")
            elif r < 0.95:
                reply = client.delete(key)
                expected = b"DELETED" if key in model else b"NOT_FOUND"
                if reply != expected:
                    error(f"delete {key!r}: {reply!r}, expected {expected!r}")
                model.pop(key, None)
            else:
                extra = rng.randbytes(rng.randint(1, 2000))
                reply = client.store(b"append", key, extra)
                if key in model:
                    if reply != b"STORED":
                        error(f"append {key!r}: {reply!r}")
                    model[key] += extra
                elif reply != b"NOT_STORED":
                    error(f"append to missing {key!r}: {reply!r}")
            ops += 1
        # Finally every key is read back once more.
        for i in range(0, len(keys), 20):
            batch = keys[i:i + 20]
            got = client.get(*batch)
            for k in batch:
                if got.get(k) != model.get(k):
                    error(f"final read of {k!r} wrong")
            ops += 1
        client.close()
    except (OSError, IOError, ValueError) as e:
        error(f"thread {tid}: {e}")
    result[tid] = (ops, errors, first_error)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(lib):
    """(process, port) of a memcached that accepts connections; tries a few ports in case one is taken."""
    for _ in range(5):
        port = free_port()
        cmd = ["memcached", "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-t", "4", "-m", "256", "-c", "64"]
        if os.geteuid() == 0:
            cmd += ["-u", "nobody"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("THREADHEAP_")}
        env["LD_PRELOAD"] = lib
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return proc, port
            except OSError:
                time.sleep(0.05)  # polling for the listening socket, bounded by the deadline
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate()
        print(f"memcached did not start on port {port}: {err.decode(errors='replace').strip()[:300]}")
    return None, None


def main(argv):
    if len(argv) < 2:
        print("usage: test_server.py LIB [--seconds S]")
        return 2
    lib = os.path.abspath(argv[1])
    seconds = float(argv[argv.index("--seconds") + 1]) if "--seconds" in argv else 10.0
    if shutil.which("memcached") is None:
        if os.environ.get("CI"):
            print("FAIL memcached is not installed (Debian package memcached)")
            return 1
        print("SKIPPED memcached is not installed (Debian package memcached)")
        return SKIP
    if not os.path.isfile(lib):
        print(f"FAIL library not found: {lib}")
        return 1

    proc, port = start_server(lib)
    if proc is None:
        print("FAIL memcached did not start")
        return 1
    failures = []
    try:
        with open(f"/proc/{proc.pid}/maps") as f:
            maps = f.read()
        if os.path.realpath(lib) not in maps or "/libthreadheap.so" not in maps:
            failures.append("libthreadheap is not mapped in the memcached process")

        deadline = time.monotonic() + seconds
        result = {}
        threads = [threading.Thread(target=load, args=(port, t, deadline, result)) for t in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 60)
        ops = sum(r[0] for r in result.values())
        errors = sum(r[1] for r in result.values())
        if len(result) != THREADS:
            failures.append(f"only {len(result)} of {THREADS} client threads finished")
        if errors:
            first = next(r[2] for r in result.values() if r[2])
            failures.append(f"{errors} errors; first: {first}")
        if ops < 1000:
            failures.append(f"only {ops} operations in {seconds:.0f} s")

        stats_client = Client(port)
        stats = stats_client.stats()
        stats_client.close()
        print(f"{ops} operations from {THREADS} threads in {seconds:.0f} s, {errors} errors; server: "
              f"{stats.get('cmd_get')} gets, {stats.get('cmd_set')} sets, {stats.get('bytes')} bytes stored, "
              f"{stats.get('evictions')} evictions, {stats.get('threads')} threads")
        if int(stats.get("cmd_set", 0)) == 0 or int(stats.get("cmd_get", 0)) == 0:
            failures.append("the server counted no sets or gets")
        if stats.get("threads") != "4":
            failures.append(f"memcached reports {stats.get('threads')} worker threads, not 4")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            failures.append("memcached did not stop within 10 s of SIGTERM")
    err_text = err.decode(errors="replace")
    if proc.returncode != 0:  # memcached handles SIGTERM and exits 0
        failures.append(f"memcached exited with {proc.returncode}: {err_text.strip()[:300]}")
    if "threadheap:" in err_text:
        failures.append("threadheap message: " + err_text[err_text.index("threadheap:"):][:300])
    for f in failures:
        print(f"FAIL {f}")
    print("ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
