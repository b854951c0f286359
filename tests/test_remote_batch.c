/* test_remote_batch.c: frees by one thread into another thread's pages are held in batches, one per page,
 * and pushed as one chain each (free.c); none may be lost or held past the points that push them.
 *
 * The main thread allocates blocks of two sizes and fills each with a pattern; a second thread checks
 * every pattern and frees them all (remote frees). The main thread's in_use (th_stats_get), which counts
 * a block as held until it is pushed onto its page's remote stack, must then be back where it was before
 * the blocks were allocated, once the second thread has
 *   - exited, having never allocated (it gets a heap at its first such free, and with it the exit hook);
 *   - called th_collect, and still lives;
 *   - made its first allocation (the malloc slow path pushes), and still lives.
 * An explicit heap's blocks are never held: its owner may destroy it as soon as the frees return, so its
 * in_use (th_heap_stats_get) is 0 while the freeing thread still lives and has pushed nothing. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "threadheap.h"

#define NBLOCKS 300
static const size_t sizes[2] = {48, 720}; /* 150 of 720 B fill two pages */

typedef enum { PUSH_AT_EXIT, PUSH_BY_COLLECT, PUSH_BY_MALLOC, EXPLICIT } mode_t_;

typedef struct {
  mode_t_ mode;
  unsigned char *blocks[NBLOCKS];
  atomic_int stage; /* 1: blocks ready; 2: freed (and pushed, as the mode says); 3: the main thread checked */
  size_t bad;
  void *own; /* PUSH_BY_MALLOC: the second thread's own block */
} shared_t;

/* The first half of the blocks of one size, the rest of the other, so that batches both fill up (64 blocks)
 * and end when the frees move to another page. */
static size_t block_size(int i) { return sizes[i >= NBLOCKS / 2]; }
static unsigned char pattern(int i, size_t k) { return (unsigned char)(i * 37u + k * 11u + 5u); }

static void wait_stage(atomic_int *stage, int want) {
  while (atomic_load(stage) < want) sched_yield();
}

static void *freer(void *arg) {
  shared_t *s = arg;
  wait_stage(&s->stage, 1);
  for (int i = 0; i < NBLOCKS; i++) {
    size_t n = block_size(i);
    for (size_t k = 0; k < n; k += 61)
      if (s->blocks[i][k] != pattern(i, k)) s->bad++;
    if (s->blocks[i][n - 1] != pattern(i, n - 1)) s->bad++;
    th_free(s->blocks[i]);
  }
  if (s->mode == PUSH_AT_EXIT) return NULL; /* stage 2 is the join */
  if (s->mode == PUSH_BY_COLLECT) th_collect();
  if (s->mode == PUSH_BY_MALLOC) s->own = th_malloc(3000); /* this thread's first allocation */
  atomic_store(&s->stage, 2);
  wait_stage(&s->stage, 3);
  th_free(s->own);
  return NULL;
}

static size_t in_use(th_heap_t *heap) {
  th_stats_t st;
  if (heap) CHECK(th_heap_stats_get(heap, &st) == 0);
  else th_stats_get(&st);
  return st.in_use;
}

static void run(mode_t_ mode, const char *name) {
  static shared_t s;
  memset(&s, 0, sizeof s);
  s.mode = mode;
  pthread_t t;
  CHECK(pthread_create(&t, NULL, freer, &s) == 0);
  th_heap_t *heap = mode == EXPLICIT ? th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0) : NULL;
  if (mode == EXPLICIT) CHECK(heap != NULL);
  size_t before = in_use(heap);
  for (int i = 0; i < NBLOCKS; i++) {
    size_t n = block_size(i);
    s.blocks[i] = heap ? th_heap_malloc(heap, n) : th_malloc(n);
    CHECK(s.blocks[i] != NULL);
    for (size_t k = 0; k < n; k++) s.blocks[i][k] = pattern(i, k);
  }
  CHECK(in_use(heap) > before);
  atomic_store(&s.stage, 1);
  if (mode == PUSH_AT_EXIT) {
    CHECK(pthread_join(t, NULL) == 0);
  } else {
    wait_stage(&s.stage, 2);
  }
  size_t after = in_use(heap);
  size_t own = mode == PUSH_BY_MALLOC ? th_usable_size(s.own) : 0;
  CHECK_MSG(after == before + own, "%s: in_use %zu after the frees, %zu before (+%zu of the thread's own)", name,
            after, before, own);
  CHECK_MSG(s.bad == 0, "%s: %zu bytes differed from what the owner wrote", name, s.bad);
  if (mode != PUSH_AT_EXIT) {
    if (heap) th_heap_destroy(heap); /* while the freeing thread still lives: nothing of it may be held */
    atomic_store(&s.stage, 3);
    CHECK(pthread_join(t, NULL) == 0);
  }
  /* Every block came back: this thread gets them again, and the counts agree. */
  if (!heap) {
    void *again[NBLOCKS];
    for (int i = 0; i < NBLOCKS; i++) CHECK((again[i] = th_malloc(block_size(i))) != NULL);
    for (int i = 0; i < NBLOCKS; i++) th_free(again[i]);
    CHECK_MSG(in_use(NULL) == before, "%s: in_use %zu after the blocks were used again, %zu before", name,
              in_use(NULL), before);
  }
}

static void *nothing(void *arg) { return arg; }

int main(void) {
  /* glibc keeps a thread's TLS vector with its cached stack: a thread made once first, so that the ones
   * below reuse it and allocate nothing the counts would see. */
  pthread_t t;
  CHECK(pthread_create(&t, NULL, nothing, NULL) == 0);
  CHECK(pthread_join(t, NULL) == 0);
  run(PUSH_AT_EXIT, "pushed at exit by a thread that never allocated");
  run(PUSH_BY_COLLECT, "pushed by th_collect");
  run(PUSH_BY_MALLOC, "pushed by the first malloc");
  run(EXPLICIT, "an explicit heap's blocks");
  return check_summary();
}
