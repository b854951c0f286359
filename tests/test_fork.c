/* test_fork.c: fork while other threads allocate. Three threads allocate, fill, verify and free blocks of
 * every size range without pause, while the main thread forks 120 times. Each child allocates and frees
 * blocks of every range (small, medium, large, huge), frees blocks the parent allocated before the fork,
 * starts a thread that allocates, and exits 0; the parent checks every child's exit status, and a child that
 * hangs is killed by its alarm and counted as failed.
 *
 * The program registers its own fork handlers from .preinit_array, that is before any shared library's
 * constructor, and so before threadheap's first use and its own handlers: the program's prepare handler
 * therefore runs after threadheap's (while threadheap holds its locks), and its child handler before
 * threadheap's. Both allocate and free blocks of every range, the huge ones included, which take the locks. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define WORKERS 3
#ifndef FORKS
#define FORKS 120
#endif
#define RING 64

static const size_t range_sizes[] = {24, 300, 4000, 20000, 60000, 300000, 1u << 20, (2u << 20) + 100};
#define NSIZES (sizeof range_sizes / sizeof range_sizes[0])

/* One byte in 64 and the last byte: enough to see a block overwritten by another, cheap for huge ones. */
static void fill(unsigned char *p, size_t n, uint64_t key) {
  for (size_t i = 0; i + 1 < n; i += 64) p[i] = (unsigned char)check_mix(key + i);
  p[n - 1] = (unsigned char)key;
}
static int intact(const unsigned char *p, size_t n, uint64_t key) {
  for (size_t i = 0; i + 1 < n; i += 64)
    if (p[i] != (unsigned char)check_mix(key + i)) return 0;
  return p[n - 1] == (unsigned char)key;
}

/* Allocates, fills, verifies and frees one block of every range; returns the number of failures. */
static int churn_all_ranges(uint64_t key) {
  int bad = 0;
  unsigned char *held[NSIZES];
  for (size_t i = 0; i < NSIZES; i++) {
    held[i] = malloc(range_sizes[i]);
    if (held[i] == NULL) bad++;
    else fill(held[i], range_sizes[i], key + i);
  }
  for (size_t i = 0; i < NSIZES; i++) {
    if (held[i] && !intact(held[i], range_sizes[i], key + i)) bad++;
    free(held[i]);
  }
  unsigned char *big = calloc(1, 9u << 20); /* huge, zeroed */
  if (big == NULL || big[12345] != 0) bad++;
  free(big);
  return bad;
}

/* ---- the program's fork handlers, registered before anything else runs */

static volatile int prepare_bad, child_bad, child_handler_ran;

static void program_prepare(void) { prepare_bad += churn_all_ranges(0x1000); }
static void program_parent(void) {}
static void program_child(void) {
  child_bad = churn_all_ranges(0x2000);
  child_handler_ran = 1;
}

static void register_early(int argc, char **argv, char **envp) {
  (void)argc, (void)argv, (void)envp;
  pthread_atfork(program_prepare, program_parent, program_child);
}
__attribute__((section(".preinit_array"), used)) static void (*preinit_entry)(int, char **, char **) =
    register_early;

/* ---- workers */

static _Atomic int stop;
static _Atomic long worker_failures; /* damaged blocks */
static _Atomic long worker_nulls;    /* malloc returned NULL */
static _Atomic long worker_ops;

static void *worker(void *arg) {
  uint64_t seed = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15u;
  unsigned char *ring[RING] = {0};
  size_t sizes[RING] = {0};
  uint64_t keys[RING] = {0};
  long ops = 0;
  while (!stop) {
    seed = check_mix(seed + 1);
    size_t slot = seed % RING;
    if (ring[slot]) {
      if (!intact(ring[slot], sizes[slot], keys[slot])) worker_failures++;
      free(ring[slot]);
    }
    /* Mostly small and medium; one in 64 large, one in 512 huge. */
    size_t n = (seed >> 20) % 512 == 0 ? (3u << 20) + (seed >> 40) % 4096
             : (seed >> 20) % 64 == 0  ? 100000 + (seed >> 30) % 900000
                                       : 1 + (seed >> 30) % 40000;
    ring[slot] = malloc(n);
    if (ring[slot] == NULL) {
      worker_nulls++;
      continue;
    }
    sizes[slot] = n;
    keys[slot] = seed;
    fill(ring[slot], n, seed);
    ops++;
  }
  for (size_t i = 0; i < RING; i++) {
    if (ring[i] && !intact(ring[i], sizes[i], keys[i])) worker_failures++;
    free(ring[i]);
  }
  worker_ops += ops;
  return NULL;
}

/* ---- the child */

static void *child_thread(void *arg) {
  return (void *)(uintptr_t)churn_all_ranges((uint64_t)(uintptr_t)arg);
}

static int child_main(unsigned char **inherited, int round) {
  alarm(20); /* a deadlock ends the child with SIGALRM, which the parent reports */
  if (!child_handler_ran) return 3;
  if (child_bad) return 4;
  /* Blocks the parent allocated before the fork are intact here, and this process may free them. */
  for (size_t i = 0; i < NSIZES; i++) {
    if (!intact(inherited[i], range_sizes[i], 0x3000 + i)) return 5;
    free(inherited[i]);
  }
  if (churn_all_ranges(0x4000 + (uint64_t)round)) return 6;
  pthread_t t;
  void *res = (void *)1;
  if (pthread_create(&t, NULL, child_thread, (void *)(uintptr_t)round) != 0) return 7;
  pthread_join(t, &res);
  if (res != NULL) return 8;
  return 0;
}

int main(void) {
  unsigned char *inherited[NSIZES];
  for (size_t i = 0; i < NSIZES; i++) {
    inherited[i] = malloc(range_sizes[i]);
    if (inherited[i]) fill(inherited[i], range_sizes[i], 0x3000 + i);
  }
  pthread_t t[WORKERS];
  for (uintptr_t i = 0; i < WORKERS; i++) CHECK(pthread_create(&t[i], NULL, worker, (void *)(i + 1)) == 0);

  int ok_children = 0;
  for (int round = 0; round < FORKS; round++) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      int rc = child_main(inherited, round);
      if (round % 2) exit(rc); /* half through exit: atexit handlers and library destructors run too */
      _exit(rc);
    }
    if (!CHECK_MSG(pid > 0, "fork: %s", strerror(errno))) break;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: %s %d", round,
                  WIFEXITED(status) ? "exit status" : "signal",
                  WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status)))
      ok_children++;
  }
  stop = 1;
  for (int i = 0; i < WORKERS; i++) pthread_join(t[i], NULL);
  for (size_t i = 0; i < NSIZES; i++) {
    CHECK(intact(inherited[i], range_sizes[i], 0x3000 + i));
    free(inherited[i]);
  }
  printf("%d of %d children exited 0; workers did %ld allocations meanwhile\n", ok_children, FORKS,
         (long)worker_ops);
  CHECK_MSG(worker_failures == 0, "%ld damaged blocks", (long)worker_failures);
  CHECK_MSG(worker_nulls == 0, "%ld failed mallocs", (long)worker_nulls);
  CHECK(prepare_bad == 0);
  CHECK(worker_ops > 0);
  return check_summary();
}
