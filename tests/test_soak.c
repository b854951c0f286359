/* test_soak.c: a long run of everything at once, to see that memory stays bounded and contents intact. Not a
 * benchmark.
 *
 * Worker threads exchange blocks of 16 B to 16 MiB through shared slots: each puts a new block into a random
 * slot and takes out the block another thread left there, checks its stamp (written at its start, end and
 * every 4 KiB) and frees it. Workers exit after a few thousand exchanges and are replaced (thread churn);
 * now and then a worker makes an explicit heap, fills and half-frees it, and destroys it. The main thread
 * forks once a second; the child checks a few slots' blocks, allocates and exits. Once a second the main
 * thread samples threadheap's committed bytes; at the end the mean of the last quarter must be at most 1.2x
 * the mean of the second quarter (the first quarter is the warm-up), in runs of a minute or more.
 *
 * usage: test_soak [--seconds N] [--threads N]   (default 600 s, 6 threads) */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "threadheap.h"

#define SLOTS 2048
#define STAMP_STEP 4096

typedef struct block_head_s {
  uint64_t stamp; /* also written at the end and every STAMP_STEP bytes */
  size_t size;
} block_head_t;

static void *_Atomic slots[SLOTS];
static atomic_int stop;
static atomic_long exchanges, bad_blocks, heaps_made, threads_made;

static uint64_t next_rand(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

/* 95% of blocks 16 B-64 KiB, 5% 64 KiB-16 MiB, log-uniform within each. */
static size_t pick_size(uint64_t *s) {
  uint64_t r = next_rand(s);
  unsigned lo = (r % 100) < 95 ? 4 : 16, hi = (r % 100) < 95 ? 16 : 24;
  unsigned bits = lo + (unsigned)((r >> 8) % (hi - lo));
  size_t size = ((size_t)1 << bits) + (size_t)((r >> 16) % ((size_t)1 << bits));
  return size < sizeof(block_head_t) + 8 ? sizeof(block_head_t) + 8 : size;
}

static void stamp(uint8_t *p, size_t size, uint64_t value) {
  block_head_t h = {value, size};
  memcpy(p, &h, sizeof h);
  for (size_t off = STAMP_STEP; off + 16 <= size; off += STAMP_STEP) memcpy(p + off, &value, 8); /* clear of the end */
  memcpy(p + size - 8, &value, 8);
}

static bool intact(const uint8_t *p) {
  block_head_t h;
  memcpy(&h, p, sizeof h);
  uint64_t v;
  for (size_t off = STAMP_STEP; off + 16 <= h.size; off += STAMP_STEP) {
    memcpy(&v, p + off, 8);
    if (v != h.stamp) return false;
  }
  memcpy(&v, p + h.size - 8, 8);
  return v == h.stamp && h.size <= th_usable_size(p);
}

static void explicit_round(uint64_t *s) {
  th_heap_t *h = th_heap_create((next_rand(s) & 1) ? TH_HEAP_NO_SERIALIZE : 0, 0, 0);
  if (h == NULL) return;
  enum { N = 256 };
  uint8_t *b[N];
  for (int i = 0; i < N; i++) {
    size_t n = sizeof(block_head_t) + 8 + next_rand(s) % 20000; /* room for the head and the end stamp */
    b[i] = th_heap_malloc(h, n);
    if (b[i]) stamp(b[i], n, (uint64_t)(uintptr_t)b[i] ^ 0x5eed);
  }
  for (int i = 0; i < N; i += 2)
    if (b[i]) {
      if (!intact(b[i])) atomic_fetch_add(&bad_blocks, 1);
      th_free(b[i]);
    }
  th_heap_destroy(h); /* the other half goes with the heap */
  atomic_fetch_add(&heaps_made, 1);
}

static void *worker(void *arg) {
  uint64_t s = (uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ull | 1;
  int rounds = 2000 + (int)(next_rand(&s) % 4000);
  for (int i = 0; i < rounds && !atomic_load(&stop); i++) {
    size_t n = pick_size(&s);
    uint8_t *p = malloc(n);
    if (p == NULL) {
      atomic_fetch_add(&bad_blocks, 1);
      continue;
    }
    stamp(p, n, next_rand(&s));
    uint8_t *old = atomic_exchange(&slots[next_rand(&s) % SLOTS], p);
    if (old) {
      if (!intact(old)) atomic_fetch_add(&bad_blocks, 1);
      free(old);
    }
    atomic_fetch_add(&exchanges, 1);
    if (next_rand(&s) % 2000 == 0) explicit_round(&s);
  }
  return NULL;
}

static size_t committed_now(void) {
  th_stats_t st;
  th_stats_get(&st);
  return st.committed;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  double seconds = 600;
  int nthreads = 6;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--seconds") == 0) seconds = atof(argv[i + 1]);
    else if (strcmp(argv[i], "--threads") == 0) nthreads = atoi(argv[i + 1]);
  }
  if (nthreads < 1 || nthreads > 64 || seconds < 2) {
    fprintf(stderr, "usage: test_soak [--seconds N>=2] [--threads 1..64]\n");
    return 2;
  }
  pthread_t t[64];
  bool running[64] = {false};
  uintptr_t seed = 1;
  size_t samples[4096];
  int nsamples = 0, forks = 0, forks_bad = 0;
  double start = now_s(), next_sample = start + 1;
  while (now_s() - start < seconds) {
    for (int i = 0; i < nthreads; i++) { /* replace the workers that finished (thread churn) */
      if (running[i] && pthread_tryjoin_np(t[i], NULL) == 0) running[i] = false;
      if (!running[i] && pthread_create(&t[i], NULL, worker, (void *)seed++) == 0) {
        running[i] = true;
        atomic_fetch_add(&threads_made, 1);
      }
    }
    if (now_s() >= next_sample) {
      next_sample += 1;
      if (nsamples < 4096) samples[nsamples++] = committed_now();
      pid_t pid = fork();
      if (pid == 0) { /* the child checks what it can see and allocates */
        int bad = 0;
        for (int i = 0; i < 64; i++) {
          uint8_t *p = atomic_load(&slots[i * 31 % SLOTS]);
          if (p && !intact(p)) bad++;
        }
        void *q = malloc(3u << 20), *r = malloc(100);
        _exit(bad == 0 && q && r ? 0 : 1);
      }
      int status = 0;
      forks++;
      if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        forks_bad++;
    }
    usleep(20000);
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < nthreads; i++)
    if (running[i]) pthread_join(t[i], NULL);
  for (int i = 0; i < SLOTS; i++) {
    uint8_t *p = atomic_exchange(&slots[i], NULL);
    if (p && !intact(p)) atomic_fetch_add(&bad_blocks, 1);
    free(p);
  }
  double q2 = 0, q4 = 0;
  int quarter = nsamples / 4;
  for (int i = quarter; i < 2 * quarter; i++) q2 += (double)samples[i];
  for (int i = nsamples - quarter; i < nsamples; i++) q4 += (double)samples[i];
  if (quarter > 0) q2 /= quarter, q4 /= quarter;
  printf("%.0f s, %d threads at a time: %ld exchanges, %ld threads, %ld explicit heaps, %d forks; committed "
         "mean %.1f MiB in the second quarter, %.1f MiB in the last (ratio %.3f)\n",
         now_s() - start, nthreads, atomic_load(&exchanges), atomic_load(&threads_made), atomic_load(&heaps_made),
         forks, q2 / 1048576, q4 / 1048576, q2 > 0 ? q4 / q2 : 0);
  CHECK_MSG(atomic_load(&bad_blocks) == 0, "%ld blocks lost their contents", atomic_load(&bad_blocks));
  CHECK_MSG(forks_bad == 0, "%d of %d forks failed", forks_bad, forks);
  /* The slots take a minute or so to fill with their share of large blocks: a shorter run (the smoke run of
   * `make test`) checks contents and forks, not the bound. */
  if (seconds >= 60)
    CHECK_MSG(quarter > 0 && q4 <= 1.2 * q2, "committed grew: %.1f MiB in the last quarter, %.1f in the second",
              q4 / 1048576, q2 / 1048576);
  return check_summary();
}
