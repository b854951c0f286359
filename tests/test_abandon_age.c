/* test_abandon_age.c: a live heap's purge rounds take over an exited thread's segments only once they have
 * waited one purge delay, and then give their emptied memory back.
 *
 * Thread A allocates about 1 MiB of 1000-byte blocks, writes them, hands them to main and exits: its
 * segment is abandoned with every block live. Main checks and frees them all (remote frees into the
 * abandoned segment), then mallocs and frees one 16-byte block in a loop, which never runs short of pages:
 * only its purge rounds (one every 4,096 frees, once their time has come) can adopt A's segment. A round
 * must not adopt it before the purge delay has passed since A's exit (a thread that replaces A takes it
 * when it first runs short, and the rounds of other live threads would take it from under it: larson with 8
 * threads held 10% more memory so), and must adopt it after: then A's pages are all free, the segment is
 * released, and the committed bytes drop by A's.
 *
 * The clock argument: A reads the clock (CLOCK_MONOTONIC_COARSE, the library's) before it returns, so before
 * its segment is stamped abandoned; main reads the adoption count, then the clock. If the clock read says
 * less than the delay since A's reading, no adoption can have happened yet, however the threads were
 * scheduled. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "threadheap.h"

enum { BLOCKS = 1000, SIZE = 1000 };
static unsigned char *blocks[BLOCKS];
static uint64_t a_done_ms;

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void *thread_a(void *arg) {
  (void)arg;
  for (int i = 0; i < BLOCKS; i++) {
    blocks[i] = th_malloc(SIZE);
    if (blocks[i]) memset(blocks[i], i % 251, SIZE);
  }
  a_done_ms = now_ms();
  return NULL;
}

int main(void) {
  const char *env = getenv("THREADHEAP_PURGE_DELAY");
  uint64_t delay = env ? strtoull(env, NULL, 10) : 250;
  th_free(th_malloc(16)); /* main's heap, with a small segment of its own, exists before A's */
  pthread_t t;
  if (!CHECK(pthread_create(&t, NULL, thread_a, NULL) == 0)) return check_summary();
  pthread_join(t, NULL);

  th_stats_t st;
  th_stats_get(&st);
  size_t adopted0 = st.segments_adopted, committed_with_a = st.committed;
  int bad = 0;
  for (int i = 0; i < BLOCKS; i++) {
    bad += blocks[i] == NULL || blocks[i][0] != i % 251 || blocks[i][SIZE - 1] != i % 251;
    th_free(blocks[i]);
  }
  CHECK_MSG(bad == 0, "%d of %d blocks of the exited thread read back wrong", bad, BLOCKS);

  /* Rounds until A's segment is adopted; each 4,096 frees of the 16-byte page is one look at the clock. */
  long early = 0, checked_early = 0;
  uint64_t adopted_after = 0;
  for (;;) {
    for (int i = 0; i < 100000; i++) {
      volatile char *p = th_malloc(16);
      p[0] = (char)i;
      th_free((void *)p);
    }
    th_stats_get(&st);
    uint64_t since = now_ms() - a_done_ms;
    if (since < delay) {
      checked_early++;
      early += st.segments_adopted != adopted0;
    }
    if (st.segments_adopted != adopted0) {
      adopted_after = since;
      break;
    }
    if (since > 20 * delay + 10000) break;
  }
  CHECK_MSG(early == 0, "adopted before the purge delay (%llu ms) in %ld of %ld looks",
            (unsigned long long)delay, early, checked_early);
  CHECK_MSG(adopted_after >= delay, "the exited thread's segment was never adopted, or adopted after %llu ms",
            (unsigned long long)adopted_after);
  /* Adoption freed A's pages (every block free) and released the segment: its bytes are no longer
   * committed to a heap. */
  CHECK_MSG(st.committed + (size_t)BLOCKS * SIZE / 2 <= committed_with_a,
            "committed %zu bytes with the exited thread's blocks, %zu after its segment was adopted",
            committed_with_a, st.committed);
  printf("purge delay %llu ms: adopted %llu ms after the thread's exit (%ld looks before the delay); "
         "committed %zu -> %zu bytes\n",
         (unsigned long long)delay, (unsigned long long)adopted_after, checked_early, committed_with_a,
         st.committed);
  return check_summary();
}
