/* test_late_alloc: allocation after a thread's heap is gone. A pthread key destructor that allocates in
 * every destructor round (re-arming its key each time) runs after threadheap's own thread-exit handler;
 * those late blocks must be valid and freeable by another thread, and the thread must not leave a heap
 * behind: exactly one heap per thread is created, and no thread heap stays live after the joins. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "threadheap.h"

enum { THREADS = 1000, ROUNDS = 8 }; /* more rounds than glibc runs (4): the last allocation is never seen */

static pthread_key_t key;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void *late_blocks[THREADS * ROUNDS];
static size_t late_count;
static size_t late_sizes[] = {24, 700, 5000, 90000, 3 << 20};

typedef struct {
  uint64_t serial;
  int rounds;
} tag_t;

static void fill(unsigned char *p, size_t n, uint64_t key_value) {
  for (size_t i = sizeof(size_t); i < n; i += 61) p[i] = (unsigned char)check_mix(key_value + i);
  memcpy(p, &n, sizeof n);
}

static int intact(const unsigned char *p, uint64_t key_value) {
  size_t n;
  memcpy(&n, p, sizeof n);
  for (size_t i = sizeof(size_t); i < n; i += 61)
    if (p[i] != (unsigned char)check_mix(key_value + i)) return 0;
  return 1;
}

static void destructor(void *v) {
  tag_t *t = v;
  size_t n = late_sizes[(t->serial + (uint64_t)t->rounds) % 5];
  unsigned char *p = th_malloc(n);
  if (p != NULL) {
    fill(p, n, (uint64_t)(uintptr_t)p);
    pthread_mutex_lock(&lock);
    late_blocks[late_count++] = p;
    pthread_mutex_unlock(&lock);
  }
  if (++t->rounds < ROUNDS) pthread_setspecific(key, t);
  else th_free(t);
}

static void *worker(void *arg) {
  tag_t *t = th_malloc(sizeof *t);
  t->serial = (uint64_t)(uintptr_t)arg;
  t->rounds = 0;
  pthread_setspecific(key, t);
  void *p = th_malloc(100); /* the thread's own heap, made before any destructor runs */
  th_free(p);
  return NULL;
}

int main(void) {
  /* Made before any thread allocates, so threadheap's own key (made at the first allocation) may come
   * before or after it; both orders are exercised over the threads since glibc runs keys by index. */
  pthread_key_create(&key, destructor);
  th_stats_t before, after;
  void *warm = th_malloc(1);
  th_free(warm);
  th_stats_get(&before);
  for (long i = 0; i < THREADS; i++) {
    pthread_t t;
    if (!CHECK(pthread_create(&t, NULL, worker, (void *)i) == 0)) break;
    pthread_join(t, NULL);
  }
  th_stats_get(&after);
  CHECK_MSG(after.heaps_created - before.heaps_created <= THREADS + 1,
            "%zu heaps created for %d threads", after.heaps_created - before.heaps_created, THREADS);
  CHECK_MSG(after.threads_live == before.threads_live, "thread heaps live: %zu before, %zu after",
            before.threads_live, after.threads_live);
  CHECK_MSG(late_count >= THREADS, "only %zu late blocks for %d threads", late_count, THREADS);
  size_t bad = 0;
  for (size_t i = 0; i < late_count; i++) {
    if (!intact(late_blocks[i], (uint64_t)(uintptr_t)late_blocks[i])) bad++;
    th_free(late_blocks[i]);
  }
  CHECK_MSG(bad == 0, "%zu of %zu late blocks damaged", bad, late_count);
  return check_summary();
}
