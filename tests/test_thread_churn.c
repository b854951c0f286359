/* test_thread_churn.c: create-and-join, one thread at a time, many times over (100,000 by default). Each
 * thread allocates one block, fills it and returns it; the joiner checks the contents and frees it, after
 * the thread that allocated it has exited. Every thread gets a heap, abandons it at exit, and the next one
 * adopts what is left, so memory must not grow with the number of threads.
 *
 * Asserts: every block holds its pattern; threadheap's committed bytes (th_stats_get) grow by at most one
 * byte per thread between thread 1,000 and the last (at most 99,000 bytes over 100,000 threads); and no
 * thread heap is left live at the end. Prints the time taken and the committed bytes at both points.
 * Usage: test_thread_churn [--threads N]  (N >= 2,000) */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "threadheap.h"

#define BASELINE_AT 1000

/* Sizes cycle through small and medium classes, and one thread in 97 takes a large block. */
static size_t size_of(uint64_t i) { return i % 97 == 0 ? 200000 + i % 5000 : 16 + (i * 131) % 3000; }

static void *thread_main(void *arg) {
  uint64_t i = (uint64_t)(uintptr_t)arg;
  size_t n = size_of(i);
  uint64_t *p = th_malloc(n);
  if (p == NULL) return NULL;
  for (size_t w = 0; w < n / 8; w++) p[w] = check_mix(i * 4096 + w);
  return p;
}

static int intact(const uint64_t *p, uint64_t i) {
  size_t n = size_of(i);
  for (size_t w = 0; w < n / 8; w++)
    if (p[w] != check_mix(i * 4096 + w)) return 0;
  return 1;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  long threads = 100000;
  if (argc == 3 && strcmp(argv[1], "--threads") == 0) threads = atol(argv[2]);
  else if (argc != 1) {
    fprintf(stderr, "usage: test_thread_churn [--threads N]\n");
    return 2;
  }
  if (threads < 2 * BASELINE_AT) {
    fprintf(stderr, "--threads must be at least %d\n", 2 * BASELINE_AT);
    return 2;
  }
  th_stats_t st0, st;
  void *warm = th_malloc(16); /* the main thread's heap exists before the count starts */
  th_free(warm);
  th_stats_get(&st0);
  double t0 = now_s();
  size_t at_baseline = 0;
  long damaged = 0, failed = 0;
  for (long i = 1; i <= threads; i++) {
    pthread_t t;
    if (pthread_create(&t, NULL, thread_main, (void *)(uintptr_t)i) != 0) {
      failed++;
      continue;
    }
    void *block = NULL;
    pthread_join(t, &block);
    if (block == NULL) {
      failed++;
      continue;
    }
    if (!intact(block, (uint64_t)i)) damaged++;
    th_free(block);
    if (i == BASELINE_AT) {
      th_stats_get(&st);
      at_baseline = st.committed;
    }
  }
  double secs = now_s() - t0;
  th_stats_get(&st);
  long growth = (long)st.committed - (long)at_baseline;
  long allowed = threads - BASELINE_AT;
  printf("%ld threads in %.1f s; committed %zu bytes after thread %d, %zu after thread %ld (growth %ld, "
         "allowed %ld); heaps created %zu, segments adopted %zu, threads_live %zu (start %zu)\n",
         threads, secs, at_baseline, BASELINE_AT, st.committed, threads, growth, allowed,
         st.heaps_created - st0.heaps_created, st.segments_adopted - st0.segments_adopted, st.threads_live,
         st0.threads_live);
  CHECK_MSG(failed == 0, "%ld threads could not start or allocate", failed);
  CHECK_MSG(damaged == 0, "%ld blocks damaged", damaged);
  CHECK_MSG(growth <= allowed, "committed grew by %ld bytes over %ld threads", growth, allowed);
  CHECK(st.threads_live == st0.threads_live);
  return check_summary();
}
