/* test_fork_stdio.c: fork while other threads use stdio, the shape that hangs a preloaded allocator whose
 * fork handler holds a lock that a thread inside stdio may wait for.
 *
 * glibc's fork runs the atfork prepare handlers (threadheap's among them), then takes the stdio list lock.
 * A thread in fflush(NULL) holds that list lock and waits for each FILE's lock; a thread in getline holds
 * its FILE's lock and grows the line buffer with realloc. If realloc waits for a lock that the forking thread
 * took in its prepare handler, the three wait on each other forever.
 *
 * Readers: getline over a file of long lines (1-6 MiB, so the buffer grows through huge blocks, whose
 * realloc and free take the segment cache), the buffer freed after each file so it grows again. One thread
 * calls fflush(NULL) without pause. The main thread forks; each child checks a block and exits. The lines'
 * contents are checked. A hang is caught by alarm() and reported as a failure (the test would otherwise sit
 * until CTest's timeout).
 *
 * Then nested forks: a prepare handler registered before any library's (from .preinit_array, so it runs after
 * threadheap's, while threadheap holds its locks) forks too, and both children allocate huge and small
 * blocks; the stdio threads keep running.
 *
 * Built with TH_FORK_HEAP, the line buffers come from one serialized explicit heap (th_heap_malloc, then grown
 * by getline's realloc inside the heap), whose shard and huge-block locks fork must hold for the child's
 * copy of the heap to be whole; the children allocate from that heap too. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#ifdef TH_FORK_HEAP
#include "threadheap.h"
static th_heap_t *shared_heap;
#endif

#define READERS 3
#define LINES 4

static atomic_int stop;
static atomic_long lines_read, lines_bad;
static char paths[READERS][64];

static size_t line_length(int reader, int line) { return ((size_t)(1 + (reader + line) % 6) << 20) - 1; }
static char line_char(int reader, int line) { return (char)('a' + (reader * 7 + line) % 26); }

static void *reader(void *arg) {
  int r = (int)(intptr_t)arg;
  while (!atomic_load(&stop)) {
    FILE *f = fopen(paths[r], "r");
    if (f == NULL) {
      atomic_fetch_add(&lines_bad, 1);
      return NULL;
    }
    char *buf = NULL;
    size_t cap = 0;
#ifdef TH_FORK_HEAP
    cap = 100;
    buf = th_heap_malloc(shared_heap, cap);
#endif
    for (int l = 0; l < LINES; l++) {
      ssize_t n = getline(&buf, &cap, f);
      size_t want = line_length(r, l);
      bool ok = n == (ssize_t)want + 1 && buf[0] == line_char(r, l) && buf[want - 1] == line_char(r, l) &&
                buf[want] == '\n';
      atomic_fetch_add(ok ? &lines_read : &lines_bad, 1);
    }
    free(buf);
    fclose(f);
  }
  return NULL;
}

static void *flusher(void *arg) {
  (void)arg;
  while (!atomic_load(&stop)) fflush(NULL);
  return NULL;
}

/* ---- the nested fork, from a prepare handler that runs inside threadheap's fork window */

static atomic_int nest, nested_bad, nested_done;

static int churn(void) {
  int bad = 0;
  for (size_t size = 24; size <= (5u << 20); size *= 3) {
    unsigned char *p = malloc(size);
    if (p == NULL) return 1;
    memset(p, 0x5a, size);
    bad += p[size - 1] != 0x5a;
    free(p);
#ifdef TH_FORK_HEAP
    p = th_heap_malloc(shared_heap, size);
    if (p == NULL) return 1;
    memset(p, 0xa5, size);
    bad += p[0] != 0xa5 || p[size - 1] != 0xa5;
    free(p);
#endif
  }
  return bad;
}

static void nested_prepare(void) {
  if (!atomic_exchange(&nest, 0)) return; /* the inner fork runs this handler too: once is enough */
  pid_t pid = fork();
  if (pid == 0) _exit(churn() == 0 ? 0 : 1);
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    atomic_fetch_add(&nested_bad, 1);
  atomic_fetch_add(&nested_done, 1);
  if (churn() != 0) atomic_fetch_add(&nested_bad, 1);
  atomic_store(&nest, 1);
}

static void register_early(int argc, char **argv, char **envp) {
  (void)argc, (void)argv, (void)envp;
  pthread_atfork(nested_prepare, NULL, NULL);
}
__attribute__((section(".preinit_array"), used)) static void (*preinit_entry)(int, char **, char **) =
    register_early;

static int fork_and_check(void) {
  pid_t pid = fork();
  if (pid == 0) _exit(churn() == 0 ? 0 : 1);
  int status = 0;
  return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "test_fork_stdio: hung (fork while threads use stdio): deadlock\n";
  write(2, msg, sizeof msg - 1);
  _exit(2);
}

int main(int argc, char **argv) {
  int forks = argc > 1 ? atoi(argv[1]) : 200;
  signal(SIGALRM, on_alarm);
#ifdef TH_FORK_HEAP
  shared_heap = th_heap_create(0, 0, 0);
  if (!CHECK(shared_heap != NULL)) return check_summary();
#endif
  for (int r = 0; r < READERS; r++) {
    snprintf(paths[r], sizeof paths[r], "/tmp/th_fork_stdio.%d.%d", (int)getpid(), r);
    FILE *f = fopen(paths[r], "w");
    if (!CHECK(f != NULL)) return check_summary();
    for (int l = 0; l < LINES; l++) {
      size_t n = line_length(r, l);
      char *line = malloc(n + 1);
      memset(line, line_char(r, l), n);
      line[n] = '\n';
      fwrite(line, 1, n + 1, f);
      free(line);
    }
    fclose(f);
  }
  pthread_t t[READERS + 1];
  for (int r = 0; r < READERS; r++) pthread_create(&t[r], NULL, reader, (void *)(intptr_t)r);
  pthread_create(&t[READERS], NULL, flusher, NULL);

  int children_bad = 0, nested_forks = forks / 4;
  alarm(30);
  for (int i = 0; i < forks; i++) children_bad += !fork_and_check();
  atomic_store(&nest, 1);
  for (int i = 0; i < nested_forks; i++) children_bad += !fork_and_check();
  atomic_store(&nest, 0);
  atomic_store(&stop, 1);
  for (int r = 0; r <= READERS; r++) pthread_join(t[r], NULL);
  alarm(0);
  for (int r = 0; r < READERS; r++) unlink(paths[r]);
#ifdef TH_FORK_HEAP
  th_heap_destroy(shared_heap);
#endif

  CHECK_MSG(children_bad == 0, "%d of %d children failed", children_bad, forks + nested_forks);
  CHECK_MSG(atomic_load(&nested_done) == nested_forks && atomic_load(&nested_bad) == 0,
            "nested forks: %d of %d done, %d failed", atomic_load(&nested_done), nested_forks,
            atomic_load(&nested_bad));
  CHECK_MSG(atomic_load(&lines_bad) == 0, "%ld lines read wrong", atomic_load(&lines_bad));
  CHECK_MSG(atomic_load(&lines_read) > 0, "no line read");
  printf("%d forks, %ld lines read while forking\n", forks, atomic_load(&lines_read));
  return check_summary();
}
