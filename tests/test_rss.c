/* test_rss.c: memory freed after a burst goes back to the OS while the program keeps running. Run with
 * THREADHEAP_PURGE_DELAY=100 (ms; CTest sets it): the test allocates a burst of >= 256 MiB in mixed sizes,
 * touches it, frees it all, and then keeps allocating and freeing small and medium blocks, as a program
 * would, polling its resident memory. It passes when resident memory falls below the pre-burst value plus
 * 48 MiB; the deadline is 10 s, a hundred times the purge delay, so only memory that is never returned
 * fails it. With --fragmented it checks the free blocks of pages still in use instead (see
 * test_fragmented_medium); with --steady, a program whose mallocs never leave the fast path (test_steady).
 *
 * Resident memory is RssAnon (/proc/self/status) minus LazyFree (/proc/self/smaps_rollup): pages given
 * back with MADV_FREE stay counted in RssAnon until the kernel needs them, yet they are returned. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "check.h"
#include "threadheap.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static long field_kib(const char *path, const char *name) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[256];
  long v = -1;
  size_t len = strlen(name);
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, name, len) == 0 && line[len] == ':') {
      v = strtol(line + len + 1, NULL, 10);
      break;
    }
  }
  fclose(f);
  return v;
}

/* Resident anonymous memory minus lazily freed pages, in KiB. */
static long rss_kib(void) {
  long anon = field_kib("/proc/self/status", "RssAnon");
  long lazy = field_kib("/proc/self/smaps_rollup", "LazyFree");
  return anon - (lazy > 0 ? lazy : 0);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x9e3779b97f4a7c15u;
static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

#define MAX_BLOCKS (400 * 1000)

/* The steady state: WORK live blocks of 16 B..48 KiB, one freed and one allocated at a time, as a program
 * keeps running; its own memory is warmed up before each baseline. */
enum { WORK = 256 };
static void *work[WORK];

/* Keep working with blocks of 16 B..max_size, polling resident memory, until it is below limit or 10 s have
 * passed; returns it. */
static long work_until_below(size_t min_size, size_t max_size, long limit, double t0, double *t_out,
                              long *ops_out) {
  long rss = rss_kib(), ops = 0;
  double t = 0;
  while ((t = now_s() - t0) < 10.0) {
    rss = rss_kib();
    if (rss < limit) break;
    for (int k = 0; k < 2000; k++) {
      int i = (int)(next_rand() % WORK);
      th_free(work[i]);
      work[i] = th_malloc(min_size + (size_t)(next_rand() % (max_size - min_size + 1)));
      if (work[i]) memset(work[i], 1, 16);
      ops++;
    }
  }
  *t_out = t;
  *ops_out = ops;
  return rss;
}

/* --fragmented: medium blocks (8..64 KiB), 90% of them freed at random, so that hardly any page is empty;
 * then the program keeps working with small blocks. The medium pages, still in use but idle, give back the
 * insides of their free blocks once the purge delay has passed: resident memory must fall below the
 * pre-burst value plus 40% of the burst (the 10% still live, the first OS page each free block keeps for
 * its list link, and slack). Kept resident, the free blocks held about 70% of such a burst. */
static void test_fragmented_medium(void **blocks) {
  long base = rss_kib();
  size_t n = 0, bytes = 0, live = 0;
  while (bytes < 96 * MiB && n < MAX_BLOCKS) {
    size_t s = 8 * KiB + 1 + (size_t)(next_rand() % (56 * KiB));
    blocks[n] = th_malloc(s);
    if (!CHECK(blocks[n] != NULL)) break;
    memset(blocks[n], 0x5a, th_usable_size(blocks[n])); /* all of it: the check below reads all of it */
    n++;
    bytes += s;
  }
  long peak = rss_kib();
  for (size_t i = 0; i < n; i++) {
    if (next_rand() % 10 == 0) {
      live += th_usable_size(blocks[i]);
      continue;
    }
    th_free(blocks[i]);
    blocks[i] = NULL;
  }
  long limit = base + (long)((bytes * 40 / 100) / KiB);
  double t;
  long ops, rss = work_until_below(32 * KiB + 1, 40 * KiB, limit, now_s(), &t, &ops);
  printf("fragmented: %zu medium blocks, %zu MiB, %zu MiB left live; RSS before %ld KiB, at peak %ld KiB, "
         "%ld KiB after %.3f s (%ld allocations meanwhile); limit %ld KiB\n",
         n, bytes / MiB, live / MiB, base, peak, rss, t, ops, limit);
  CHECK_MSG(rss < limit, "RSS %ld KiB is still above %ld KiB (pre-burst %ld KiB + 40%% of %zu MiB) after %.1f s",
            rss, limit, base, bytes / MiB, t);
  /* The purge never touches a live block: after th_collect too (which purges every page in use), each
   * still holds what was written into it. */
  th_collect();
  size_t intact = 0, live_blocks = 0;
  for (size_t i = 0; i < n; i++) {
    if (!blocks[i]) continue;
    live_blocks++;
    const unsigned char *b = blocks[i];
    size_t k = 0, size = th_usable_size(b);
    while (k < size && b[k] == 0x5a) k++;
    intact += k == size;
  }
  CHECK_MSG(intact == live_blocks, "%zu of %zu live blocks changed", live_blocks - intact, live_blocks);
  for (size_t i = 0; i < n; i++) th_free(blocks[i]);
}

/* --steady: a burst of 128 MiB of 16 B..32 KiB blocks, all freed; then the program only allocates and frees
 * the same four 64-byte blocks, which never runs a page dry, so malloc never takes its slow path. The pop
 * count's tick (page_pop) must still run the purge: resident memory must fall below the pre-burst value plus
 * 16 MiB. Without the tick it stayed at the burst's size (146 MB after 10 s). */
static void test_steady(void **blocks) {
  long base = rss_kib();
  size_t n = 0, bytes = 0;
  while (bytes < 128 * MiB && n < MAX_BLOCKS) {
    size_t s = 16 + (size_t)(next_rand() % (32 * KiB));
    blocks[n] = th_malloc(s);
    if (!CHECK(blocks[n] != NULL)) break;
    memset(blocks[n++], 0x5a, s);
    bytes += s;
  }
  long peak = rss_kib();
  for (size_t i = 0; i < n; i++) th_free(blocks[i]);
  long limit = base + (long)(16 * MiB / KiB);
  double t0 = now_s(), t;
  long rss = rss_kib(), ops = 0, wrong = 0;
  while ((t = now_s() - t0) < 10.0) {
    rss = rss_kib();
    if (rss < limit) break;
    for (int k = 0; k < 100000; k++) {
      unsigned char *q[4];
      for (int j = 0; j < 4; j++) {
        q[j] = th_malloc(64);
        memset(q[j], j + 1, 64);
      }
      for (int j = 0; j < 4; j++) {
        wrong += q[j][0] != j + 1 || q[j][63] != j + 1;
        th_free(q[j]);
      }
      ops += 4;
    }
  }
  printf("steady: %zu blocks, %zu MiB; RSS before %ld KiB, at peak %ld KiB, %ld KiB after %.3f s (%ld "
         "allocations of 64 B meanwhile); limit %ld KiB\n",
         n, bytes / MiB, base, peak, rss, t, ops, limit);
  CHECK_MSG(peak - base >= (long)(100 * MiB / KiB), "the burst did not raise RSS (%ld -> %ld KiB)", base, peak);
  CHECK_MSG(wrong == 0, "%ld of the steady loop's blocks lost their contents", wrong);
  CHECK_MSG(rss < limit, "RSS %ld KiB is still above %ld KiB (pre-burst %ld KiB + 16 MiB) after %.1f s", rss,
            limit, base, t);
}

int main(int argc, char **argv) {
  const char *delay = getenv("THREADHEAP_PURGE_DELAY");
  printf("THREADHEAP_PURGE_DELAY=%s\n", delay ? delay : "(unset)");
  /* The pointer table lives outside the allocator and is touched now, so it is in the baseline. */
  void **blocks = mmap(NULL, MAX_BLOCKS * sizeof(void *), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
  if (!CHECK(blocks != MAP_FAILED)) return check_summary();
  memset(blocks, 0, MAX_BLOCKS * sizeof(void *));
  /* Warm up the steady-state loop's memory too, so the baseline includes what the loop itself keeps. */
  for (int i = 0; i < WORK; i++) work[i] = th_malloc(16 + (size_t)(next_rand() % (48 * KiB)));
  if (argc > 1 && (!strcmp(argv[1], "--fragmented") || !strcmp(argv[1], "--steady"))) {
    if (!strcmp(argv[1], "--steady")) test_steady(blocks);
    else test_fragmented_medium(blocks);
    for (int i = 0; i < WORK; i++) th_free(work[i]);
    munmap(blocks, MAX_BLOCKS * sizeof(void *));
    return check_summary();
  }
  long base = rss_kib();
  if (!CHECK_MSG(base > 0, "cannot read RssAnon")) return check_summary();

  /* The burst: 80 MiB of small blocks, 96 MiB of medium ones, 96 MiB of huge ones; all touched. */
  size_t n = 0, bytes_small = 0, bytes_medium = 0, bytes_huge = 0;
  while (bytes_small < 80 * MiB && n < MAX_BLOCKS) {
    size_t s = 16 + (size_t)(next_rand() % 1009);
    blocks[n] = th_malloc(s);
    if (!CHECK(blocks[n] != NULL)) break;
    memset(blocks[n++], 0x5a, s);
    bytes_small += s;
  }
  while (bytes_medium < 96 * MiB && n < MAX_BLOCKS) {
    size_t s = 8 * KiB + (size_t)(next_rand() % (500 * KiB));
    blocks[n] = th_malloc(s);
    if (!CHECK(blocks[n] != NULL)) break;
    memset(blocks[n++], 0x5a, s);
    bytes_medium += s;
  }
  while (bytes_huge < 96 * MiB && n < MAX_BLOCKS) {
    size_t s = 2 * MiB + (size_t)(next_rand() % (14 * MiB));
    blocks[n] = th_malloc(s);
    if (!CHECK(blocks[n] != NULL)) break;
    memset(blocks[n++], 0x5a, s);
    bytes_huge += s;
  }
  long peak = rss_kib();
  /* Free in an order that mixes the kinds, as a real program's teardown of a data structure would. */
  for (size_t i = 0; i < n; i += 2) th_free(blocks[i]);
  for (size_t i = 1; i < n; i += 2) th_free(blocks[i]);
  double t0 = now_s();
  long after_free = rss_kib();
  long limit = base + (long)(48 * MiB / KiB);
  printf("burst: %zu blocks, %zu MiB (small %zu, medium %zu, huge %zu); RSS before %ld KiB, at peak %ld KiB, "
         "right after free %ld KiB; limit %ld KiB\n",
         n, (bytes_small + bytes_medium + bytes_huge) / MiB, bytes_small / MiB, bytes_medium / MiB,
         bytes_huge / MiB, base, peak, after_free, limit);
  CHECK_MSG(peak - base >= (long)(200 * MiB / KiB), "the burst did not raise RSS (%ld -> %ld KiB)", base, peak);

  /* Keep working; poll the condition until it holds or the deadline passes. */
  double t;
  long ops, rss = work_until_below(16, 48 * KiB, limit, t0, &t, &ops);
  printf("RSS %ld KiB after %.3f s (%ld allocations meanwhile): %s\n", rss, t, ops,
         rss < limit ? "below the limit" : "still above the limit at the deadline");
  CHECK_MSG(rss < limit, "RSS %ld KiB is still above %ld KiB (pre-burst %ld KiB + 48 MiB) after %.1f s", rss,
            limit, base, t);

  for (int i = 0; i < WORK; i++) th_free(work[i]);
  munmap(blocks, MAX_BLOCKS * sizeof(void *));
  return check_summary();
}
