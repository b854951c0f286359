/* test_page_pool.c: the free small page slots one thread heap leaves serve the others (pool.c), whichever
 * thread exits first, with every block's contents kept.
 *
 * CTest sets THREADHEAP_PURGE_DELAY=200 (rounds every 50 ms). Thread A fills pages of 64-byte blocks, frees
 * them and runs purge rounds: its empty pages go back to their slots, which it lends to the pool. Then, while A
 * waits:
 *   lend    thread B allocates 4 pages' worth: every block lies in A's slots; B frees them and exits, and A,
 *           allocating again, gets its own slots back;
 *   misuse  a double free in a borrowed page, by its borrower and by another thread, stops the process with
 *           the usual line (in forked children);
 *   orphan  thread C borrows 2 pages and exits holding every block: main finds them intact and frees them,
 *           th_collect makes the emptied pages free slots of the pool again, and thread D gets them;
 *   lender  thread E borrows a page and holds its blocks while A exits: E keeps using the page (frees, new
 *           blocks, contents checked) after its lender's segment is abandoned, and the page goes back to the
 *           pool when E empties it. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "pool_stages.h"
#include "purge_rounds.h"
#include "threadheap.h"

enum { SIZE = 64, PER_PAGE = SLOT / SIZE };

/* A's slots: those its blocks lay in. */
static uintptr_t a_slots[MAX_SLOTS];
static int a_nslots;

static int in_a_slots(const void *p) { return in_slots(a_slots, a_nslots, p); }

/* n blocks, each filled with its own pattern (key + index). */
static void **fill_blocks(size_t n, unsigned key) {
  void **b = malloc(n * sizeof *b); /* (this array is main's or the thread's own: not counted below) */
  if (b == NULL) return NULL;
  for (size_t i = 0; i < n; i++) {
    b[i] = th_malloc(SIZE);
    if (b[i] == NULL) {
      CHECK_MSG(0, "th_malloc(%d) returned NULL (errno %d)", SIZE, errno);
      exit(1);
    }
    check_fill(b[i], SIZE, key + (unsigned)i);
  }
  return b;
}

static size_t bad_blocks(void **b, size_t n, unsigned key) {
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    if (b[i] != NULL && check_verify(b[i], SIZE, key + (unsigned)i) != SIZE) bad++;
  return bad;
}

static size_t outside_a(void **b, size_t n) {
  size_t out = 0;
  for (size_t i = 0; i < n; i++) out += b[i] != NULL && !in_a_slots(b[i]);
  return out;
}

/* ---- A: the lender */

static void *thread_a(void *arg) {
  (void)arg;
  size_t n = 6 * PER_PAGE;
  void **b = fill_blocks(n, 1);
  for (size_t i = 0; i < n; i++) note_slot(a_slots, &a_nslots, b[i]);
  CHECK_MSG(bad_blocks(b, n, 1) == 0, "A's blocks changed");
  for (size_t i = 0; i < n; i++) th_free(b[i]);
  free(b);
  run_rounds(0.2); /* its empty pages go back to their slots, lent on the same rounds */
  set_stage(1);
  wait_stage(2); /* B borrowed, freed and exited */
  b = fill_blocks(4 * PER_PAGE, 2);
  size_t out = outside_a(b, 4 * PER_PAGE);
  CHECK_MSG(out == 0, "%zu of A's new blocks lie outside its own slots, which the pool held", out);
  CHECK_MSG(bad_blocks(b, 4 * PER_PAGE, 2) == 0, "A's new blocks changed");
  for (size_t i = 0; i < 4 * PER_PAGE; i++) th_free(b[i]);
  run_rounds(0.2); /* lent again */
  free(b);
  set_stage(3);
  wait_stage(6); /* E holds a borrowed page: A exits now */
  return NULL;
}

/* ---- the borrowers */

static void *thread_b(void *arg) {
  (void)arg;
  size_t before = stats().pages_borrowed, n = 4 * PER_PAGE;
  void **b = fill_blocks(n, 3);
  size_t out = outside_a(b, n);
  CHECK_MSG(out == 0, "%zu of B's %zu blocks lie outside A's %d slots, lent to the pool", out, n, a_nslots);
  size_t borrowed = stats().pages_borrowed - before;
  CHECK_MSG(borrowed >= 4, "pages_borrowed went up by %zu for B's 4 pages", borrowed);
  CHECK_MSG(bad_blocks(b, n, 3) == 0, "B's blocks changed");
  for (size_t i = 0; i < n; i++) th_free(b[i]);
  free(b);
  return NULL; /* its emptied pages go back to the pool at its exit */
}

static void **c_blocks;

static void *thread_c(void *arg) {
  (void)arg;
  c_blocks = fill_blocks(2 * PER_PAGE, 4);
  size_t out = outside_a(c_blocks, 2 * PER_PAGE);
  CHECK_MSG(out == 0, "%zu of C's blocks lie outside A's slots", out);
  return NULL; /* exits holding them all */
}

static void *thread_d(void *arg) {
  (void)arg;
  void **b = fill_blocks(2 * PER_PAGE, 5);
  size_t out = outside_a(b, 2 * PER_PAGE);
  CHECK_MSG(out == 0, "%zu of D's blocks lie outside A's slots (C's orphaned pages were emptied)", out);
  CHECK_MSG(bad_blocks(b, 2 * PER_PAGE, 5) == 0, "D's blocks changed");
  for (size_t i = 0; i < 2 * PER_PAGE; i++) th_free(b[i]);
  free(b);
  return NULL;
}

static void *thread_e(void *arg) {
  pthread_t *a = arg;
  size_t n = PER_PAGE / 2;
  void **b = fill_blocks(n, 6);
  size_t out = outside_a(b, n);
  CHECK_MSG(out == 0, "%zu of E's blocks lie outside A's slots", out);
  set_stage(6);
  pthread_join(*a, NULL); /* the lender exits, its segments abandoned */
  CHECK_MSG(bad_blocks(b, n, 6) == 0, "E's blocks changed when their page's lender exited");
  for (size_t i = 0; i < n; i += 2) { /* half freed, and allocated again in the same page */
    th_free(b[i]);
    b[i] = NULL;
  }
  for (size_t i = 0; i < n; i += 2) {
    b[i] = th_malloc(SIZE);
    if (!CHECK(b[i] != NULL)) return NULL;
    check_fill(b[i], SIZE, 7 + (unsigned)i);
  }
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += check_verify(b[i], SIZE, (i % 2 ? 6 : 7) + (unsigned)i) != SIZE;
  CHECK_MSG(bad == 0, "%zu of E's blocks changed after its lender exited", bad);
  size_t slots_before = stats().pool_slots;
  for (size_t i = 0; i < n; i++) th_free(b[i]);
  free(b);
  run_rounds(0.2); /* the emptied page back to the pool */
  CHECK_MSG(stats().pool_slots > slots_before, "E's emptied page did not go back to the pool (%zu slots, %zu before)",
            stats().pool_slots, slots_before);
  return NULL;
}

/* ---- misuse in a borrowed page, in forked children */

static void *held_block;

static void double_free(int a, int b) {
  (void)a, (void)b;
  th_free(held_block);
  check_expect("%p", held_block);
  th_free(held_block);
}

static void expect_double_free(const char *label, void (*fn)(int, int)) {
  check_child_t res;
  check_run_child(fn, 0, 0, &check_info_fd, &res);
  char how[128];
  CHECK_MSG(WIFSIGNALED(res.status) && WTERMSIG(res.status) == SIGABRT, "%s: child %s; stderr: %s", label,
            check_describe(res.status, how, sizeof how), res.err);
  char want[600];
  snprintf(want, sizeof want, "threadheap: double free at %s", res.info);
  CHECK_MSG(strncmp(res.err, want, strlen(want)) == 0, "%s: stderr \"%s\", not \"%s ...\"", label, res.err, want);
}

static void *thread_misuse(void *arg) {
  (void)arg;
  held_block = th_malloc(SIZE);
  if (!CHECK(held_block != NULL)) return NULL;
  CHECK_MSG(in_a_slots(held_block), "the block %p is not in A's slots", held_block);
  expect_double_free("double free in a borrowed page, by its borrower", double_free);
  th_free(held_block);
  return NULL;
}

static void *thread_misuse_hold(void *arg) {
  (void)arg;
  held_block = th_malloc(SIZE);
  if (!CHECK(held_block != NULL)) return NULL;
  CHECK_MSG(in_a_slots(held_block), "the block %p is not in A's slots", held_block);
  set_stage(4);
  wait_stage(5);
  th_free(held_block);
  return NULL;
}

static pthread_t start(void *(*fn)(void *), void *arg) {
  pthread_t t;
  if (pthread_create(&t, NULL, fn, arg) != 0) {
    perror("pthread_create");
    exit(2);
  }
  return t;
}

int main(void) {
  /* main's heap, so that A's heap is not the only one (a single thread heap lends nothing): main's malloc
   * may be a sanitizer's, th_malloc is not. */
  th_free(th_malloc(16));
  pthread_t a = start(thread_a, NULL);
  wait_stage(1);
  th_stats_t s = stats();
  printf("A used %d slots; the pool holds %zu\n", a_nslots, s.pool_slots);
  CHECK_MSG(s.pool_slots >= 4, "the pool holds %zu slots after A's rounds (A emptied 6 pages)", s.pool_slots);

  pthread_join(start(thread_b, NULL), NULL); /* lend */
  set_stage(2);
  wait_stage(3);

  pthread_join(start(thread_misuse, NULL), NULL); /* misuse, by the borrower */
  pthread_t h = start(thread_misuse_hold, NULL);  /* and by another thread (main, in a child) */
  wait_stage(4);
  expect_double_free("double free in a borrowed page, by another thread", double_free);
  set_stage(5);
  pthread_join(h, NULL);

  /* C's first page is handed off when it fills (pages_handed_off), its second left at its exit (orphaned). */
  size_t orphaned = stats().pages_orphaned + stats().pages_handed_off;
  pthread_join(start(thread_c, NULL), NULL); /* orphan */
  size_t left = stats().pages_orphaned + stats().pages_handed_off - orphaned;
  CHECK_MSG(left >= 2, "pages_orphaned and pages_handed_off went up by %zu for C's 2 pages", left);
  CHECK_MSG(bad_blocks(c_blocks, 2 * PER_PAGE, 4) == 0, "C's blocks changed after C exited");
  for (size_t i = 0; i < 2 * PER_PAGE; i++) th_free(c_blocks[i]);
  free(c_blocks);
  th_collect(); /* main's held frees pushed, and the emptied orphans made free slots */
  pthread_join(start(thread_d, NULL), NULL);

  pthread_join(start(thread_e, &a), NULL); /* lender: E joins A */
  printf("pool: %zu slots, %zu pages borrowed, %zu orphaned, %zu handed off\n", stats().pool_slots,
         stats().pages_borrowed, stats().pages_orphaned, stats().pages_handed_off);
  return check_summary();
}
