/* test_huge_race.c: huge blocks moved by realloc while other threads map and unmap huge blocks of their own.
 *
 * A realloc that cannot grow a huge block in place moves its pages to a new range with mremap, which frees
 * the old range at once; another thread's next huge block may be mapped right there. The old range's entries
 * in the segment map must be gone before that can happen: cleared afterwards, they erased the new block's,
 * and its next free, realloc or malloc_usable_size stopped the process with "invalid pointer" (two threads of
 * each kind hit it within a second). Every block carries a pattern that is checked before it is freed, and
 * after each move.
 *
 *   test_huge_race [--seconds S]     default 1.5; CTest runs it with the default purge delay and with 0
 *                                    (no segment cache, so every huge free unmaps)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "threadheap.h"

#define MiB ((size_t)1 << 20)

static _Atomic int g_stop;
static _Atomic long g_moves, g_blocks;

/* One byte per 64 KiB, derived from the block's key: enough to see a block replaced or zeroed. */
static void fill(unsigned char *p, size_t n, uint64_t key) {
  for (size_t i = 0; i < n; i += 65536) p[i] = (unsigned char)check_mix(key + i);
  p[n - 1] = (unsigned char)check_mix(key ^ n);
}
static int intact(const unsigned char *p, size_t n, uint64_t key) {
  for (size_t i = 0; i < n; i += 65536)
    if (p[i] != (unsigned char)check_mix(key + i)) return 0;
  return p[n - 1] == (unsigned char)check_mix(key ^ n);
}

/* Allocates a huge block and grows it past what fits in place, so that realloc moves it. */
static void *mover(void *arg) {
  uint64_t key = (uint64_t)(uintptr_t)arg << 32;
  while (!atomic_load(&g_stop)) {
    size_t n = 2 * MiB + 100;
    unsigned char *p = th_malloc(n);
    if (!CHECK(p != NULL)) break;
    fill(p, n, key);
    unsigned char *q = th_realloc(p, 9 * MiB);
    if (!CHECK(q != NULL)) break;
    /* The first n bytes moved with the pages. */
    for (size_t i = 0; i < n; i += 65536) CHECK(q[i] == (unsigned char)check_mix(key + i));
    fill(q, 9 * MiB, key + 1);
    CHECK(th_usable_size(q) >= 9 * MiB);
    CHECK(intact(q, 9 * MiB, key + 1));
    th_free(q);
    atomic_fetch_add(&g_moves, 1);
    key += 2;
  }
  return NULL;
}

/* Maps and unmaps huge blocks of another size, which the kernel likes to place where a move just left. */
static void *mapper(void *arg) {
  uint64_t key = ((uint64_t)(uintptr_t)arg << 32) | 0x80000000u;
  while (!atomic_load(&g_stop)) {
    size_t n = 3 * MiB;
    unsigned char *p = th_malloc(n);
    if (!CHECK(p != NULL)) break;
    fill(p, n, key);
    CHECK(th_usable_size(p) >= n);
    CHECK(intact(p, n, key));
    th_free(p);
    atomic_fetch_add(&g_blocks, 1);
    key++;
  }
  return NULL;
}

int main(int argc, char **argv) {
  double seconds = 1.5;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--seconds") && i + 1 < argc) seconds = atof(argv[++i]);
    else {
      fprintf(stderr, "usage: test_huge_race [--seconds S]\n");
      return 2;
    }
  }
  const char *delay = getenv("THREADHEAP_PURGE_DELAY");
  pthread_t t[4];
  for (int i = 0; i < 4; i++)
    if (pthread_create(&t[i], NULL, i < 2 ? mover : mapper, (void *)(uintptr_t)(i + 1)) != 0) {
      perror("pthread_create");
      return 2;
    }
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  nanosleep(&ts, NULL);
  atomic_store(&g_stop, 1);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  printf("THREADHEAP_PURGE_DELAY=%s: %ld moves by realloc, %ld other huge blocks in %.1f s\n",
         delay ? delay : "(unset)", (long)g_moves, (long)g_blocks, seconds);
  CHECK_MSG(g_moves > 0 && g_blocks > 0, "the threads made no progress");
  return check_summary();
}
