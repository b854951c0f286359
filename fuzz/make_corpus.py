#!/usr/bin/env python3
"""Writes fuzz/corpus/: the seed inputs of fuzz_heap, one small file per scenario, in its input format
(see fuzz_heap.cpp). Deterministic; rerun after changing the format. Inputs found by longer fuzzing runs
are added to the corpus beside these."""
import os
import random

CREATE, DESTROY, MALLOC, CALLOC, REALLOC, HEAP_REALLOC, FREE, ALIGNED, USABLE = range(9)
DEFAULT = 4  # heap byte for the thread's default heap


def size16(n):
    """The 2-byte size encoding closest to n (see decode_size)."""
    if n < 256:
        v = n
    elif n < 0x4000:
        v = 0x4000 | n
    elif n < 0x4000 * 16:
        v = 0x8000 | (n // 16)
    else:
        v = 0xC000 | min(n // 256, 0x3FFF)
    return bytes([v & 0xFF, v >> 8])


def create(k, noserialize=False, initial=0, cap=0, bad=False):
    flags = (1 if noserialize else 0) | (0xF0 if bad else 0)
    return bytes([CREATE, k, flags, initial | (cap << 2)])


def malloc(h, slot, n):
    return bytes([MALLOC, h, slot]) + size16(n)


def calloc(h, slot, count, n):
    return bytes([CALLOC, h, slot, count, n])


def realloc(slot, n):
    return bytes([REALLOC, slot]) + size16(n)


def heap_realloc(h, slot, n):
    return bytes([HEAP_REALLOC, h, slot]) + size16(n)


def free(slot):
    return bytes([FREE, slot])


def aligned(h, slot, log2, n):
    return bytes([ALIGNED, h, slot, log2]) + size16(n)


def destroy(k):
    return bytes([DESTROY, k])


def usable(slot):
    return bytes([USABLE, slot])


KiB, MiB = 1024, 1024 * 1024
SIZES = [0, 1, 16, 100, 1000, 4096, 9000, 65536, 100000, 600 * KiB, 1 * MiB, 2 * MiB, 3 * MiB]
# cap indexes into fuzz_heap.cpp's table: 0 none, 2 256K, 3 1M, 4 4M, 5 16M, 6 64K
CAP_NONE, CAP_256K, CAP_1M, CAP_4M, CAP_16M, CAP_64K = 0, 2, 3, 4, 5, 6

seeds = {}
for ns in (False, True):
    tag = "ns" if ns else "ser"
    seeds[f"sizes_{tag}"] = create(0, ns) + b"".join(malloc(0, i, n) for i, n in enumerate(SIZES)) + b"".join(
        free(i) for i in range(len(SIZES)))
    seeds[f"destroy_live_{tag}"] = create(1, ns) + b"".join(malloc(1, i, n) for i, n in enumerate(SIZES)) + \
        free(3) + destroy(1) + malloc(DEFAULT, 0, 100)
    seeds[f"realloc_chain_{tag}"] = create(2, ns) + malloc(2, 5, 10) + b"".join(
        realloc(5, n) for n in (100, 5000, 70000, 2 * MiB, 50, 3 * MiB, 16)) + free(5)
    seeds[f"cap_1m_{tag}"] = create(0, ns, cap=CAP_1M) + b"".join(malloc(0, i, 64 * KiB) for i in range(20)) + \
        free(4) + malloc(0, 4, 64 * KiB) + malloc(0, 25, 2 * MiB)
    seeds[f"cap_64k_{tag}"] = create(3, ns, cap=CAP_64K) + b"".join(malloc(3, i, 4096) for i in range(20)) + \
        b"".join(free(i) for i in range(0, 20, 2)) + malloc(3, 21, 9000)
    seeds[f"initial_{tag}"] = create(0, ns, initial=3) + b"".join(malloc(0, i, 256) for i in range(30))
    seeds[f"calloc_{tag}"] = create(1, ns) + b"".join(calloc(1, i, c, n) for i, (c, n) in
                                                       enumerate([(0, 5), (1, 1), (63, 255), (10, 16), (40, 100)]))
    seeds[f"aligned_{tag}"] = create(2, ns) + b"".join(aligned(2, i, lg, n) for i, (lg, n) in enumerate(
        [(0, 1), (4, 16), (6, 100), (12, 5000), (13, 70000), (13, 2 * MiB), (9, 0)]))
    seeds[f"across_{tag}"] = create(0, ns) + create(1, not ns, cap=CAP_4M) + malloc(0, 0, 1000) + \
        heap_realloc(1, 0, 3000) + heap_realloc(0, 0, 2 * MiB) + heap_realloc(DEFAULT, 0, 500) + \
        malloc(DEFAULT, 1, 700) + heap_realloc(1, 1, 800) + destroy(0) + usable(0) + usable(1)

seeds["bad_flags"] = create(0, bad=True) + malloc(0, 0, 10) + create(1, initial=3, cap=CAP_256K) + malloc(1, 1, 10)
seeds["null_heap"] = malloc(2, 0, 10) + calloc(3, 1, 2, 2) + aligned(1, 2, 6, 64) + heap_realloc(0, 3, 9) + \
    malloc(DEFAULT, 4, 40) + heap_realloc(1, 4, 80) + usable(4)
seeds["recreate"] = b"".join(create(0, i & 1, cap=i % 6) + malloc(0, i, 1000 * i) for i in range(8))
seeds["default_heap"] = b"".join(malloc(DEFAULT, i, n) for i, n in enumerate(SIZES)) + b"".join(
    realloc(i, n + 1) for i, n in enumerate(reversed(SIZES)))
seeds["move_between"] = create(0) + create(1, True) + create(2) + malloc(0, 0, 50) + b"".join(
    heap_realloc(k % 3, 0, 50 + 100 * k) for k in range(12)) + destroy(1) + destroy(0) + usable(0)
seeds["cap_realloc"] = create(0, cap=CAP_1M) + malloc(0, 0, 16) + realloc(0, 600 * KiB) + \
    malloc(0, 1, 600 * KiB) + free(0) + malloc(0, 1, 600 * KiB) + realloc(1, 900 * KiB)
# memalign(32, 0) once handed out the end of its carrier block, the start of the next (freed) block: the
# fuzzer found it as "malloc_usable_size of a freed block". Freed 48-byte neighbours, then aligned size-0 blocks.
seeds["aligned_zero_neighbour"] = create(0, True) + b"".join(malloc(0, i, 48) for i in range(16)) + b"".join(
    free(i) for i in range(1, 16, 2)) + b"".join(aligned(k % 2 * 4, 16 + k, 5, 0) for k in range(12))
seeds["huge_cap"] = create(0, cap=CAP_16M) + b"".join(malloc(0, i, 3 * MiB) for i in range(6)) + free(2) + \
    realloc(3, 4 * MiB) + realloc(4, 1 * MiB)

# A few pseudo-random streams of valid-looking operations.
rng = random.Random(1)
for s in range(10):
    out = bytearray()
    for _ in range(60):
        op = rng.randrange(9)
        if op == CREATE:
            out += create(rng.randrange(4), rng.random() < 0.5, rng.randrange(4), rng.choice([0, 0, 3, 4, 5]))
        elif op == MALLOC:
            out += malloc(rng.randrange(5), rng.randrange(32), rng.choice(SIZES[:9]))
        elif op == REALLOC:
            out += realloc(rng.randrange(32), rng.choice(SIZES[:10]))
        elif op == HEAP_REALLOC:
            out += heap_realloc(rng.randrange(5), rng.randrange(32), rng.choice(SIZES[:9]))
        elif op == ALIGNED:
            out += aligned(rng.randrange(5), rng.randrange(32), rng.randrange(14), rng.choice(SIZES[:8]))
        elif op == CALLOC:
            out += calloc(rng.randrange(5), rng.randrange(32), rng.randrange(64), rng.randrange(256))
        else:
            out += bytes([op, rng.randrange(32)])
    seeds[f"random_{s:02d}"] = bytes(out)

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
os.makedirs(here, exist_ok=True)
for name, data in sorted(seeds.items()):
    with open(os.path.join(here, name), "wb") as f:
        f.write(data)
print(f"{len(seeds)} inputs in {here}")
