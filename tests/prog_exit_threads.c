/* prog_exit_threads.c: exits while worker threads are still allocating. Not linked to threadheap: run it
 * with LD_PRELOAD and THREADHEAP_SHOW_STATS=1 (test_stats_exit.sh does). main calls exit() only once every
 * worker has made 20,000 malloc/free rounds, and the workers never stop, so the library's exit-time
 * statistics run while they allocate; they must neither crash nor hang, and the process exits 0.
 * It prints nothing itself. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define WORKERS 4
#define ROUNDS_BEFORE_EXIT 20000

static atomic_int ready;

static void *work(void *arg) {
  uint64_t x = (uintptr_t)arg * 0x9E3779B97F4A7C15u + 1;
  void *keep[64] = {0};
  for (long round = 0;; round++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    size_t i = x % 64, n = 1 + (x >> 20) % 20000;
    free(keep[i]);
    keep[i] = malloc(n);
    if (keep[i] == NULL) abort();
    memset(keep[i], 1, n < 64 ? n : 64);
    if (round == ROUNDS_BEFORE_EXIT) atomic_fetch_add(&ready, 1);
  }
  return NULL;
}

int main(void) {
  pthread_t t;
  for (uintptr_t i = 0; i < WORKERS; i++)
    if (pthread_create(&t, NULL, work, (void *)i) != 0) return 2;
  while (atomic_load(&ready) < WORKERS) sched_yield();
  exit(0);
}
