/* test_producer.c: a thread that hands all it allocates to another thread gets its pages back as pages.
 *
 * The producer (main thread) allocates 16 MiB of 64-byte blocks, each filled with a pattern of its own, and
 * a consumer thread checks every block and frees them all: every free is remote, and every page but the
 * producer's last was parked as full, so each comes back on the producer's ready stack, empty. The
 * producer's next malloc that runs its page dry must free those pages (all but one) to their segments,
 * not put them back in its queue: afterwards the blocks free in pages in use (th_stats_get's
 * free_in_pages) are under 1 MiB, where they were the whole 16 MiB while the pages waited for a purge
 * round. CTest sets THREADHEAP_PURGE_DELAY to 100 s, so no purge round runs during the test and only the
 * slow path's own collection can pass it. The producer then makes a second burst of the same size,
 * checked the same way: its committed bytes must not grow past the first burst's peak by more than
 * 2 MiB (the freed page slots are used again). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "threadheap.h"

#define MiB ((size_t)1 << 20)
#define BLOCK 64
#define COUNT (16 * MiB / BLOCK)

typedef struct {
  unsigned char **blocks;
  size_t n;
  size_t bad;
} burst_t;

static unsigned char pattern(size_t i, size_t k) { return (unsigned char)(i * 131u + k * 7u + 1u); }

static void fill(burst_t *b) {
  for (size_t i = 0; i < b->n; i++) {
    unsigned char *p = th_malloc(BLOCK);
    if (p == NULL) {
      b->bad++;
      continue;
    }
    for (size_t k = 0; k < BLOCK; k++) p[k] = pattern(i, k);
    b->blocks[i] = p;
  }
}

/* The consumer: check each block, then free it. */
static void *consume(void *arg) {
  burst_t *b = arg;
  for (size_t i = 0; i < b->n; i++) {
    unsigned char *p = b->blocks[i];
    if (p == NULL) continue;
    for (size_t k = 0; k < BLOCK; k++)
      if (p[k] != pattern(i, k)) {
        b->bad++;
        break;
      }
    th_free(p);
  }
  return NULL;
}

/* One burst: fill on this thread, check and free on another. */
static void burst(burst_t *b) {
  fill(b);
  pthread_t t;
  if (!CHECK(pthread_create(&t, NULL, consume, b) == 0)) return;
  pthread_join(t, NULL);
}

int main(void) {
  burst_t b = {.blocks = calloc(COUNT, sizeof(unsigned char *)), .n = COUNT};
  if (!CHECK(b.blocks != NULL)) return check_summary();
  burst(&b);
  th_stats_t peak;
  th_stats_get(&peak);

  /* Two pages' worth of the same class: the producer's page runs dry and its slow path collects. */
  enum { AGAIN = 2048 };
  static void *again[AGAIN];
  for (size_t i = 0; i < AGAIN; i++) {
    again[i] = th_malloc(BLOCK);
    CHECK(again[i] != NULL);
    memset(again[i], 0x5a, BLOCK);
  }
  th_stats_t after;
  th_stats_get(&after);
  CHECK_MSG(after.free_in_pages < MiB,
            "free_in_pages %zu after the burst came back (16 MiB burst; empty_pages %zu, cached %zu)",
            after.free_in_pages, after.empty_pages, after.cached);
  for (size_t i = 0; i < AGAIN; i++) {
    unsigned char *p = again[i];
    CHECK(p[0] == 0x5a && p[BLOCK - 1] == 0x5a);
    th_free(p);
  }

  /* The second burst takes the freed slots again. */
  memset(b.blocks, 0, COUNT * sizeof *b.blocks);
  burst(&b);
  th_stats_t second;
  th_stats_get(&second);
  CHECK_MSG(second.committed_peak <= peak.committed_peak + 2 * MiB,
            "committed peak %zu after the second burst, %zu after the first", second.committed_peak,
            peak.committed_peak);
  CHECK_MSG(b.bad == 0, "%zu blocks failed (allocation or pattern)", b.bad);
  printf("free_in_pages %zu KiB, empty_pages %zu KiB, cached %zu KiB after the burst came back; "
         "committed peak %zu then %zu KiB\n",
         after.free_in_pages >> 10, after.empty_pages >> 10, after.cached >> 10, peak.committed_peak >> 10,
         second.committed_peak >> 10);
  free(b.blocks);
  return check_summary();
}
