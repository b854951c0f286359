/* test_large.c: a program that repeatedly allocates a large block, writes all of it and frees it must
 * not pay a page fault per page each time. threadheap keeps freed huge blocks committed in its cache, so
 * after a few warm-up rounds the same memory comes back already mapped: the minor page faults per round
 * (getrusage) must stay below 1% of the block's pages. The cache hits counter must rise meanwhile.
 *
 * split_merge: the cache serves a request of another size from what it holds. A freed 24 MiB block is split
 * for an 8 MiB request (the rest, 16 MiB, stays cached and serves the next), and the two merge again when
 * freed, so a 24 MiB request takes them whole: no new mapping all along, every byte written and read back.
 *
 * gather: a request larger than every cached segment takes their memory too. Two freed 8 MiB blocks, kept
 * apart by a live one, are moved into a 20 MiB request (after a fork, so that they stay separate kernel
 * mappings there): the cache gives up their 16 MiB, and the block holds their bytes. Grown to 64 MiB with
 * realloc, it moves (several mappings) with its bytes; freed, it is moved whole into a 72 MiB request.
 * (Linux 6.17 and later move several mappings in one mremap; older kernels take os_move's region-by-region
 * path, which this test reaches only there.) */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "threadheap.h"

#define MiB ((size_t)1 << 20)

static long minor_faults(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

static void run(size_t size) {
  const int warmup = 3, rounds = 50;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t pages = size / page;
  th_stats_t st0, st1;
  long faults = 0;
  int ok = 1;
  for (int r = 0; r < warmup + rounds; r++) {
    if (r == warmup) th_stats_get(&st0);
    long before = minor_faults();
    volatile unsigned char *p = th_malloc(size);
    if (!CHECK_MSG(p != NULL, "malloc(%zu)", size)) return;
    for (size_t i = 0; i < size; i += page) p[i] = (unsigned char)(r + i / page);
    /* The writes landed: read back one byte per page. */
    for (size_t i = 0; i < size; i += page) ok &= p[i] == (unsigned char)(r + i / page);
    th_free((void *)p);
    if (r >= warmup) faults += minor_faults() - before;
  }
  th_stats_get(&st1);
  double per_round = (double)faults / rounds;
  printf("%zu MiB: %.1f minor faults per round (%zu pages, limit %.1f); cache hits +%zu, misses +%zu\n",
         size / MiB, per_round, pages, pages / 100.0, st1.cache_hits - st0.cache_hits,
         st1.cache_misses - st0.cache_misses);
  CHECK(ok);
  CHECK_MSG(per_round < (double)pages / 100.0, "%zu MiB: %.1f faults per round", size / MiB, per_round);
  CHECK_MSG(st1.cache_hits > st0.cache_hits, "%zu MiB: cache hits did not rise (%zu)", size / MiB,
            st1.cache_hits);
}

/* A request whose huge block spans exactly n MiB of segments (its header and alignment fit in the 64 KiB). */
static size_t spanning(size_t n) { return n * MiB - 64 * 1024; }

static int holds(const unsigned char *p, size_t size, unsigned char seed) {
  int ok = 1;
  for (size_t i = 0; i < size; i += 4096) ok &= p[i] == (unsigned char)(seed + i / 4096);
  return ok;
}

static int fill_check(unsigned char *p, size_t size, unsigned char seed) {
  for (size_t i = 0; i < size; i += 4096) p[i] = (unsigned char)(seed + i / 4096);
  return holds(p, size, seed);
}

static void split_merge(void) {
  unsigned char *big = th_malloc(spanning(24));
  if (!CHECK(big != NULL)) return;
  CHECK(fill_check(big, spanning(24), 1));
  th_free(big);
  th_stats_t st0, st1, st2;
  th_stats_get(&st0);
  unsigned char *x = th_malloc(spanning(8));  /* the head of the cached 24 MiB */
  unsigned char *y = th_malloc(spanning(16)); /* its rest */
  if (!CHECK(x != NULL && y != NULL)) return;
  th_stats_get(&st1);
  CHECK_MSG(st1.os_maps == st0.os_maps, "split: %zu new mappings", st1.os_maps - st0.os_maps);
  CHECK_MSG(st1.cache_hits == st0.cache_hits + 2, "split: cache hits +%zu", st1.cache_hits - st0.cache_hits);
  /* cached counts the resident bytes: the block's written pages and the header, not the untouched slack */
  CHECK_MSG(st0.cached - st1.cached >= spanning(24) && st0.cached - st1.cached <= 24 * MiB,
            "split: cached %zu -> %zu", st0.cached, st1.cached);
  CHECK_MSG(x == big && y == big + 8 * MiB, "split: %p and %p from %p", (void *)x, (void *)y, (void *)big);
  CHECK(th_usable_size(x) >= spanning(8) && th_usable_size(x) < 8 * MiB);
  CHECK(th_usable_size(y) >= spanning(16) && th_usable_size(y) < 16 * MiB);
  CHECK(fill_check(x, spanning(8), 2) && fill_check(y, spanning(16), 3));
  CHECK(fill_check(x, spanning(8), 2)); /* y's writes stayed out of x */
  th_free(y);
  th_free(x);
  unsigned char *z = th_malloc(spanning(24)); /* the two, merged */
  th_stats_get(&st2);
  CHECK_MSG(z == big, "merge: %p, not %p", (void *)z, (void *)big);
  CHECK_MSG(st2.os_maps == st0.os_maps, "merge: %zu new mappings", st2.os_maps - st0.os_maps);
  CHECK(z != NULL && fill_check(z, spanning(24), 4));
  th_free(z);
  printf("split and merge: 24 MiB served 8 + 16 MiB, then 24 MiB again, %zu new mappings\n",
         st2.os_maps - st0.os_maps);
}

static void gather(void) {
  unsigned char *a = th_malloc(spanning(8)), *sep = th_malloc(spanning(8)), *b = th_malloc(spanning(8));
  if (!CHECK(a != NULL && sep != NULL && b != NULL)) return;
  CHECK(fill_check(a, spanning(8), 5) && fill_check(b, spanning(8), 6) && fill_check(sep, spanning(8), 7));
  /* After a fork the kernel does not merge moved pages with their new neighbours: the gathered block is
   * several kernel mappings, as it is in any program that has forked. */
  pid_t child = fork();
  if (child == 0) _exit(0);
  CHECK(child > 0 && waitpid(child, NULL, 0) == child);
  th_free(a);
  th_free(b);
  th_stats_t st0, st1;
  th_stats_get(&st0);
  unsigned char *big = th_malloc(spanning(20));
  if (!CHECK(big != NULL)) return;
  th_stats_get(&st1);
  CHECK_MSG(st0.cached - st1.cached >= 2 * spanning(8) && st0.cached - st1.cached <= 16 * MiB,
            "gather: cached %zu -> %zu", st0.cached, st1.cached);
  /* The two blocks' pages, moved (fresh memory would read zero), in either order. */
  bool moved = (holds(big, spanning(8), 5) && holds(big + 8 * MiB, spanning(8), 6)) ||
               (holds(big, spanning(8), 6) && holds(big + 8 * MiB, spanning(8), 5));
  CHECK_MSG(moved, "gather: the 20 MiB block does not hold the two cached blocks' bytes");
  CHECK(fill_check(big, spanning(20), 8));
  CHECK(holds(sep, spanning(8), 7)); /* the live block between them kept its bytes */
  /* Several kernel mappings: growing it moves them all, bytes kept. */
  unsigned char *grown = th_realloc(big, spanning(64));
  if (!CHECK(grown != NULL)) return;
  big = grown;
  CHECK(holds(big, spanning(20), 8));
  CHECK(fill_check(big, spanning(64), 9));
  /* Freed, it is one cached piece of several mappings, gathered whole into a larger request. */
  th_free(big);
  big = th_malloc(spanning(72));
  if (!CHECK(big != NULL)) return;
  CHECK_MSG(holds(big, spanning(64), 9), "gather: the 72 MiB block does not hold the cached 64 MiB block's bytes");
  CHECK(fill_check(big, spanning(72), 10));
  printf("gather: two cached 8 MiB blocks moved into a 20 MiB one, grown to 64 MiB, moved into a 72 MiB one\n");
  th_free(big);
  th_free(sep);
  th_collect();
}

int main(void) {
  gather();
  split_merge();
  run(16 * MiB);
  run(8 * MiB);
  run(40 * MiB);
  return check_summary();
}
