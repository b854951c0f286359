/* prog_profile.c: programs whose heap profiles test_profile.py checks against the truth they print.
 *   accuracy [THREADS]  three call sites hold 60%, 30% and 10% of 256 MiB in blocks of 16 B to 1 MiB; a fourth
 *                       site's blocks are all freed (by other threads when THREADS > 0); then th_profile_dump(PATH)
 *   leak                leaky() keeps 24 MiB, tidy() frees all of its 64 MiB; the leak report names leaky only
 *   fork                the child allocates at child_site() and exits: it writes its own profile
 *   dlopen LIB          LIB's dl_site() keeps 16 MiB; then th_profile_dump(PATH)
 *   thread_exit         a thread keeps 16 MiB at exiting_site() and exits; then th_profile_dump(PATH)
 * Each prints "truth SITE BYTES" lines for the bytes each site still holds, and "allocated SITE BYTES". */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "threadheap.h"

static size_t live_total = (size_t)256 << 20; /* PROFILE_LIVE_MB sets it (the ThreadSanitizer run) */

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

/* Sizes from 16 B to 1 MiB, spread over the powers of two so that every range of the allocator is used. */
static size_t random_size(uint64_t *rng) {
  unsigned shift = 4 + (unsigned)(rng_next(rng) % 17); /* 16 B .. 1 MiB */
  size_t hi = (size_t)1 << shift;
  return hi / 2 + 1 + (size_t)(rng_next(rng) % (hi / 2));
}

typedef struct list_s {
  void **p;
  size_t n, cap;
} list_t;

static void keep(list_t *l, void *p) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 1024;
    l->p = realloc(l->p, l->cap * sizeof *l->p);
  }
  l->p[l->n++] = p;
}

static void *fill(size_t n) {
  unsigned char *p = malloc(n);
  if (p == NULL) abort();
  memset(p, 0x5a, n < 4096 ? n : 4096);
  p[n - 1] = 0x5a;
  return p;
}

__attribute__((noipa)) void *site_sixty(size_t n) { return fill(n); }
__attribute__((noipa)) void *site_thirty(size_t n) { return fill(n); }
__attribute__((noipa)) void *site_ten(size_t n) { return fill(n); }
__attribute__((noipa)) void *site_freed(size_t n) { return fill(n); }

/* Blocks of site_freed go to the freeing threads through this queue. */
static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t queue_cond = PTHREAD_COND_INITIALIZER;
static list_t queue;
static int producers_left;

typedef struct worker_s {
  uint64_t rng;
  size_t share; /* bytes of live data this thread makes */
  list_t held;
  size_t bytes[4];
  int pass_on; /* site_freed blocks go to the freeing threads */
} worker_t;

static void *allocate(void *arg) {
  worker_t *w = arg;
  size_t target[3] = {w->share * 6 / 10, w->share * 3 / 10, w->share / 10};
  void *(*sites[3])(size_t) = {site_sixty, site_thirty, site_ten};
  size_t made[3] = {0, 0, 0};
  while (made[0] < target[0] || made[1] < target[1] || made[2] < target[2]) {
    unsigned s = (unsigned)(rng_next(&w->rng) % 3);
    if (made[s] >= target[s]) continue;
    size_t n = random_size(&w->rng);
    keep(&w->held, sites[s](n));
    made[s] += n;
    /* as many bytes at site_freed, freed soon */
    size_t m = random_size(&w->rng);
    void *f = site_freed(m);
    w->bytes[3] += m;
    if (w->pass_on) {
      pthread_mutex_lock(&queue_lock);
      keep(&queue, f);
      pthread_cond_signal(&queue_cond);
      pthread_mutex_unlock(&queue_lock);
    } else {
      free(f);
    }
  }
  memcpy(w->bytes, made, sizeof made);
  if (w->pass_on) {
    pthread_mutex_lock(&queue_lock);
    producers_left--;
    pthread_cond_broadcast(&queue_cond);
    pthread_mutex_unlock(&queue_lock);
  }
  return NULL;
}

static void *free_queued(void *arg) {
  (void)arg;
  pthread_mutex_lock(&queue_lock);
  for (;;) {
    while (queue.n > 0) {
      void *p = queue.p[--queue.n];
      pthread_mutex_unlock(&queue_lock);
      free(p);
      pthread_mutex_lock(&queue_lock);
    }
    if (producers_left == 0) break;
    pthread_cond_wait(&queue_cond, &queue_lock);
  }
  pthread_mutex_unlock(&queue_lock);
  return NULL;
}

static int accuracy(const char *path, int threads) {
  int n = threads > 0 ? threads : 1;
  worker_t *w = calloc((size_t)n, sizeof *w);
  pthread_t *t = calloc((size_t)n + 2, sizeof *t);
  producers_left = threads;
  for (int i = 0; i < n; i++) {
    w[i].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    w[i].share = live_total / (size_t)n;
    w[i].pass_on = threads > 0;
  }
  if (threads == 0) {
    allocate(&w[0]);
  } else {
    for (int i = 0; i < 2; i++) pthread_create(&t[n + i], NULL, free_queued, NULL);
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, allocate, &w[i]);
    for (int i = 0; i < n + 2; i++) pthread_join(t[i], NULL);
  }
  const char *names[4] = {"site_sixty", "site_thirty", "site_ten", "site_freed"};
  for (int s = 0; s < 4; s++) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += w[i].bytes[s];
    printf("%s %s %zu\n", s == 3 ? "allocated" : "truth", names[s], total);
  }
  /* Contents intact: every kept block still holds its pattern at both ends. */
  for (int i = 0; i < n; i++)
    for (size_t k = 0; k < w[i].held.n; k++)
      if (((unsigned char *)w[i].held.p[k])[0] != 0x5a) return 3;
  if (th_profile_dump(path) != 0) {
    perror("th_profile_dump");
    return 1;
  }
  return 0;
}

__attribute__((noipa)) void leaky(list_t *l) {
  for (size_t i = 0; i < 384; i++) keep(l, fill((size_t)64 << 10));
}
__attribute__((noipa)) void tidy(void) {
  for (size_t i = 0; i < 1024; i++) free(fill((size_t)64 << 10));
}

__attribute__((noipa)) void *child_site(size_t n) { return fill(n); }
__attribute__((noipa)) void *exiting_site(size_t n) { return fill(n); }

static void *exiting_thread(void *arg) {
  list_t *l = arg;
  for (int i = 0; i < 256; i++) keep(l, exiting_site((size_t)64 << 10));
  return NULL;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  const char *path = getenv("PROFILE_DUMP");
  setvbuf(stdout, NULL, _IONBF, 0);
  if (getenv("PROFILE_LIVE_MB")) live_total = (size_t)atol(getenv("PROFILE_LIVE_MB")) << 20;
  if (strcmp(mode, "accuracy") == 0) return accuracy(path, argc > 2 ? atoi(argv[2]) : 0);
  if (strcmp(mode, "leak") == 0) {
    static list_t l; /* reachable, like a real leak the program forgot about */
    leaky(&l);
    tidy();
    return 0;
  }
  if (strcmp(mode, "fork") == 0) {
    pid_t pid = fork();
    if (pid == 0) {
      static list_t l;
      for (int i = 0; i < 256; i++) keep(&l, child_site((size_t)64 << 10));
      printf("child %d\n", (int)getpid());
      exit(0); /* destructors run: the child writes PATH.<pid> */
    }
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
  }
  if (strcmp(mode, "dlopen") == 0 && argc > 2) {
    void *lib = dlopen(argv[2], RTLD_NOW);
    if (lib == NULL) {
      fprintf(stderr, "%s\n", dlerror());
      return 1;
    }
    void (*dl_site)(void) = (void (*)(void))dlsym(lib, "dl_site");
    dl_site();
    return th_profile_dump(path) == 0 ? 0 : 1;
  }
  if (strcmp(mode, "thread_exit") == 0) {
    static list_t l;
    pthread_t t;
    pthread_create(&t, NULL, exiting_thread, &l);
    pthread_join(t, NULL);
    return th_profile_dump(path) == 0 ? 0 : 1;
  }
  fprintf(stderr, "usage: prog_profile accuracy [THREADS] | leak | fork | dlopen LIB | thread_exit\n");
  return 2;
}
