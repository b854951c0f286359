/* prog_top: workloads for the tests of `threadheap top` (python/tests/test_top.py); not a benchmark.
 *
 *   prog_top contention THREADS SECONDS  THREADS threads malloc 64 blocks of 32 KiB, then free them, in a
 *                                        loop. 64 blocks of one size overflow glibc's per-thread cache (7 per
 *                                        size), so most of them take the arena's lock, and blocks that large
 *                                        grow and trim the heap (brk) with the lock held. With MALLOC_ARENA_MAX=1
 *                                        every thread shares that one lock and waits for it in futex (voluntary
 *                                        switches); 16 threads keep doing so on two busy cores, where smaller
 *                                        blocks or fewer threads went from thousands of waits a second to none
 *                                        depending on what else ran. Without MALLOC_ARENA_MAX each thread gets
 *                                        an arena of its own and the waits disappear.
 *   prog_top refault MIB SECONDS         malloc a block of MIB MiB, write one byte per page, free it, in a loop.
 *                                        glibc maps blocks that large and unmaps them at free, so every
 *                                        iteration faults every page in afresh while RSS stays flat.
 *   prog_top handoff 2 SECONDS           a thread named "producer" mallocs 64-byte blocks and hands them over
 *                                        a ring to one named "consumer", which frees them: with threadheap,
 *                                        every free is a remote free of the same pair of threads.
 *   prog_top steady MIB SECONDS          hold MIB MiB in 32 KiB blocks (written), then only malloc and free four
 *                                        64-byte blocks in turn: a server between bursts, every call on
 *                                        threadheap's fast paths.
 *
 * Threads are named "worker-N" (pthread_setname_np), so the tests can find them in /proc/PID/task. Each
 * mode exits by itself after SECONDS; the tests also kill it when they are done. The tests compile this file
 * with gcc into a temporary folder; CMake does not build it.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double deadline;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *volatile sink;

static void *contend(void *arg) {
  char name[16];
  snprintf(name, sizeof name, "worker-%d", (int)(long)arg);
  pthread_setname_np(pthread_self(), name);
  void *blocks[64];
  while (now() < deadline) {
    for (int i = 0; i < 64; i++) {
      blocks[i] = malloc(32768);
      sink = blocks[i];
    }
    for (int i = 0; i < 64; i++) free(blocks[i]);
  }
  return NULL;
}

/* The handoff ring: one writer (producer), one reader (consumer); a slot is NULL when empty. */
#define RING 256
static void *_Atomic ring[RING];

static void *produce(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "producer");
  for (unsigned i = 0; now() < deadline; i++) {
    void *p = malloc(64);
    if (p == NULL) exit(1);
    while (__atomic_load_n(&ring[i % RING], __ATOMIC_ACQUIRE) != NULL)
      if (now() >= deadline) return NULL;
    __atomic_store_n(&ring[i % RING], p, __ATOMIC_RELEASE);
  }
  return NULL;
}

static void *consume(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "consumer");
  for (unsigned i = 0; now() < deadline; i++) {
    void *p;
    while ((p = __atomic_load_n(&ring[i % RING], __ATOMIC_ACQUIRE)) == NULL)
      if (now() >= deadline) return NULL;
    __atomic_store_n(&ring[i % RING], NULL, __ATOMIC_RELEASE);
    free(p);
  }
  return NULL;
}

static void refault(size_t bytes) {
  long page = sysconf(_SC_PAGESIZE);
  while (now() < deadline) {
    char *p = malloc(bytes);
    if (p == NULL) {
      fprintf(stderr, "prog_top: malloc(%zu) failed\n", bytes);
      exit(1);
    }
    for (size_t i = 0; i < bytes; i += (size_t)page) p[i] = 1;
    sink = p;
    free(p);
  }
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: prog_top contention THREADS SECONDS | refault MIB SECONDS | handoff 2 SECONDS | "
                    "steady MIB SECONDS\n");
    return 2;
  }
  long n = atol(argv[2]);
  deadline = now() + atof(argv[3]);
  if (!strcmp(argv[1], "contention") && n >= 1 && n <= 64) {
    pthread_t tid[64];
    for (long t = 0; t < n; t++)
      if (pthread_create(&tid[t], NULL, contend, (void *)t) != 0) {
        fprintf(stderr, "prog_top: pthread_create failed\n");
        return 1;
      }
    for (long t = 0; t < n; t++) pthread_join(tid[t], NULL);
    return 0;
  }
  if (!strcmp(argv[1], "refault") && n >= 1) {
    refault((size_t)n << 20);
    return 0;
  }
  if (!strcmp(argv[1], "steady") && n >= 1) {
    size_t count = ((size_t)n << 20) / 32768;
    void **held = malloc(count * sizeof *held);
    for (size_t i = 0; held && i < count; i++) {
      held[i] = malloc(32768);
      if (held[i]) memset(held[i], 1, 32768);
    }
    void *ring[4] = {0};
    for (unsigned long i = 0; now() < deadline; i++) {
      for (int k = 0; k < 100000; k++, i++) {
        free(ring[i & 3]);
        ring[i & 3] = malloc(64);
      }
    }
    return 0;
  }
  if (!strcmp(argv[1], "handoff") && n == 2) {
    pthread_t a, b;
    if (pthread_create(&a, NULL, produce, NULL) != 0 || pthread_create(&b, NULL, consume, NULL) != 0) {
      fprintf(stderr, "prog_top: pthread_create failed\n");
      return 1;
    }
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    return 0;
  }
  fprintf(stderr, "prog_top: bad arguments\n");
  return 2;
}
