/* test_lazy_commit.c: with lazy commit (THREADHEAP_LAZY_COMMIT=1, the default under strict overcommit), a
 * heap's segment is writable only as far as its pages have been carved, so that strict overcommit
 * charges what is used rather than 4 MiB a segment (src/segment.c, "lazy commit").
 *
 * Read from /proc/self/maps: the writable bytes of the segment (4 MiB, aligned) that holds a block. One small,
 * one medium and one large block each leave their segment writable for at most 320 KiB; 30,000 more small
 * blocks, each written and checked, make their segments writable as far as they were carved; a thread's
 * segments, partly writable when it exits, enter the cache writable whole (CTest sets a purge delay of 10 s);
 * the next thread's segment taken from the cache is writable for its first 64 KiB again, and a huge block of
 * 3 MiB takes one writable whole, its contents kept. A huge block fresh from the OS is writable to its end
 * rounded up to 256 KiB only, as realloc grows it to 3 MB within its segment, to 9 MB past it and shrinks it
 * to 2 MB, its contents checked at each step; an explicit heap's small and huge blocks likewise. `--eager`
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
static size_t thread_medium_writable;   /* its medium block's segment, writable bytes, while it lived */

static void *thread_main(void *arg) {
  (void)arg;
  unsigned char *p = th_malloc(20000), *q = th_malloc(100);
  if (CHECK(p != NULL && q != NULL)) {
    fill(p, 20000, 7);
    fill(q, 100, 8);
    CHECK(intact(p, 20000, 7) && intact(q, 100, 8));
  }
  thread_blocks[0] = (uintptr_t)p, thread_blocks[1] = (uintptr_t)q;
  thread_medium_writable = segment_writable(p);
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

  /* An explicit heap's blocks, small and huge, the same way; destroyed, its segments go to the cache whole. */
  th_heap_t *eh = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
  if (CHECK(eh != NULL)) {
    static const size_t esizes[] = {100, 2000000};
    unsigned char *e[2];
    for (int i = 0; i < 2; i++) {
      e[i] = th_heap_malloc(eh, esizes[i]);
      if (!CHECK(e[i] != NULL)) break;
      fill(e[i], esizes[i], 20u + (unsigned)i);
      uintptr_t seg = (uintptr_t)e[i] & ~(uintptr_t)(SEGMENT - 1);
      size_t w = writable_in(seg, seg + SEGMENT), end = (uintptr_t)e[i] + esizes[i] - seg;
      printf("an explicit heap's block of %zu bytes: its segment writable for %zu KiB\n", esizes[i], w / KiB);
      if (eager) CHECK(w == SEGMENT);
      else CHECK_MSG(w >= end && w <= (end < 320 * KiB ? 320 * KiB : end + 256 * KiB), "%zu KiB writable", w / KiB);
      CHECK(intact(e[i], esizes[i], 20u + (unsigned)i));
    }
    th_heap_destroy(eh);
  }

  /* A huge block fresh from the OS: writable to its end only, through realloc's growth within its segment,
   * its move past it and its shrinking; its contents kept. th_collect first empties the cache, so that the
   * block does not take a cached segment (writable whole, and charged already). */
  th_collect();
  static const size_t steps[] = {1100000, 3000000, 9000000, 2000000};
  unsigned char *h = NULL;
  size_t kept = 0;
  for (int i = 0; i < 4; i++) {
    unsigned char *q = th_realloc(h, steps[i]);
    if (!CHECK(q != NULL)) break;
    h = q;
    size_t keep = kept < steps[i] ? kept : steps[i];
    CHECK_MSG(intact(h, keep, 11), "a huge block lost its contents when reallocated to %zu bytes", steps[i]);
    fill(h, steps[i], 11);
    kept = steps[i];
    uintptr_t seg = (uintptr_t)h & ~(uintptr_t)(SEGMENT - 1);
    size_t span = (((uintptr_t)h + steps[i] - seg) + SEGMENT - 1) & ~(SEGMENT - 1); /* the block's segment */
    size_t w = writable_in(seg, seg + span), end = (uintptr_t)h + steps[i] - seg;
    printf("a huge block of %zu bytes: %zu KiB of its %zu KiB segment writable\n", steps[i], w / KiB, span / KiB);
    if (eager) CHECK_MSG(w == span, "%zu KiB writable of %zu", w / KiB, span / KiB);
    else CHECK_MSG(w >= end && w < end + 256 * KiB, "%zu KiB writable for a block ending at %zu KiB", w / KiB,
                   end / KiB);
  }
  th_free(h);

  /* A thread's segments, partly writable when it exits, enter the cache writable whole; the next thread takes
   * them back writable for their first 64 KiB only, and a huge block takes one as it is, writable whole. */
  th_collect();
  uintptr_t first_thread[2];
  pthread_t t;
  if (!CHECK(pthread_create(&t, NULL, thread_main, NULL) == 0)) return check_summary();
  pthread_join(t, NULL);
  memcpy(first_thread, thread_blocks, sizeof first_thread);
  th_stats_t s;
  th_stats_get(&s);
  size_t w_medium = segment_writable((void *)first_thread[0]), w_small = segment_writable((void *)first_thread[1]);
  printf("after a thread's exit: %zu KiB of cached segments resident; its segments writable for %zu and %zu KiB\n",
         s.cached / KiB, w_medium / KiB, w_small / KiB);
  CHECK_MSG(s.cached > 0, "the exited thread's segments were not cached");
  CHECK_MSG(w_medium == SEGMENT && w_small == SEGMENT, "cached segments writable for %zu and %zu KiB", w_medium / KiB,
            w_small / KiB);
  if (!CHECK(pthread_create(&t, NULL, thread_main, NULL) == 0)) return check_summary();
  pthread_join(t, NULL);
  bool same = (thread_blocks[0] & ~(uintptr_t)(SEGMENT - 1)) == (first_thread[0] & ~(uintptr_t)(SEGMENT - 1));
  w_medium = segment_writable((void *)thread_blocks[0]);
  printf("the next thread's medium block: in %s segment, writable for %zu KiB while it lived\n",
         same ? "the same" : "another", thread_medium_writable / KiB);
  if (eager) CHECK(thread_medium_writable == SEGMENT);
  else CHECK_MSG(thread_medium_writable <= 320 * KiB, "%zu KiB writable", thread_medium_writable / KiB);
  size_t huge = (size_t)3 << 20;
  h = th_malloc(huge);
  if (CHECK(h != NULL)) {
    fill(h, huge, 9);
    CHECK_MSG(intact(h, huge, 9), "a huge block lost its contents");
    uintptr_t seg = (uintptr_t)h & ~(uintptr_t)(SEGMENT - 1);
    size_t w = writable_in(seg, seg + SEGMENT);
    printf("a huge block of 3 MiB from the cache: %zu KiB of its segment writable\n", w / KiB);
    CHECK_MSG(w == SEGMENT, "%zu KiB writable", w / KiB);
    th_free(h);
  }
  return check_summary();
}
