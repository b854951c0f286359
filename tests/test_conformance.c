/* test_conformance.c: glibc's allocation interface through the standard names, in the spirit of glibc's own
 * malloc tests. The same source is built twice: linked to threadheap (run with --threadheap) and plain, on
 * glibc's malloc (run with --glibc), so every shared expectation is checked against glibc itself. Cases:
 *   - too-large requests at every entry point, the __libc_ aliases included: NULL and ENOMEM;
 *   - the error cases of posix_memalign, memalign and aligned_alloc; blocks of random alignments (16 B to
 *     64 KiB) and sizes freed by another thread;
 *   - calloc zeroing, also of memory just freed with non-zero contents, in every size range;
 *   - realloc: NULL, 0, growing and shrinking across the size ranges with contents kept, failure keeps the block;
 *   - free, and realloc(p, 0), keep errno; malloc(0) and realloc(NULL, 0) are unique;
 *   - a low RLIMIT_AS: malloc returns NULL (no crash), and works again once memory is freed (in a child),
 *     also with four threads running out at once, which with threadheap together get at least half as many
 *     blocks as the main thread freed just before;
 *   - mallopt, malloc_info; with threadheap also malloc_trim, mallinfo/mallinfo2 (and their saturation),
 *     malloc_stats, and malloc_usable_size/realloc of a pointer threadheap never returned. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "threadheap.h"

/* glibc exports these without declaring them. */
extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

static int with_threadheap;

/* mallinfo is deprecated in glibc's header (its fields are int); it is part of the interface under test. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* --threadheap: the threadheap-only checks run too */

/* Hidden from the optimiser, so that it neither folds a too-large request nor warns about it. */
static volatile size_t v_size_max = SIZE_MAX;
static volatile size_t v_ptrdiff_max = PTRDIFF_MAX;

static const size_t range_sizes[] = {1, 16, 24, 100, 1000, 8192, 9000, 65536, 70000, 500000, 1048576,
                                     1048577, 3u << 20, 9u << 20};
#define NSIZES (sizeof range_sizes / sizeof range_sizes[0])

static void fill(unsigned char *p, size_t n, unsigned key) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(key + i * 31 + (i >> 8));
}
static int intact(const unsigned char *p, size_t n, unsigned key) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (unsigned char)(key + i * 31 + (i >> 8))) return 0;
  return 1;
}
static int all_zero(const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != 0) return 0;
  return 1;
}

/* ---- too large */

typedef void *(*one_arg_fn)(size_t);

static void expect_enomem(const char *name, void *p) {
  int e = errno;
  CHECK_MSG(p == NULL && e == ENOMEM, "%s: returned %p, errno %d (want NULL, ENOMEM)", name, p, e);
  free(p);
}

static void test_too_large(void) {
  const size_t huge[] = {v_size_max, v_size_max - 4096, v_ptrdiff_max, v_ptrdiff_max + 1, v_size_max / 2 + 2};
  for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
    size_t n = huge[i];
    errno = 0;
    expect_enomem("malloc", malloc(n));
    errno = 0;
    expect_enomem("__libc_malloc", __libc_malloc(n));
    errno = 0;
    expect_enomem("calloc(n, 1)", calloc(n, 1));
    errno = 0;
    expect_enomem("calloc(1, n)", calloc(1, n));
    errno = 0;
    expect_enomem("__libc_calloc", __libc_calloc(n, 1));
    errno = 0;
    expect_enomem("realloc(NULL, n)", realloc(NULL, n));
    errno = 0;
    expect_enomem("__libc_realloc(NULL, n)", __libc_realloc(NULL, n));
    errno = 0;
    expect_enomem("reallocarray(NULL, n, 1)", reallocarray(NULL, n, 1));
    errno = 0;
    expect_enomem("memalign(64, n)", memalign(64, n));
    errno = 0;
    expect_enomem("__libc_memalign(64, n)", __libc_memalign(64, n));
    errno = 0;
    expect_enomem("aligned_alloc(64, n)", aligned_alloc(64, n));
    errno = 0;
    expect_enomem("valloc", valloc(n));
    errno = 0;
    expect_enomem("__libc_valloc", __libc_valloc(n));
    errno = 0;
    expect_enomem("pvalloc", pvalloc(n));
    errno = 0;
    expect_enomem("__libc_pvalloc", __libc_pvalloc(n));
    void *out = (void *)&out;
    int rc = posix_memalign(&out, 64, n);
    CHECK_MSG(rc == ENOMEM && out == (void *)&out, "posix_memalign(64, %zu): %d, out changed: %d", n, rc,
              out != (void *)&out);
  }
  /* Products that overflow. */
  errno = 0;
  expect_enomem("calloc overflow", calloc(v_size_max / 2 + 1, 2));
  errno = 0;
  expect_enomem("calloc overflow 2", calloc(v_size_max >> 31, (size_t)1 << 31));
  errno = 0;
  expect_enomem("reallocarray overflow", reallocarray(NULL, v_size_max / 8, 16));
}

/* A failed growth leaves the old block as it was. The calls go through volatile pointers: GCC assumes that any
 * realloc frees its argument, and would warn about the uses that follow. */
static void *(*volatile realloc_fn)(void *, size_t) = realloc;
static void *(*volatile reallocarray_fn)(void *, size_t, size_t) = reallocarray;

static void test_failed_growth(void) {
  unsigned char *p = malloc(200);
  if (CHECK(p != NULL)) {
    fill(p, 200, 5);
    errno = 0;
    void *q = realloc_fn(p, v_size_max - 8192);
    CHECK(q == NULL && errno == ENOMEM);
    errno = 0;
    q = reallocarray_fn(p, v_size_max / 4, 8);
    CHECK(q == NULL && errno == ENOMEM);
    CHECK(intact(p, 200, 5));
    p = realloc(p, 400);
    CHECK(p != NULL && intact(p, 200, 5));
    free(p);
  }
}

/* ---- aligned allocation */

static void test_aligned(void) {
  void *out = (void *)&out;
  /* posix_memalign: the alignment must be a power of two and a multiple of sizeof(void *). */
  static const size_t bad[] = {0, 1, 2, 4, 12, 24, 48, 4095, 4097};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    out = (void *)&out;
    int rc = posix_memalign(&out, bad[i], 64);
    CHECK_MSG(rc == EINVAL && out == (void *)&out, "posix_memalign(alignment %zu): %d", bad[i], rc);
  }
  static const size_t good[] = {8, 16, 32, 64, 4096, 65536, 1u << 20, 4u << 20};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    for (size_t s = 0; s < 4; s++) {
      size_t n = (size_t[]){0, 1, 5000, 3u << 20}[s];
      out = NULL;
      int rc = posix_memalign(&out, good[i], n);
      CHECK_MSG(rc == 0 && out != NULL && ((uintptr_t)out & (good[i] - 1)) == 0,
                "posix_memalign(%zu, %zu): %d, %p", good[i], n, rc, out);
      if (out && n) memset(out, 0x5a, n);
      free(out);
      void *m = memalign(good[i], n);
      CHECK_MSG(m != NULL && ((uintptr_t)m & (good[i] - 1)) == 0, "memalign(%zu, %zu): %p", good[i], n, m);
      free(m);
      m = aligned_alloc(good[i], n);
      CHECK_MSG(m != NULL && ((uintptr_t)m & (good[i] - 1)) == 0, "aligned_alloc(%zu, %zu): %p", good[i], n, m);
      free(m);
    }
  }
  /* glibc 2.36: memalign (and aligned_alloc, the same function) rounds an alignment that is not a power of
   * two up to the next one, and alignments up to 16 are plain mallocs. */
  static const size_t odd[] = {1, 3, 24, 100, 3000};
  for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
    size_t want = 1;
    while (want < odd[i]) want <<= 1;
    void *m = memalign(odd[i], 100);
    CHECK_MSG(m != NULL && ((uintptr_t)m & (want - 1)) == 0, "memalign(%zu): %p", odd[i], m);
    free(m);
    m = aligned_alloc(odd[i], 100);
    CHECK_MSG(m != NULL && ((uintptr_t)m & (want - 1)) == 0, "aligned_alloc(%zu): %p", odd[i], m);
    free(m);
  }
  /* An alignment above half the address space is no power of two glibc accepts: EINVAL. */
  errno = 0;
  void *m = memalign(v_size_max / 2 + 2, 16);
  CHECK_MSG(m == NULL && errno == EINVAL, "memalign(SIZE_MAX/2+2): %p errno %d", m, errno);
  errno = 0;
  m = __libc_memalign(v_size_max / 2 + 2, 16);
  CHECK(m == NULL && errno == EINVAL);
  /* valloc and pvalloc: page-aligned; pvalloc rounds the size up to whole pages (one page for 0). */
  size_t ps = (size_t)sysconf(_SC_PAGESIZE);
  unsigned char *v = valloc(10);
  CHECK(v != NULL && ((uintptr_t)v & (ps - 1)) == 0);
  free(v);
  /* pvalloc(0): glibc 2.36 masks the rounded size with -(pagesize - 1), which leaves 1 byte for 0, so only
   * threadheap is held to a whole page here. */
  v = pvalloc(0);
  CHECK(v != NULL && ((uintptr_t)v & (ps - 1)) == 0);
  if (with_threadheap) {
    CHECK(v != NULL && malloc_usable_size(v) >= ps);
    if (v) memset(v, 1, ps);
  }
  free(v);
  v = pvalloc(ps + 1);
  CHECK(v != NULL && ((uintptr_t)v & (ps - 1)) == 0 && malloc_usable_size(v) >= 2 * ps);
  if (v) memset(v, 1, 2 * ps);
  free(v);
  v = __libc_valloc(1);
  CHECK(v != NULL && ((uintptr_t)v & (ps - 1)) == 0);
  __libc_free(v);
  v = __libc_pvalloc(1);
  CHECK(v != NULL && ((uintptr_t)v & (ps - 1)) == 0 && malloc_usable_size(v) >= ps);
  __libc_free(v);
}

/* ---- calloc zeroing */

static void test_calloc(void) {
  for (int round = 0; round < 3; round++) {
    for (size_t i = 0; i < NSIZES; i++) {
      size_t n = range_sizes[i];
      /* Dirty blocks of this size, then free them: calloc may get exactly that memory back. */
      unsigned char *dirty[8];
      for (int k = 0; k < 8; k++) {
        dirty[k] = malloc(n);
        if (dirty[k]) memset(dirty[k], 0xa5, malloc_usable_size(dirty[k]));
      }
      for (int k = 0; k < 8; k++) free(dirty[k]);
      for (int k = 0; k < 8; k++) {
        unsigned char *z = k % 2 ? calloc(n, 1) : calloc(1, n);
        if (!CHECK_MSG(z != NULL, "calloc(%zu)", n)) continue;
        CHECK_MSG(all_zero(z, n), "calloc(%zu) round %d: not zeroed", n, round);
        dirty[k] = z;
      }
      for (int k = 0; k < 8; k++) free(dirty[k]);
    }
  }
  /* count * size, in both orders, and the __libc_ alias. */
  unsigned char *z = calloc(1000, 70);
  CHECK(z != NULL && all_zero(z, 70000));
  free(z);
  z = __libc_calloc(3, 1 << 20);
  CHECK(z != NULL && all_zero(z, 3u << 20));
  __libc_free(z);
  z = calloc(0, 10);
  CHECK(z != NULL);
  free(z);
}

/* ---- realloc */

static void test_realloc(void) {
  /* malloc(0) and realloc(NULL, 0): unique, distinct, freeable. */
  void *z[8];
  for (int i = 0; i < 8; i++) z[i] = i % 2 ? malloc(0) : realloc(NULL, 0);
  int distinct = 1;
  for (int i = 0; i < 8; i++) {
    CHECK(z[i] != NULL);
    for (int j = 0; j < i; j++) distinct &= z[i] != z[j];
  }
  CHECK(distinct);
  for (int i = 0; i < 8; i++) free(z[i]);

  /* realloc(p, 0) frees p, returns NULL and leaves errno alone. */
  for (size_t i = 0; i < NSIZES; i++) {
    void *p = malloc(range_sizes[i]);
    errno = 1234;
    void *q = realloc(p, 0);
    CHECK_MSG(q == NULL && errno == 1234, "realloc(p of %zu, 0): %p errno %d", range_sizes[i], q, errno);
  }
  void *p = __libc_malloc(100);
  errno = 77;
  CHECK(__libc_realloc(p, 0) == NULL && errno == 77);

  /* Up through every range and back down; the common prefix survives every step. */
  unsigned char *b = NULL;
  size_t have = 0;
  const unsigned key = 9;
  for (int dir = 0; dir < 2; dir++) {
    for (size_t k = 0; k < NSIZES; k++) {
      size_t n = range_sizes[dir == 0 ? k : NSIZES - 1 - k];
      unsigned char *q = realloc(b, n);
      if (!CHECK_MSG(q != NULL, "realloc to %zu", n)) break;
      size_t keep = have < n ? have : n;
      CHECK_MSG(intact(q, keep, key), "realloc %zu -> %zu lost the contents", have, n);
      fill(q, n, key);
      CHECK(malloc_usable_size(q) >= n);
      b = q;
      have = n;
    }
  }
  free(b);
  /* realloc(NULL, n) is malloc(n). */
  b = realloc(NULL, 5000);
  CHECK(b != NULL && malloc_usable_size(b) >= 5000);
  free(b);
  /* reallocarray keeps the contents as realloc does. */
  unsigned int *arr = reallocarray(NULL, 10, sizeof *arr);
  if (CHECK(arr != NULL)) {
    for (unsigned i = 0; i < 10; i++) arr[i] = i * 7;
    arr = reallocarray(arr, 100000, sizeof *arr);
    int ok = arr != NULL;
    for (unsigned i = 0; ok && i < 10; i++) ok &= arr[i] == i * 7;
    CHECK(ok);
    free(arr);
  }
}

/* ---- errno and free */

static void test_errno(void) {
  for (size_t i = 0; i < NSIZES; i++) {
    void *a = malloc(range_sizes[i]);
    void *al = memalign(4096, range_sizes[i]);
    errno = 4321;
    free(a);
    free(al);
    free(NULL);
    CHECK_MSG(errno == 4321, "free of %zu bytes changed errno to %d", range_sizes[i], errno);
  }
  /* Huge blocks go to the OS when freed with no cache room: still no errno change. */
  void *big[4];
  for (int i = 0; i < 4; i++) big[i] = malloc((size_t)(40 + i) << 20);
  errno = 99;
  for (int i = 0; i < 4; i++) __libc_free(big[i]);
  CHECK(errno == 99);
  CHECK(malloc_usable_size(NULL) == 0);
}

/* ---- low RLIMIT_AS, in a child */

static size_t vm_size(void) { return check_statm_bytes(0); }

/* Allocates blocks of one size until NULL under the limit; returns how many it got (0 on a wrong errno). */
static size_t fill_until_null(void **slots, size_t max, size_t n, int *bad) {
  size_t got = 0;
  while (got < max) {
    errno = 0;
    void *p = malloc(n);
    if (p == NULL) {
      if (errno != ENOMEM) *bad |= 1;
      break;
    }
    memset(p, (int)(got & 255), n < 4096 ? n : 4096); /* touch it: this memory must really be usable */
    slots[got++] = p;
  }
  if (got == max) *bad |= 2; /* the limit never bit */
  return got;
}

#define RLIMIT_THREADS 4
static size_t rlimit_size;
static void *rlimit_slots[RLIMIT_THREADS][50000];

static pthread_barrier_t rlimit_go;

/* Waits for the go (the threads are made before the limit, so that their stacks are not what runs out), then
 * fills until NULL and frees: returns how many blocks it had, or -1 on a wrong errno. */
static void *rlimit_thread(void *arg) {
  pthread_barrier_wait(&rlimit_go);
  int me = (int)(intptr_t)arg, bad = 0;
  size_t got = fill_until_null(rlimit_slots[me], 50000, rlimit_size, &bad);
  for (size_t i = 0; i < got; i++) free(rlimit_slots[me][i]);
  return (void *)(intptr_t)((bad & 1) ? -1 : (intptr_t)got);
}

/* The barrier threadheap's sweep needs (os_fence_all_threads): without it, a thread's freed memory waits for
 * that thread's next slow path. */
static int membarrier_works(void) {
  long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  return cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED);
}

/* One size range per child, so that each starts from a fresh address space. */
static int rlimit_child(size_t size, size_t other) {
  /* Cached memory the parent left (freed huge blocks) would serve the first blocks with no new mapping:
   * give it back first, so that the limit is 96 MiB of new address space. */
  pthread_barrier_init(&rlimit_go, NULL, RLIMIT_THREADS + 1);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 << 10);
  pthread_t t[RLIMIT_THREADS];
  int made = 0;
  for (int i = 0; i < RLIMIT_THREADS; i++) made += pthread_create(&t[i], &attr, rlimit_thread, (void *)(intptr_t)i) == 0;
  if (made != RLIMIT_THREADS) return 70;
  malloc_trim(0);
  size_t limit = vm_size() + ((size_t)96 << 20);
  struct rlimit rl = {limit, limit};
  if (setrlimit(RLIMIT_AS, &rl) != 0) return 10;
  static void *slots[200000];
  int bad = 0;
  size_t got = fill_until_null(slots, 200000, size, &bad);
  if (bad || got == 0) {
    fprintf(stderr, "size %zu: %zu blocks before NULL (bad %d)\n", size, got, bad);
    return 20;
  }
  /* Everything else fails cleanly too while the space is used up. */
  errno = 0;
  if (calloc(64, 1 << 20) != NULL || errno != ENOMEM) return 30;
  void *out;
  if (posix_memalign(&out, 1 << 20, 64 << 20) != ENOMEM) return 40;
  errno = 0;
  if (realloc(slots[0], 64 << 20) != NULL || errno != ENOMEM) return 41;
  for (size_t i = 0; i < got; i++) free(slots[i]);
  /* Freed memory serves again: as many blocks as before, less a little for lost alignment slack. */
  int bad2 = 0;
  size_t again = fill_until_null(slots, 200000, size, &bad2);
  if (bad2 || again + again / 8 + 2 < got) {
    fprintf(stderr, "size %zu: %zu blocks first, %zu after freeing (bad %d)\n", size, got, again, bad2);
    return 50;
  }
  for (size_t i = 0; i < again; i++) free(slots[i]);
  /* The freed space serves another size range too, with no malloc_trim: at least 32 MiB of it (a failed
   * map gives empty pages and cached segments back first). */
  size_t n = 0;
  while (n < 200000 && (slots[n] = malloc(other)) != NULL) memset(slots[n++], 3, other < 4096 ? other : 4096);
  if (n * other < ((size_t)32 << 20)) {
    fprintf(stderr, "after freeing, only %zu blocks of %zu bytes\n", n, other);
    return 60;
  }
  for (size_t i = 0; i < n; i++) free(slots[i]);
  /* Four threads run out at once: each gets NULL with ENOMEM (never a crash), and after they free, a
   * block of the size serves again. */
  rlimit_size = size;
  pthread_barrier_wait(&rlimit_go);
  size_t total = 0;
  for (int i = 0; i < RLIMIT_THREADS; i++) {
    void *r;
    pthread_join(t[i], &r);
    if ((intptr_t)r < 0) {
      fprintf(stderr, "size %zu: thread %d saw a wrong errno\n", size, i);
      return 71;
    }
    total += (size_t)(intptr_t)r;
  }
  /* With threadheap, the main thread's freed memory serves them: at least half as many blocks as it had (a
   * thread that runs out sweeps the other heaps, sweep.c, which needs the kernel's membarrier). Not asked
   * of glibc, whose threads may each map an arena of their own out of the same space: on a loaded machine
   * they got 30,000 to 50,000 blocks of 1,000 bytes where its main thread had 112,282. */
  if (with_threadheap && total * 2 < got && membarrier_works()) {
    fprintf(stderr, "size %zu: the main thread had %zu blocks, the four threads after it %zu\n", size, got, total);
    return 72;
  }
  void *last = malloc(size);
  if (last == NULL) return 73;
  free(last);
  return 0;
}

static void test_rlimit(void) {
  const size_t sizes[] = {1000, 30000, 600000, 5u << 20};
  for (size_t s = 0; s < 4; s++) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(60);
      _exit(rlimit_child(sizes[s], sizes[(s + 1) % 4]));
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "RLIMIT_AS child for %zu bytes: %s %d", sizes[s],
              WIFEXITED(status) ? "exit" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  }
}

/* ---- aligned blocks of random alignments, freed by another thread (both allocators) */

#define ALIGNED_RING 64
static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  void *block[ALIGNED_RING];
  size_t align[ALIGNED_RING], size[ALIGNED_RING];
  unsigned head, tail;
  int done;
} ring = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {0}, {0}, {0}, 0, 0, 0};
static int aligned_bad;

static void *aligned_consumer(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&ring.lock);
    while (ring.head == ring.tail && !ring.done) pthread_cond_wait(&ring.cond, &ring.lock);
    if (ring.head == ring.tail) {
      pthread_mutex_unlock(&ring.lock);
      return NULL;
    }
    unsigned k = ring.head++ % ALIGNED_RING;
    unsigned char *p = ring.block[k];
    size_t a = ring.align[k], n = ring.size[k];
    pthread_cond_broadcast(&ring.cond);
    pthread_mutex_unlock(&ring.lock);
    if (((uintptr_t)p & (a - 1)) != 0 || p[0] != (unsigned char)a || p[n - 1] != (unsigned char)(n >> 4))
      aligned_bad++;
    free(p);
  }
}

static void test_aligned_threads(void) {
  pthread_t t;
  if (!CHECK(pthread_create(&t, NULL, aligned_consumer, NULL) == 0)) return;
  unsigned seed = 7;
  int made = 0;
  for (int i = 0; i < 20000; i++) {
    size_t a = (size_t)16 << (rand_r(&seed) % 13); /* 16 B .. 64 KiB */
    size_t n = 2 + (size_t)rand_r(&seed) % ((rand_r(&seed) % 16) ? 5000 : 3000000); /* first and last bytes differ */
    void *p = NULL;
    int how = rand_r(&seed) % 3;
    if (how == 0) p = aligned_alloc(a, (n + a - 1) / a * a);
    else if (how == 1) p = memalign(a, n);
    else if (posix_memalign(&p, a, n) != 0) p = NULL;
    if (p == NULL) {
      aligned_bad++;
      continue;
    }
    ((unsigned char *)p)[0] = (unsigned char)a;
    ((unsigned char *)p)[n - 1] = (unsigned char)(n >> 4);
    pthread_mutex_lock(&ring.lock);
    while (ring.tail - ring.head == ALIGNED_RING) pthread_cond_wait(&ring.cond, &ring.lock);
    unsigned k = ring.tail++ % ALIGNED_RING;
    ring.block[k] = p, ring.align[k] = a, ring.size[k] = n;
    pthread_cond_broadcast(&ring.cond);
    pthread_mutex_unlock(&ring.lock);
    made++;
  }
  pthread_mutex_lock(&ring.lock);
  ring.done = 1;
  pthread_cond_broadcast(&ring.cond);
  pthread_mutex_unlock(&ring.lock);
  pthread_join(t, NULL);
  CHECK_MSG(aligned_bad == 0 && made == 20000, "%d of 20000 aligned blocks wrong or missing (%d made)", aligned_bad,
            made);
}

/* ---- mallopt and malloc_info (both allocators) */

static void test_mallopt_info(void) {
  CHECK(mallopt(M_MMAP_THRESHOLD, 1 << 20) == 1);
  CHECK(mallopt(M_TRIM_THRESHOLD, 1 << 20) == 1);
  CHECK(mallopt(M_ARENA_MAX, 4) == 1);
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (CHECK(f != NULL)) {
    CHECK(malloc_info(0, f) == 0);
    CHECK(malloc_info(1, f) == EINVAL); /* glibc returns the error number */
    fclose(f);
    CHECK(text != NULL && strstr(text, "<malloc version=") != NULL && strstr(text, "</malloc>") != NULL);
    free(text);
  }
}

/* ---- threadheap only: malloc_trim, mallinfo, malloc_stats, foreign pointers */

static void test_trim_and_info(void) {
  void (*stats_get)(th_stats_t *) = (void (*)(th_stats_t *))dlsym(RTLD_DEFAULT, "th_stats_get");
  if (!CHECK(stats_get != NULL)) return;
  th_stats_t s;
  /* Huge blocks freed go to the cache; malloc_trim empties it and says so. */
  void *big[3];
  for (int i = 0; i < 3; i++) {
    big[i] = malloc((size_t)(5 + i) << 20);
    if (big[i]) memset(big[i], 1, (size_t)(5 + i) << 20);
  }
  struct mallinfo2 m0 = mallinfo2();
  stats_get(&s);
  CHECK_MSG(m0.uordblks >= ((size_t)18 << 20) && m0.arena >= m0.uordblks, "uordblks %zu arena %zu",
            m0.uordblks, m0.arena);
  CHECK(m0.usmblks >= m0.uordblks && m0.hblks == 0 && m0.hblkhd == 0);
  struct mallinfo mi = mallinfo();
  CHECK(mi.uordblks > (18 << 20) && (size_t)mi.arena >= (size_t)mi.uordblks);
  for (int i = 0; i < 3; i++) free(big[i]);
  struct mallinfo2 m1 = mallinfo2();
  CHECK_MSG(m1.uordblks + ((size_t)18 << 20) <= m0.uordblks, "uordblks %zu after freeing 18 MiB (was %zu)",
            m1.uordblks, m0.uordblks);
  CHECK_MSG(m1.keepcost >= ((size_t)18 << 20), "keepcost %zu: the freed huge blocks are not cached", m1.keepcost);
  CHECK(malloc_trim(0) == 1);
  struct mallinfo2 m2 = mallinfo2();
  stats_get(&s);
  CHECK_MSG(m2.keepcost == 0 && s.cached == 0, "after malloc_trim: keepcost %zu", m2.keepcost);
  CHECK_MSG(m2.arena + ((size_t)18 << 20) <= m1.arena, "arena %zu after trim, %zu before", m2.arena, m1.arena);
  CHECK(malloc_trim(0) == 0); /* nothing left to give back */

  /* Saturation: 3 GiB of address space in one block (never touched) is over INT_MAX. */
  void *g = malloc((size_t)3 << 30);
  if (CHECK(g != NULL)) {
    struct mallinfo2 w = mallinfo2();
    struct mallinfo wi = mallinfo();
    CHECK_MSG(w.uordblks > (size_t)INT_MAX && wi.uordblks == INT_MAX && wi.arena == INT_MAX,
              "uordblks %zu, int %d", w.uordblks, wi.uordblks);
    free(g);
    malloc_trim(0);
  }

  /* malloc_stats writes the counters to stderr. */
  fflush(stderr);
  int pipefd[2];
  if (CHECK(pipe(pipefd) == 0)) {
    int saved = dup(STDERR_FILENO);
    dup2(pipefd[1], STDERR_FILENO);
    malloc_stats();
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(pipefd[1]);
    char buf[4096];
    ssize_t n = read(pipefd[0], buf, sizeof buf - 1);
    close(pipefd[0]);
    buf[n > 0 ? n : 0] = '\0';
    CHECK_MSG(strstr(buf, "threadheap: committed") != NULL && strstr(buf, "threadheap: mapped") != NULL,
              "malloc_stats wrote: %.200s", buf);
  }
}

/* Everything fd gives until end of file (at most size - 1 bytes) into buf as a string; closes fd. */
static void read_all(int fd, char *buf, size_t size) {
  size_t len = 0;
  ssize_t r;
  while (len < size - 1 && (r = read(fd, buf + len, size - 1 - len)) > 0) len += (size_t)r;
  buf[len] = '\0';
  close(fd);
}

/* ---- malloc_stats (both allocators): glibc's summary lines, and no cancellation point */

static int stats_pipe[2];
static volatile int stats_returned;

static void *stats_with_cancel_pending(void *arg) {
  (void)arg;
  pthread_setcanceltype(PTHREAD_CANCEL_DEFERRED, NULL);
  pthread_cancel(pthread_self()); /* pending: acted on at the next cancellation point */
  malloc_stats();
  stats_returned = 1;
  pthread_testcancel();
  return NULL;
}

static void test_malloc_stats(void) {
  fflush(stderr);
  if (!CHECK(pipe(stats_pipe) == 0)) return;
  int saved = dup(STDERR_FILENO);
  dup2(stats_pipe[1], STDERR_FILENO);
  pthread_t t;
  void *result = NULL;
  int made = pthread_create(&t, NULL, stats_with_cancel_pending, NULL) == 0;
  if (made) pthread_join(t, &result);
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(stats_pipe[1]);
  char buf[8192];
  read_all(stats_pipe[0], buf, sizeof buf);
  CHECK(made);
  CHECK_MSG(stats_returned == 1 && result == PTHREAD_CANCELED,
            "malloc_stats with a cancellation pending: returned %d, thread %s", stats_returned,
            result == PTHREAD_CANCELED ? "cancelled" : "not cancelled");
  static const char *lines[] = {"Arena 0:\n", "\nsystem bytes     = ", "\nin use bytes     = ",
                                "\nTotal (incl. mmap):\n", "\nmax mmap regions = ", "\nmax mmap bytes   = "};
  for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
    CHECK_MSG(strstr(buf, lines[i]) != NULL, "malloc_stats lacks \"%s\": wrote \"%.300s\"", lines[i], buf);
}

/* malloc_usable_size and realloc of memory threadheap never returned stop the process with one line. */
static void test_foreign(void) {
  static char global_buf[64];
  void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void *targets[] = {global_buf + 16, page};
  for (int t = 0; t < 2; t++) {
    for (int op = 0; op < 2; op++) {
      int err[2];
      if (!CHECK(pipe(err) == 0)) return;
      fflush(NULL);
      pid_t pid = fork();
      if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        dup2(err[1], STDERR_FILENO);
        if (op == 0) printf("%zu\n", malloc_usable_size(targets[t]));
        else printf("%p\n", realloc(targets[t], 100));
        _exit(0);
      }
      close(err[1]);
      char buf[512];
      read_all(err[0], buf, sizeof buf);
      int status = 0;
      waitpid(pid, &status, 0);
      char want[128];
      snprintf(want, sizeof want, "threadheap: %s of invalid pointer %p (not allocated by threadheap)\n",
               op == 0 ? "malloc_usable_size" : "realloc", targets[t]);
      CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT && strcmp(buf, want) == 0,
                "foreign pointer %d, op %d: status %#x, stderr \"%s\"", t, op, status, buf);
    }
  }
  munmap(page, 4096);
}

int main(int argc, char **argv) {
  int mode_ok = argc == 2 && (strcmp(argv[1], "--threadheap") == 0 || strcmp(argv[1], "--glibc") == 0);
  if (!mode_ok) {
    fprintf(stderr, "usage: test_conformance --threadheap|--glibc\n");
    return 2;
  }
  with_threadheap = strcmp(argv[1], "--threadheap") == 0;
  /* The mode must match the allocator really serving malloc: threadheap is there exactly when asked for. */
  int loaded = dlsym(RTLD_DEFAULT, "th_malloc") != NULL;
  if (!CHECK_MSG(loaded == with_threadheap, "%s, but threadheap is %s", argv[1], loaded ? "loaded" : "absent"))
    return check_summary();
  test_too_large();
  test_failed_growth();
  test_aligned();
  test_calloc();
  test_realloc();
  test_errno();
  test_mallopt_info();
  test_rlimit();
  test_aligned_threads(); /* after test_rlimit, like test_malloc_stats: glibc keeps a thread's arena */
  test_malloc_stats(); /* after test_rlimit: glibc keeps the thread's arena, which would change its counts */
  if (with_threadheap) {
    test_trim_and_info();
    test_foreign();
  }
  return check_summary();
}
