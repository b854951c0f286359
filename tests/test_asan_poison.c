/* test_asan_poison: in the AddressSanitizer build, a free block inside threadheap's pages is poisoned, so a
 * read after free is reported by ASan; reads of live blocks, of recycled blocks and of blocks carved but
 * not yet handed out through malloc stay quiet. Blocks above 64 KiB (large pages) are not poisoned. Each
 * bad access runs in a forked child, whose stderr and exit status the parent checks. Built only with
 * TH_SANITIZE=address. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "threadheap.h"

typedef struct {
  int status;
  char err[4096];
} child_t;

/* Run fn in a child with stderr captured. */
static child_t run_child(void (*fn)(size_t), size_t size) {
  child_t r = {0};
  int fd[2];
  if (pipe(fd) != 0) abort();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fd[1], 2);
    close(fd[0]);
    fn(size);
    _exit(0);
  }
  close(fd[1]);
  size_t n = 0;
  ssize_t k;
  while ((k = read(fd[0], r.err + n, sizeof r.err - 1 - n)) > 0) n += (size_t)k;
  r.err[n] = '\0';
  close(fd[0]);
  waitpid(pid, &r.status, 0);
  return r;
}

static void read_after_free(size_t size) {
  volatile char *p = th_malloc(size);
  memset((char *)p, 1, size);
  th_free((void *)p);
  char c = p[size - 1]; /* past the two list words: poisoned */
  (void)c;
}

static void *free_it(void *p) {
  th_free(p);
  return NULL;
}

static void read_after_remote_free_thread(size_t size) {
  volatile char *p = th_malloc(size);
  pthread_t t;
  pthread_create(&t, NULL, free_it, (void *)p);
  pthread_join(t, NULL);
  char c = p[size - 1];
  (void)c;
}

static void live_reuse(size_t size) {
  /* Free then malloc again: the block comes back unpoisoned, whole. */
  for (int i = 0; i < 1000; i++) {
    char *p = th_malloc(size);
    memset(p, i, th_usable_size(p));
    th_free(p);
  }
  char *q = th_calloc(1, size);
  for (size_t i = 0; i < size; i++)
    if (q[i] != 0) _exit(3);
  th_free(q);
}

int main(void) {
  static const size_t sizes[] = {48, 200, 4000, 40000, 65536}; /* small and medium blocks */
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    child_t r = run_child(read_after_free, sizes[i]);
    CHECK_MSG(r.status != 0 && strstr(r.err, "AddressSanitizer") && strstr(r.err, "use-after-poison"),
              "size %zu: read after free not reported; status %d, stderr: %.300s", sizes[i], r.status, r.err);
    r = run_child(read_after_remote_free_thread, sizes[i]);
    CHECK_MSG(r.status != 0 && strstr(r.err, "use-after-poison"),
              "size %zu: read after a remote free not reported; status %d, stderr: %.300s", sizes[i], r.status,
              r.err);
    r = run_child(live_reuse, sizes[i]);
    CHECK_MSG(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0 && r.err[0] == '\0',
              "size %zu: reuse of freed blocks reported; status %d, stderr: %.300s", sizes[i], r.status, r.err);
  }
  return check_summary();
}
