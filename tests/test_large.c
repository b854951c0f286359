/* test_large.c: a program that repeatedly allocates a large block, writes all of it and frees it must
 * not pay a page fault per page each time. threadheap keeps freed huge blocks committed in its cache, so
 * after a few warm-up rounds the same memory comes back already mapped: the minor page faults per round
 * (getrusage) must stay below 1% of the block's pages. The cache hits counter must rise meanwhile. */
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
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

int main(void) {
  run(16 * MiB);
  run(8 * MiB);
  run(40 * MiB);
  return check_summary();
}
