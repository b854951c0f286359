/* test_heap_misuse.c: misuse of explicit heaps stops the process with one "threadheap: " line and SIGABRT:
 * allocating from a TH_HEAP_NO_SERIALIZE heap on a thread that did not create it (with each allocation
 * function), and using a destroyed heap: allocating from it, and freeing or reallocating one of its blocks
 * after th_heap_destroy. Each case runs in a forked child whose stderr goes through a pipe (as in
 * test_misuse.c). Negative controls: what is allowed across threads (freeing and reallocating a
 * no-serialize heap's blocks, allocating from a serialized heap) stays silent. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "threadheap.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* ---- the cases, run in the child */

static th_heap_t *g_heap;
static int g_fn;
static int g_misuse = 1; /* 0 in the negative control, where allocating from another thread is allowed */

static void *alloc_from_g_heap(void *arg) {
  (void)arg;
  void *p = NULL;
  switch (g_fn) {
    case 0: p = th_heap_malloc(g_heap, 48); break;
    case 1: p = th_heap_calloc(g_heap, 4, 12); break;
    case 2: p = th_heap_aligned_alloc(g_heap, 256, 100); break;
    case 3: p = th_heap_realloc(g_heap, NULL, 48); break;
    case 4: p = th_heap_malloc(g_heap, 3 * MiB); break;
  }
  /* Not reached when the allocator catches the misuse. */
  if (g_misuse) fprintf(stderr, "allocation from another thread returned %p\n", p);
  return p;
}

static void run_on_thread(void *(*fn)(void *), void *arg) {
  pthread_t t;
  if (pthread_create(&t, NULL, fn, arg) != 0) _exit(90);
  pthread_join(t, NULL);
}

static void case_noserialize_other_thread(int fn) {
  g_heap = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
  if (!g_heap) _exit(91);
  void *own = th_heap_malloc(g_heap, 48); /* the heap is in use by its owner */
  if (!own) _exit(91);
  g_fn = fn;
  run_on_thread(alloc_from_g_heap, NULL);
}

static const size_t block_sizes[] = {48, 20 * KiB, 300 * KiB, 6 * MiB};

/* what: 0 free, 1 realloc, 2 th_heap_realloc into another heap, 3 free by another thread. That thread is
 * started before the heap is destroyed, and frees once told through a pipe: pthread_create allocates, and an
 * allocation made after the destroy could be carved from the destroyed heap's memory, reused by then, right
 * where the block was (secure mode's random block order made that happen now and then), leaving a valid
 * block to free. */
static int free_pipe[2];
static void *free_there(void *p) {
  char go;
  if (read(free_pipe[0], &go, 1) != 1) _exit(94);
  th_free(p);
  return NULL;
}
static void case_block_of_destroyed_heap(int size_idx, int what) {
  pthread_t t;
  if (what == 3 && pipe(free_pipe) != 0) _exit(90);
  th_heap_t *h = th_heap_create(0, 0, 0);
  if (!h) _exit(91);
  void *p = th_heap_malloc(h, block_sizes[size_idx]);
  if (!p) _exit(91);
  memset(p, 0x5a, 64);
  if (what == 3 && pthread_create(&t, NULL, free_there, p) != 0) _exit(90);
  th_heap_destroy(h);
  th_heap_t *other = th_heap_create(0, 0, 0);
  if (!other) _exit(91);
  switch (what) {
    case 0: th_free(p); break;
    case 1: fprintf(stderr, "realloc returned %p\n", th_realloc(p, 100)); break;
    case 2: fprintf(stderr, "th_heap_realloc returned %p\n", th_heap_realloc(other, p, 100)); break;
    case 3:
      if (write(free_pipe[1], "x", 1) != 1) _exit(90);
      pthread_join(t, NULL);
      break;
  }
}

static void case_alloc_from_destroyed_heap(int flags, int fn) {
  th_heap_t *h = th_heap_create((unsigned)flags, 0, 0);
  if (!h) _exit(91);
  void *p = th_heap_malloc(h, 100);
  if (!p) _exit(91);
  th_heap_destroy(h);
  void *q = NULL;
  switch (fn) {
    case 0: q = th_heap_malloc(h, 48); break;
    case 1: q = th_heap_calloc(h, 1, 48); break;
    case 2: q = th_heap_aligned_alloc(h, 64, 48); break;
    case 3: q = th_heap_realloc(h, NULL, 48); break;
  }
  fprintf(stderr, "allocation from a destroyed heap returned %p\n", q);
}

/* ---- negative controls: exit 0, nothing on stderr */

typedef struct {
  void *p[4];
} four_t;
static void *free_and_realloc_there(void *arg) {
  four_t *f = arg;
  th_free(f->p[0]);
  th_free(f->p[1]);
  void *q = th_realloc(f->p[2], 5000);
  void *r = th_realloc(f->p[3], 40);
  if (!q || !r) _exit(92);
  th_free(q);
  th_free(r);
  return NULL;
}
static void case_allowed_across_threads(void) {
  th_heap_t *h = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
  if (!h) _exit(91);
  for (int round = 0; round < 20; round++) {
    four_t f = {{th_heap_malloc(h, 48), th_heap_malloc(h, 3 * MiB), th_heap_malloc(h, 100),
                 th_heap_aligned_alloc(h, 4096, 9000)}};
    for (int i = 0; i < 4; i++)
      if (!f.p[i]) _exit(91);
    run_on_thread(free_and_realloc_there, &f);
  }
  th_heap_destroy(h);
  /* A serialized heap is allocated from by any thread. */
  g_misuse = 0;
  g_heap = th_heap_create(0, 0, 0);
  if (!g_heap) _exit(91);
  for (g_fn = 0; g_fn < 5; g_fn++) {
    pthread_t t;
    void *p = NULL;
    if (pthread_create(&t, NULL, alloc_from_g_heap, NULL) != 0) _exit(90);
    pthread_join(t, &p);
    if (!p) _exit(93);
    th_free(p);
  }
  th_heap_destroy(g_heap);
  _exit(0);
}

/* ---- the parent side */

/* SIGABRT, and stderr is exactly one line that starts "threadheap: " and contains `word`. */
static void misuse(const char *label, void (*fn)(int, int), int a, int b, const char *word) {
  check_child_t res;
  check_run_child(fn, a, b, NULL, &res);
  char how[128];
  check_describe(res.status, how, sizeof how);
  printf("%-64s %s", label, res.err_len ? res.err : "(no output)\n");
  CHECK_MSG(WIFSIGNALED(res.status) && WTERMSIG(res.status) == SIGABRT, "%s: child %s; stderr: %s", label, how,
            res.err);
  const char *nl = strchr(res.err, '\n');
  CHECK_MSG(res.err_len > 0 && nl == res.err + res.err_len - 1, "%s: stderr is not exactly one line: \"%s\"",
            label, res.err);
  CHECK_MSG(strncmp(res.err, "threadheap: ", 12) == 0, "%s: stderr \"%s\" does not start with \"threadheap: \"",
            label, res.err);
  CHECK_MSG(strstr(res.err, word) != NULL, "%s: stderr \"%s\" does not mention \"%s\"", label, res.err, word);
}

static void silent(const char *label, void (*fn)(int, int)) {
  check_child_t res;
  check_run_child(fn, 0, 0, NULL, &res);
  char how[128];
  CHECK_MSG(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0, "%s: child %s; stderr: %s", label,
            check_describe(res.status, how, sizeof how), res.err);
  CHECK_MSG(res.err_len == 0, "%s: unexpected stderr \"%s\"", label, res.err);
}

static void c_other(int fn, int b) { (void)b, case_noserialize_other_thread(fn); }
static void c_block(int s, int what) { case_block_of_destroyed_heap(s, what); }
static void c_alloc_destroyed(int flags, int fn) { case_alloc_from_destroyed_heap(flags, fn); }
static void c_allowed(int a, int b) { (void)a, (void)b, case_allowed_across_threads(); }

int main(void) {
  static const char *const fn_name[] = {"th_heap_malloc", "th_heap_calloc", "th_heap_aligned_alloc",
                                        "th_heap_realloc(NULL)", "th_heap_malloc (huge)"};
  static const char *const what_name[] = {"th_free", "th_realloc", "th_heap_realloc into another heap",
                                          "th_free by another thread"};
  static const char *const size_name[] = {"small", "medium", "large", "huge"};
  char label[160];
  for (int fn = 0; fn < 5; fn++) {
    snprintf(label, sizeof label, "no-serialize heap, %s on another thread", fn_name[fn]);
    misuse(label, c_other, fn, 0, "thread");
  }
  for (int flags = 0; flags <= 1; flags++)
    for (int fn = 0; fn < 4; fn++) {
      snprintf(label, sizeof label, "%s on a destroyed %s heap", fn_name[fn], flags ? "no-serialize" : "serialized");
      misuse(label, c_alloc_destroyed, flags, fn, "destroyed");
    }
  for (int s = 0; s < 4; s++)
    for (int what = 0; what < 4; what++) {
      snprintf(label, sizeof label, "%s of a %s block of a destroyed heap", what_name[what], size_name[s]);
      misuse(label, c_block, s, what, "");
    }
  silent("frees and reallocs across threads, allocations from a serialized heap", c_allowed);
  return check_summary();
}
