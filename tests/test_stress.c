/* test_stress.c: many threads allocate, verify, reallocate and free blocks of random sizes, and hand
 * blocks to each other through exchange slots so that a large share is freed (or reallocated) by a thread
 * that did not allocate it. Every block carries a pattern derived from (seed, thread, serial); it is
 * verified before each realloc and free, so a block handed out twice, or memory reused while still live,
 * shows up as a wrong byte rather than as luck.
 *
 *   test_stress [--seconds S] [--seed N] [--threads T] [--ops N]
 * The seed makes each thread's sequence of decisions reproducible (the interleaving of threads is not).
 * --ops bounds the operations per thread (used under ThreadSanitizer, which makes each access slow). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "threadheap.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

typedef struct block_s {
  unsigned char *p;
  size_t size;
  uint64_t key; /* from (seed, thread, serial): the pattern the block holds */
  int owner;    /* the thread that allocated (or last reallocated) it */
} block_t;

static uint64_t g_seed = 1;
static double g_seconds = 3;
static long g_max_ops = 0; /* 0: no bound */
static int g_threads = 8;

/* Exchange slots: each holds at most one block; a thread swaps its block for whatever is there. */
#define SLOTS 64
static struct {
  pthread_mutex_t lock;
  block_t b;
} g_slots[SLOTS];

static _Atomic long g_total_ops, g_foreign_frees, g_frees, g_reallocs, g_bad_blocks;
static _Atomic int g_stop;

static uint64_t xorshift(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

/* Words of the pattern: distinct per block (key) and per position, so a shifted copy does not match.
 * A byte past the last whole word is the byte the word would have there (little-endian), so the pattern
 * of a prefix does not depend on the block's length: a shrunk block still matches. */
static unsigned char tail_byte(size_t i, uint64_t key) {
  return (unsigned char)((key ^ ((i / 8) * 0x9e3779b97f4a7c15u)) >> (8 * (i & 7)));
}
static void fill(unsigned char *p, size_t n, uint64_t key) {
  size_t words = n / 8;
  uint64_t *w = (uint64_t *)p;
  for (size_t i = 0; i < words; i++) w[i] = key ^ (i * 0x9e3779b97f4a7c15u);
  for (size_t i = words * 8; i < n; i++) p[i] = tail_byte(i, key);
}
/* Bytes of [0, n) that match; n when the whole prefix is intact. */
static size_t check_pattern(const unsigned char *p, size_t n, uint64_t key) {
  size_t words = n / 8;
  const uint64_t *w = (const uint64_t *)p;
  for (size_t i = 0; i < words; i++)
    if (w[i] != (key ^ (i * 0x9e3779b97f4a7c15u))) return i * 8;
  for (size_t i = words * 8; i < n; i++)
    if (p[i] != tail_byte(i, key)) return i;
  return n;
}

/* Mostly small, some medium, a few huge: 1 B..1 KiB 88%, 1..64 KiB 9%, 64 KiB..1 MiB 2.5%, 1..4 MiB 0.5%. */
static size_t random_size(uint64_t *rng) {
  uint64_t r = xorshift(rng);
  unsigned pick = (unsigned)(r % 1000);
  uint64_t v = r >> 20;
  if (pick < 880) return 1 + (size_t)(v % 1024);
  if (pick < 970) return 1024 + (size_t)(v % (63 * KiB));
  if (pick < 995) return 64 * KiB + (size_t)(v % (960 * KiB));
  return MiB + (size_t)(v % (3 * MiB + 1));
}

static int verify_block(const block_t *b, const char *when) {
  size_t ok = check_pattern(b->p, b->size, b->key);
  if (ok != b->size) {
    g_bad_blocks++;
    CHECK_MSG(ok == b->size, "%s: block %p of %zu bytes (thread %d) wrong from byte %zu", when, (void *)b->p,
              b->size, b->owner, ok);
    return 0;
  }
  return 1;
}

typedef struct worker_s {
  int id;
  pthread_t thread;
  long ops;
} worker_t;

#define LIVE 128

static void *worker(void *arg) {
  worker_t *self = arg;
  uint64_t rng = check_mix(g_seed * 0x100000001b3u + (uint64_t)self->id + 1) | 1;
  uint64_t serial = 0;
  block_t live[LIVE];
  int nlive = 0;
  long ops = 0;

  while (!g_stop && (g_max_ops == 0 || ops < g_max_ops)) {
    unsigned op = (unsigned)(xorshift(&rng) % 100);
    if (nlive < LIVE && (op < 40 || nlive == 0)) {
      /* allocate */
      block_t b;
      b.size = random_size(&rng);
      b.key = check_mix(g_seed ^ ((uint64_t)self->id << 48) ^ ++serial);
      b.owner = self->id;
      b.p = th_malloc(b.size);
      if (!CHECK_MSG(b.p != NULL, "malloc(%zu)", b.size)) break;
      fill(b.p, b.size, b.key);
      live[nlive++] = b;
    } else if (op < 65) {
      /* verify and free a random block */
      int i = (int)(xorshift(&rng) % (uint64_t)nlive);
      verify_block(&live[i], "before free");
      if (live[i].owner != self->id) g_foreign_frees++;
      g_frees++;
      th_free(live[i].p);
      live[i] = live[--nlive];
    } else if (op < 75) {
      /* realloc a random block: the common prefix survives, then the whole block gets a new pattern */
      int i = (int)(xorshift(&rng) % (uint64_t)nlive);
      block_t *b = &live[i];
      verify_block(b, "before realloc");
      size_t n = (xorshift(&rng) & 1) ? random_size(&rng) : b->size + (b->size >> 1) + 1;
      unsigned char *q = th_realloc(b->p, n);
      if (!CHECK_MSG(q != NULL, "realloc(%zu -> %zu)", b->size, n)) break;
      block_t old = *b;
      b->p = q;
      b->size = old.size < n ? old.size : n;
      verify_block(b, "after realloc");
      b->size = n;
      b->key = check_mix(g_seed ^ ((uint64_t)self->id << 48) ^ ++serial);
      b->owner = self->id;
      fill(b->p, n, b->key);
      g_reallocs++;
    } else {
      /* swap a block with an exchange slot: the block we get was (most likely) allocated elsewhere */
      int i = (int)(xorshift(&rng) % (uint64_t)nlive);
      int s = (int)(xorshift(&rng) % SLOTS);
      pthread_mutex_lock(&g_slots[s].lock);
      block_t theirs = g_slots[s].b;
      g_slots[s].b = live[i];
      pthread_mutex_unlock(&g_slots[s].lock);
      if (theirs.p != NULL) {
        verify_block(&theirs, "after exchange");
        live[i] = theirs;
      } else {
        live[i] = live[--nlive];
      }
    }
    ops++;
  }
  for (int i = 0; i < nlive; i++) {
    verify_block(&live[i], "at exit");
    if (live[i].owner != self->id) g_foreign_frees++;
    g_frees++;
    th_free(live[i].p);
  }
  self->ops = ops;
  g_total_ops += ops;
  return NULL;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (i + 1 < argc && strcmp(argv[i], "--seconds") == 0) g_seconds = atof(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--seed") == 0) g_seed = strtoull(argv[++i], NULL, 0);
    else if (i + 1 < argc && strcmp(argv[i], "--threads") == 0) g_threads = atoi(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--ops") == 0) g_max_ops = atol(argv[++i]);
    else {
      fprintf(stderr, "usage: %s [--seconds S] [--seed N] [--threads T] [--ops N]\n", argv[0]);
      return 2;
    }
  }
  if (g_threads < 1 || g_threads > 256) g_threads = 8;
  printf("seed %llu, %d threads, %.1f s\n", (unsigned long long)g_seed, g_threads, g_seconds);
  for (int s = 0; s < SLOTS; s++) pthread_mutex_init(&g_slots[s].lock, NULL);

  worker_t *w = calloc((size_t)g_threads, sizeof *w);
  if (!w) return 2;
  double t0 = now_s();
  int started = 0;
  for (int i = 0; i < g_threads; i++) {
    w[i].id = i + 1;
    if (CHECK(pthread_create(&w[i].thread, NULL, worker, &w[i]) == 0)) started++;
  }
  /* The main thread only watches the clock: a worker that finishes its --ops early just stops. */
  while (now_s() - t0 < g_seconds) {
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    if (g_max_ops && g_total_ops >= (long)started * g_max_ops) break;
  }
  g_stop = 1;
  for (int i = 0; i < started; i++) pthread_join(w[i].thread, NULL);
  double elapsed = now_s() - t0;

  /* Blocks left in the slots came from threads that have exited; the main thread frees them. */
  for (int s = 0; s < SLOTS; s++) {
    if (g_slots[s].b.p != NULL) {
      verify_block(&g_slots[s].b, "left in a slot");
      g_foreign_frees++;
      g_frees++;
      th_free(g_slots[s].b.p);
      g_slots[s].b.p = NULL;
    }
  }
  long ops = g_total_ops;
  printf("%ld operations in %.2f s: %.0f ops/s; %ld frees, %ld (%.0f%%) by a thread that did not allocate "
         "the block; %ld reallocs\n",
         ops, elapsed, (double)ops / elapsed, (long)g_frees, (long)g_foreign_frees,
         g_frees ? 100.0 * (double)g_foreign_frees / (double)g_frees : 0.0, (long)g_reallocs);
  CHECK_MSG(g_bad_blocks == 0, "%ld blocks had wrong contents", (long)g_bad_blocks);
  /* The run must have done real work, and handed a real share of blocks across threads. */
  CHECK(ops >= (long)started * 100);
  CHECK_MSG(g_foreign_frees * 10 >= g_frees, "only %ld of %ld frees were remote", (long)g_foreign_frees,
            (long)g_frees);
  free(w);
  return check_summary();
}
