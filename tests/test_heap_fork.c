/* test_heap_fork: fork while three threads allocate from one serialized explicit heap (every shard busy).
 * Each child allocates from that heap (blocks of many sizes and a huge one, contents checked), makes and
 * destroys a heap of its own, and exits 0; a deadlock fails by the child's alarm. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "threadheap.h"

enum { FORKS = 100, THREADS = 3 };

static th_heap_t *heap;
static volatile int stop;

static void *worker(void *arg) {
  unsigned key = (unsigned)(uintptr_t)arg;
  size_t bad = 0;
  for (size_t i = 0; !stop; i++) {
    size_t n = 16 + check_mix(key + i) % 6000;
    void *p = th_heap_malloc(heap, n);
    check_fill(p, n, key);
    void *q = (i % 64 == 0) ? th_heap_malloc(heap, (size_t)3 << 20) : NULL;
    if (check_verify(p, n, key) != n) bad++;
    th_free(p);
    th_free(q);
  }
  return (void *)bad;
}

static int child(void) {
  alarm(20);
  for (size_t k = 1; k < 600; k++) {
    size_t n = k * 29; /* 29 B .. 17 KiB */
    unsigned char *p = th_heap_malloc(heap, n);
    if (p == NULL) return 2;
    check_fill(p, n, (unsigned)k);
    if (check_verify(p, n, (unsigned)k) != n) return 3;
    th_free(p);
  }
  void *big = th_heap_malloc(heap, (size_t)5 << 20);
  if (big == NULL) return 4;
  th_free(big);
  th_heap_t *own = th_heap_create(0, 0, 0);
  void *b = th_heap_malloc(own, 100);
  if (b == NULL) return 5;
  th_heap_destroy(own);
  return 0;
}

int main(void) {
  heap = th_heap_create(0, 0, 0);
  if (!CHECK(heap != NULL)) return check_summary();
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1)) == 0);
  int failed = 0;
  for (int i = 0; i < FORKS; i++) {
    pid_t pid = fork();
    if (pid == 0) _exit(child());
    int status = 0;
    if (!CHECK(pid > 0 && waitpid(pid, &status, 0) == pid)) break;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
  }
  stop = 1;
  size_t bad = 0;
  for (int i = 0; i < THREADS; i++) {
    void *r;
    pthread_join(t[i], &r);
    bad += (size_t)r;
  }
  CHECK_MSG(failed == 0, "%d of %d children failed or hung", failed, FORKS);
  CHECK_MSG(bad == 0, "%zu damaged blocks in the parent's threads", bad);
  th_heap_destroy(heap);
  return check_summary();
}
