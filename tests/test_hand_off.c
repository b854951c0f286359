/* test_hand_off.c: a thread heap hands each small page it fills to the pool while other threads live
 * (pool_hand_off), and the page serves whoever needs it next, with every block's contents kept.
 *
 * Thread P allocates four pages' worth of 64-byte blocks and waits, alive; main checks and frees them:
 *   recycle  the frees that bring a handed-off page's last block back make it a free slot of the pool at
 *            once, with no purge round (pool_slots), and thread Q, allocating next, gets P's slots;
 *   reclaim  P fills two more pages and frees its own blocks: the first of those frees into a page it had
 *            handed off takes the page back (pool_reclaim), so none of them becomes a pool slot;
 *   adopt    thread P2 fills a page and one block more; main frees half of that page's blocks, and thread
 *            R's first malloc of the class takes the page over with them (pool_adopt_orphan): its block lies
 *            in P2's slot, and main's other blocks there keep their contents until main frees them.
 * A page its owner freed into as it filled is parked as before, not handed off (thread L). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "pool_stages.h"
#include "threadheap.h"

enum { SIZE = 64, PER_PAGE = SLOT / SIZE, N = 4 * PER_PAGE };

static void fill(void *p, unsigned key) { memset(p, (int)(key * 31 + 7) & 0xff, SIZE); }
static int intact(const void *p, unsigned key) {
  const unsigned char *b = p;
  for (size_t i = 0; i < SIZE; i++)
    if (b[i] != ((key * 31 + 7) & 0xff)) return 0;
  return 1;
}

static void *blocks[N];
static uintptr_t p_slots[MAX_SLOTS];
static int p_nslots;

static int in_p_slots(const void *p) { return in_slots(p_slots, p_nslots, p); }

static size_t handed_in_p; /* pages P handed off while filling its first four pages */
static size_t reclaim_pool_growth;
static int reclaim_bad;
static void *adopt_blocks[PER_PAGE + 1];
static size_t adopt_n;

static void *thread_p(void *arg) {
  (void)arg;
  size_t before = stats().pages_handed_off;
  for (size_t i = 0; i < N; i++) {
    blocks[i] = th_malloc(SIZE);
    if (!CHECK(blocks[i] != NULL)) return NULL;
    fill(blocks[i], (unsigned)i);
  }
  handed_in_p = stats().pages_handed_off - before;
  set_stage(1);
  wait_stage(2);

  /* reclaim: two pages' worth and one block, then every one freed by P itself */
  enum { M = 2 * PER_PAGE + 1 };
  static void *mine[M];
  before = stats().pages_handed_off;
  for (size_t i = 0; i < M; i++) {
    mine[i] = th_malloc(SIZE);
    if (!CHECK(mine[i] != NULL)) return NULL;
    fill(mine[i], (unsigned)i + 5);
  }
  CHECK_MSG(stats().pages_handed_off - before >= 1, "P filled 2 pages and handed off %zu",
            stats().pages_handed_off - before);
  size_t pool = stats().pool_slots;
  for (size_t i = 0; i < M; i++) {
    reclaim_bad += !intact(mine[i], (unsigned)i + 5);
    th_free(mine[i]);
  }
  size_t after = stats().pool_slots;
  reclaim_pool_growth = after > pool ? after - pool : 0;
  set_stage(3);
  wait_stage(6);
  return NULL;
}

/* adopt: one page full (handed off when the next block needs a page) and one block more, by a thread of its
 * own (P's pages had P's frees in them: it parks those as before) */
static void *thread_p2(void *arg) {
  (void)arg;
  adopt_n = 0;
  void *first = th_malloc(SIZE);
  fill(first, 1000);
  adopt_blocks[adopt_n++] = first;
  while (adopt_n < PER_PAGE + 1) {
    void *p = th_malloc(SIZE);
    if (!CHECK(p != NULL)) return NULL;
    fill(p, 1000 + (unsigned)adopt_n);
    adopt_blocks[adopt_n++] = p;
  }
  set_stage(5);
  wait_stage(6);
  return NULL;
}

static size_t q_in_p;
static int q_bad;

static void *thread_q(void *arg) {
  (void)arg;
  size_t n = (size_t)(p_nslots - 1) * PER_PAGE / 2;
  void **b = malloc(n * sizeof *b);
  if (!CHECK(b != NULL)) return NULL;
  for (size_t i = 0; i < n; i++) {
    b[i] = th_malloc(SIZE);
    if (!CHECK(b[i] != NULL)) return NULL;
    fill(b[i], (unsigned)i + 77);
    q_in_p += in_p_slots(b[i]);
  }
  for (size_t i = 0; i < n; i++) {
    q_bad += !intact(b[i], (unsigned)i + 77);
    th_free(b[i]);
  }
  free(b);
  return NULL;
}

/* A thread that frees some of its own blocks as it fills its pages (every fourth, at once) hands none off. */
static size_t l_handed = 1;
static void *thread_l(void *arg) {
  (void)arg;
  enum { M = 3 * PER_PAGE };
  static void *kept[M];
  size_t before = stats().pages_handed_off, n = 0;
  for (size_t i = 0; i < M; i++) {
    void *p = th_malloc(SIZE);
    if (!CHECK(p != NULL)) return NULL;
    fill(p, (unsigned)i);
    if (i % 4 == 3) th_free(p);
    else kept[n++] = p;
  }
  l_handed = stats().pages_handed_off - before;
  for (size_t i = 0; i < n; i++) th_free(kept[i]);
  return NULL;
}

static void *r_block;

static void *thread_r(void *arg) {
  (void)arg;
  r_block = th_malloc(SIZE);
  if (CHECK(r_block != NULL)) fill(r_block, 4242);
  CHECK_MSG(intact(r_block, 4242), "R's block changed");
  th_free(r_block);
  return NULL;
}

int main(void) {
  th_free(th_malloc(16)); /* main's heap: a thread alone hands nothing off */
  pthread_t p;
  if (pthread_create(&p, NULL, thread_p, NULL) != 0) return 2;
  wait_stage(1);
  CHECK_MSG(handed_in_p >= 3, "P filled 4 pages and handed off %zu", handed_in_p);

  /* recycle: P's slots, the last (its page in use) apart */
  uintptr_t last = slot_of(blocks[N - 1]);
  for (size_t i = 0; i < N; i++)
    if (slot_of(blocks[i]) != last) note_slot(p_slots, &p_nslots, blocks[i]);
  size_t bad = 0, pool = stats().pool_slots;
  for (size_t i = 0; i < N; i++) bad += !intact(blocks[i], (unsigned)i);
  CHECK_MSG(bad == 0, "%zu of P's blocks changed", bad);
  for (size_t i = 0; i < N; i++)
    if (slot_of(blocks[i]) != last) th_free(blocks[i]);
  size_t grown = stats().pool_slots - pool; /* th_stats_get pushes main's held frees first */
  printf("P handed off %zu pages; main's frees made %zu of P's %d other slots pool slots\n", handed_in_p, grown,
         p_nslots);
  CHECK_MSG(grown >= (size_t)p_nslots, "the pool gained %zu slots for the %d pages emptied", grown, p_nslots);
  pthread_t q;
  if (pthread_create(&q, NULL, thread_q, NULL) != 0) return 2;
  pthread_join(q, NULL);
  printf("Q: %zu of its blocks in P's slots\n", q_in_p);
  CHECK_MSG(q_in_p >= (size_t)PER_PAGE / 2, "only %zu of Q's blocks lie in P's emptied slots", q_in_p);
  CHECK_MSG(q_bad == 0, "%d of Q's blocks changed", q_bad);
  for (size_t i = 0; i < N; i++)
    if (slot_of(blocks[i]) == last) th_free(blocks[i]);

  /* reclaim */
  set_stage(2);
  wait_stage(3);
  CHECK_MSG(reclaim_bad == 0, "%d of P's own blocks changed", reclaim_bad);
  CHECK_MSG(reclaim_pool_growth == 0, "P's own frees made %zu pool slots (its pages were not taken back)",
            reclaim_pool_growth);

  /* adopt: main frees every other block of P's full page (the first PER_PAGE blocks' slot) */
  pthread_t p2;
  if (pthread_create(&p2, NULL, thread_p2, NULL) != 0) return 2;
  wait_stage(5);
  uintptr_t full = slot_of(adopt_blocks[0]);
  size_t freed = 0;
  for (size_t i = 0; i < adopt_n; i++)
    if (slot_of(adopt_blocks[i]) == full && i % 2 == 0) {
      th_free(adopt_blocks[i]);
      adopt_blocks[i] = NULL;
      freed++;
    }
  th_stats_get(&(th_stats_t){0}); /* main's held frees pushed */
  pthread_t r;
  if (pthread_create(&r, NULL, thread_r, NULL) != 0) return 2;
  pthread_join(r, NULL);
  printf("adopt: main freed %zu blocks of P's full page; R's block %s in it\n", freed,
         slot_of(r_block) == full ? "is" : "is not");
  CHECK_MSG(slot_of(r_block) == full, "R's first block %p is not in P's handed-off page", r_block);
  bad = 0;
  for (size_t i = 0; i < adopt_n; i++)
    if (adopt_blocks[i] != NULL) {
      bad += !intact(adopt_blocks[i], 1000 + (unsigned)i);
      th_free(adopt_blocks[i]);
    }
  CHECK_MSG(bad == 0, "%zu of P's blocks in the adopted page changed", bad);
  set_stage(6);
  pthread_join(p, NULL);
  pthread_join(p2, NULL);

  pthread_t l;
  if (pthread_create(&l, NULL, thread_l, NULL) != 0) return 2;
  pthread_join(l, NULL);
  CHECK_MSG(l_handed == 0, "a thread freeing its own blocks as it filled its pages handed off %zu", l_handed);
  return check_summary();
}
