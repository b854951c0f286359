/* test_valgrind_heap.c: explicit heaps seen by valgrind's memcheck (the TH_VALGRIND build option). Run under
 * `valgrind --leak-check=full` by test_valgrind.sh, which expects exactly two errors: the read after free
 * and the leak below, each pointing into this file. Everything else here is correct use of every kind of
 * explicit-heap block (small, medium, huge, zeroed, aligned, reallocated in place and moved, destroyed
 * with its blocks), which must raise nothing: threadheap's own reads and writes of its lists stay legal. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "threadheap.h"

static th_heap_t *keep_heap;
static char *kept[4];

__attribute__((noinline)) static void leak_one(th_heap_t *h) {
  char *leaked = th_heap_malloc(h, 100); /* the leak the test expects */
  memset(leaked, 1, 100);
}

__attribute__((noinline)) static void scrub_stack(void) {
  volatile char junk[4096];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = 0;
}

__attribute__((noinline)) static int read_after_free(th_heap_t *h) {
  char *p = th_heap_malloc(h, 200);
  memset(p, 7, 200);
  th_free(p);
  return ((volatile char *)p)[64]; /* the read after free the test expects */
}

static int correct_use(th_heap_t *h) {
  int bad = 0;
  size_t sizes[] = {16, 100, 5000, 40000, 300000, (size_t)3 << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    char *p = th_heap_malloc(h, sizes[i]);
    memset(p, 3, sizes[i]);
    char *z = th_heap_calloc(h, 1, sizes[i]);
    bad += z[sizes[i] - 1] != 0;
    char *a = th_heap_aligned_alloc(h, 256, sizes[i]);
    bad += ((uintptr_t)a & 255) != 0;
    memset(a, 4, sizes[i]);
    p = th_heap_realloc(h, p, sizes[i] / 2 + 1); /* in place */
    bad += p[0] != 3;
    p = th_heap_realloc(h, p, sizes[i] * 3); /* moved (or grown) */
    bad += p[0] != 3;
    memset(p, 5, sizes[i] * 3);
    th_free(p);
    th_free(z);
    th_free(a);
  }
  return bad;
}

/* memcheck skips its leak search when no malloc block is left at exit ("no leaks are possible"), pool
 * chunks or not; every real program has some (stdio's), so this one keeps one too. */
static void *volatile anchor;

int main(void) {
  anchor = malloc(16);
  keep_heap = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
  th_heap_t *shared = th_heap_create(0, 0, 0);
  kept[0] = th_heap_malloc(keep_heap, 100); /* reachable at exit: not a leak */
  leak_one(keep_heap);
  scrub_stack();
  int bad = correct_use(shared) + correct_use(keep_heap);
  int c = read_after_free(shared);
  th_heap_t *gone = th_heap_create(0, 0, 0);
  for (int i = 0; i < 100; i++) /* freed by the destroy: no leak */
    if (th_heap_malloc(gone, 64 * (size_t)(i + 1)) == NULL) bad++;
  th_heap_destroy(gone);
  bad += correct_use(shared); /* memory of the destroyed heap is used again */
  th_heap_destroy(shared);
  printf("test_valgrind_heap: %d wrong values (read after free gave %d)\n", bad, c);
  return bad != 0;
}
