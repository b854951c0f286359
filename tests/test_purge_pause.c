/* test_purge_pause.c: memory a heap left free before a pause is not given back at the purge rounds just
 * after it, but once the heap has run for the purge delay without using it; and with `busy`, a segment cached
 * before the thread runs for as long on no allocator path at all is given back at the first rounds after.
 *
 * One thread fills three pages of 1,008-byte blocks, writes every block and frees them all; a purge round
 * frees the empty pages but the first of the class to their segment, where their slots wait, committed, for
 * the purge delay (CTest sets 600 ms: rounds every 150 ms). The thread then sleeps three delays, so that by
 * the wall clock the slots have waited long enough; the rounds of a short burst after the pause must leave
 * them resident (mincore), since a pause is not counted toward the delay (th_heap_t.paused_ms): a program
 * that wakes is about to reuse what it had. Rounds for more than two delays after it must give them back.
 * The same for a huge block freed before the pause, whose segment waits in the process-wide cache (its clock
 * in segment.c).
 *
 * `test_purge_pause busy` spins for the three delays instead of sleeping: the thread ran through the gap
 * between its rounds (heap_ran_through reads its usage: it never blocked), as a program busy on its own data or on its fast
 * paths alone does, so the gap counts whole on the process clock and the first rounds after it unmap the
 * huge block's cached segment. The slot is the heap's own, on its own clock, which still counts the gap as
 * a pause: it stays. Before, any gap between rounds counted as a pause for the cache too, and a busy program
 * kept its cached segments for as long as it stayed off the slow paths, then for the delay again.
 *
 * `test_purge_pause fresh` runs the same spin in a new thread whose first two rounds (th_collect) come before
 * it has used 1 ms of CPU: its usage then reads 0 ms, which heap_ran_through once took for "not read yet",
 * and counted the spin after it as a pause. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "purge_rounds.h"
#include "threadheap.h"

enum { BLOCKS = 3 * 64, SLOT = 65536, BIG = 2 << 20 };

/* The thread runs, on no allocator path, for the given time. */
static void spin(double seconds) {
  for (double end = now_s() + seconds; now_s() < end;) {
  }
}

/* A huge block, written and freed: its segment waits in the process-wide cache, resident, for the delay.
 * Returns its first OS page (mincore takes OS pages), 0 when the malloc failed. */
static uintptr_t huge_block_freed(void) {
  unsigned char *big = th_malloc(BIG);
  if (!CHECK(big != NULL)) return 0;
  memset(big, 0x5a, BIG);
  uintptr_t at = (uintptr_t)big & ~(uintptr_t)(sysconf(_SC_PAGESIZE) - 1);
  th_free(big);
  return at;
}

static void *fresh_thread(void *arg) {
  double delay = *(const double *)arg;
  void *keep = th_malloc(16); /* the thread's heap, whose segment stays with it (else the cache would hold
                                 it, and a new segment for the rounds below would take the huge block's) */
  th_collect();                /* its first round: usage not read */
  usleep(20000);
  th_collect();                /* its second: usage read, under 1 ms of CPU */
  struct rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  long cpu_us = (long)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000 + ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
  uintptr_t big_at = huge_block_freed();
  if (big_at == 0) return NULL;
  long big_before = resident_pages(big_at, BIG);
  CHECK(big_before == BIG / sysconf(_SC_PAGESIZE));
  spin(3 * delay);
  run_rounds(delay / 12);
  long big_after = resident_pages(big_at, BIG);
  CHECK(big_after <= 0); /* purged or unmapped */
  printf("a thread at %ld us of CPU at its second round: resident pages of the huge block %ld before %.1f s of "
         "running, %ld after it\n", cpu_us, big_before, 3 * delay, big_after);
  th_free(keep);
  return NULL;
}

int main(int argc, char **argv) {
  bool busy = argc > 1 && strcmp(argv[1], "busy") == 0;
  const char *delay_env = getenv("THREADHEAP_PURGE_DELAY");
  double delay = delay_env ? atof(delay_env) / 1000 : 0;
  if (!CHECK(delay >= 0.3)) return check_summary(); /* CTest's 600 ms: the timings below need room */
  if (argc > 1 && strcmp(argv[1], "fresh") == 0) {
    pthread_t t;
    if (CHECK(pthread_create(&t, NULL, fresh_thread, &delay) == 0)) pthread_join(t, NULL);
    return check_summary();
  }

  static unsigned char *a[BLOCKS];
  for (int i = 0; i < BLOCKS; i++) {
    a[i] = th_malloc(1008);
    if (!CHECK(a[i] != NULL)) return check_summary();
    memset(a[i], 0x5a, 1008);
  }
  /* The second page's slot: blocks 65-129 (65 fit in a page), whichever slot the first page took. */
  uintptr_t slot = (uintptr_t)a[100] & ~(uintptr_t)(SLOT - 1);
  /* a[0] stays: a segment left with no block goes to the process-wide cache, tested below with its own */
  for (int i = 1; i < BLOCKS; i++) th_free(a[i]);
  uintptr_t big_at = huge_block_freed();
  if (big_at == 0) return check_summary();
  run_rounds(delay / 3); /* a round frees the empty second page: its slot stays committed for the delay */
  long before = resident_pages(slot, SLOT), big_before = resident_pages(big_at, BIG);
  CHECK(before >= 12);                      /* its 64 written blocks */
  CHECK(big_before == BIG / sysconf(_SC_PAGESIZE)); /* the whole block */

  if (busy) {
    spin(3 * delay);
    run_rounds(delay / 12); /* the rounds just after it: the slot and the segment have waited three delays */
    long slot_after = resident_pages(slot, SLOT), big_after = resident_pages(big_at, BIG);
    CHECK(slot_after == before); /* the heap's own: its clock took the gap for a pause */
    CHECK(big_after <= 0);       /* purged or unmapped */
    printf("resident pages of the slot: %ld before %.1f s of running, %ld after it; of the huge block: %ld, %ld\n",
           before, 3 * delay, slot_after, big_before, big_after);
    th_free(a[0]);
    return check_summary();
  }
  usleep((useconds_t)(3 * delay * 1e6));
  run_rounds(delay / 12); /* the rounds just after the pause */
  long woken = resident_pages(slot, SLOT), big_woken = resident_pages(big_at, BIG);
  CHECK(woken == before);
  CHECK(big_woken == big_before);

  run_rounds(2.5 * delay); /* the delay, and more, of rounds with the slot unused */
  long later = resident_pages(slot, SLOT), big_later = resident_pages(big_at, BIG);
  CHECK(later == 0);
  CHECK(big_later <= 0); /* purged or unmapped */

  printf("resident pages of the slot: %ld before the pause, %ld after it, %ld after %.1f s of rounds; of the huge "
         "block: %ld, %ld, %ld\n", before, woken, later, 2.5 * delay, big_before, big_woken, big_later);
  th_free(a[0]);
  return check_summary();
}
