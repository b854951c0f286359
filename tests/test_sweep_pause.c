/* test_sweep_pause.c: a thread that frees its blocks and pauses finds them still committed when it runs
 * again, though another thread swept its heap meanwhile; what it does not use again goes back later.
 *
 * An owner thread writes three pages of 1,008-byte blocks (64 to a page), frees all but the first on its
 * fast paths (the emptied pages stay in its queues until a purge round) and waits on a condition variable.
 * The main thread runs purge rounds, so that once the owner's heap has passed no round for the purge delay
 * (CTest sets 200 ms) a round of the main thread sweeps it (src/sweep.c): the empty pages go back to their
 * segment, as free slots. That first sweep must not purge the slots (mincore): the owner freed them just
 * before its pause, as a program does between two phases of the same work (mimalloc-bench's rptest). Then:
 *
 * - the owner, swept only after five delays of its pause, wakes at once and runs purge rounds of its own:
 *   the slots stay resident through the first of them and go once it has run 2.5 delays without them (the
 *   sweep stamped them on the heap's clock with the pause taken out, where the owner's first round after
 *   the pause finds them: new, neither older than any delay nor five delays ahead);
 * - or, in a second owner thread, the owner keeps waiting: a later sweep, a delay after the first at the
 *   soonest, purges them;
 * - or, in a third, the owner frees only the first block of the second page (the page was parked as full:
 *   that free takes it back, and its count of the owner's frees starts again from 0) and the main thread
 *   frees the other 63, checked first: the owner worked in that page too, so the first sweep keeps it
 *   committed as well, and a later one purges it. Before `owner_freed`, the count's 0 read as a page
 *   handed away whole, and the first sweep purged it.
 *
 * Exit 77 (skipped) where the kernel refuses the fence the sweep needs (membarrier). */
#define _GNU_SOURCE
#include <linux/membarrier.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "check.h"
#include "purge_rounds.h"
#include "threadheap.h"

enum { BLOCKS = 3 * 64, SIZE = 1008, SLOT = 65536 };

static double delay; /* seconds */

/* The owner's side, under m: stage moves 0 -> 1 (owner: blocks freed, waiting) -> 2 (main: swept, wake). */
static struct {
  pthread_mutex_t m;
  pthread_cond_t c;
  int stage;
  bool rounds_after;       /* the owner runs rounds of its own once woken (else it only finishes) */
  bool hands_rest;         /* the owner frees one block of the second page; the main thread the rest */
  unsigned char *a[BLOCKS]; /* the blocks, block i filled by check_fill with key i */
  bool handed[BLOCKS];      /* with hands_rest: the blocks the main thread frees */
  uintptr_t slot;          /* the second page's slot */
  long woken, later;       /* its resident pages after the owner's first rounds, and after 2.5 delays */
  bool kept_intact;        /* the block the owner kept still holds what it wrote */
} own = {.m = PTHREAD_MUTEX_INITIALIZER, .c = PTHREAD_COND_INITIALIZER};

static void set_stage(int s) {
  pthread_mutex_lock(&own.m);
  own.stage = s;
  pthread_cond_broadcast(&own.c);
  pthread_mutex_unlock(&own.m);
}

static void wait_stage(int s) {
  pthread_mutex_lock(&own.m);
  while (own.stage < s) pthread_cond_wait(&own.c, &own.m);
  pthread_mutex_unlock(&own.m);
}

static void *owner(void *arg) {
  (void)arg;
  unsigned char **a = own.a;
  run_rounds(delay / 4); /* rounds of its own first: a heap that never had one is never idle */
  for (int i = 0; i < BLOCKS; i++) {
    a[i] = th_malloc(SIZE);
    if (!CHECK(a[i] != NULL)) abort();
    check_fill(a[i], SIZE, (unsigned)i);
  }
  own.slot = (uintptr_t)a[100] & ~(uintptr_t)(SLOT - 1); /* the second page */
  bool one_freed = false;
  for (int i = 1; i < BLOCKS; i++) {
    bool in_slot = ((uintptr_t)a[i] & ~(uintptr_t)(SLOT - 1)) == own.slot;
    own.handed[i] = own.hands_rest && in_slot && one_freed;
    if (in_slot) one_freed = true;
    if (!own.handed[i]) th_free(a[i]);
  }
  set_stage(1);
  wait_stage(2); /* no malloc, no free: idle */
  if (own.rounds_after) {
    run_rounds(delay / 12);
    own.woken = resident_pages(own.slot, SLOT);
    run_rounds(2.5 * delay);
    own.later = resident_pages(own.slot, SLOT);
  }
  own.kept_intact = check_verify(a[0], SIZE, 0) == SIZE;
  th_free(a[0]);
  return NULL;
}

/* One owner: returns the slot's resident pages before the first sweep, and after it. */
static void run_owner(bool rounds_after, bool hands_rest, long *before, long *swept, long *after_second) {
  own.stage = 0;
  own.rounds_after = rounds_after;
  own.hands_rest = hands_rest;
  pthread_t t;
  if (!CHECK(pthread_create(&t, NULL, owner, NULL) == 0)) exit(check_summary());
  wait_stage(1);
  if (hands_rest) { /* the second page's other blocks, freed here: remote frees */
    bool intact = true;
    int n = 0;
    for (int i = 0; i < BLOCKS; i++) {
      if (!own.handed[i]) continue;
      intact = intact && check_verify(own.a[i], SIZE, (unsigned)i) == SIZE;
      th_free(own.a[i]);
      n++;
    }
    CHECK_MSG(intact, "a block handed to the main thread lost its contents");
    CHECK_MSG(n >= 12, "only %d blocks of the second page were handed to the main thread", n);
  }
  *before = resident_pages(own.slot, SLOT);
  th_stats_t s0, s;
  th_stats_get(&s0);
  /* With rounds after: no round of any thread for five delays, so that the sweep comes five delays after the
   * owner's last round (on a clock that left the pause in, the slots it frees would be stamped that much
   * ahead of the owner's clock, and outlast 2.5 delays of its rounds). */
  if (rounds_after) usleep((useconds_t)(5 * delay * 1e6));
  /* Rounds of this thread until one sweeps the owner's heap: its second page (the third, first of its class
   * queue, stays) leaves committed. */
  double end = now_s() + 20 * delay;
  bool seen = false;
  while (!seen && now_s() < end) {
    run_rounds(delay / 50);
    th_stats_get(&s);
    seen = s.committed + 48 * 1024 <= s0.committed;
  }
  CHECK_MSG(seen, "no sweep freed the waiting owner's empty pages in %.1f s (committed %zu -> %zu KiB)",
            20 * delay, s0.committed >> 10, s.committed >> 10);
  *swept = resident_pages(own.slot, SLOT);
  *after_second = -2;
  if (!rounds_after) {
    run_rounds(2.5 * delay); /* the owner still waits: a later sweep */
    *after_second = resident_pages(own.slot, SLOT);
  }
  set_stage(2);
  pthread_join(t, NULL);
  CHECK_MSG(own.kept_intact, "the block the owner kept lost its contents");
}

int main(void) {
  const char *delay_env = getenv("THREADHEAP_PURGE_DELAY");
  delay = delay_env ? atof(delay_env) / 1000 : 0;
  if (!CHECK(delay >= 0.1)) return check_summary(); /* CTest's 200 ms: the timings below need room */
  long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (cmds < 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED)) {
    printf("no membarrier: nothing is swept, skipped\n");
    return 77;
  }
  run_rounds(delay / 4); /* this thread's heap, made */

  long before, swept, second;
  run_owner(true, false, &before, &swept, &second);
  CHECK(before >= 12); /* its 64 written blocks */
  CHECK_MSG(swept == before, "the first sweep purged what the owner freed before its pause (%ld -> %ld pages)",
            before, swept);
  CHECK_MSG(own.woken == before, "the owner's first rounds after its pause purged the swept slot (%ld -> %ld)",
            before, own.woken);
  CHECK_MSG(own.later == 0, "2.5 delays of the owner's rounds left %ld pages of the unused slot", own.later);
  printf("owner woken: the slot's resident pages %ld, %ld after the first sweep, %ld after its first rounds, %ld "
         "after 2.5 delays\n", before, swept, own.woken, own.later);

  run_owner(false, false, &before, &swept, &second);
  CHECK(before >= 12);
  CHECK_MSG(swept == before, "the first sweep purged what the owner freed before its pause (%ld -> %ld pages)",
            before, swept);
  CHECK_MSG(second == 0, "a later sweep left %ld pages of the slot of an owner still waiting", second);
  printf("owner waiting: %ld, %ld after the first sweep, %ld after a later one\n", before, swept, second);

  run_owner(false, true, &before, &swept, &second);
  CHECK(before >= 12);
  CHECK_MSG(swept == before,
            "the first sweep purged a page the owner had freed into, its count reset (%ld -> %ld pages)", before,
            swept);
  CHECK_MSG(second == 0, "a later sweep left %ld pages of that slot", second);
  printf("owner freed one block, the rest freed remotely: %ld, %ld after the first sweep, %ld after a later "
         "one\n", before, swept, second);
  return check_summary();
}
