/* test_fork_reuse.c: a forked child's thread that gets the thread pointer of a parent thread. The child has
 * one thread, the one that forked; glibc keeps the other threads' stacks for the child's next threads, with
 * their thread structs in place, so the first thread the child starts has the thread pointer a parent thread
 * had, and that thread's segments still name it as their owner. Its frees into them then take the owner's
 * path, into a heap no live thread has, while the forking thread sweeps that heap as idle.
 *
 * The parent's thread X allocates blocks of four ranges (enough to park small pages as full), writes them and
 * waits; the main thread forks. In the child, thread Y (checked to have X's thread pointer: exit 77, skipped,
 * if this libc does not hand it out) checks X's blocks, frees half, allocates as many of its own, frees the
 * rest, and hands its own to the main thread, which meanwhile allocates, writes and frees in the same ranges
 * (its purge rounds sweep X's idle heap). Then the main thread checks Y's blocks and frees them, and a third
 * thread allocates and frees. The parent checks X's blocks after the child exits: the child's frees must not
 * reach them. Run with a short purge delay, so that the sweeps happen, and in secure mode. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static const size_t sizes[] = {48, 3000, 20000, 200000};
static const size_t counts[] = {8000, 400, 120, 10};
#define RANGES (sizeof sizes / sizeof sizes[0])
#define MAX_COUNT 8000

static unsigned char *x_blocks[RANGES][MAX_COUNT]; /* X's, inherited by the child */
static unsigned char *y_blocks[RANGES][MAX_COUNT]; /* Y's, handed to the child's main thread */
static void *x_pointer;                            /* X's thread pointer */
static int x_ready[2], x_go[2];                    /* X -> main: allocated; main -> X: check and exit */

/* Every byte of a block, from check.h's pattern; the key spread from who made it, its range and index. */
static void fill(unsigned char *p, size_t n, uint64_t key) { check_fill(p, n, (unsigned)check_mix(key)); }
static int intact(const unsigned char *p, size_t n, uint64_t key) {
  return check_verify(p, n, (unsigned)check_mix(key)) == n;
}
static uint64_t key_of(uint64_t who, size_t r, size_t i) { return who << 40 | (uint64_t)r << 32 | i; }

static long check_blocks(unsigned char *blocks[RANGES][MAX_COUNT], uint64_t who) {
  long bad = 0;
  for (size_t r = 0; r < RANGES; r++)
    for (size_t i = 0; i < counts[r]; i++) bad += !intact(blocks[r][i], sizes[r], key_of(who, r, i));
  return bad;
}

static void *x_main(void *arg) {
  (void)arg;
  x_pointer = __builtin_thread_pointer();
  for (size_t r = 0; r < RANGES; r++)
    for (size_t i = 0; i < counts[r]; i++) {
      x_blocks[r][i] = malloc(sizes[r]);
      if (x_blocks[r][i] == NULL) abort();
      fill(x_blocks[r][i], sizes[r], key_of(1, r, i));
    }
  char c = 1;
  if (write(x_ready[1], &c, 1) != 1 || read(x_go[0], &c, 1) != 1) abort();
  CHECK_MSG(check_blocks(x_blocks, 1) == 0, "the parent's blocks changed while a child freed its copies");
  for (size_t r = 0; r < RANGES; r++)
    for (size_t i = 0; i < counts[r]; i++) free(x_blocks[r][i]);
  return NULL;
}

static _Atomic int y_done;
static _Atomic int y_same_pointer;

static void *y_main(void *arg) {
  (void)arg;
  atomic_store(&y_same_pointer, __builtin_thread_pointer() == x_pointer);
  CHECK_MSG(check_blocks(x_blocks, 1) == 0, "the child's copies of X's blocks");
  for (int half = 0; half < 2; half++) {
    for (size_t r = 0; r < RANGES; r++)
      for (size_t i = (size_t)half; i < counts[r]; i += 2) {
        free(x_blocks[r][i]);
      }
    /* Blocks of Y's own, as many as it freed: they come from its own heap, not from X's pages. */
    for (size_t r = 0; r < RANGES; r++)
      for (size_t i = (size_t)half; i < counts[r]; i += 2) {
        y_blocks[r][i] = malloc(sizes[r]);
        if (y_blocks[r][i] == NULL) abort();
        fill(y_blocks[r][i], sizes[r], key_of(2, r, i));
      }
  }
  CHECK_MSG(check_blocks(y_blocks, 2) == 0, "Y's blocks, before it hands them over");
  atomic_store(&y_done, 1);
  return NULL;
}

/* The child's main thread: work in the same ranges while Y runs, so that its purge rounds come and sweep. */
static long churn(uint64_t round) {
  unsigned char *held[RANGES][16];
  long bad = 0;
  for (size_t r = 0; r < RANGES; r++)
    for (size_t i = 0; i < 16; i++) {
      held[r][i] = malloc(sizes[r]);
      if (held[r][i] == NULL) abort();
      fill(held[r][i], sizes[r], key_of(3 + round, r, i));
    }
  for (size_t r = 0; r < RANGES; r++)
    for (size_t i = 0; i < 16; i++) {
      bad += !intact(held[r][i], sizes[r], key_of(3 + round, r, i));
      free(held[r][i]);
    }
  return bad;
}

static void *z_main(void *arg) {
  (void)arg;
  return (void *)(intptr_t)churn(1u << 20);
}

static int child_main(void) {
  alarm(60);
  pthread_t y, z;
  if (pthread_create(&y, NULL, y_main, NULL) != 0) return 2;
  long bad = 0;
  uint64_t round = 0;
  while (!atomic_load(&y_done)) bad += churn(round++);
  for (int i = 0; i < 200; i++) bad += churn(round++); /* sweeps after Y's frees */
  pthread_join(y, NULL);
  CHECK_MSG(bad == 0, "%ld of the child's main thread's blocks changed", bad);
  CHECK_MSG(check_blocks(y_blocks, 2) == 0, "Y's blocks, after its exit");
  for (size_t r = 0; r < RANGES; r++)
    for (size_t i = 0; i < counts[r]; i++) free(y_blocks[r][i]);
  void *z_bad;
  if (pthread_create(&z, NULL, z_main, NULL) != 0 || pthread_join(z, &z_bad) != 0) return 2;
  CHECK_MSG(z_bad == NULL, "a later thread's blocks changed");
  if (!atomic_load(&y_same_pointer)) {
    printf("skipped: the child's first thread did not get the parent thread's thread pointer\n");
    return 77;
  }
  printf("child: %ld rounds of the main thread while and after Y freed X's blocks\n", (long)round);
  return check_summary() == 0 ? 0 : 1;
}

int main(void) {
  if (pipe(x_ready) != 0 || pipe(x_go) != 0) return 2;
  pthread_t x;
  if (pthread_create(&x, NULL, x_main, NULL) != 0) return 2;
  char c;
  if (read(x_ready[0], &c, 1) != 1) return 2;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) _exit(child_main());
  CHECK(pid > 0);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  bool skipped = WIFEXITED(status) && WEXITSTATUS(status) == 77;
  if (!skipped) CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child: status %#x", status);
  c = 1;
  if (write(x_go[1], &c, 1) != 1) return 2;
  pthread_join(x, NULL); /* X checks its own blocks, whatever the child did */
  int rc = check_summary();
  return rc == 0 && skipped ? 77 : rc;
}
