/* pool_stages.h: what the tests of the page pool share (test_page_pool.c, test_hand_off.c): the 64 KiB slot a
 * block lies in, a set of slots, the test's stage for its threads to wait on, and the statistics. */
#ifndef TH_TESTS_POOL_STAGES_H
#define TH_TESTS_POOL_STAGES_H

#include <pthread.h>
#include <stdint.h>

#include "threadheap.h"

enum { SLOT = 65536, MAX_SLOTS = 64 };

static inline uintptr_t slot_of(const void *p) { return (uintptr_t)p & ~(uintptr_t)(SLOT - 1); }

/* Is p in one of the n slots? */
static inline int in_slots(const uintptr_t *slots, int n, const void *p) {
  for (int i = 0; i < n; i++)
    if (slots[i] == slot_of(p)) return 1;
  return 0;
}

/* p's slot joins the set (at most MAX_SLOTS), once. */
static inline void note_slot(uintptr_t *slots, int *n, const void *p) {
  if (!in_slots(slots, *n, p) && *n < MAX_SLOTS) slots[(*n)++] = slot_of(p);
}

/* The stage the test is at, for its threads to wait on. */
static pthread_mutex_t stage_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t stage_cond = PTHREAD_COND_INITIALIZER;
static int stage;

static inline void set_stage(int s) {
  pthread_mutex_lock(&stage_lock);
  stage = s;
  pthread_cond_broadcast(&stage_cond);
  pthread_mutex_unlock(&stage_lock);
}

static inline void wait_stage(int s) {
  pthread_mutex_lock(&stage_lock);
  while (stage < s) pthread_cond_wait(&stage_cond, &stage_lock);
  pthread_mutex_unlock(&stage_lock);
}

static inline th_stats_t stats(void) {
  th_stats_t s;
  th_stats_get(&s);
  return s;
}

#endif
