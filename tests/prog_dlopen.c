/* prog_dlopen.c LIB: threadheap loaded with dlopen into a program that runs on glibc's malloc, as docs/usage.md
 * documents it: dlopen succeeds (the library's initial-exec TLS fits in glibc's static TLS surplus); the
 * process's malloc stays glibc's; th_malloc and th_free found with dlsym work from two threads, with blocks
 * freed by the other thread; dlclose returns 0 but the library stays loaded (it is linked with -z nodelete,
 * because exiting threads still run its destructor), so its functions keep working afterwards, and a thread
 * that used it can still exit. Exits 0 when every check passed.
 * test_startup.sh also runs it with threadheap preloaded and LIB a second copy of the library: that process
 * must stop at dlopen with the "two copies" message. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PER_THREAD 20000
#define SHARED 1000

static void *(*th_malloc_fn)(size_t);
static void (*th_free_fn)(void *);
static size_t (*th_usable_fn)(const void *);

static int failures;
static void fail(const char *what) {
  __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);
  fprintf(stderr, "prog_dlopen: %s\n", what);
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x9e3779b97f4a7c15u;
  return x ^ (x >> 29);
}

/* Each thread hands SHARED blocks to the other, which checks and frees them. */
static uint64_t *handed[2][SHARED];
static pthread_barrier_t handover;

static void *worker(void *arg) {
  int id = (int)(uintptr_t)arg;
  for (int i = 0; i < PER_THREAD; i++) {
    size_t n = 16 + (size_t)(mix((uint64_t)(i + id * PER_THREAD)) % 5000);
    uint64_t *p = th_malloc_fn(n);
    if (p == NULL || th_usable_fn(p) < n) {
      fail("th_malloc");
      return NULL;
    }
    for (size_t w = 0; w < n / 8; w++) p[w] = mix(w + (uint64_t)i);
    for (size_t w = 0; w < n / 8; w++)
      if (p[w] != mix(w + (uint64_t)i)) fail("block contents");
    if (i < SHARED) handed[id][i] = p;
    else th_free_fn(p);
  }
  pthread_barrier_wait(&handover);
  for (int i = 0; i < SHARED; i++) {
    uint64_t *p = handed[1 - id][i];
    size_t n = 16 + (size_t)(mix((uint64_t)(i + (1 - id) * PER_THREAD)) % 5000);
    for (size_t w = 0; w < n / 8; w++)
      if (p[w] != mix(w + (uint64_t)i)) {
        fail("block handed over by the other thread");
        break;
      }
    th_free_fn(p);
  }
  return NULL;
}

static void *late_user(void *arg) {
  (void)arg;
  void *p = th_malloc_fn(300);
  if (p == NULL) fail("th_malloc after dlclose");
  memset(p, 1, 300);
  th_free_fn(p);
  return NULL; /* the thread exits, running threadheap's thread-exit code */
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: prog_dlopen LIB\n");
    return 2;
  }
  void *glibc_malloc = dlsym(RTLD_DEFAULT, "malloc");
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    fprintf(stderr, "prog_dlopen: dlopen: %s\n", dlerror());
    return 1;
  }
  th_malloc_fn = (void *(*)(size_t))dlsym(h, "th_malloc");
  th_free_fn = (void (*)(void *))dlsym(h, "th_free");
  th_usable_fn = (size_t (*)(const void *))dlsym(h, "th_usable_size");
  if (th_malloc_fn == NULL || th_free_fn == NULL || th_usable_fn == NULL) {
    fail("dlsym of th_malloc, th_free, th_usable_size");
    return 1;
  }
  /* The malloc already bound stays the process's malloc. */
  if (dlsym(RTLD_DEFAULT, "malloc") != glibc_malloc || dlsym(h, "malloc") == glibc_malloc)
    fail("dlopen changed which malloc the process uses");
  void *m = malloc(64);
  free(m);

  pthread_barrier_init(&handover, NULL, 2);
  pthread_t t[2];
  for (uintptr_t i = 0; i < 2; i++)
    if (pthread_create(&t[i], NULL, worker, (void *)i) != 0) fail("pthread_create");
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);

  pthread_t keep;
  if (pthread_create(&keep, NULL, late_user, NULL) != 0) fail("pthread_create");
  if (dlclose(h) != 0) fail("dlclose");
  /* Still loaded: -z nodelete. */
  void *again = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
  if (again == NULL) fail("the library was unloaded by dlclose");
  else dlclose(again);
  pthread_join(keep, NULL);
  late_user(NULL);
  return failures == 0 ? 0 : 1;
}
