/* test_remote_empty.c: pages that another thread's frees empty go back to the OS while their owner lives.
 *
 * The owner allocates 48 MiB of small and medium blocks and fills each with a pattern of its own. A second
 * thread checks every block's pattern and frees them all: every free is remote, so the blocks wait on
 * their pages' thread_free stacks, and the owner's queues still hold the pages. The owner then keeps
 * working on blocks of another size in batches (allocate a batch, free it), which runs its pages dry and so
 * its slow path and purge rounds. It passes when threadheap's committed bytes fall back below the value
 * before the burst plus 8 MiB within 10 s (CTest sets THREADHEAP_PURGE_DELAY=100: a hundred times the
 * delay, so only memory that is never given back fails). The remote frees counted are printed, not
 * checked: a page that also holds a live block (pthread_create allocates one for the new thread, which
 * glibc keeps with the cached stack) keeps its remote frees uncollected, by design, until it runs dry.
 * Run with --blocks-mb N for a bigger or smaller burst. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "threadheap.h"

#define MiB ((size_t)1 << 20)

typedef struct {
  unsigned char **blocks;
  size_t *sizes;
  size_t n;
  size_t bad;
} burst_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static unsigned char pattern(size_t i, size_t k) { return (unsigned char)(i * 131u + k * 7u + 1u); }

/* The other thread: check each block's pattern (first, middle and last byte), then free it. */
static void *free_all(void *arg) {
  burst_t *b = arg;
  for (size_t i = 0; i < b->n; i++) {
    size_t s = b->sizes[i];
    unsigned char *p = b->blocks[i];
    if (p[0] != pattern(i, 0) || p[s / 2] != pattern(i, s / 2) || p[s - 1] != pattern(i, s - 1)) b->bad++;
    th_free(p);
  }
  return NULL;
}

int main(int argc, char **argv) {
  size_t burst_mb = 48;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--blocks-mb") && i + 1 < argc) burst_mb = (size_t)atol(argv[++i]);
    else {
      fprintf(stderr, "usage: test_remote_empty [--blocks-mb N]\n");
      return 2;
    }
  }
  enum { BATCH = 600 };
  static void *work[BATCH];
  /* The tables come before the baseline: they stay allocated to the end. */
  size_t cap = burst_mb * MiB / 16 + 1;
  burst_t b = {.blocks = malloc(cap * sizeof *b.blocks), .sizes = malloc(cap * sizeof *b.sizes)};
  if (!CHECK(b.blocks != NULL && b.sizes != NULL)) return check_summary();
  /* Warm the steady-state work first, so the baseline holds what that work keeps. */
  for (int i = 0; i < BATCH; i++) work[i] = th_malloc(2000);
  for (int i = 0; i < BATCH; i++) th_free(work[i]);
  th_stats_t before;
  th_stats_get(&before);

  uint64_t rng = 0x2545f4914f6cdd1dULL;
  size_t bytes = 0;
  while (bytes < burst_mb * MiB && b.n < cap) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    /* Three of four blocks small (16 B-1 KiB), the rest medium (8-40 KiB). */
    size_t s = (rng & 3) ? 16 + (size_t)(rng >> 8) % 1009 : 8192 + (size_t)(rng >> 8) % (32 * 1024);
    unsigned char *p = th_malloc(s);
    if (!CHECK(p != NULL)) break;
    for (size_t k = 0; k < s; k += 64) p[k] = pattern(b.n, k);
    p[s / 2] = pattern(b.n, s / 2);
    p[s - 1] = pattern(b.n, s - 1);
    b.blocks[b.n] = p;
    b.sizes[b.n++] = s;
    bytes += s;
  }
  th_stats_t peak;
  th_stats_get(&peak);
  CHECK_MSG(peak.committed >= before.committed + burst_mb * MiB, "the burst did not raise committed (%zu -> %zu)",
            before.committed, peak.committed);

  pthread_t t;
  if (!CHECK(pthread_create(&t, NULL, free_all, &b) == 0)) return check_summary();
  pthread_join(t, NULL);
  CHECK_MSG(b.bad == 0, "%zu of %zu blocks had lost their pattern when the other thread freed them", b.bad, b.n);

  size_t limit = before.committed + 8 * MiB;
  double t0 = now_s(), elapsed = 0;
  long rounds = 0;
  th_stats_t now;
  for (;;) {
    th_stats_get(&now);
    elapsed = now_s() - t0;
    if (now.committed < limit || elapsed > 10.0) break;
    for (int i = 0; i < BATCH; i++) {
      work[i] = th_malloc(2000);
      if (work[i]) memset(work[i], i, 2000);
    }
    for (int i = 0; i < BATCH; i++) th_free(work[i]);
    rounds++;
  }
  printf("burst: %zu blocks, %zu MiB, freed by another thread; committed %zu KiB before, %zu KiB at peak, "
         "%zu KiB after %.3f s (%ld rounds of work); remote frees counted %zu of %zu\n",
         b.n, bytes / MiB, before.committed >> 10, peak.committed >> 10, now.committed >> 10, elapsed, rounds,
         now.remote_frees - before.remote_frees, b.n);
  CHECK_MSG(now.committed < limit, "committed %zu KiB is still above %zu KiB after %.1f s", now.committed >> 10,
            limit >> 10, elapsed);
  free(b.blocks);
  free(b.sizes);
  return check_summary();
}
