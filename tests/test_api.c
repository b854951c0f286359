/* test_api.c: the edge cases of every th_* entry point, against the semantics of glibc 2.36 that
 * threadheap.h promises: minimum size and alignment, malloc(0), size overflow, the alignment rules of
 * posix_memalign / memalign / aligned_alloc, calloc zeroing (also of recycled memory), realloc contents
 * and failure, usable sizes, errno preservation by free, and huge reallocs that move no bytes. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "check.h"
#include "purge_rounds.h"
#include "threadheap.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static long minor_faults(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

/* Sizes from every range the allocator distinguishes: tiny, the 16-byte classes, small, medium, large
 * and huge, plus the neighbours of the range borders. */
static const size_t g_sizes[] = {1, 7, 15, 16, 17, 24, 31, 32, 48, 100, 127, 128, 129, 255, 256, 257,
                                 1000, 1024, 1025, 4095, 4096, 4097, 8191, 8192, 8193, 10000, 65535,
                                 65536, 65537, 100000, 262144, 524287, 524288, 524289, 1048575, 1048576,
                                 1048577, 3 * MiB, 4 * MiB - 1, 4 * MiB, 4 * MiB + 1, 9 * MiB + 3};
#define NSIZES (sizeof g_sizes / sizeof g_sizes[0])

/* Secure mode (THREADHEAP_SECURE, docs/design.md) changes two promises, checked either way below: the usable
 * size is exactly the size asked for (the bytes past it are the canary's), and a freed block is held back
 * for a number of frees instead of coming back at the next malloc. */
static int g_secure;

/* At least max(16, n) bytes; exactly n in secure mode. */
static int usable_ok(size_t u, size_t n) { return g_secure ? u == n : u >= 16 && u >= n; }

static void test_minimum_and_alignment(void) {
  for (size_t i = 0; i < NSIZES; i++) {
    size_t n = g_sizes[i];
    unsigned char *p = th_malloc(n);
    if (!CHECK_MSG(p != NULL, "malloc(%zu)", n)) continue;
    CHECK_MSG(check_aligned(p, 16), "malloc(%zu) = %p", n, (void *)p);
    size_t u = th_usable_size(p);
    CHECK_MSG(usable_ok(u, n), "usable_size(malloc(%zu)) = %zu", n, u);
    /* The whole usable size belongs to the caller. */
    check_fill(p, u, (unsigned)i);
    CHECK_MSG(check_verify(p, u, (unsigned)i) == u, "size %zu", n);
    th_free(p);
  }
}

static void test_malloc_zero(void) {
  void *a = th_malloc(0), *b = th_malloc(0);
  CHECK(a != NULL);
  CHECK(b != NULL);
  CHECK(a != b);
  CHECK(check_aligned(a, 16) && check_aligned(b, 16));
  CHECK(usable_ok(th_usable_size(a), 0));
  if (a) memset(a, 0x5a, th_usable_size(a));
  th_free(a);
  th_free(b);
  /* Many live zero-size blocks are all distinct. */
  enum { N = 1000 };
  static void *ps[N];
  for (int i = 0; i < N; i++) ps[i] = th_malloc(0);
  int distinct = 1;
  for (int i = 0; i < N; i++)
    for (int j = i + 1; j < N; j++)
      if (ps[i] == NULL || ps[i] == ps[j]) distinct = 0;
  CHECK(distinct);
  for (int i = 0; i < N; i++) th_free(ps[i]);
}

#define CHECK_ENOMEM(expr, what)                                                          \
  do {                                                                                    \
    errno = 0;                                                                            \
    void *r_ = (expr);                                                                    \
    int e_ = errno;                                                                       \
    CHECK_MSG(r_ == NULL && e_ == ENOMEM, "%s: got %p, errno %d", what, r_, e_);          \
    if (r_ != NULL) th_free(r_);                                                          \
  } while (0)

static void test_overflow(void) {
  char what[128];
  CHECK_ENOMEM(th_calloc(SIZE_MAX / 2 + 1, 2), "calloc(SIZE_MAX/2+1, 2)");
  CHECK_ENOMEM(th_calloc(2, SIZE_MAX / 2 + 1), "calloc(2, SIZE_MAX/2+1)");
  CHECK_ENOMEM(th_calloc(SIZE_MAX, SIZE_MAX), "calloc(SIZE_MAX, SIZE_MAX)");
  CHECK_ENOMEM(th_calloc((size_t)1 << 32, (size_t)1 << 32), "calloc(2^32, 2^32)");
  CHECK_ENOMEM(th_reallocarray(NULL, SIZE_MAX / 2 + 1, 2), "reallocarray(NULL, SIZE_MAX/2+1, 2)");
  CHECK_ENOMEM(th_reallocarray(NULL, (size_t)1 << 33, (size_t)1 << 31), "reallocarray(NULL, 2^33, 2^31)");
  CHECK_ENOMEM(th_malloc(SIZE_MAX), "malloc(SIZE_MAX)");
  CHECK_ENOMEM(th_malloc((size_t)PTRDIFF_MAX + 1), "malloc(PTRDIFF_MAX+1)");
  CHECK_ENOMEM(th_calloc(1, (size_t)PTRDIFF_MAX + 1), "calloc(1, PTRDIFF_MAX+1)");
  CHECK_ENOMEM(th_realloc(NULL, (size_t)PTRDIFF_MAX + 1), "realloc(NULL, PTRDIFF_MAX+1)");

  /* Sizes just below SIZE_MAX are where "size + header" or "size + alignment - 1" wraps to a small number;
   * every entry point must notice rather than return a tiny block. */
  void *live = th_malloc(100);
  CHECK(live != NULL);
  if (live) check_fill(live, 100, 77);
  for (size_t k = 0; k <= 4200; k += (k < 64 ? 1 : 4096 - 63)) {
    size_t n = SIZE_MAX - k;
    snprintf(what, sizeof what, "malloc(SIZE_MAX-%zu)", k);
    CHECK_ENOMEM(th_malloc(n), what);
    snprintf(what, sizeof what, "calloc(1, SIZE_MAX-%zu)", k);
    CHECK_ENOMEM(th_calloc(1, n), what);
    snprintf(what, sizeof what, "calloc(SIZE_MAX-%zu, 1)", k);
    CHECK_ENOMEM(th_calloc(n, 1), what);
    snprintf(what, sizeof what, "realloc(NULL, SIZE_MAX-%zu)", k);
    CHECK_ENOMEM(th_realloc(NULL, n), what);
    snprintf(what, sizeof what, "reallocarray(NULL, 1, SIZE_MAX-%zu)", k);
    CHECK_ENOMEM(th_reallocarray(NULL, 1, n), what);
    if (live) {
      snprintf(what, sizeof what, "realloc(live, SIZE_MAX-%zu)", k);
      CHECK_ENOMEM(th_realloc(live, n), what);
    }
    static const size_t aligns[] = {16, 64, 4096, 65536, (size_t)4 << 20, (size_t)1 << 30};
    for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
      snprintf(what, sizeof what, "aligned_alloc(%zu, SIZE_MAX-%zu)", aligns[a], k);
      CHECK_ENOMEM(th_aligned_alloc(aligns[a], n), what);
      snprintf(what, sizeof what, "memalign(%zu, SIZE_MAX-%zu)", aligns[a], k);
      CHECK_ENOMEM(th_memalign(aligns[a], n), what);
      void *out = (void *)&what; /* a sentinel that must survive the failure */
      int rc = th_posix_memalign(&out, aligns[a], n);
      CHECK_MSG(rc == ENOMEM && out == (void *)&what, "posix_memalign(%zu, SIZE_MAX-%zu) = %d, out %p",
                aligns[a], k, rc, out);
      if (rc == 0) th_free(out);
    }
  }
  /* The failed reallocs left the block where it was, with its contents. */
  if (live) {
    CHECK(check_verify(live, 100, 77) == 100);
    th_free(live);
  }
  /* The allocator still works after all those failures. */
  void *p = th_malloc(32);
  CHECK(p != NULL);
  th_free(p);
}

static void test_posix_memalign_einval(void) {
  static const size_t bad[] = {0, 1, 2, 4, 12, 24, 48, 100, 4095, 4097, ((size_t)1 << 20) + 8, SIZE_MAX,
                               SIZE_MAX / 2 + 2};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    void *out = (void *)bad; /* sentinel */
    int rc = th_posix_memalign(&out, bad[i], 64);
    CHECK_MSG(rc == EINVAL, "posix_memalign(align %zu) = %d", bad[i], rc);
    CHECK_MSG(out == (void *)bad, "posix_memalign(align %zu) changed *out to %p", bad[i], out);
    if (rc == 0) th_free(out);
  }
  /* 8 is a power-of-two multiple of sizeof(void*): valid, and the block still has the 16-byte minimum. */
  void *out = NULL;
  int rc = th_posix_memalign(&out, sizeof(void *), 10);
  CHECK(rc == 0 && out != NULL && check_aligned(out, 16));
  if (rc == 0) th_free(out);
}

/* memalign and (in glibc 2.36) aligned_alloc round an alignment that is not a power of two up to the next
 * one, treat alignments up to 16 as plain malloc, and refuse alignments above SIZE_MAX/2+1 with EINVAL. */
static void test_memalign_rounding(void) {
  static const struct { size_t align, expect; } cases[] = {
      {0, 16}, {1, 16}, {3, 16}, {8, 16}, {24, 32}, {48, 64}, {100, 128}, {1000, 1024},
      {4097, 8192}, {(3u << 20), (4u << 20)}, {(5u << 20) + 1, (8u << 20)}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    for (int fn = 0; fn < 2; fn++) {
      const char *name = fn ? "aligned_alloc" : "memalign";
      for (size_t n = 1; n <= 1001; n += 500) {
        void *p = fn ? th_aligned_alloc(cases[i].align, n) : th_memalign(cases[i].align, n);
        if (!CHECK_MSG(p != NULL, "%s(%zu, %zu)", name, cases[i].align, n)) continue;
        CHECK_MSG(check_aligned(p, cases[i].expect), "%s(%zu, %zu) = %p, want alignment %zu", name,
                  cases[i].align, n, p, cases[i].expect);
        CHECK_MSG(th_usable_size(p) >= n, "%s(%zu, %zu)", name, cases[i].align, n);
        memset(p, 0xa5, n);
        th_free(p);
      }
    }
  }
  static const size_t too_big[] = {SIZE_MAX / 2 + 2, SIZE_MAX - 1, SIZE_MAX};
  for (size_t i = 0; i < sizeof too_big / sizeof too_big[0]; i++) {
    errno = 0;
    void *p = th_memalign(too_big[i], 16);
    CHECK_MSG(p == NULL && errno == EINVAL, "memalign(%#zx) = %p errno %d", too_big[i], p, errno);
    errno = 0;
    void *q = th_aligned_alloc(too_big[i], 16);
    CHECK_MSG(q == NULL && errno == EINVAL, "aligned_alloc(%#zx) = %p errno %d", too_big[i], q, errno);
  }
  /* SIZE_MAX/2+1 is a valid power of two that no address space can honour: ENOMEM, not EINVAL. */
  errno = 0;
  void *p = th_memalign(SIZE_MAX / 2 + 1, 16);
  CHECK_MSG(p == NULL && errno == ENOMEM, "memalign(2^63) = %p errno %d", p, errno);
}

/* An aligned block of size 0 or 1 is handed out near the end of a larger block: it must stay inside it, with
 * 16 usable bytes that no other live block overlaps. */
static void test_aligned_tiny(void) {
  for (size_t a = 32; a <= 4096; a <<= 1) {
    for (size_t n = 0; n <= 1; n++) {
      enum { K = 64 };
      unsigned char *p[K], *q[K];
      for (int i = 0; i < K; i++) {
        p[i] = th_memalign(a, n);
        q[i] = th_malloc(a + 16); /* the size of the block the aligned one is carved from */
      }
      int overlap = 0, small = 0;
      for (int i = 0; i < K; i++) {
        size_t u = th_usable_size(p[i]);
        if (u < 16) small++;
        for (int j = 0; j < K; j++) {
          size_t v = th_usable_size(q[j]);
          if (p[i] < q[j] + v && q[j] < p[i] + u) overlap++;
        }
      }
      CHECK_MSG(overlap == 0 && small == 0, "memalign(%zu, %zu): %d overlaps, %d blocks under 16 B", a, n,
                overlap, small);
      for (int i = 0; i < K; i++) {
        th_free(p[i]);
        th_free(q[i]);
      }
    }
  }
}

static void test_alignments(void) {
  for (size_t a = 16; a <= 8 * MiB; a <<= 1) {
    size_t sizes[] = {0, 1, 100, a - 1, a + 1, 3 * MiB};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
      size_t n = sizes[s];
      for (int fn = 0; fn < 3; fn++) {
        static const char *names[] = {"aligned_alloc", "posix_memalign", "memalign"};
        void *p = NULL;
        if (fn == 0) p = th_aligned_alloc(a, n);
        if (fn == 1) {
          int rc = th_posix_memalign(&p, a, n);
          CHECK_MSG(rc == 0, "posix_memalign(%zu, %zu) = %d", a, n, rc);
          if (rc != 0) p = NULL;
        }
        if (fn == 2) p = th_memalign(a, n);
        if (!CHECK_MSG(p != NULL, "%s(%zu, %zu)", names[fn], a, n)) continue;
        CHECK_MSG(check_aligned(p, a), "%s(%zu, %zu) = %p", names[fn], a, n, p);
        size_t u = th_usable_size(p);
        /* (In secure mode an aligned block lies inside a larger one: at least n, then.) */
        CHECK_MSG(g_secure ? u >= n : usable_ok(u, n), "%s(%zu, %zu): usable %zu", names[fn], a, n, u);
        /* Writing the whole usable size must not disturb anything: with an aligned block carved out of
         * a larger one, a wrong usable size would overwrite the neighbour or the allocator's data. */
        check_fill(p, u, (unsigned)(a + n));
        CHECK_MSG(check_verify(p, u, (unsigned)(a + n)) == u, "%s(%zu, %zu)", names[fn], a, n);
        th_free(p);
      }
    }
  }
  /* Aligned and plain blocks interleaved: aligned blocks freed in an order different from allocation. */
  enum { N = 64 };
  void *ps[N];
  for (int i = 0; i < N; i++) {
    size_t a = (size_t)16 << (i % 10);
    ps[i] = (i % 3 == 0) ? th_malloc((size_t)i * 40 + 1) : th_aligned_alloc(a, (size_t)i * 24 + 8);
    CHECK(ps[i] != NULL);
    if (ps[i]) check_fill(ps[i], th_usable_size(ps[i]), (unsigned)i);
  }
  for (int i = 0; i < N; i++) {
    int j = (i * 37) % N;
    if (ps[j]) CHECK_MSG(check_verify(ps[j], th_usable_size(ps[j]), (unsigned)j) == th_usable_size(ps[j]), "%d", j);
    th_free(ps[j]);
  }
}

/* Every small size, 0 to 160 bytes (calloc zeroes blocks up to 128 bytes with 16-byte stores of its own,
 * in three patterns): a dirtied block freed between two others and taken back by calloc is zero, and its
 * neighbours, whether or not they touch it, keep every byte. */
static void test_calloc_small(void) {
  for (size_t n = 0; n <= 160; n++) {
    unsigned char *a = th_malloc(n), *b = th_malloc(n), *c = th_malloc(n);
    if (!CHECK_MSG(a && b && c, "malloc(%zu)", n)) return;
    size_t ua = th_usable_size(a), ub = th_usable_size(b), uc = th_usable_size(c);
    check_fill(a, ua, 1);
    memset(b, 0xee, ub);
    check_fill(c, uc, 3);
    th_free(b);
    unsigned char *z = th_calloc(1, n);
    if (!CHECK_MSG(z != NULL, "calloc(1, %zu)", n)) return;
    CHECK_MSG(check_all_zero(z, n), "calloc(1, %zu) of a dirtied block", n);
    CHECK_MSG(check_verify(a, ua, 1) == ua, "calloc(1, %zu) wrote into the block before", n);
    CHECK_MSG(check_verify(c, uc, 3) == uc, "calloc(1, %zu) wrote into the block after", n);
    th_free(a);
    th_free(z);
    th_free(c);
  }
}

static void test_calloc(void) {
  static const size_t sizes[] = {1, 16, 48, 200, 1000, 5000, 20000, 100 * KiB, 300 * KiB, 8 * MiB};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    unsigned char *p = th_calloc(1, n);
    if (!CHECK_MSG(p != NULL, "calloc(1, %zu)", n)) continue;
    size_t u = th_usable_size(p);
    CHECK_MSG(check_all_zero(p, n), "calloc(1, %zu) fresh", n);
    /* Dirty it (all of the usable size) and free it: the same size is most likely served from the same
     * memory, which calloc must clear again. A few rounds make reuse near certain. */
    for (int round = 0; round < 4; round++) {
      memset(p, 0xee, u);
      th_free(p);
      p = th_calloc(n, 1);
      if (!CHECK_MSG(p != NULL, "calloc(%zu, 1)", n)) break;
      u = th_usable_size(p);
      CHECK_MSG(check_all_zero(p, n), "calloc(%zu, 1) after dirty free, round %d", n, round);
    }
    /* The count*size product as two factors. */
    th_free(p);
    p = th_calloc(n < 8 ? 1 : n / 8, 8);
    if (p) CHECK_MSG(check_all_zero(p, n < 8 ? 8 : n / 8 * 8), "calloc(%zu, 8)", n / 8);
    th_free(p);
  }
  /* Many blocks of one small size, dirtied and freed, then calloc'ed back. */
  enum { N = 500 };
  void *ps[N];
  for (int i = 0; i < N; i++) {
    ps[i] = th_malloc(64);
    if (ps[i]) memset(ps[i], 0xff, 64);
  }
  for (int i = 0; i < N; i++) th_free(ps[i]);
  int zero = 1;
  for (int i = 0; i < N; i++) {
    ps[i] = th_calloc(4, 16);
    if (ps[i] == NULL || !check_all_zero(ps[i], 64)) zero = 0;
  }
  CHECK(zero);
  for (int i = 0; i < N; i++) th_free(ps[i]);
  void *z = th_calloc(0, 0);
  CHECK(z != NULL);
  th_free(z);
}

/* calloc may skip its memset only for a block never handed out from memory that was zero when carved.
 * Blocks dirtied here come back by every other way a block returns: freed by another thread (collected
 * onto the page later), and from page slots emptied and purged (th_collect), whose memory is zero again
 * except, where the slot does not start or end on an OS page, the unpurged bytes at its ends. */
enum { REMOTE_N = 3000 };
static void *remote_blocks[REMOTE_N];
static void *free_remote_blocks(void *arg) {
  (void)arg;
  for (int i = 0; i < REMOTE_N; i++) th_free(remote_blocks[i]);
  return NULL;
}

static void test_calloc_returned_blocks(void) {
  static const size_t sizes[] = {16, 80, 1000, 3000, 24000};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t n = sizes[s], bad = 0;
    for (int i = 0; i < REMOTE_N; i++) {
      remote_blocks[i] = th_malloc(n);
      if (remote_blocks[i]) memset(remote_blocks[i], 0x5c, th_usable_size(remote_blocks[i]));
    }
    pthread_t t;
    if (!CHECK(pthread_create(&t, NULL, free_remote_blocks, NULL) == 0)) return;
    pthread_join(t, NULL);
    for (int i = 0; i < REMOTE_N; i++) {
      remote_blocks[i] = th_calloc(1, n);
      bad += remote_blocks[i] == NULL || !check_all_zero(remote_blocks[i], n);
    }
    CHECK_MSG(bad == 0, "calloc(1, %zu) after remote frees: %zu of %d blocks not zero", n, bad, REMOTE_N);
    for (int i = 0; i < REMOTE_N; i++) {
      if (remote_blocks[i]) memset(remote_blocks[i], 0xc5, n);
      th_free(remote_blocks[i]);
    }
    th_collect(); /* empty pages go back, and their slots are purged */
    bad = 0;
    for (int i = 0; i < REMOTE_N; i++) {
      remote_blocks[i] = th_calloc(n, 1);
      bad += remote_blocks[i] == NULL || !check_all_zero(remote_blocks[i], n);
    }
    CHECK_MSG(bad == 0, "calloc(%zu, 1) from purged page slots: %zu of %d blocks not zero", n, bad, REMOTE_N);
    for (int i = 0; i < REMOTE_N; i++) th_free(remote_blocks[i]);
  }
}

static void test_realloc_contents(void) {
  static const size_t steps[] = {16, 17, 40, 100, 128, 129, 700, 1024, 4000, 8192, 9000, 40000, 65536,
                                 70000, 200 * KiB, 600 * KiB, MiB, MiB + 1, 3 * MiB, 4 * MiB + 16,
                                 9 * MiB, 33 * MiB, 64 * MiB};
  const size_t nsteps = sizeof steps / sizeof steps[0];
  unsigned char *p = th_realloc(NULL, steps[0]);
  CHECK(p != NULL);
  if (!p) return;
  check_fill(p, steps[0], 5);
  size_t have = steps[0];
  /* Grow through every range: what was written survives; then fill the new part too. */
  for (size_t i = 1; i < nsteps; i++) {
    unsigned char *q = th_realloc(p, steps[i]);
    if (!CHECK_MSG(q != NULL, "grow to %zu", steps[i])) break;
    p = q;
    size_t bad = check_verify(p, have, 5);
    CHECK_MSG(bad == have, "grow %zu -> %zu: byte %zu differs", have, steps[i], bad);
    CHECK(check_aligned(p, 16) && th_usable_size(p) >= steps[i]);
    check_fill(p, steps[i], 5);
    have = steps[i];
  }
  /* Shrink back through every range: the prefix survives. */
  for (size_t i = nsteps - 1; i-- > 0;) {
    unsigned char *q = th_realloc(p, steps[i]);
    if (!CHECK_MSG(q != NULL, "shrink to %zu", steps[i])) break;
    p = q;
    size_t bad = check_verify(p, steps[i], 5);
    CHECK_MSG(bad == steps[i], "shrink %zu -> %zu: byte %zu differs", have, steps[i], bad);
    CHECK(th_usable_size(p) >= steps[i]);
    have = steps[i];
  }
  /* Jumps across several ranges at once, both ways. */
  static const size_t jumps[] = {30, 5 * MiB, 50, 300 * KiB, 20, 2 * MiB, 9000, 24};
  for (size_t i = 0; i < sizeof jumps / sizeof jumps[0]; i++) {
    size_t keep = have < jumps[i] ? have : jumps[i];
    unsigned char *q = th_realloc(p, jumps[i]);
    if (!CHECK_MSG(q != NULL, "jump to %zu", jumps[i])) break;
    p = q;
    CHECK_MSG(check_verify(p, keep, 5) == keep, "jump %zu -> %zu", have, jumps[i]);
    check_fill(p, jumps[i], 5);
    have = jumps[i];
  }
  /* A failed realloc returns NULL, sets ENOMEM, and leaves the block alone. */
  errno = 0;
  void *f = th_realloc(p, SIZE_MAX);
  CHECK(f == NULL && errno == ENOMEM);
  CHECK(check_verify(p, have, 5) == have);
  CHECK(th_usable_size(p) >= have);
  errno = 0;
  f = th_reallocarray(p, SIZE_MAX / 2 + 1, 2);
  CHECK(f == NULL && errno == ENOMEM);
  CHECK(check_verify(p, have, 5) == have);
  /* reallocarray without overflow is realloc. */
  unsigned char *q = th_reallocarray(p, 100, 3);
  CHECK(q != NULL);
  if (q) {
    p = q;
    CHECK(check_verify(p, have < 300 ? have : 300, 5) == (have < 300 ? have : 300));
    CHECK(th_usable_size(p) >= 300);
  }
  /* realloc(p, 0) frees p and returns NULL (glibc); test_misuse checks that p is really freed. */
  errno = 0;
  CHECK(th_realloc(p, 0) == NULL);
  /* realloc(NULL, n) is malloc(n), also for n == 0. */
  void *m = th_realloc(NULL, 0);
  CHECK(m != NULL && check_aligned(m, 16));
  void *m2 = th_realloc(NULL, 0);
  CHECK(m2 != NULL && m2 != m);
  th_free(m);
  th_free(m2);
  m = th_realloc(NULL, 5000);
  CHECK(m != NULL && th_usable_size(m) >= 5000);
  th_free(m);
  /* Same-size and tiny reallocs keep the data too. */
  unsigned char *s = th_malloc(64);
  if (CHECK(s != NULL)) {
    check_fill(s, 64, 9);
    for (int i = 0; i < 100 && s; i++) {
      size_t n = 64 + (size_t)(i % 5) - 2;
      unsigned char *t = th_realloc(s, n);
      if (!CHECK(t != NULL)) break;
      s = t;
      CHECK(check_verify(s, 62, 9) == 62);
    }
    th_free(s);
  }
}

static void test_usable_size(void) {
  CHECK(th_usable_size(NULL) == 0);
  for (size_t n = 1; n <= 70000; n = n * 5 / 4 + 1) {
    void *p = th_malloc(n);
    if (!CHECK_MSG(p != NULL, "%zu", n)) continue;
    size_t u = th_usable_size(p);
    CHECK_MSG(u >= n, "usable(%zu) = %zu", n, u);
    memset(p, 0x3c, u);
    /* Stable: asking again gives the same answer. */
    CHECK(th_usable_size(p) == u);
    th_free(p);
  }
}

static void test_free_null_and_errno(void) {
  errno = 4242;
  th_free(NULL);
  CHECK(errno == 4242);
  static const size_t sizes[] = {1, 100, 5000, 100 * KiB, 900 * KiB, 2 * MiB, 16 * MiB};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    /* Free enough blocks that pages, segments and cached huge blocks are returned to the OS too. */
    enum { N = 40 };
    void *ps[N];
    for (int j = 0; j < N; j++) {
      ps[j] = th_malloc(sizes[i]);
      if (ps[j]) memset(ps[j], 1, sizes[i] < 8192 ? sizes[i] : 8192);
    }
    int kept = 1;
    for (int j = 0; j < N; j++) {
      errno = 1000 + j;
      th_free(ps[j]);
      if (errno != 1000 + j) kept = 0;
    }
    CHECK_MSG(kept, "free of %zu-byte blocks changed errno", sizes[i]);
  }
  errno = 77;
  th_collect();
  CHECK(errno == 77);
}

/* An owner's free is LIFO: the next malloc of the same class gets the block just freed, still in cache, at
 * every size the heap's pages serve (1 B-1 MiB). A block in between, of another class, does not change it.
 * In secure mode the freed block is quarantined instead: the next malloc gets another. */
static void test_free_is_lifo(void) {
  static const size_t sizes[] = {1, 48, 1000, 5000, 40 * KiB, 100 * KiB, 900 * KiB};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    void *keep = th_malloc(sizes[i]); /* the page stays in use, so the free below cannot empty it */
    void *p = th_malloc(sizes[i]);
    if (!CHECK(keep != NULL && p != NULL)) continue;
    memset(p, 0x11, sizes[i]);
    th_free(p);
    void *other = th_malloc(sizes[i] * 2 + 100);
    void *q = th_malloc(sizes[i]);
    if (g_secure)
      CHECK_MSG(q != p, "secure mode: a %zu-byte malloc after a free of the same size gave the freed %p", sizes[i], p);
    else
      CHECK_MSG(q == p, "a %zu-byte malloc after a free of the same size gave %p, not the freed %p", sizes[i], q, p);
    th_free(q);
    th_free(other);
    th_free(keep);
  }
}

/* A huge realloc must move page mappings, not bytes: copying 64 MiB would touch 16384 fresh pages and
 * take as many page faults, while remapping takes a handful. */
static void test_huge_realloc_no_copy(void) {
  size_t n = 64 * MiB;
  unsigned char *p = th_malloc(n);
  if (!CHECK(p != NULL)) return;
  for (size_t i = 0; i < n; i += 4096) p[i] = (unsigned char)(i >> 12);
  p[n - 1] = 0x77;
  long before = minor_faults();
  unsigned char *q = th_realloc(p, 2 * n);
  long grow_faults = minor_faults() - before;
  if (!CHECK(q != NULL)) {
    th_free(p);
    return;
  }
  printf("realloc 64 MiB -> 128 MiB: %ld minor faults\n", grow_faults);
  CHECK_MSG(grow_faults < 1000, "growing took %ld faults", grow_faults);
  int ok = q[n - 1] == 0x77;
  for (size_t i = 0; i < n; i += 4096) ok &= q[i] == (unsigned char)(i >> 12);
  CHECK(ok);
  /* The new half is usable. */
  memset(q + n, 0x11, n);
  before = minor_faults();
  unsigned char *r = th_realloc(q, 24 * MiB);
  long shrink_faults = minor_faults() - before;
  if (!CHECK(r != NULL)) {
    th_free(q);
    return;
  }
  printf("realloc 128 MiB -> 24 MiB: %ld minor faults\n", shrink_faults);
  CHECK_MSG(shrink_faults < 1000, "shrinking took %ld faults", shrink_faults);
  ok = 1;
  for (size_t i = 0; i < 24 * MiB; i += 4096) ok &= r[i] == (unsigned char)(i >> 12);
  CHECK(ok);
  th_free(r);
}

/* A block that realloc grows past 128 KiB becomes a block of its own segment and grows where it is from
 * then on: 4 KiB at a time up to 3 MiB, its bytes kept, at one address. Shrunk back to 200 KiB, it stays
 * there and the pages past its new end go back to the OS. Secure mode keeps blocks in their classes. */
static void test_realloc_grows_in_place(void) {
  if (g_secure) return;
  unsigned char *p = th_realloc(NULL, 100 * KiB);
  if (!CHECK(p != NULL)) return;
  check_fill(p, 100 * KiB, 9);
  size_t have = 132 * KiB;
  unsigned char *huge = th_realloc(p, have);
  if (!CHECK(huge != NULL)) {
    th_free(p);
    return;
  }
  p = huge;
  CHECK(check_verify(p, 100 * KiB, 9) == 100 * KiB);
  check_fill(p, have, 9);
  size_t moves = 0, bad = 0, steps = 0, not_copied = 0;
  th_stats_t s0, s1;
  th_stats_get(&s0);
  for (size_t n = have + 4 * KiB; n <= 3 * MiB; n += 4 * KiB) {
    unsigned char *q = th_realloc(p, n);
    if (!CHECK_MSG(q != NULL, "grow to %zu", n)) break;
    moves += q != p;
    steps++, not_copied += have;
    p = q;
    for (size_t i = have; i < n; i++) p[i] = check_pattern_byte(i, 9);
    have = n;
  }
  bad = check_verify(p, have, 9);
  CHECK_MSG(bad == have, "grown to %zu: byte %zu differs", have, bad);
  CHECK_MSG(moves == 0, "growing 132 KiB -> 3 MiB by 4 KiB moved the block %zu times", moves);
  th_stats_get(&s1); /* each step counted as grown in place, its bytes as not copied */
  CHECK_MSG(s1.remaps_in_place - s0.remaps_in_place == steps &&
                s1.remap_bytes_not_copied - s0.remap_bytes_not_copied == not_copied,
            "%zu steps: %zu counted in place, %zu of %zu bytes not copied", steps,
            s1.remaps_in_place - s0.remaps_in_place, s1.remap_bytes_not_copied - s0.remap_bytes_not_copied,
            not_copied);
  unsigned char *q = th_realloc(p, 200 * KiB);
  if (!CHECK(q != NULL)) {
    th_free(p);
    return;
  }
  CHECK_MSG(q == p, "a shrink to 200 KiB moved the block");
  CHECK(check_verify(q, 200 * KiB, 9) == 200 * KiB);
  CHECK(th_usable_size(q) >= 200 * KiB && th_usable_size(q) < 200 * KiB + 4096);
  size_t ps = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t end = ((uintptr_t)q + 200 * KiB + ps - 1) & ~(uintptr_t)(ps - 1); /* the first page past it */
  long tail = resident_pages(end, (((uintptr_t)q + have) & ~(uintptr_t)(ps - 1)) - end);
  printf("realloc 3 MiB -> 200 KiB: %ld pages past the new end still resident\n", tail);
  CHECK_MSG(tail == 0, "%ld pages past the shrunk block's end still resident", tail);
  th_free(q);
}

int main(void) {
  const char *secure = getenv("THREADHEAP_SECURE");
  g_secure = secure != NULL && secure[0] >= '1' && secure[0] <= '2';
  test_minimum_and_alignment();
  test_malloc_zero();
  test_overflow();
  test_posix_memalign_einval();
  test_memalign_rounding();
  test_calloc();
  test_calloc_small();
  test_calloc_returned_blocks();
  test_realloc_contents();
  test_usable_size();
  test_free_null_and_errno();
  test_free_is_lifo();
  test_huge_realloc_no_copy();
  test_realloc_grows_in_place();
  /* Last: a wrong alignment answer may end the process, and the other results are already in. */
  test_aligned_tiny();
  test_alignments();
  return check_summary();
}
