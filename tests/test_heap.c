/* test_heap.c: the explicit heap API on one thread: th_heap_create's flags and sizes, bad arguments, every
 * th_heap_* allocation function, the byte cap (NULL with ENOMEM, then usable again after frees; a 1 MiB cap
 * works), initial_size (the first allocations take no page faults, and the memory is not purged while the
 * heap lives), th_realloc keeping a block in its heap, th_heap_realloc moving a block across heaps, and
 * th_heap_destroy with live blocks of every size range giving their memory back.
 *
 * Which heap a block is in is observed two ways: through a heap's cap (a block counted in a capped heap
 * makes a second allocation there fail) and through th_stats_get's committed bytes, which drop when the
 * heap holding the block is destroyed. This test is single-threaded, so the process-wide gauge is exact.
 * CTest runs it with THREADHEAP_PURGE_DELAY=0, so that memory which may be purged is purged at once. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "check.h"
#include "threadheap.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

#if defined(__SANITIZE_ADDRESS__)
/* AddressSanitizer reads its shadow memory on every access of the library, which takes page faults of
 * its own: the page-fault measurements mean nothing in that build. */
#define TH_TEST_FAULTS 0
#else
#define TH_TEST_FAULTS 1
#endif

static size_t committed(void) {
  th_stats_t s;
  th_stats_get(&s);
  return s.committed;
}

static long minor_faults(void) {
  struct rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_minflt;
}

/* ---- bad arguments */

static void test_bad_arguments(void) {
  static const unsigned bad_flags[] = {0x2u, 0x80000000u, ~0u, TH_HEAP_NO_SERIALIZE | 0x4u};
  for (size_t i = 0; i < sizeof bad_flags / sizeof bad_flags[0]; i++) {
    errno = 0;
    th_heap_t *h = th_heap_create(bad_flags[i], 0, 0);
    CHECK_MSG(h == NULL && errno == EINVAL, "flags %#x: heap %p errno %d", bad_flags[i], (void *)h, errno);
    th_heap_destroy(h);
  }
  errno = 0;
  th_heap_t *h = th_heap_create(0, 2 * MiB, 1 * MiB);
  CHECK_MSG(h == NULL && errno == EINVAL, "initial 2 MiB > max 1 MiB: heap %p errno %d", (void *)h, errno);
  th_heap_destroy(h);
  errno = 0;
  h = th_heap_create(TH_HEAP_NO_SERIALIZE, 64 * KiB + 1, 64 * KiB);
  CHECK_MSG(h == NULL && errno == EINVAL, "initial > max by one byte: heap %p errno %d", (void *)h, errno);
  th_heap_destroy(h);

  /* Legal edges: no cap with an initial size, and initial == max. */
  h = th_heap_create(0, 1 * MiB, 0);
  CHECK(h != NULL);
  th_heap_destroy(h);
  h = th_heap_create(TH_HEAP_NO_SERIALIZE, 1 * MiB, 1 * MiB);
  if (CHECK(h != NULL)) {
    void *p = th_heap_malloc(h, 1000);
    CHECK(p != NULL);
    th_free(p);
  }
  th_heap_destroy(h);

  /* A NULL heap: NULL with EINVAL from every function, and a block given to th_heap_realloc stays valid. */
  errno = 0;
  CHECK(th_heap_malloc(NULL, 16) == NULL && errno == EINVAL);
  errno = 0;
  CHECK(th_heap_calloc(NULL, 2, 16) == NULL && errno == EINVAL);
  errno = 0;
  CHECK(th_heap_aligned_alloc(NULL, 64, 64) == NULL && errno == EINVAL);
  errno = 0;
  CHECK(th_heap_realloc(NULL, NULL, 16) == NULL && errno == EINVAL);
  void *p = th_malloc(100);
  if (CHECK(p != NULL)) {
    check_fill(p, 100, 7);
    errno = 0;
    CHECK(th_heap_realloc(NULL, p, 200) == NULL && errno == EINVAL);
    CHECK(check_verify(p, 100, 7) == 100);
    th_free(p);
  }
  th_heap_destroy(NULL); /* does nothing */
  CHECK(1);

  /* The malloc-family errors, on a heap. */
  h = th_heap_create(0, 0, 0);
  if (!CHECK(h != NULL)) return;
  errno = 0;
  CHECK(th_heap_malloc(h, SIZE_MAX) == NULL && errno == ENOMEM);
  errno = 0;
  CHECK(th_heap_malloc(h, SIZE_MAX / 2) == NULL && errno == ENOMEM);
  errno = 0;
  CHECK(th_heap_calloc(h, SIZE_MAX / 2, 3) == NULL && errno == ENOMEM);
  /* glibc 2.36's aligned_alloc is memalign: an alignment that is not a power of two is rounded up. */
  void *a = th_heap_aligned_alloc(h, 24, 48);
  CHECK_MSG(a != NULL && check_aligned(a, 32), "th_heap_aligned_alloc(24, 48) = %p", a);
  th_free(a);
  a = th_heap_aligned_alloc(h, 0, 48);
  CHECK(a != NULL && check_aligned(a, 16));
  th_free(a);
  errno = 0;
  CHECK(th_heap_aligned_alloc(h, SIZE_MAX / 2 + 2, 48) == NULL && errno == EINVAL);
  th_heap_destroy(h);
}

/* ---- the allocation functions, in a heap of each kind */

static const size_t g_sizes[] = {0, 1, 15, 16, 17, 100, 1000, 1024, 4096, 8192, 8193, 65536, 65537,
                                 300000, 1 * MiB, 1 * MiB + 1, 3 * MiB};
#define NSIZES (sizeof g_sizes / sizeof g_sizes[0])

static void test_functions(unsigned flags) {
  th_heap_t *h = th_heap_create(flags, 0, 0);
  if (!CHECK_MSG(h != NULL, "flags %u", flags)) return;
  void *blocks[NSIZES];
  for (size_t i = 0; i < NSIZES; i++) {
    size_t n = g_sizes[i];
    blocks[i] = th_heap_malloc(h, n);
    if (!CHECK_MSG(blocks[i] != NULL, "flags %u: th_heap_malloc(%zu)", flags, n)) continue;
    CHECK_MSG(check_aligned(blocks[i], 16), "th_heap_malloc(%zu) = %p", n, blocks[i]);
    size_t u = th_usable_size(blocks[i]);
    CHECK_MSG(u >= n && u >= 16, "usable size %zu of th_heap_malloc(%zu)", u, n);
    check_fill(blocks[i], n, (unsigned)i);
  }
  for (size_t i = 0; i < NSIZES; i++)
    for (size_t j = i + 1; j < NSIZES; j++) CHECK_MSG(blocks[i] != blocks[j], "sizes %zu and %zu", g_sizes[i], g_sizes[j]);
  /* Grow and shrink with both realloc functions; the common prefix is kept. */
  for (size_t i = 0; i < NSIZES; i++) {
    if (!blocks[i]) continue;
    size_t n = g_sizes[i], grow = n * 2 + 100, shrink = n / 3;
    CHECK_MSG(check_verify(blocks[i], n, (unsigned)i) == n, "block of %zu before realloc", n);
    void *q = (i & 1) ? th_realloc(blocks[i], grow) : th_heap_realloc(h, blocks[i], grow);
    if (!CHECK_MSG(q != NULL, "realloc %zu -> %zu", n, grow)) continue;
    CHECK_MSG(check_verify(q, n, (unsigned)i) == n, "prefix after realloc %zu -> %zu", n, grow);
    check_fill(q, grow, (unsigned)i + 100);
    void *r = (i & 1) ? th_heap_realloc(h, q, shrink) : th_realloc(q, shrink);
    if (shrink == 0) {
      /* realloc(p, 0) frees p and returns NULL, as glibc's does. */
      CHECK_MSG(r == NULL, "realloc to 0 returned %p", r);
      blocks[i] = NULL;
      continue;
    }
    if (!CHECK_MSG(r != NULL, "realloc %zu -> %zu", grow, shrink)) continue;
    CHECK_MSG(check_verify(r, shrink, (unsigned)i + 100) == shrink, "prefix after realloc %zu -> %zu", grow, shrink);
    blocks[i] = r;
  }
  for (size_t i = 0; i < NSIZES; i++) th_free(blocks[i]);

  /* th_heap_realloc(h, NULL, n) allocates. */
  void *p = th_heap_realloc(h, NULL, 500);
  CHECK(p != NULL && th_usable_size(p) >= 500);
  th_free(p);

  /* calloc zeroes, also memory that held a pattern a moment ago. */
  static const size_t csizes[] = {16, 240, 3000, 40000, 200000, 2 * MiB};
  for (size_t i = 0; i < sizeof csizes / sizeof csizes[0]; i++) {
    size_t n = csizes[i];
    for (int round = 0; round < 2; round++) {
      unsigned char *c = th_heap_calloc(h, n / 8, 8);
      if (!CHECK_MSG(c != NULL, "th_heap_calloc(%zu, 8)", n / 8)) break;
      CHECK_MSG(check_all_zero(c, n), "th_heap_calloc(%zu, 8) round %d", n / 8, round);
      memset(c, 0xa5, th_usable_size(c));
      th_free(c);
    }
  }
  unsigned char *z = th_heap_calloc(h, 0, 100);
  CHECK(z != NULL);
  th_free(z);

  /* Aligned blocks, small to huge alignments. */
  for (size_t a = 16; a <= 4 * MiB; a *= 4) {
    static const size_t asizes[] = {1, 100, 5000, 70000, 2 * MiB};
    for (size_t k = 0; k < sizeof asizes / sizeof asizes[0]; k++) {
      size_t n = asizes[k];
      void *b = th_heap_aligned_alloc(h, a, n);
      if (!CHECK_MSG(b != NULL, "th_heap_aligned_alloc(%zu, %zu)", a, n)) continue;
      CHECK_MSG(check_aligned(b, a), "th_heap_aligned_alloc(%zu, %zu) = %p", a, n, b);
      CHECK_MSG(th_usable_size(b) >= n, "usable size of th_heap_aligned_alloc(%zu, %zu)", a, n);
      check_fill(b, n, 3);
      /* An aligned block grows in its heap like any other. */
      void *g = th_realloc(b, n + 5000);
      if (CHECK(g != NULL)) {
        CHECK(check_verify(g, n, 3) == n);
        th_free(g);
      }
    }
  }
  /* malloc(0) is unique. */
  void *a0 = th_heap_malloc(h, 0), *b0 = th_heap_malloc(h, 0);
  CHECK(a0 != NULL && b0 != NULL && a0 != b0);
  th_free(a0);
  th_free(b0);
  th_heap_destroy(h);
}

/* ---- the cap */

static void test_cap_small_blocks(void) {
  /* The seed's own example: a heap capped at 1 MiB. It must hand out most of that in 4 KiB blocks (it
   * commits page by page), then fail with ENOMEM, then work again once a block is freed. */
  th_heap_t *h = th_heap_create(0, 4 * KiB, 1 * MiB);
  if (!CHECK(h != NULL)) return;
  enum { MAXB = 512 };
  void *b[MAXB];
  int n = 0;
  errno = 0;
  while (n < MAXB && (b[n] = th_heap_malloc(h, 4 * KiB)) != NULL) {
    check_fill(b[n], 4 * KiB, (unsigned)n);
    n++;
  }
  int err = errno;
  CHECK_MSG(n < MAXB, "a 1 MiB heap handed out %d blocks of 4 KiB", n);
  CHECK_MSG((size_t)n * 4 * KiB >= 768 * KiB, "a 1 MiB heap handed out only %d blocks of 4 KiB", n);
  CHECK_MSG(err == ENOMEM, "errno %d at the cap", err);
  /* Every other function fails at the cap too, and a failed realloc keeps its block. */
  errno = 0;
  CHECK(th_heap_calloc(h, 1, 64 * KiB) == NULL && errno == ENOMEM);
  errno = 0;
  CHECK(th_heap_aligned_alloc(h, 4096, 64 * KiB) == NULL && errno == ENOMEM);
  errno = 0;
  CHECK(th_heap_malloc(h, 2 * MiB) == NULL && errno == ENOMEM);
  if (n > 0) {
    errno = 0;
    void *r = th_realloc(b[0], 512 * KiB);
    CHECK_MSG(r == NULL && errno == ENOMEM, "realloc past the cap: %p errno %d", r, errno);
    CHECK(check_verify(b[0], 4 * KiB, 0) == 4 * KiB);
  }
  /* Still usable: free one block, and a block of the same size fits again. */
  if (n > 0) {
    th_free(b[n - 1]);
    b[n - 1] = th_heap_malloc(h, 4 * KiB);
    CHECK_MSG(b[n - 1] != NULL, "no 4 KiB block after one was freed at the cap (errno %d)", errno);
    if (b[n - 1]) check_fill(b[n - 1], 4 * KiB, (unsigned)(n - 1));
  }
  for (int i = 0; i < n; i++) {
    if (!b[i]) continue;
    CHECK_MSG(check_verify(b[i], 4 * KiB, (unsigned)i) == 4 * KiB, "block %d at the cap", i);
    th_free(b[i]);
  }
  /* Everything freed: the whole cap is available again, for blocks of another size range. */
  void *big = th_heap_malloc(h, 640 * KiB);
  CHECK_MSG(big != NULL, "640 KiB in an empty 1 MiB heap (errno %d)", errno);
  if (big) check_fill(big, 640 * KiB, 9);
  void *big2 = th_heap_malloc(h, 640 * KiB);
  CHECK_MSG(big2 == NULL, "two blocks of 640 KiB in a 1 MiB heap");
  th_free(big2);
  if (big) CHECK(check_verify(big, 640 * KiB, 9) == 640 * KiB);
  th_free(big);
  th_heap_destroy(h);
}

static void test_cap_huge_blocks(void) {
  /* Huge blocks count against the cap with their size. */
  th_heap_t *h = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 8 * MiB);
  if (!CHECK(h != NULL)) return;
  void *a = th_heap_malloc(h, 3 * MiB), *b = th_heap_malloc(h, 3 * MiB);
  CHECK(a != NULL && b != NULL);
  errno = 0;
  void *c = th_heap_malloc(h, 3 * MiB);
  CHECK_MSG(c == NULL && errno == ENOMEM, "a third 3 MiB block in an 8 MiB heap: %p errno %d", c, errno);
  th_free(c);
  th_free(a);
  c = th_heap_malloc(h, 3 * MiB);
  CHECK_MSG(c != NULL, "3 MiB after a 3 MiB block was freed (errno %d)", errno);
  if (c) check_fill(c, 3 * MiB, 1);
  /* Growing a huge block in place counts too. */
  errno = 0;
  void *g = th_realloc(b, 6 * MiB);
  CHECK_MSG(g == NULL && errno == ENOMEM, "realloc of a huge block past the cap: %p errno %d", g, errno);
  th_free(b);
  g = th_realloc(c, 5 * MiB);
  if (CHECK_MSG(g != NULL, "realloc 3 -> 5 MiB within an 8 MiB cap (errno %d)", errno)) {
    CHECK(check_verify(g, 3 * MiB, 1) == 3 * MiB);
    th_free(g);
  } else {
    th_free(c);
  }
  th_heap_destroy(h);
}

/* ---- a block stays in its heap across th_realloc; th_heap_realloc moves it */

static void test_realloc_keeps_heap(void) {
  /* Cap view: a block grown with th_realloc still counts in its capped heap. */
  th_heap_t *h = th_heap_create(0, 0, 1 * MiB);
  if (!CHECK(h != NULL)) return;
  void *p = th_heap_malloc(h, 16);
  if (CHECK(p != NULL)) {
    check_fill(p, 16, 4);
    void *q = th_realloc(p, 640 * KiB);
    if (CHECK(q != NULL)) {
      CHECK(check_verify(q, 16, 4) == 16);
      errno = 0;
      void *r = th_heap_malloc(h, 640 * KiB);
      CHECK_MSG(r == NULL && errno == ENOMEM, "the block th_realloc grew is not counted in its heap");
      th_free(r);
      th_free(q);
      r = th_heap_malloc(h, 640 * KiB);
      CHECK_MSG(r != NULL, "640 KiB after the grown block was freed (errno %d)", errno);
      th_free(r);
    }
  }
  th_heap_destroy(h);

  /* Stats view: destroying the heap takes the block th_realloc grew with it. */
  h = th_heap_create(0, 0, 0);
  if (!CHECK(h != NULL)) return;
  p = th_heap_malloc(h, 100);
  void *q = p ? th_realloc(p, 6 * MiB) : NULL;
  CHECK(q != NULL);
  size_t before = committed();
  th_heap_destroy(h);
  size_t after = committed();
  CHECK_MSG(after + 6 * MiB <= before, "destroy gave back %zd bytes, the 6 MiB block was not in the heap",
            (ssize_t)(before - after));
}

static void test_heap_realloc_across(void) {
  th_heap_t *h1 = th_heap_create(0, 0, 0);
  th_heap_t *h2 = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 1 * MiB);
  if (!CHECK(h1 != NULL && h2 != NULL)) return;
  /* From h1 into capped h2: copied, counted in h2, independent of h1. */
  void *p = th_heap_malloc(h1, 1000);
  if (CHECK(p != NULL)) {
    check_fill(p, 1000, 5);
    void *q = th_heap_realloc(h2, p, 640 * KiB);
    if (CHECK(q != NULL)) {
      CHECK(check_verify(q, 1000, 5) == 1000);
      errno = 0;
      void *r = th_heap_malloc(h2, 640 * KiB);
      CHECK_MSG(r == NULL && errno == ENOMEM, "th_heap_realloc's block is not counted in the target heap");
      th_free(r);
      th_heap_destroy(h1); /* the block does not depend on h1 any more */
      h1 = NULL;
      CHECK(check_verify(q, 1000, 5) == 1000);
      check_fill(q, 640 * KiB, 6);
      CHECK(check_verify(q, 640 * KiB, 6) == 640 * KiB);
      th_free(q);
      r = th_heap_malloc(h2, 640 * KiB);
      CHECK_MSG(r != NULL, "640 KiB in h2 after the moved block was freed");
      th_free(r);
    }
  }
  th_heap_destroy(h1);

  /* From the thread's default heap into h2, and a failure at the cap keeps the original. */
  p = th_malloc(3000);
  if (CHECK(p != NULL)) {
    check_fill(p, 3000, 8);
    errno = 0;
    void *f = th_heap_realloc(h2, p, 2 * MiB);
    CHECK_MSG(f == NULL && errno == ENOMEM, "th_heap_realloc past the target's cap: %p errno %d", f, errno);
    CHECK(check_verify(p, 3000, 8) == 3000);
    void *q = th_heap_realloc(h2, p, 5000);
    if (CHECK(q != NULL)) {
      CHECK(check_verify(q, 3000, 8) == 3000);
      /* It is in h2 now: destroying h2 gives its memory back (a huge block makes that visible). */
      void *g = th_heap_realloc(h2, q, 700 * KiB);
      CHECK(g != NULL);
    }
  }
  size_t before = committed();
  th_heap_destroy(h2);
  CHECK_MSG(committed() + 700 * KiB <= before, "h2's blocks outlived it");
}

/* ---- initial_size: no page faults for the first allocations, and no purge while the heap lives */

#define NSMALL 512
#define NMEDIUM 16

/* Allocates NSMALL blocks of 256 bytes and NMEDIUM of 4 KiB, writes every byte; returns minor faults. */
static long alloc_and_touch(th_heap_t *h, void **small, void **medium) {
  long f0 = minor_faults();
  for (int i = 0; i < NSMALL; i++) {
    small[i] = th_heap_malloc(h, 256);
    if (small[i]) memset(small[i], 0x11, 256);
  }
  for (int i = 0; i < NMEDIUM; i++) {
    medium[i] = th_heap_malloc(h, 4 * KiB);
    if (medium[i]) memset(medium[i], 0x22, 4 * KiB);
  }
  return minor_faults() - f0;
}
static int all_allocated(void **small, void **medium) {
  for (int i = 0; i < NSMALL; i++)
    if (!small[i]) return 0;
  for (int i = 0; i < NMEDIUM; i++)
    if (!medium[i]) return 0;
  return 1;
}
static void free_all(void **small, void **medium) {
  for (int i = 0; i < NSMALL; i++) th_free(small[i]);
  for (int i = 0; i < NMEDIUM; i++) th_free(medium[i]);
}

static void test_initial_size(void) {
  static void *small[NSMALL], *medium[NMEDIUM];
  /* Warm the code paths and the arrays, so that only the heap's memory can fault. */
  th_heap_t *warm = th_heap_create(0, 0, 0);
  if (!CHECK(warm != NULL)) return;
  alloc_and_touch(warm, small, medium);
  free_all(small, medium);
  th_heap_destroy(warm);

  /* Control: a heap without initial_size faults on the same allocations, so the measure can see faults. */
  th_heap_t *h0 = th_heap_create(0, 0, 0);
  if (!CHECK(h0 != NULL)) return;
  long f_control = alloc_and_touch(h0, small, medium);
  CHECK(all_allocated(small, medium));
  free_all(small, medium);
  th_heap_destroy(h0);

  th_heap_t *h = th_heap_create(0, 1 * MiB, 0);
  if (!CHECK(h != NULL)) return;
  long f_first = alloc_and_touch(h, small, medium);
  CHECK(all_allocated(small, medium));
  free_all(small, medium);
  /* With THREADHEAP_PURGE_DELAY=0 anything purgeable goes at once; th_collect asks for it explicitly. */
  th_collect();
  long f_again = alloc_and_touch(h, small, medium);
  CHECK(all_allocated(small, medium));
  free_all(small, medium);
  th_heap_destroy(h);

  printf("minor faults for %d KiB in %d blocks: no initial size %ld, initial size 1 MiB %ld, again after "
         "free and th_collect %ld\n",
         (int)((NSMALL * 256 + NMEDIUM * 4 * KiB) / KiB), NSMALL + NMEDIUM, f_control, f_first, f_again);
#if TH_TEST_FAULTS
  CHECK_MSG(f_control > 0, "the control heap took no faults (%ld): the measure proves nothing", f_control);
  CHECK_MSG(f_first == 0, "%ld page faults in a heap created with 1 MiB initial size", f_first);
  CHECK_MSG(f_again == 0, "%ld page faults after free and th_collect: the initial size was purged", f_again);
#else
  printf("(page-fault checks skipped under AddressSanitizer)\n");
#endif
}

/* ---- destroy with live blocks */

static void test_destroy_live(unsigned flags) {
  size_t base = committed();
  th_heap_t *h = th_heap_create(flags, 0, 0);
  if (!CHECK(h != NULL)) return;
  /* Blocks of every size range, most left live; a few freed so that pages are in every state. */
  for (int i = 0; i < 3000; i++) {
    size_t n = (size_t)16 << (i % 13); /* 16 B .. 64 KiB */
    void *p = th_heap_malloc(h, n);
    if (!CHECK_MSG(p != NULL, "th_heap_malloc(%zu)", n)) break;
    memset(p, i & 0xff, n < 256 ? n : 256);
    if (i % 5 == 0) th_free(p);
  }
  for (int i = 0; i < 4; i++) CHECK(th_heap_malloc(h, 300 * KiB + (size_t)i * 200 * KiB) != NULL);
  for (int i = 0; i < 3; i++) CHECK(th_heap_malloc(h, 2 * MiB + (size_t)i * MiB) != NULL);
  size_t full = committed();
  CHECK_MSG(full >= base + 9 * MiB, "committed grew by %zu only", full - base);
  th_heap_destroy(h);
  size_t after = committed();
  CHECK_MSG(after <= base, "flags %u: committed %zu after destroy, %zu before the heap was created", flags,
            after, base);
}

int main(void) {
  test_bad_arguments();
  test_functions(0);
  test_functions(TH_HEAP_NO_SERIALIZE);
  test_cap_small_blocks();
  test_cap_huge_blocks();
  test_realloc_keeps_heap();
  test_heap_realloc_across();
  test_initial_size();
  test_destroy_live(0);
  test_destroy_live(TH_HEAP_NO_SERIALIZE);
  return check_summary();
}
