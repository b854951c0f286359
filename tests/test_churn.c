/* test_churn.c: thousands of short-lived threads. Each allocates a few blocks of mixed sizes, frees some
 * itself and hands the rest on: to the main thread, to the threads of the next wave, and to a long-lived
 * ring that main frees much later. So most blocks are freed after the thread that allocated them has
 * exited, which is what abandoning and adopting a dead thread's memory is for.
 *
 * Asserts: every handed-on block still holds its pattern when freed; after every wave of joins the number
 * of live thread heaps is back to where it started (join returns after the thread's destructors ran);
 * and memory stays bounded: committed bytes after 2,000 threads are at most those after 200 threads plus
 * 16 MiB, since an exited thread's pages must be reused rather than piling up (a leak of even one 64 KiB
 * page per thread would add 112 MiB over the last 1,800 threads). The level itself moves with timing: with
 * 2 MiB medium pages the growth was 6.4-8.9 MiB, and the same after 8,000 threads (6.4-7.4 MiB, so it
 * levels off), which passed an 8 MiB bound only most of the time when the machine was busy. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "threadheap.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

#define WAVE 8
#define THREADS 2000
#define EARLY 200
#define PER_THREAD 6
#define RING 96

typedef struct block_s {
  unsigned char *p;
  size_t size;
  uint64_t key;
} block_t;

static void fill(block_t *b) {
  uint64_t *w = (uint64_t *)b->p;
  for (size_t i = 0; i < b->size / 8; i++) w[i] = b->key + i;
  for (size_t i = b->size / 8 * 8; i < b->size; i++) b->p[i] = (unsigned char)(b->key + i);
}
static int intact(const block_t *b) {
  const uint64_t *w = (const uint64_t *)b->p;
  for (size_t i = 0; i < b->size / 8; i++)
    if (w[i] != b->key + i) return 0;
  for (size_t i = b->size / 8 * 8; i < b->size; i++)
    if (b->p[i] != (unsigned char)(b->key + i)) return 0;
  return 1;
}
static void check_and_free(block_t *b, const char *who) {
  CHECK_MSG(intact(b), "%s: block %p of %zu bytes was changed after its thread exited", who, (void *)b->p,
            b->size);
  th_free(b->p);
  b->p = NULL;
}

/* Blocks for main (freed right after the join) and for the next wave (freed by those threads). Both lists
 * are filled by one wave and emptied after that wave was joined. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static block_t g_to_main[WAVE * PER_THREAD], g_to_next[WAVE * PER_THREAD], g_inbox[WAVE * PER_THREAD];
static int g_n_main, g_n_next, g_n_inbox;
static block_t g_ring[RING]; /* one block per thread, freed RING threads later */
static int g_ring_pos;

typedef struct job_s {
  int index; /* 0 .. THREADS-1 */
  pthread_t thread;
} job_t;

static size_t pick_size(uint64_t r, int k, int index) {
  if (k == 0 && index % 25 == 7) return 2 * MiB + (size_t)(r % (4 * MiB)); /* a huge block, now and then */
  switch (k % 3) {
    case 0: return 1 + (size_t)(r % 512);            /* small */
    case 1: return 1024 + (size_t)(r % (31 * KiB));  /* small to medium */
    default: return 40 * KiB + (size_t)(r % (200 * KiB)); /* medium and large */
  }
}

static void *worker(void *arg) {
  job_t *job = arg;
  uint64_t r = check_mix((uint64_t)job->index + 1);
  /* First the blocks of the previous wave, whose threads have exited: check and free them here. */
  for (;;) {
    block_t b = {0};
    pthread_mutex_lock(&g_lock);
    if (g_n_inbox > 0) b = g_inbox[--g_n_inbox];
    pthread_mutex_unlock(&g_lock);
    if (b.p == NULL) break;
    check_and_free(&b, "next wave");
  }
  block_t mine[PER_THREAD];
  for (int k = 0; k < PER_THREAD; k++) {
    r = check_mix(r + (uint64_t)k);
    mine[k].size = pick_size(r, k, job->index);
    mine[k].key = check_mix(r ^ 0x5bd1e995u);
    mine[k].p = th_malloc(mine[k].size);
    if (!CHECK_MSG(mine[k].p != NULL, "malloc(%zu)", mine[k].size)) return NULL;
    fill(&mine[k]);
  }
  /* Blocks 0 and 3 die here; 1 goes to main, 2 and 4 to the next wave, 5 to the ring. */
  check_and_free(&mine[0], "own thread");
  check_and_free(&mine[3], "own thread");
  pthread_mutex_lock(&g_lock);
  g_to_main[g_n_main++] = mine[1];
  g_to_next[g_n_next++] = mine[2];
  g_to_next[g_n_next++] = mine[4];
  block_t old = g_ring[g_ring_pos];
  g_ring[g_ring_pos] = mine[5];
  g_ring_pos = (g_ring_pos + 1) % RING;
  pthread_mutex_unlock(&g_lock);
  /* The ring's oldest block was allocated RING threads ago, by a thread long gone. */
  if (old.p != NULL) check_and_free(&old, "ring");
  return NULL;
}

/* Resident memory in KiB, printed next to the allocator's own count as a cross-check. */
static long rss_kib(void) { return (long)(check_statm_bytes(1) / 1024); }

static size_t committed(void) {
  th_stats_t st;
  th_stats_get(&st);
  return st.committed;
}

int main(void) {
  /* Let the main thread's own heap exist before taking the baseline. */
  void *warm = th_malloc(64);
  th_free(warm);
  th_stats_t st0;
  th_stats_get(&st0);
  size_t live0 = st0.threads_live;
  size_t created0 = st0.heaps_created;
  size_t at_early = 0, at_end = 0;
  long rss_early = 0, rss_end = 0;
  int live_mismatches = 0;
  size_t worst_live = live0;
  job_t jobs[WAVE];

  for (int base = 0; base < THREADS; base += WAVE) {
    int started = 0;
    for (int i = 0; i < WAVE; i++) {
      jobs[i].index = base + i;
      if (!CHECK(pthread_create(&jobs[i].thread, NULL, worker, &jobs[i]) == 0)) break;
      started++;
    }
    for (int i = 0; i < started; i++) pthread_join(jobs[i].thread, NULL);
    /* Every thread of the wave has exited (join waited for its destructors). */
    th_stats_t st;
    th_stats_get(&st);
    if (st.threads_live != live0) {
      live_mismatches++;
      if (st.threads_live > worst_live) worst_live = st.threads_live;
    }
    /* Main frees its share; what is left over from the previous wave's next-wave list (threads that found
     * it empty) stays in the inbox for the coming wave. */
    for (int i = 0; i < g_n_main; i++) check_and_free(&g_to_main[i], "main");
    g_n_main = 0;
    for (int i = 0; i < g_n_next; i++) g_inbox[g_n_inbox++] = g_to_next[i];
    g_n_next = 0;
    int done = base + started;
    if (done == EARLY || done == THREADS) {
      /* Measure with the same live set each time: a full ring, an empty inbox. */
      for (int i = 0; i < g_n_inbox; i++) check_and_free(&g_inbox[i], "main (measurement)");
      g_n_inbox = 0;
      if (done == EARLY) at_early = committed(), rss_early = rss_kib();
      else at_end = committed(), rss_end = rss_kib();
    }
  }
  for (int i = 0; i < g_n_inbox; i++) check_and_free(&g_inbox[i], "main (end)");
  for (int i = 0; i < RING; i++)
    if (g_ring[i].p != NULL) check_and_free(&g_ring[i], "main (ring)");

  th_stats_t st;
  th_stats_get(&st);
  printf("committed after %d threads: %zu KiB, after %d threads: %zu KiB; peak %zu KiB; heaps created %zu, "
         "abandoned %zu, segments adopted %zu; threads_live %zu (start %zu); VmRSS %ld KiB then %ld KiB\n",
         EARLY, at_early >> 10, THREADS, at_end >> 10, st.committed_peak >> 10, st.heaps_created - created0,
         st.heaps_abandoned, st.segments_adopted, st.threads_live, live0, rss_early, rss_end);
  CHECK_MSG(live_mismatches == 0, "threads_live differed from %zu after %d of %d waves (up to %zu)", live0,
            live_mismatches, THREADS / WAVE, worst_live);
  CHECK(st.threads_live == live0);
  CHECK_MSG(at_early > 0, "committed is 0 while blocks are live");
  CHECK_MSG(at_end <= at_early + 16 * MiB, "committed grew from %zu KiB to %zu KiB", at_early >> 10,
            at_end >> 10);
  /* Each thread's heap was given up when the thread exited. */
  CHECK_MSG(st.heaps_abandoned >= THREADS, "heaps abandoned: %zu", st.heaps_abandoned);
  return check_summary();
}
