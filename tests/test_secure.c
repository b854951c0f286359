/* test_secure.c: secure mode's protections (THREADHEAP_SECURE=1, and =2 for zero-on-free; CTest runs both).
 * Each misuse runs in a forked child, which sends the line it expects on a pipe; the parent checks that the
 * child died of SIGABRT with exactly that line on stderr, or of SIGSEGV with nothing written (guard pages).
 * Then, in this process, what secure mode promises that is not a stop: random order of fresh blocks,
 * delayed reuse (of remote frees too), zero-on-free, usable size and realloc, and secure heaps for threads
 * started before the library's constructor. The lines:
 *   threadheap: heap overflow past block at <p> (size <n>)                 at free or realloc
 *   threadheap: heap overflow past block at <p> (its size record overwritten too; usable size at most <n>)
 *   threadheap: free of invalid pointer <p> (not allocated by threadheap)  a free into a guard page
 *   threadheap: write after free at <p> (size <n>)                          when the block is handed out again
 *   threadheap: corrupted free list in page <start> at <p> (size <block>)   when the block is popped
 * (blocks freed by other threads: when the chain they wait in hands them out). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "threadheap.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define SEGMENT ((uintptr_t)4 * MiB)
#define DELAY 16 /* frees of a small class before a freed block comes back (src/secure.c) */

static int g_mode; /* THREADHEAP_SECURE */

/* A thread started before any library constructor has run (from the program's .preinit_array, as start-up
 * code may), which makes its heap then: its blocks are checked like every other's. It has exited by main. */
#define EARLY_SIZE 40
static unsigned char *g_early_block;
static void *early_thread(void *arg) {
  (void)arg;
  g_early_block = th_malloc(EARLY_SIZE);
  if (g_early_block) memset(g_early_block, 0x5c, EARLY_SIZE);
  return NULL;
}
static void early_start(void) {
  pthread_t t;
  if (pthread_create(&t, NULL, early_thread, NULL) == 0) pthread_join(t, NULL);
}
__attribute__((section(".preinit_array"), used)) static void (*const early_init)(void) = early_start;

static void *free_on_thread(void *p) {
  th_free(p);
  return NULL;
}

static void run_on_thread(void *(*fn)(void *), void *arg) {
  pthread_t t;
  if (pthread_create(&t, NULL, fn, arg) != 0) _exit(90);
  pthread_join(t, NULL);
}

static unsigned char *must_malloc(size_t n) {
  unsigned char *p = th_malloc(n);
  if (p == NULL) _exit(91);
  memset(p, 0x5c, n);
  return p;
}

/* ---- overflows: reported at free (by the owner or another thread) or realloc */

/* The sizes overflowed, with the block each takes (the class of size + 8: canary and trailer, src/secure.c). */
static const struct {
  int size, block;
} overflow_sizes[] = {{24, 32}, {28, 48}, {100, 112}, {4096, 5120}, {10000, 10240}, {65536, 81920}, {300000, 327680}};
#define OVERFLOW_SIZES (int)(sizeof overflow_sizes / sizeof overflow_sizes[0])

/* how: 0 the NUL of an off-by-one, 1 a hundred bytes, 2 a byte flipped. A hundred bytes past a block with
 * less slack overwrite its record of its size (its last 4 bytes) too: the report says so and names the
 * most the program could have had, the block's size less the canary and the record. */
static void c_overflow(int i, int how) {
  int size = overflow_sizes[i].size, block = overflow_sizes[i].block;
  unsigned char *p = must_malloc((size_t)size);
  if (how == 1 && block - 8 - size < 100)
    check_expect("threadheap: heap overflow past block at %p (its size record overwritten too; usable size at most %d)\n",
                 (void *)p, block - 8);
  else check_expect("threadheap: heap overflow past block at %p (size %d)\n", (void *)p, size);
  if (how == 0) p[size] = 0;
  if (how == 1) memset(p + size, 'A', 100);
  if (how == 2) p[size] ^= 0x80;
  th_free(p);
}

static void c_overflow_realloc(int size, int b) {
  (void)b;
  unsigned char *p = must_malloc((size_t)size);
  check_expect("threadheap: heap overflow past block at %p (size %d)\n", (void *)p, size);
  p[size] = 0;
  void *q = th_realloc(p, (size_t)size * 3);
  fprintf(stderr, "realloc returned %p\n", q);
}

static void c_overflow_remote(int size, int b) {
  (void)b;
  unsigned char *p = must_malloc((size_t)size);
  check_expect("threadheap: heap overflow past block at %p (size %d)\n", (void *)p, size);
  p[size] = 0;
  run_on_thread(free_on_thread, p);
}

/* An off-by-one NUL past a block of each size from 1 to 256 bytes (slacks of 8 to 23 bytes past the size
 * asked for, the canary's first byte at every offset of a 16-byte granule): each stops at free, with the
 * size. One line for all of them. */
static void c_off_by_one(int size, int b) {
  (void)b;
  unsigned char *p = must_malloc((size_t)size);
  check_expect("threadheap: heap overflow past block at %p (size %d)\n", (void *)p, size);
  p[size] = 0;
  th_free(p);
}

static void test_off_by_one_every_size(void) {
  int stopped = 0;
  for (int n = 1; n <= 256; n++) {
    check_child_t res;
    check_run_child(c_off_by_one, n, 0, &check_info_fd, &res);
    int ok = WIFSIGNALED(res.status) && WTERMSIG(res.status) == SIGABRT && res.info[0] != '\0' &&
             strcmp(res.err, res.info) == 0;
    CHECK_MSG(ok, "off-by-one NUL past malloc(%d): stderr \"%s\", expected \"%s\"", n, res.err, res.info);
    stopped += ok;
  }
  printf("%-62s %d of 256 stopped\n", "off-by-one NUL past malloc(1) .. malloc(256)", stopped);
}

/* An aligned block: reported with the pointer handed out and its usable size. */
static void c_overflow_aligned(int a, int b) {
  (void)a, (void)b;
  unsigned char *p = th_aligned_alloc(256, 1000);
  if (p == NULL) _exit(91);
  size_t u = th_usable_size(p);
  check_expect("threadheap: heap overflow past block at %p (size %zu)\n", (void *)p, u);
  p[u] = 0;
  th_free(p);
}

/* A huge block's canary runs to the end of its last OS page. */
static void c_overflow_huge(int a, int b) {
  (void)a, (void)b;
  size_t n = 2 * MiB + 100;
  unsigned char *p = must_malloc(n);
  check_expect("threadheap: heap overflow past block at %p (size %zu)\n", (void *)p, n);
  p[n] = 0;
  th_free(p);
}

/* The early thread's block: an overflow found at its free. */
static void c_overflow_early(int a, int b) {
  (void)a, (void)b;
  if (g_early_block == NULL) _exit(91);
  check_expect("threadheap: heap overflow past block at %p (size %d)\n", (void *)g_early_block, EARLY_SIZE);
  g_early_block[EARLY_SIZE] = 0;
  th_free(g_early_block);
}

/* ---- a free of a pointer into a guard page is reported, not a fault */

/* The guard page just past the metadata of the segment at seg: the one inaccessible mapping between the
 * segment's start and page 0's blocks (found in /proc/self/maps). */
static uintptr_t metadata_guard(uintptr_t seg) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (f == NULL) _exit(92);
  char line[512];
  uintptr_t guard = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && lo > seg && lo < seg + 64 * KiB &&
        strcmp(perms, "---p") == 0) {
      guard = lo;
      break;
    }
  }
  fclose(f);
  if (guard == 0) _exit(93); /* no guard page in the header's page slot */
  return guard;
}

/* which 0: the guard at the end of a medium page slot not in use (the segment's second), 1: at the end of
 * the page in use, 2: after the segment's metadata. */
static void c_free_guard(int which, int b) {
  (void)b;
  th_heap_t *h = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
  if (h == NULL) _exit(94);
  unsigned char *p = th_heap_malloc(h, 20000); /* the first page of a new medium segment (2 MiB pages) */
  if (p == NULL) _exit(91);
  uintptr_t seg = (uintptr_t)p & ~(SEGMENT - 1), page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t target = which == 0 ? seg + SEGMENT - page : seg + SEGMENT / 2 - page;
  if (which == 2) target = metadata_guard(seg);
  check_expect("threadheap: free of invalid pointer %p (not allocated by threadheap)\n", (void *)target);
  th_free((void *)target);
}

/* ---- guard pages: a write faults */

static volatile unsigned char *g_target;

static void write_target(void) {
  check_expect("SIGSEGV");
  *g_target = 1;
}

/* Past a huge block: its size a multiple of the OS page (no canary), or not (past the canary's page); and
 * after a realloc that grew it (the guard moved with its end). Then blocks of segments the cache kept with
 * their guard pages: 8 MiB again after a free of 8 MiB (the same layout), 9 MiB (the same 12 MiB segment,
 * its end guard moved), and 7 MiB after a free of 20 MiB (the 24 MiB segment's guards lifted, then split). */
static void c_guard_huge(int which, int b) {
  (void)b;
  static const size_t first[] = {0, 0, 0, 8 * MiB, 8 * MiB, 20 * MiB};
  static const size_t then[] = {2 * MiB, 2 * MiB + 100, 2 * MiB, 8 * MiB, 9 * MiB, 7 * MiB};
  if (first[which] != 0) {
    unsigned char *f = must_malloc(first[which]);
    memset(f, 0x3c, first[which]);
    th_free(f);
  }
  size_t n = then[which];
  unsigned char *p = must_malloc(n);
  memset(p, 0x3d, n); /* no guard page left inside it */
  if (which == 2) {
    p = th_realloc(p, 3 * MiB);
    if (p == NULL) _exit(91);
    n = 3 * MiB;
  }
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  g_target = p + (n + page - 1) / page * page;
  p[n - 1] = 1; /* the block's own last byte is writable */
  write_target();
}

/* The rest of a cached segment split for a smaller block holds no guard page: a 20 MiB block's 24 MiB
 * segment, freed with its guard pages, serves 7 MiB from its first 8 MiB (cache_take lifts the guards, then
 * splits), and 15 MiB from the other 16, written whole. A guard page left there (the old block's end guard,
 * 20 MiB in) would kill the child. */
static void c_split_rest(int a, int b) {
  (void)a, (void)b;
  unsigned char *f = must_malloc(20 * MiB);
  uintptr_t seg = (uintptr_t)f & ~(SEGMENT - 1);
  th_free(f);
  unsigned char *p = th_malloc(7 * MiB), *q = th_malloc(15 * MiB);
  if (p == NULL || q == NULL) _exit(91);
  if (((uintptr_t)p & ~(SEGMENT - 1)) != seg || (uintptr_t)q < seg + 8 * MiB || (uintptr_t)q >= seg + 24 * MiB) {
    check_expect("7 and 15 MiB not served from the freed 24 MiB segment (cache held another)");
    _exit(92);
  }
  check_expect("ok");
  memset(p, 0x3e, 7 * MiB);
  memset(q, 0x3f, 15 * MiB);
  _exit(0);
}

/* Just past a segment's metadata. */
static void c_guard_metadata(int a, int b) {
  (void)a, (void)b;
  unsigned char *p = must_malloc(48);
  uintptr_t guard = metadata_guard((uintptr_t)p & ~(SEGMENT - 1));
  volatile unsigned char *meta = (volatile unsigned char *)guard - 1;
  (void)*meta; /* the metadata's last byte is readable */
  g_target = (volatile unsigned char *)guard;
  write_target();
}

/* Past the end of a medium page (2 MiB) and of a large one (the whole segment). */
static void c_guard_page(int size, int b) {
  (void)b;
  unsigned char *p = must_malloc((size_t)size);
  uintptr_t seg = (uintptr_t)p & ~(SEGMENT - 1);
  unsigned shift = size <= 64 * 1024 ? 21 : 22;
  uintptr_t end = seg + ((((uintptr_t)p - seg) >> shift) + 1) * ((uintptr_t)1 << shift);
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  ((volatile unsigned char *)(end - page))[-1] = 1; /* the last byte of the page's blocks is writable */
  g_target = (volatile unsigned char *)(end - page);
  write_target();
}

/* ---- writes after free and forged links: found when the block is popped again. In a heap of their own,
 * whose one page of the class the next malloc pops from. */

static th_heap_t *must_heap(void) {
  th_heap_t *h = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
  if (h == NULL) _exit(94);
  return h;
}

static unsigned char *heap_block(th_heap_t *h, size_t n) {
  unsigned char *p = th_heap_malloc(h, n);
  if (p == NULL) _exit(91);
  memset(p, 0x5c, n);
  return p;
}

/* Frees DELAY more blocks of the class, so that the block freed before them leaves the quarantine for the
 * head of its page's list. */
static void push_out(th_heap_t *h, size_t n) {
  void *q[DELAY];
  for (int i = 0; i < DELAY; i++) q[i] = heap_block(h, n);
  for (int i = 0; i < DELAY; i++) th_free(q[i]);
}

/* A block another thread freed waits on its page's remote stack, then in the quarantine in the chain its
 * owner collected (src/secure.c), and is checked when the chain hands it out: the owner allocates until it
 * has collected the chain, frees DELAY blocks so that the chain has served its time, and allocates until
 * the chain's block is popped. */
static void pop_remote(th_heap_t *h, size_t n) {
  for (int i = 0; i < 3000; i++) heap_block(h, n);
  push_out(h, n);
  for (int i = 0; i < 3000; i++) heap_block(h, n);
  fprintf(stderr, "the block freed by another thread was never handed out again\n");
  _exit(0); /* not the stop the parent expects: the case fails with this line */
}

/* offset: where the program writes in the freed block (8: the tag word, seen in every mode; 40: seen with
 * zero-on-free). remote: freed by another thread. */
static void c_write_after_free(int offset, int remote) {
  th_heap_t *h = must_heap();
  unsigned char *p = heap_block(h, 48);
  check_expect("threadheap: write after free at %p (size 48)\n", (void *)p);
  if (remote) {
    run_on_thread(free_on_thread, p);
    p[offset] ^= 1;
    pop_remote(h, 48);
  }
  th_free(p);
  p[offset] ^= 1; /* a change, whatever the byte was (the tag word's bytes are random) */
  push_out(h, 48);
  void *q = th_heap_malloc(h, 48);
  fprintf(stderr, "malloc returned %p\n", q);
}

/* A link rewritten: to a global on a page's list (encoded there); to another block of the page, in use,
 * in a chain of one block freed by another thread (plain there: the chain's length gives it away). */
static int a_global;
static void c_forged_link(int remote, int b) {
  (void)b;
  th_heap_t *h = must_heap();
  unsigned char *p = heap_block(h, 48);
  check_expect(" at %p (size 64)\n", (void *)p); /* 48 + 8 bytes of canary and trailer: the 64-byte class */
  if (remote) {
    unsigned char *q = heap_block(h, 48);
    run_on_thread(free_on_thread, p);
    *(void **)p = q;
    pop_remote(h, 48);
  }
  th_free(p);
  push_out(h, 48);
  *(void **)p = &a_global;
  void *q = th_heap_malloc(h, 48);
  fprintf(stderr, "malloc returned %p\n", q);
}

/* ---- the parent side */

/* The child run, and how it ended in words (for the messages of stop, fault and runs). */
static void child(void (*fn)(int, int), int a, int b, check_child_t *res, char *how, size_t n) {
  check_run_child(fn, a, b, &check_info_fd, res);
  check_describe(res->status, how, n);
}

/* The child's info is the whole line; with prefix, the line is prefix + anything + info. */
static void stop(const char *label, void (*fn)(int, int), int a, int b, const char *prefix) {
  check_child_t res;
  char how[128];
  child(fn, a, b, &res, how, sizeof how);
  printf("%-62s %s", label, res.err_len ? res.err : "(no output)\n");
  CHECK_MSG(WIFSIGNALED(res.status) && WTERMSIG(res.status) == SIGABRT, "%s: child %s; stderr: %s", label, how,
            res.err);
  if (!CHECK_MSG(res.info[0] != '\0', "%s: the child failed before the misuse (%s)", label, how)) return;
  if (prefix) { /* the line's start, then what the child knew */
    size_t np = strlen(prefix), ni = strlen(res.info);
    int ends = res.err_len > ni && strcmp(res.err + res.err_len - ni, res.info) == 0;
    CHECK_MSG(strncmp(res.err, prefix, np) == 0 && ends && strchr(res.err, '\n') == res.err + res.err_len - 1,
              "%s: stderr \"%s\", expected \"%s...%s\"", label, res.err, prefix, res.info);
  } else {
    CHECK_MSG(strcmp(res.err, res.info) == 0, "%s: stderr \"%s\", expected \"%s\"", label, res.err, res.info);
  }
}

static void fault(const char *label, void (*fn)(int, int), int a, int b) {
  check_child_t res;
  char how[128];
  child(fn, a, b, &res, how, sizeof how);
  printf("%-62s %s\n", label, how);
  CHECK_MSG(strcmp(res.info, "SIGSEGV") == 0, "%s: the child failed before the write (%s)", label, how);
  CHECK_MSG(WIFSIGNALED(res.status) && WTERMSIG(res.status) == SIGSEGV, "%s: child %s; stderr: %s", label, how,
            res.err);
  CHECK_MSG(res.err_len == 0, "%s: unexpected stderr \"%s\"", label, res.err);
}

/* A child that must finish: it says "ok" just before the part that must not fault, then exits 0. */
static void runs(const char *label, void (*fn)(int, int), int a, int b) {
  check_child_t res;
  char how[128];
  child(fn, a, b, &res, how, sizeof how);
  printf("%-62s %s\n", label, how);
  CHECK_MSG(strcmp(res.info, "ok") == 0, "%s: %s (%s)", label, res.info[0] ? res.info : "no word from the child", how);
  CHECK_MSG(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0, "%s: child %s; stderr: %s", label, how, res.err);
}

static void c_ovf(int size, int how) { c_overflow(size, how); }

/* ---- in this process */

/* Fresh blocks come in random order: the first 32 of a class in two new heaps (fresh pages each), as offsets
 * from their lowest, differ, and neither goes up or down in address order, as a plain carve would. */
static void test_random_order(void) {
  enum { N = 32 };
  uintptr_t off[2][N];
  for (int h = 0; h < 2; h++) {
    th_heap_t *heap = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
    if (!CHECK(heap != NULL)) return;
    void *p[N];
    uintptr_t lo = UINTPTR_MAX;
    for (int i = 0; i < N; i++) {
      p[i] = th_heap_malloc(heap, 48);
      if (!CHECK(p[i] != NULL)) return;
      if ((uintptr_t)p[i] < lo) lo = (uintptr_t)p[i];
    }
    int up = 1, down = 1;
    for (int i = 0; i < N; i++) {
      off[h][i] = (uintptr_t)p[i] - lo;
      if (i > 0 && p[i] < p[i - 1]) up = 0;
      if (i > 0 && p[i] > p[i - 1]) down = 0;
    }
    CHECK_MSG(!up && !down, "heap %d: %d fresh blocks handed out in address order", h, N);
    th_heap_destroy(heap);
  }
  CHECK_MSG(memcmp(off[0], off[1], sizeof off[0]) != 0, "two fresh pages handed out their blocks in the same order");
}

/* A freed block comes back only after DELAY more frees of its class: not in the many mallocs before, and at
 * the first malloc after (it is then the head of its page's list). A heap of its own: its quarantine is empty. */
static void test_delayed_reuse(void) {
  th_heap_t *heap = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
  if (!CHECK(heap != NULL)) return;
  enum { MANY = 200 };
  void *a = th_heap_malloc(heap, 48), *q[DELAY], *m[MANY];
  for (int i = 0; i < DELAY; i++) q[i] = th_heap_malloc(heap, 48);
  th_free(a);
  for (int i = 0; i < DELAY - 1; i++) th_free(q[i]);
  int seen = 0;
  for (int i = 0; i < MANY; i++) seen += (m[i] = th_heap_malloc(heap, 48)) == a;
  CHECK_MSG(seen == 0, "a freed block came back after %d frees of its class, before %d", DELAY - 1, DELAY);
  th_free(q[DELAY - 1]);
  void *back = th_heap_malloc(heap, 48);
  CHECK_MSG(back == a, "after %d frees the freed block %p is next, got %p", DELAY, a, back);
  th_heap_destroy(heap);
}

/* A block freed by a thread other than its owner (serialized 0: another thread frees a block of a heap
 * this thread owns; 1: a serialized heap, every free of whose blocks is remote) is not handed out again
 * before DELAY more frees of its class, although its page runs dry meanwhile (a page holds 32 blocks of
 * the class), and comes back after them. The frees are this thread's, in the order of the test. */
static void test_remote_delay(int serialized) {
  enum { SIZE = 2000, BEFORE = 200, AFTER = 3000 };
  const char *what = serialized ? "serialized heap" : "another thread's free";
  /* A cap makes a serialized heap a single shard, whose quarantine sees every free. */
  th_heap_t *h = serialized ? th_heap_create(0, 0, (size_t)1 << 30) : th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
  if (!CHECK(h != NULL)) return;
  static void *held[2 * BEFORE + AFTER]; /* held at most: 2 * BEFORE - DELAY + AFTER */
  int n = 0;
  void *a = th_heap_malloc(h, SIZE);
  if (!CHECK(a != NULL)) return;
  if (serialized) th_free(a);
  else run_on_thread(free_on_thread, a);
  int early = 0; /* a handed out before DELAY more frees */
  for (int i = 0; i < BEFORE; i++) early += (held[n++] = th_heap_malloc(h, SIZE)) == a;
  for (int i = 0; i < DELAY - 1; i++) th_free(held[--n]);
  for (int i = 0; i < BEFORE; i++) early += (held[n++] = th_heap_malloc(h, SIZE)) == a;
  CHECK_MSG(early == 0, "%s: the block freed remotely came back %d time(s) before %d more frees of its class", what,
            early, DELAY);
  th_free(held[--n]); /* the DELAY-th */
  int back = 0;
  for (int i = 0; i < AFTER && !back; i++) back = (held[n++] = th_heap_malloc(h, SIZE)) == a;
  CHECK_MSG(back, "%s: the block freed remotely never came back after %d more frees", what, DELAY);
  th_heap_destroy(h);
}

/* Blocks another thread freed, of a class this thread no longer allocates, do not stay on their pages'
 * remote stacks or in the quarantine for good: the heap's purge rounds (driven here by this thread's
 * mallocs and frees of another class) collect them, send them back to their pages and free the pages. The
 * heap holds them meanwhile as blocks in use (collected, in the quarantine) or free in pages in use (on the
 * remote stacks). */
enum { BOUNDED_N = 100000, BOUNDED_SIZE = 48 };
static void *g_bounded[BOUNDED_N];
static void *free_bounded(void *arg) {
  (void)arg;
  for (int i = 0; i < BOUNDED_N; i++) th_free(g_bounded[i]);
  return NULL;
}
static void test_remote_bounded(void) {
  th_heap_t *h = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
  if (!CHECK(h != NULL)) return;
  for (int i = 0; i < BOUNDED_N; i++)
    if (!CHECK((g_bounded[i] = th_heap_malloc(h, BOUNDED_SIZE)) != NULL)) return;
  th_stats_t st;
  if (!CHECK(th_heap_stats_get(h, &st) == 0)) return;
  size_t before = st.in_use + st.free_in_pages;
  run_on_thread(free_bounded, NULL);
  /* Purge rounds come at most every quarter of the purge delay (50 ms by default): a few seconds at most. */
  for (int round = 0; round < 2000; round++) {
    for (int i = 0; i < 4096; i++) th_free(th_heap_malloc(h, 1000));
    if (!CHECK(th_heap_stats_get(h, &st) == 0)) return;
    if (st.in_use + st.free_in_pages < MiB) break;
  }
  CHECK_MSG(st.in_use + st.free_in_pages < MiB,
            "blocks freed by another thread still held: %zu bytes in use, %zu free in pages; %zu before their frees",
            st.in_use, st.free_in_pages, before);
  th_heap_destroy(h);
}

/* THREADHEAP_SECURE=2: a freed block is zero past its two list words (up to its 4-byte trailer). */
static void test_zero_on_free(void) {
  unsigned char *p = th_malloc(100);
  if (!CHECK(p != NULL)) return;
  memset(p, 0xab, 100);
  th_free(p);
  CHECK_MSG(check_all_zero(p + 16, 100 - 16), "a freed block still holds its data");
}

/* A huge block freed and allocated again at its size keeps its guard pages in the cache: the second pair makes
 * no system call (with zero-on-free, the free's purge alone). Only a pair served from the cache tells: one whose
 * segment was unmapped in between (a pause past the purge delay) is tried again. */
static void test_huge_reuse(void) {
  bool seen = false;
  for (int attempt = 0; attempt < 5 && !seen; attempt++) {
    th_stats_t s0, s1;
    th_free(must_malloc(8 * MiB));
    th_stats_get(&s0);
    unsigned char *p = must_malloc(8 * MiB);
    memset(p, 0x5a, 8 * MiB);
    th_free(p);
    th_stats_get(&s1);
    if (s1.cache_hits - s0.cache_hits != 1 || s1.os_unmaps != s0.os_unmaps) continue;
    seen = true;
    size_t calls = (s1.os_calls - s0.os_calls) - (s1.os_purges - s0.os_purges);
    CHECK_MSG(calls == 0, "8 MiB taken again from the cache with its guard pages: %zu system calls", calls);
  }
  CHECK_MSG(seen, "no 8 MiB block came from the cache in 5 tries");
}

/* Huge blocks of varying sizes, each written whole: the cache's splits and moves of segments that kept their
 * guard pages leave none inside a block (a write into one would kill the test). */
static void test_huge_vary(void) {
  static const size_t mb[] = {20, 7, 9, 14, 32, 6, 11, 40, 8, 17};
  for (int round = 0; round < 3; round++)
    for (size_t i = 0; i < sizeof mb / sizeof mb[0]; i++) {
      size_t n = mb[i] * MiB + (size_t)round * 1000;
      unsigned char *p = must_malloc(n), *q = must_malloc(n / 2);
      memset(p, (int)i, n);
      memset(q, (int)i + 1, n / 2);
      CHECK(p[n - 1] == (unsigned char)i && q[n / 2 - 1] == (unsigned char)(i + 1));
      th_free(i % 2 ? p : q);
      th_free(i % 2 ? q : p);
    }
}

/* Every size from 0 to 1,100 bytes written whole and freed: no stop (the canary and the record always fit
 * past the program's bytes), the usable size exact. */
static void test_every_size_fits(void) {
  for (size_t n = 0; n <= 1100; n++) {
    unsigned char *p = th_malloc(n);
    if (!CHECK(p != NULL)) continue;
    memset(p, 0xa5, n);
    CHECK_MSG(th_usable_size(p) == n, "usable size of malloc(%zu): %zu", n, th_usable_size(p));
    th_free(p);
  }
}

/* The usable size is the size asked for, and realloc keeps to it: in place within the size class, moved
 * beyond, data kept; calloc and huge blocks alike. */
static void test_sizes(void) {
  static const size_t sizes[] = {0, 1, 12, 13, 24, 28, 29, 100, 4092, 4096, 5000, 65532, 65536, 300000,
                                 1048567, 1048568, 1048569, 1048572, 1048573, 2 * MiB, 5 * MiB + 7};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    unsigned char *p = th_malloc(n);
    if (!CHECK(p != NULL)) continue;
    CHECK_MSG(th_usable_size(p) == n, "usable size of malloc(%zu): %zu", n, th_usable_size(p));
    check_fill(p, n, (unsigned)i);
    unsigned char *q = th_realloc(p, n + 1);
    if (!CHECK(q != NULL)) continue;
    CHECK_MSG(th_usable_size(q) == n + 1, "usable size after realloc to %zu: %zu", n + 1, th_usable_size(q));
    CHECK_MSG(check_verify(q, n, (unsigned)i) == n, "realloc(%zu -> %zu) lost data", n, n + 1);
    q[n] = 0x77; /* the new byte is the program's */
    unsigned char *r = th_realloc(q, n / 2 + 1);
    if (!CHECK(r != NULL)) continue;
    CHECK_MSG(check_verify(r, n / 2, (unsigned)i) == n / 2, "realloc(%zu -> %zu) lost data", n + 1, n / 2 + 1);
    th_free(r);
    unsigned char *c = th_calloc(1, n);
    if (!CHECK(c != NULL)) continue;
    CHECK_MSG(th_usable_size(c) == n && check_all_zero(c, n), "calloc(1, %zu)", n);
    th_free(c);
  }
}

int main(void) {
  const char *mode = getenv("THREADHEAP_SECURE");
  g_mode = mode ? atoi(mode) : 0;
  if (g_mode < 1 || g_mode > 2) {
    printf("test_secure: run with THREADHEAP_SECURE=1 or 2\n");
    return 77;
  }
  static const char *const how_name[] = {"one NUL byte", "100 bytes", "one byte flipped"};
  char label[160];
  for (int i = 0; i < OVERFLOW_SIZES; i++)
    for (int how = 0; how < 3; how++) {
      snprintf(label, sizeof label, "overflow of %s past malloc(%d)", how_name[how], overflow_sizes[i].size);
      stop(label, c_ovf, i, how, NULL);
    }
  stop("overflow found by realloc", c_overflow_realloc, 100, 0, NULL);
  stop("overflow found by another thread's free", c_overflow_remote, 40, 0, NULL);
  stop("overflow past an aligned block", c_overflow_aligned, 0, 0, NULL);
  stop("overflow into a huge block's canary", c_overflow_huge, 0, 0, NULL);
  fault("linear overflow past a huge block of whole pages", c_guard_huge, 0, 0);
  fault("linear overflow past a huge block's canary page", c_guard_huge, 1, 0);
  fault("linear overflow past a huge block grown by realloc", c_guard_huge, 2, 0);
  fault("linear overflow past a huge block in a cached segment of the same size", c_guard_huge, 3, 0);
  fault("linear overflow past a huge block in a cached segment, its end guard moved", c_guard_huge, 4, 0);
  fault("linear overflow past a huge block split from a cached segment", c_guard_huge, 5, 0);
  fault("write just past a segment's metadata", c_guard_metadata, 0, 0);
  runs("the rest of a cached segment split for a smaller block", c_split_rest, 0, 0);
  fault("write past the end of a medium page", c_guard_page, 20000, 0);
  fault("write past the end of a large page", c_guard_page, 300000, 0);
  stop("write after free into the tag word", c_write_after_free, 8, 0, NULL);
  if (g_mode == 2) stop("write after free past the list words (zero-on-free)", c_write_after_free, 40, 0, NULL);
  stop("write after free into the tag word, freed by another thread", c_write_after_free, 8, 1, NULL);
  if (g_mode == 2)
    stop("write after free past the list words, freed by another thread", c_write_after_free, 40, 1, NULL);
  stop("forged free-list link", c_forged_link, 0, 0, "threadheap: corrupted free list in page 0x");
  stop("forged link of a block freed by another thread", c_forged_link, 1, 0, "threadheap: corrupted free list in page 0x");
  stop("free into the guard page of a page slot not in use", c_free_guard, 0, 0, NULL);
  stop("free into the guard page of a page in use", c_free_guard, 1, 0, NULL);
  stop("free into the guard page after a segment's metadata", c_free_guard, 2, 0, NULL);
  /* A thread that made its heap before the library's constructor read THREADHEAP_SECURE. */
  CHECK_MSG(g_early_block != NULL && th_usable_size(g_early_block) == EARLY_SIZE,
            "a block of a thread started before the constructors: usable size %zu, not the %d asked for",
            g_early_block ? th_usable_size(g_early_block) : 0, EARLY_SIZE);
  stop("overflow past a block of a thread started before the constructors", c_overflow_early, 0, 0, NULL);
  test_remote_delay(0);
  test_remote_delay(1);
  test_remote_bounded();
  test_random_order();
  test_delayed_reuse();
  test_off_by_one_every_size();
  test_every_size_fits();
  test_sizes();
  test_huge_reuse();
  test_huge_vary();
  if (g_mode == 2) test_zero_on_free();
  return check_summary();
}
