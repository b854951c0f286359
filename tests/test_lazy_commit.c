/* test_lazy_commit.c: with lazy commit (THREADHEAP_LAZY_COMMIT=1, the default under strict overcommit), a
 * thread heap's segment is writable only as far as its pages have been carved, so that strict overcommit
 * charges what is used rather than 4 MiB a segment (src/segment.c, "lazy commit").
 *
 * Read from /proc/self/maps: the writable bytes of the segment (4 MiB, aligned) that holds a block. One small,
 * one medium and one large block each leave their segment writable for at most 320 KiB; 30,000 more small
 * blocks, each written and checked, make their segments writable as far as they were carved; a thread's
 * segments, partly writable when it exits, are cached as they are (CTest sets a purge delay of 10 s), and a
 * huge block of 3 MiB, which takes one of them, finds it writable whole and keeps its contents. `--eager`
 * (THREADHEAP_LAZY_COMMIT=0) checks that every segment is writable whole. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "threadheap.h"

#define KiB ((size_t)1 << 10)
#define SEGMENT ((size_t)4 << 20)

/* The writable bytes of /proc/self/maps's mappings within [lo, hi). */
static size_t writable_in(uintptr_t lo, uintptr_t hi) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!CHECK(f != NULL)) return 0;
  size_t total = 0;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    unsigned long a, b;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &a, &b, perms) != 3 || perms[1] != 'w') continue;
    uintptr_t from = a > lo ? a : lo, to = b < hi ? b : hi;
    if (to > from) total += to - from;
  }
  fclose(f);
  return total;
}

static size_t segment_writable(const void *p) {
  uintptr_t seg = (uintptr_t)p & ~(uintptr_t)(SEGMENT - 1);
  return writable_in(seg, seg + SEGMENT);
}

static void fill(unsigned char *p, size_t n, unsigned tag) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(tag * 31u + i);
}

static bool intact(const unsigned char *p, size_t n, unsigned tag) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (unsigned char)(tag * 31u + i)) return false;
  return true;
}

static uintptr_t thread_blocks[2]; /* where the thread's two blocks were */

static void *thread_main(void *arg) {
  (void)arg;
  unsigned char *p = th_malloc(20000), *q = th_malloc(100);
  if (CHECK(p != NULL && q != NULL)) {
    fill(p, 20000, 7);
    fill(q, 100, 8);
    CHECK(intact(p, 20000, 7) && intact(q, 100, 8));
  }
  thread_blocks[0] = (uintptr_t)p, thread_blocks[1] = (uintptr_t)q;
  th_free(p);
  th_free(q);
  return NULL;
}

int main(int argc, char **argv) {
  bool eager = argc == 2 && !strcmp(argv[1], "--eager");
  static const size_t sizes[] = {100, 20000, 200000}; /* small, medium and large pages */
  unsigned char *first[3];
  for (int i = 0; i < 3; i++) {
    first[i] = th_malloc(sizes[i]);
    if (!CHECK(first[i] != NULL)) return check_summary();
    fill(first[i], sizes[i], (unsigned)i);
    size_t w = segment_writable(first[i]);
    printf("a block of %zu bytes: its segment writable for %zu KiB\n", sizes[i], w / KiB);
    if (eager) CHECK_MSG(w == SEGMENT, "%zu KiB writable, not the whole segment", w / KiB);
    else CHECK_MSG(w >= 64 * KiB && w <= 320 * KiB, "%zu KiB writable for a block of %zu bytes", w / KiB, sizes[i]);
  }

  /* 30,000 small blocks of 112 bytes (3.2 MiB): carved page after page, each written and checked. */
  enum { N = 30000 };
  static unsigned char *many[N];
  for (int i = 0; i < N; i++) {
    many[i] = th_malloc(112);
    if (!CHECK(many[i] != NULL)) return check_summary();
    fill(many[i], 112, (unsigned)i);
  }
  size_t bad = 0;
  for (int i = 0; i < N; i++) bad += !intact(many[i], 112, (unsigned)i);
  CHECK_MSG(bad == 0, "%zu small blocks lost their contents", bad);
  size_t w = segment_writable(many[N - 1]);
  printf("after 30,000 blocks of 112 bytes: the last one's segment writable for %zu KiB\n", w / KiB);
  if (!eager) {
    uintptr_t seg = (uintptr_t)many[N - 1] & ~(uintptr_t)(SEGMENT - 1);
    uintptr_t last_end = (uintptr_t)many[N - 1] + 112 - seg;
    for (int i = 0; i < N; i++) /* the furthest block of that segment sets how far it is writable */
      if (((uintptr_t)many[i] & ~(uintptr_t)(SEGMENT - 1)) == seg && (uintptr_t)many[i] + 112 - seg > last_end)
        last_end = (uintptr_t)many[i] + 112 - seg;
    CHECK_MSG(w >= last_end && w <= last_end + 128 * KiB, "%zu KiB writable, blocks carved to %zu KiB", w / KiB,
              (size_t)last_end / KiB);
  }
  for (int i = 0; i < N; i++) th_free(many[i]);
  for (int i = 0; i < 3; i++) {
    CHECK(intact(first[i], sizes[i], (unsigned)i));
    th_free(first[i]);
  }

  /* A thread's segments, partly writable when it exits, are cached as they are; a huge block that takes one
   * of them from the cache gets it writable whole. */
  th_collect();
  pthread_t t;
  if (!CHECK(pthread_create(&t, NULL, thread_main, NULL) == 0)) return check_summary();
  pthread_join(t, NULL);
  th_stats_t s;
  th_stats_get(&s);
  size_t w_medium = segment_writable((void *)thread_blocks[0]), w_small = segment_writable((void *)thread_blocks[1]);
  printf("after a thread's exit: %zu KiB of cached segments resident; its segments writable for %zu and %zu KiB\n",
         s.cached / KiB, w_medium / KiB, w_small / KiB);
  CHECK_MSG(s.cached > 0, "the exited thread's segments were not cached");
  if (eager) CHECK(w_medium == SEGMENT && w_small == SEGMENT);
  else CHECK_MSG(w_medium <= 320 * KiB && w_small <= 320 * KiB, "cached segments writable for %zu and %zu KiB",
                 w_medium / KiB, w_small / KiB);
  size_t huge = (size_t)3 << 20;
  unsigned char *h = th_malloc(huge);
  if (CHECK(h != NULL)) {
    fill(h, huge, 9);
    CHECK_MSG(intact(h, huge, 9), "a huge block lost its contents");
    uintptr_t seg = (uintptr_t)h & ~(uintptr_t)(SEGMENT - 1);
    bool reused = seg == (thread_blocks[0] & ~(uintptr_t)(SEGMENT - 1)) ||
                  seg == (thread_blocks[1] & ~(uintptr_t)(SEGMENT - 1));
    printf("a huge block of 3 MiB, in %s\n", reused ? "one of the exited thread's segments" : "another segment");
    CHECK(writable_in(seg, (uintptr_t)h + huge) == (uintptr_t)h + huge - seg);
    th_free(h);
  }
  return check_summary();
}
