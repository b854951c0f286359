/* test_exit_reuse.c: what an exiting thread freed last serves the thread that replaces it without page faults.
 *
 * Thread A carves about 2 MiB of 1000-byte blocks, writes them, frees all but one (so its segment stays with
 * its pages' slots rather than going to the cache whole) and exits. Thread B then allocates the same blocks
 * and writes them. B adopts A's segment before mapping one of its own; the slots A freed in the last eighth
 * of the purge delay are still committed, so B's writes take (almost) no page faults, where purging them at A's exit cost
 * one fault per 4 KiB. B checks what it wrote, and the one block A left is freed by main, contents checked. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "check.h"
#include "threadheap.h"

enum { BLOCKS = 2000, SIZE = 1000 };
static void *kept;
static long b_faults = -1;
static int b_bad;

static long thread_faults(void) {
  struct rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_minflt;
}

static void *thread_a(void *arg) {
  (void)arg;
  static void *p[BLOCKS];
  for (int i = 0; i < BLOCKS; i++) {
    p[i] = th_malloc(SIZE);
    if (p[i]) memset(p[i], 0xa0 + i % 16, SIZE);
  }
  kept = p[BLOCKS / 2];
  for (int i = 0; i < BLOCKS; i++)
    if (i != BLOCKS / 2) th_free(p[i]);
  return NULL;
}

static void *thread_b(void *arg) {
  (void)arg;
  static unsigned char *p[BLOCKS];
  long before = thread_faults();
  for (int i = 0; i < BLOCKS; i++) {
    p[i] = th_malloc(SIZE);
    if (p[i]) memset(p[i], i % 251, SIZE);
  }
  b_faults = thread_faults() - before;
  for (int i = 0; i < BLOCKS; i++) {
    b_bad += p[i] == NULL || p[i][0] != i % 251 || p[i][SIZE - 1] != i % 251;
    th_free(p[i]);
  }
  return NULL;
}

int main(void) {
  pthread_t t;
  th_free(th_malloc(16)); /* the main thread's own heap exists before A's */
  if (!CHECK(pthread_create(&t, NULL, thread_a, NULL) == 0)) return check_summary();
  pthread_join(t, NULL);
  if (!CHECK(pthread_create(&t, NULL, thread_b, NULL) == 0)) return check_summary();
  pthread_join(t, NULL);
  long pages = (long)BLOCKS * SIZE / 4096;
  CHECK_MSG(b_bad == 0, "%d of %d blocks read back wrong", b_bad, BLOCKS);
  CHECK_MSG(b_faults >= 0 && b_faults < pages / 4,
            "the next thread took %ld page faults for %ld pages the exited thread had just freed", b_faults, pages);
  unsigned char *k = kept;
  CHECK(k != NULL && k[0] == 0xa0 + (BLOCKS / 2) % 16 && k[SIZE - 1] == k[0]);
  th_free(kept);
  printf("next thread: %ld page faults for %ld pages\n", b_faults, pages);
  return check_summary();
}
