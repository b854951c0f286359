/* prog_startup.c: allocation at start-up, before threadheap's own constructor has run. Built three ways by
 * tests/CMakeLists.txt and run by test_startup.sh:
 *   prog_startup         not linked to threadheap: run with LD_PRELOAD (and fails without it);
 *   prog_startup_linked  linked to libthreadheap.so;
 *   prog_startup_static  linked to the whole static library (TH_STATIC: threadheap's symbols are not
 *                        exported from a program, so it calls th_stats_get directly).
 * Stages:
 *   .preinit_array  runs before every shared library's constructor, threadheap's included: it starts four
 *                   threads that wait on a barrier and then make their first malloc at the same moment as
 *                   the main thread makes its own (threads that exist before the first call); it calls dlsym
 *                   for a missing symbol and dlerror, which allocate inside libc;
 *   constructor     (the program's static constructor) the same dlsym/dlerror, and blocks of every range;
 *   main            every block from the earlier stages is intact and threadheap's; then the program forks
 *                   and the child execs this program again with --child, which must run the same stages
 *                   and exit 0 (the check for a second copy must not fire after fork or exec).
 * Prints nothing on success (test_startup.sh compares stderr); exits 0 when every check passed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "threadheap.h"

#define EARLY_THREADS 4
#define RANGES 5
static const size_t range_sizes[RANGES] = {40, 3000, 50000, 700000, 5u << 20};

static int failures;
static void fail(const char *what) {
  failures++;
  fprintf(stderr, "prog_startup: %s\n", what);
}

static void fill(unsigned char *p, size_t n, unsigned key) {
  for (size_t i = 0; i < n; i += 97) p[i] = (unsigned char)(key * 7 + i);
}
static int intact(const unsigned char *p, size_t n, unsigned key) {
  for (size_t i = 0; i < n; i += 97)
    if (p[i] != (unsigned char)(key * 7 + i)) return 0;
  return 1;
}

/* threadheap's functions: direct calls in the static build, looked up otherwise (the preloaded build is not
 * linked to threadheap, and finds nothing when it is not loaded). */
static size_t (*usable_fn)(const void *);
static void (*stats_fn)(th_stats_t *);
static void find_threadheap(void) {
#ifdef TH_STATIC
  usable_fn = th_usable_size;
  stats_fn = th_stats_get;
#else
  usable_fn = (size_t (*)(const void *))dlsym(RTLD_DEFAULT, "th_usable_size");
  stats_fn = (void (*)(th_stats_t *))dlsym(RTLD_DEFAULT, "th_stats_get");
#endif
}

/* dlsym of a symbol that does not exist, then dlerror: both allocate inside libc (the message). */
static void dl_error_roundtrip(const char *stage) {
  void *sym = dlsym(RTLD_DEFAULT, "threadheap_no_such_symbol");
  const char *msg = dlerror();
  if (sym != NULL || msg == NULL || strstr(msg, "threadheap_no_such_symbol") == NULL) {
    fail(stage);
    return;
  }
  char *copy = strdup(msg);
  if (copy == NULL || strcmp(copy, msg) != 0) fail(stage);
  free(copy);
  if (dlerror() != NULL) fail(stage); /* the error is reported once */
}

/* Blocks made before main, checked in main. */
static unsigned char *early_blocks[EARLY_THREADS + 1];
static unsigned char *ctor_blocks[RANGES];
static size_t heaps_at_preinit = (size_t)-1;

static pthread_barrier_t start_line;
static pthread_t early[EARLY_THREADS];

static void *early_thread(void *arg) {
  unsigned id = (unsigned)(uintptr_t)arg;
  pthread_barrier_wait(&start_line);
  unsigned char *p = malloc(100 + id * 1000);
  if (p) fill(p, 100 + id * 1000, id);
  return p;
}

static void preinit(int argc, char **argv, char **envp) {
  (void)argc, (void)argv, (void)envp;
  find_threadheap();
  if (stats_fn) {
    th_stats_t s;
    stats_fn(&s);
    heaps_at_preinit = s.heaps_created;
  }
  if (pthread_barrier_init(&start_line, NULL, EARLY_THREADS + 1) != 0) fail("barrier");
  for (uintptr_t i = 0; i < EARLY_THREADS; i++)
    if (pthread_create(&early[i], NULL, early_thread, (void *)i) != 0) fail("pthread_create in preinit");
  pthread_barrier_wait(&start_line);
  early_blocks[EARLY_THREADS] = calloc(1, 777);
  dl_error_roundtrip("dlsym/dlerror in preinit");
  for (int i = 0; i < EARLY_THREADS; i++) pthread_join(early[i], (void **)&early_blocks[i]);
}
__attribute__((section(".preinit_array"), used)) static void (*preinit_entry)(int, char **, char **) = preinit;

__attribute__((constructor)) static void program_constructor(void) {
  dl_error_roundtrip("dlsym/dlerror in a constructor");
  for (int i = 0; i < RANGES; i++) {
    ctor_blocks[i] = malloc(range_sizes[i]);
    if (ctor_blocks[i] == NULL) fail("malloc in a constructor");
    else fill(ctor_blocks[i], range_sizes[i], 50u + (unsigned)i);
  }
  unsigned char *r = realloc(ctor_blocks[0], 20000);
  if (r == NULL) fail("realloc in a constructor");
  else ctor_blocks[0] = r;
}

int main(int argc, char **argv) {
  int child = argc == 2 && strcmp(argv[1], "--child") == 0;
  if (usable_fn == NULL || stats_fn == NULL) {
    fail("threadheap is not loaded");
    return 1;
  }
  /* Every early block is threadheap's (th_usable_size stops the process on any other pointer). */
  for (int i = 0; i < EARLY_THREADS; i++) {
    size_t n = 100 + (size_t)i * 1000;
    if (early_blocks[i] == NULL || usable_fn(early_blocks[i]) < n || !intact(early_blocks[i], n, (unsigned)i))
      fail("block from an early thread");
    free(early_blocks[i]);
  }
  unsigned char *z = early_blocks[EARLY_THREADS];
  if (z == NULL || usable_fn(z) < 777) fail("calloc in preinit");
  for (int i = 0; z && i < 777; i++)
    if (z[i] != 0) {
      fail("calloc in preinit: not zero");
      break;
    }
  free(z);
  for (int i = 0; i < RANGES; i++) {
    if (ctor_blocks[i] == NULL) continue;
    size_t n = i == 0 ? 20000 : range_sizes[i];
    size_t check = i == 0 ? range_sizes[0] : n;
    if (usable_fn(ctor_blocks[i]) < n || !intact(ctor_blocks[i], check, 50u + (unsigned)i))
      fail("block from the constructor");
    free(ctor_blocks[i]);
  }
  if (getenv("PROG_STARTUP_VERBOSE"))
    fprintf(stderr, "heaps created before preinit: %zu\n", heaps_at_preinit);
  if (!child) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
      execl("/proc/self/exe", argv[0], "--child", (char *)NULL);
      _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      fail("the forked and re-executed child failed");
  }
  return failures == 0 ? 0 : 1;
}
