/* prog_override.c: a program that is not linked to threadheap and calls only the standard names. Run with
 * LD_PRELOAD=libthreadheap.so (test_preload.sh does), it checks that malloc and friends are threadheap's:
 * the library is present, its huge-block counter moves when malloc is asked for a huge block, and its own
 * th_usable_size agrees with malloc_usable_size on malloc's pointers. It needs no environment variable
 * (THREADHEAP_SHOW_STATS in particular) to see that. Then it exercises the standard interface, including
 * memory that libc allocates internally (strdup, getline, stdio) and frees through free. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "threadheap.h"

static void *thread_work(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  int ok = 1;
  for (int i = 0; i < 2000; i++) {
    size_t n = 1 + (size_t)((i * 37 + id * 11) % 3000);
    unsigned char *p = malloc(n);
    if (!p) return (void *)0;
    memset(p, (int)(id + (uintptr_t)i), n);
    ok &= p[n - 1] == (unsigned char)(id + (uintptr_t)i);
    free(p);
  }
  return (void *)(uintptr_t)ok;
}

int main(void) {
  void (*stats_get)(th_stats_t *) = (void (*)(th_stats_t *))dlsym(RTLD_DEFAULT, "th_stats_get");
  size_t (*usable)(const void *) = (size_t (*)(const void *))dlsym(RTLD_DEFAULT, "th_usable_size");
  if (!CHECK_MSG(stats_get != NULL && usable != NULL, "threadheap is not loaded")) return check_summary();

  void *p5 = malloc(5);
  CHECK(p5 != NULL && ((uintptr_t)p5 & 15) == 0);
  CHECK(malloc_usable_size(p5) >= 16);
  CHECK(malloc_usable_size(p5) == usable(p5));
  free(p5);

  /* malloc of a huge block goes to threadheap: its counter moves. */
  th_stats_t st0, st1;
  stats_get(&st0);
  unsigned char *big = malloc(8 << 20);
  CHECK(big != NULL);
  if (big) memset(big, 7, 8 << 20);
  stats_get(&st1);
  CHECK_MSG(st1.huge_allocs > st0.huge_allocs, "malloc(8 MiB) did not reach threadheap");
  CHECK(big == NULL || usable(big) >= (8 << 20));
  free(big);

  unsigned char *z = calloc(1000, 3);
  int zero = z != NULL;
  for (int i = 0; z && i < 3000; i++) zero &= z[i] == 0;
  CHECK(zero);
  unsigned char *r = realloc(z, 100000);
  CHECK(r != NULL);
  if (r) {
    int kept = 1;
    for (int i = 0; i < 3000; i++) kept &= r[i] == 0;
    CHECK(kept);
  }
  free(r);

  void *a = NULL;
  CHECK(posix_memalign(&a, 4096, 100) == 0 && ((uintptr_t)a & 4095) == 0);
  free(a);
  a = aligned_alloc(256, 512);
  CHECK(a != NULL && ((uintptr_t)a & 255) == 0);
  free(a);
  a = memalign(65536, 10);
  CHECK(a != NULL && ((uintptr_t)a & 65535) == 0);
  free(a);
  a = valloc(10);
  CHECK(a != NULL && ((uintptr_t)a & ((uintptr_t)sysconf(_SC_PAGESIZE) - 1)) == 0);
  free(a);
  errno = 0;
  volatile size_t too_big = SIZE_MAX; /* volatile: the compiler would refuse the constant */
  CHECK(malloc(too_big) == NULL && errno == ENOMEM);

  /* Memory that libc allocates for the program, freed with free. */
  char *d = strdup("threadheap");
  CHECK(d != NULL && strcmp(d, "threadheap") == 0 && usable(d) >= 11);
  free(d);
  FILE *f = tmpfile();
  CHECK(f != NULL);
  if (f) {
    fputs("one\ntwo\n", f);
    rewind(f);
    char *line = NULL;
    size_t cap = 0;
    CHECK(getline(&line, &cap, f) == 4 && strcmp(line, "one\n") == 0);
    CHECK(line == NULL || usable(line) >= cap);
    free(line);
    fclose(f);
  }

  pthread_t t[4];
  for (uintptr_t i = 0; i < 4; i++) CHECK(pthread_create(&t[i], NULL, thread_work, (void *)i) == 0);
  for (int i = 0; i < 4; i++) {
    void *ok = NULL;
    pthread_join(t[i], &ok);
    CHECK(ok == (void *)1);
  }
  return check_summary();
}
