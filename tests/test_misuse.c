/* test_misuse.c: threadheap stops the process on a double free, on a pointer it never returned and on a
 * pointer into the middle of a block, with exactly one line on stderr that names the error and the
 * address. Each case runs in a forked child whose stderr goes through a pipe; the parent asserts that the
 * child died of SIGABRT and checks the line. Negative controls check that legitimate frees (of blocks
 * whose words hold arbitrary user data, and of recycled blocks) stay silent.
 *
 * Expected lines:
 *   threadheap: double free at <p> (size <usable>)
 *   threadheap: realloc of a freed block at <p> (size <usable>)
 *   threadheap: malloc_usable_size of a freed block at <p> (size <usable>)
 *   threadheap: free of invalid pointer <p> (not allocated by threadheap)        (also realloc of / ...)
 *   threadheap: free of interior pointer <p> (block <b>, size <usable>)          (also realloc of / ...)
 * The child computes the addresses and the usable size before the misuse and sends them on a second
 * pipe, so the parent compares with what the allocator really handed out. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "threadheap.h"
#include "../src/types.h" /* the page descriptor's layout, for case_stale_page's forgery */

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

enum op { OP_FREE, OP_REALLOC, OP_USABLE };
static const char *const op_word[] = {"free of", "realloc of", "malloc_usable_size of"};

/* What the child tells the parent (check_expect): the words the line must contain, in order of appearance. */

/* The misuse itself, with op chosen at run time so that the compiler cannot reason about it. */
static void do_op(enum op op, void *p) {
  if (op == OP_FREE) th_free(p);
  if (op == OP_REALLOC) {
    void *q = th_realloc(p, 100);
    /* Not reached when the allocator catches the misuse. */
    fprintf(stderr, "realloc returned %p\n", q);
  }
  if (op == OP_USABLE) {
    size_t n = th_usable_size(p);
    fprintf(stderr, "usable size %zu\n", n);
  }
}

static void *run_on_thread(void *(*fn)(void *), void *arg) {
  pthread_t t;
  void *ret = NULL;
  if (pthread_create(&t, NULL, fn, arg) != 0) _exit(90);
  pthread_join(t, &ret);
  return ret;
}
static void *thread_free(void *p) {
  th_free(p);
  return NULL;
}
static void *thread_free_twice(void *p) {
  th_free(p);
  th_free(p);
  return NULL;
}
static void *thread_alloc(void *size) {
  void *p = th_malloc((size_t)(uintptr_t)size);
  if (p) memset(p, 0x42, (size_t)(uintptr_t)size < 64 ? (size_t)(uintptr_t)size : 64);
  return p;
}

/* ---- the cases; each runs in the child and is expected not to return */

static const size_t sizes[] = {48, 200 * KiB, 16 * MiB};
static const char *const size_name[] = {"small", "medium", "huge"};

/* who: 0 owner frees twice; 1 another thread frees twice; 2 owner frees, another thread frees again;
 * 3 another thread frees, owner frees again; 4 the block was allocated by a thread that then exited,
 * main frees it twice. */
static void case_double_free(int size_idx, int who) {
  size_t n = sizes[size_idx];
  void *p = who == 4 ? run_on_thread(thread_alloc, (void *)(uintptr_t)n) : th_malloc(n);
  if (!p) _exit(91);
  memset(p, 0x42, n < 4096 ? n : 4096);
  check_expect("double free at %p (size %zu)", p, th_usable_size(p));
  switch (who) {
    case 0: th_free(p); th_free(p); break;
    case 1: run_on_thread(thread_free_twice, p); break;
    case 2: th_free(p); run_on_thread(thread_free, p); break;
    case 3: run_on_thread(thread_free, p); th_free(p); break;
    case 4: th_free(p); th_free(p); break;
  }
}

/* The freed block sits between live blocks of its page, and other frees happen in between: a check that
 * only looks at the most recently freed block would miss it. */
static void case_double_free_shared_page(void) {
  enum { N = 32 };
  void *ps[N];
  for (int i = 0; i < N; i++) {
    ps[i] = th_malloc(48);
    if (!ps[i]) _exit(91);
    memset(ps[i], i, 48);
  }
  void *p = ps[N / 2];
  check_expect("double free at %p (size %zu)", p, th_usable_size(p));
  th_free(p);
  th_free(ps[3]);
  th_free(ps[N - 2]);
  th_free(p);
}

/* A free medium block whose inside went back to the OS (th_collect purges the free blocks of pages in use)
 * keeps its first OS page, with the tag: a second free is still caught, and so is one by another thread. */
static void case_double_free_purged(int by_other) {
  enum { N = 8 };
  void *ps[N];
  for (int i = 0; i < N; i++) {
    ps[i] = th_malloc(40 * KiB);
    if (!ps[i]) _exit(91);
    memset(ps[i], i, 40 * KiB);
  }
  void *p = ps[N / 2];
  check_expect("double free at %p (size %zu)", p, th_usable_size(p));
  th_free(p);
  th_collect();
  if (by_other) run_on_thread(thread_free, p);
  else th_free(p);
}

/* realloc(p, 0) frees p (glibc): a later free of p is a double free. */
static void case_realloc_zero_then_free(void) {
  void *p = th_malloc(48);
  if (!p) _exit(91);
  check_expect("double free at %p (size %zu)", p, th_usable_size(p));
  void *r = th_realloc(p, 0);
  if (r != NULL) _exit(92);
  th_free(p);
}

static void case_freed(int size_idx, enum op op) {
  void *p = th_malloc(sizes[size_idx]);
  if (!p) _exit(91);
  check_expect("%s a freed block at %p (size %zu)", op == OP_REALLOC ? "realloc of" : "malloc_usable_size of", p,
               th_usable_size(p));
  th_free(p);
  do_op(op, p);
}

static int a_global[64];
static void case_invalid(int kind, enum op op) {
  int on_stack[64];
  void *p = NULL;
  switch (kind) {
    case 0: p = &on_stack[8]; break;
    case 1: p = &a_global[4]; break;
    case 2:
      p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) _exit(93);
      break;
    case 3: p = (void *)0x10; break;
    /* A live block's address with a bit past the 47-bit address space set: its low bits name a real block
     * of a real segment, which the fast paths' map lookup (of the low 47 bits) finds. */
    case 4:
    case 6: p = (void *)((uintptr_t)th_malloc(48) | (uintptr_t)1 << 47); break;
    case 5: p = (void *)((uintptr_t)th_malloc(48) | (uintptr_t)1 << 63); break;
  }
  /* threadheap has been used before the bad call, so its tables exist. */
  void *warm = th_malloc(100);
  th_free(warm);
  check_expect("%s invalid pointer %p (not allocated by threadheap)", op_word[op], p);
  if (kind == 6 && op == OP_FREE) run_on_thread(thread_free, p); /* the remote path */
  else do_op(op, p);
  on_stack[0] = 1; /* keep the array alive until after the call */
}

static void case_interior(int size_idx, enum op op) {
  static const size_t offset[] = {16, 4096, 4 * MiB};
  static const size_t isize[] = {64, 200 * KiB, 16 * MiB};
  unsigned char *b = th_malloc(isize[size_idx]);
  if (!b) _exit(91);
  void *p = b + offset[size_idx];
  check_expect("%s interior pointer %p (block %p, size %zu)", op_word[op], p, (void *)b, th_usable_size(b));
  do_op(op, p);
}

/* A huge block of 520 regions (2 GiB of address space, never touched): a pointer into region k is found
 * through the address map's back entries (k < 253), one "look again" entry (253..505) or two (506 on),
 * and named as an interior pointer of the block, not as memory threadheap never handed out. */
static const size_t long_region[] = {1, 252, 253, 400, 505, 506, 519};
static void case_interior_long(int which, enum op op) {
  unsigned char *b = th_malloc(520 * 4 * MiB - 4096);
  if (!b) _exit(91);
  void *p = b + long_region[which] * 4 * MiB + 16;
  check_expect("%s interior pointer %p (block %p, size %zu)", op_word[op], p, (void *)b, th_usable_size(b));
  do_op(op, p);
}

/* A huge block laid where an explicit heap's small pages were (its segment, cached when the heap was
 * destroyed, taken again whole): a pointer into it that was a block start of a small page is an interior
 * pointer of the huge block. The bytes where the old page descriptors were are the block's now, filled
 * here, every 128 bytes, with a forged descriptor (types.h's layout) that names this thread as owner and
 * the pointer as a carved block start: a page map that still named them would take the free as the
 * owner's. Without the cache (THREADHEAP_PURGE_DELAY=0) the range comes back from the OS elsewhere, and
 * the pointer at the same offset of the block is checked instead. */
static void case_stale_page(void) {
  th_heap_t *h = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
  if (!h) _exit(91);
  unsigned char *q = NULL;
  for (int i = 0; i < 100000 && q == NULL; i++) {
    unsigned char *p = th_heap_malloc(h, 64);
    if (!p) _exit(91);
    if (((uintptr_t)p & (4 * MiB - 1)) >= 64 * KiB) q = p; /* past the segment's first 64 KiB page */
  }
  if (!q) _exit(91);
  uintptr_t seg = (uintptr_t)q & ~(uintptr_t)(4 * MiB - 1);
  th_heap_destroy(h);
  uintptr_t *big = th_malloc(3 * MiB);
  if (!big) _exit(91);
  const char *delay = getenv("THREADHEAP_PURGE_DELAY");
  bool cached = delay == NULL || strcmp(delay, "0") != 0;
  if (((uintptr_t)big & ~(uintptr_t)(4 * MiB - 1)) != seg) {
    if (cached) _exit(92); /* the cache did not give the segment back: the case cannot be made */
    q = (unsigned char *)big + ((uintptr_t)q - seg);
  }
  th_page_t forged;
  memset(&forged, 0, sizeof forged);
  forged.owner = (uintptr_t)pthread_self();
  forged.start = q;
  forged.block_inv = 1;
  forged.block_size = 64;
  forged.capacity = 1;
  for (size_t i = 0; i + sizeof forged <= 3 * MiB; i += sizeof forged) memcpy((char *)big + i, &forged, sizeof forged);
  check_expect("free of interior pointer %p (block %p, size %zu)", (void *)q, (void *)big, th_usable_size(big));
  th_free(q);
}

/* ---- negative controls: must exit 0 with nothing on stderr */

static void case_user_data_in_words(void) {
  /* Free blocks keep allocator data in their first two words; live blocks belong to the user, who may
   * store anything there, including values that look like pointers or tags. */
  static const size_t nsz[] = {16, 48, 100, 1000, 9000, 100 * KiB, 2 * MiB};
  for (size_t s = 0; s < sizeof nsz / sizeof nsz[0]; s++) {
    for (int v = 0; v < 6; v++) {
      uintptr_t *w = th_malloc(nsz[s]);
      if (!w) _exit(91);
      uintptr_t vals[] = {0, ~(uintptr_t)0, (uintptr_t)w, (uintptr_t)w ^ 0x5555555555555555u,
                          (uintptr_t)&w, 0x0123456789abcdefu};
      w[0] = vals[(v + 1) % 6];
      w[1] = vals[v];
      th_free(w);
    }
  }
  /* The same, freed by another thread. */
  for (int v = 0; v < 4; v++) {
    uintptr_t *w = th_malloc(64);
    if (!w) _exit(91);
    w[1] = v == 0 ? (uintptr_t)w : v == 1 ? ~(uintptr_t)0 : (uintptr_t)v * 0x1111111111111111u;
    run_on_thread(thread_free, w);
  }
  _exit(0);
}

static void case_recycled(void) {
  /* Free, allocate again (the same address comes back), free again: not a double free. */
  static const size_t nsz[] = {48, 200 * KiB, 16 * MiB};
  for (size_t s = 0; s < 3; s++) {
    for (int i = 0; i < 50; i++) {
      void *p = th_malloc(nsz[s]);
      if (!p) _exit(91);
      memset(p, 0xab, nsz[s] < 64 ? nsz[s] : 64);
      th_free(p);
    }
    /* Freed by another thread, then recycled by the owner. */
    for (int i = 0; i < 20; i++) {
      void *p = th_malloc(nsz[s]);
      if (!p) _exit(91);
      run_on_thread(thread_free, p);
      void *q = th_malloc(nsz[s]);
      if (!q) _exit(91);
      th_free(q);
    }
  }
  _exit(0);
}

/* ---- the parent side */

/* Runs one misuse case and checks: SIGABRT; stderr is one line, "threadheap: " + the expected text. */
static void misuse(const char *label, void (*fn)(int, int), int a, int b) {
  check_child_t res;
  check_run_child(fn, a, b, &check_info_fd, &res);
  char how[128];
  check_describe(res.status, how, sizeof how);
  printf("%-60s %s", label, res.err_len ? res.err : "(no output)\n");
  CHECK_MSG(WIFSIGNALED(res.status) && WTERMSIG(res.status) == SIGABRT, "%s: child %s; stderr: %s", label,
            how, res.err);
  if (!CHECK_MSG(res.info[0] != '\0', "%s: the child failed before the misuse (%s)", label, how)) return;
  const char *nl = strchr(res.err, '\n');
  CHECK_MSG(res.err_len > 0 && nl == res.err + res.err_len - 1, "%s: stderr is not exactly one line: \"%s\"",
            label, res.err);
  CHECK_MSG(strncmp(res.err, "threadheap: ", 12) == 0, "%s: stderr \"%s\" does not start with \"threadheap: \"",
            label, res.err);
  /* The line carries the expected text: the words, the address as %p prints it, the block and size. */
  CHECK_MSG(strstr(res.err, res.info) != NULL, "%s: stderr \"%s\" does not contain \"%s\"", label, res.err,
            res.info);
}

/* Runs a negative control: exit status 0 and nothing on stderr. */
static void silent(const char *label, void (*fn)(int, int)) {
  check_child_t res;
  check_run_child(fn, 0, 0, &check_info_fd, &res);
  char how[128];
  CHECK_MSG(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0, "%s: child %s; stderr: %s", label,
            check_describe(res.status, how, sizeof how), res.err);
  CHECK_MSG(res.err_len == 0, "%s: unexpected stderr \"%s\"", label, res.err);
}

static void c_double(int s, int who) { case_double_free(s, who); }
static void c_shared(int a, int b) { (void)a, (void)b; case_double_free_shared_page(); }
static void c_rzero(int a, int b) { (void)a, (void)b; case_realloc_zero_then_free(); }
static void c_purged(int other, int b) { (void)b; case_double_free_purged(other); }
static void c_freed(int s, int op) { case_freed(s, (enum op)op); }
static void c_invalid(int k, int op) { case_invalid(k, (enum op)op); }
static void c_interior(int s, int op) { case_interior(s, (enum op)op); }
static void c_interior_long(int k, int op) { case_interior_long(k, (enum op)op); }
static void c_user_data(int a, int b) { (void)a, (void)b; case_user_data_in_words(); }
static void c_recycled(int a, int b) { (void)a, (void)b; case_recycled(); }
static void c_stale(int a, int b) { (void)a, (void)b; case_stale_page(); }

int main(void) {
  static const char *const who_name[] = {"owner frees twice", "other thread frees twice",
                                         "owner then other thread", "other thread then owner",
                                         "allocated by an exited thread, freed twice"};
  static const char *const invalid_name[] = {"stack address", "global", "mmap'ed memory", "(void*)0x10",
                                             "a block's address | 2^47", "a block's address | 2^63",
                                             "a block's address | 2^47, by another thread"};
  char label[160];
  for (int s = 0; s < 3; s++)
    for (int who = 0; who < 5; who++) {
      snprintf(label, sizeof label, "double free, %s block, %s", size_name[s], who_name[who]);
      misuse(label, c_double, s, who);
    }
  misuse("double free of a block among live blocks of its page", c_shared, 0, 0);
  misuse("free after realloc(p, 0)", c_rzero, 0, 0);
  misuse("double free of a medium block whose inside was purged, by its owner", c_purged, 0, 0);
  misuse("double free of a medium block whose inside was purged, by another thread", c_purged, 1, 0);
  for (int s = 0; s < 3; s++)
    for (int op = OP_REALLOC; op <= OP_USABLE; op++) {
      snprintf(label, sizeof label, "%s a freed %s block", op_word[op], size_name[s]);
      misuse(label, c_freed, s, op);
    }
  for (int k = 0; k < 7; k++)
    for (int op = OP_FREE; op <= OP_USABLE; op++) {
      if (k == 6 && op != OP_FREE) continue;
      snprintf(label, sizeof label, "%s invalid pointer: %s", op_word[op], invalid_name[k]);
      misuse(label, c_invalid, k, op);
    }
  for (int s = 0; s < 3; s++)
    for (int op = OP_FREE; op <= OP_USABLE; op++) {
      snprintf(label, sizeof label, "%s interior pointer of a %s block", op_word[op], size_name[s]);
      misuse(label, c_interior, s, op);
    }
  for (int k = 0; k < (int)(sizeof long_region / sizeof long_region[0]); k++)
    for (int op = OP_FREE; op <= OP_USABLE; op++) {
      snprintf(label, sizeof label, "%s interior pointer in region %zu of a 520-region block", op_word[op],
               long_region[k]);
      misuse(label, c_interior_long, k, op);
    }
  misuse("free of a pointer into a huge block where an explicit heap's small pages were", c_stale, 0, 0);
  silent("blocks holding arbitrary values in their first words", c_user_data);
  silent("recycled blocks", c_recycled);
  return check_summary();
}
