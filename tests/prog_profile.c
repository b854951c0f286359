/* prog_profile.c: programs whose heap profiles test_profile.py checks against the truth they print.
 *   accuracy [THREADS]  three call sites hold 60%, 30% and 10% of 256 MiB in blocks of 16 B to 1 MiB; a fourth
 *                       site's blocks are all freed (by other threads when THREADS > 0); then th_profile_dump(PATH)
 *   leak                leaky() keeps 24 MiB, tidy() frees all of its 64 MiB; the leak report names leaky only
 *   fork                the child allocates at child_site() and exits: it writes its own profile
 *   dlopen LIB          LIB's dl_site() keeps 16 MiB; then th_profile_dump(PATH)
 *   thread_exit         a thread keeps 16 MiB at exiting_site() and exits; then th_profile_dump(PATH)
 * Each prints "truth SITE BYTES" lines for the bytes each site still holds, and "allocated SITE BYTES".
 * When profiles are written (PATH is THREADHEAP_PROFILE's, DUMP is PROFILE_DUMP):
 *   interval            site_grow() holds 16 MiB more after each PATH.<n> appears; "file N live BYTES" for 1..3
 *   signal              raises SIGUSR2 holding 16 MiB at site_signal(), then holding 32 MiB prints "ready PID" and
 *                       waits for the test's SIGUSR2; "file N live BYTES" for 1..2
 *   signal_own HOW      its own SIGUSR2 handler (HOW: preinit, main) or SIG_IGN (ignore): 3 signals, 64 MiB of churn
 *   dump_threads        4 threads churn rings of checked blocks at site_worker() while main writes DUMP.1 .. DUMP.20
 *   dump_errors on|off  th_profile_dump's failures, in the folder DUMP; "case NAME rc RC errno E"
 *   many_threads        100 threads at once allocate 16 MiB each at site_many() (more threads than take libunwind's
 *                       fast path: the others step through their frames); "allocated site_many BYTES", then
 *                       th_profile_dump(PATH) while they all still live
 *   patterns            the sampler's split of a page's budget meets each way of using a page: site_pairs()
 *                       frees each block at once, site_batch() allocates 200 then frees them, phases alternating;
 *                       "allocated SITE BYTES", then th_profile_dump(PATH)
 *   many_stacks         262,144 distinct call stacks (an 18-deep binary path of calls) each allocate and free
 *                       600 KiB at site_deep(): more stacks than the profiler's first table holds;
 *                       "allocated site_deep BYTES", then th_profile_dump(PATH)
 *   aligned             aligned blocks, sampled: from an explicit heap (every sampled block of one is huge) and
 *                       of about 1 MiB from malloc (huge when sampled), each handed out inside its block; their
 *                       usable size read, some reallocated, all freed at site_aligned(); then aligned
 *                       malloc/free pairs at site_aligned_pairs(); "allocated" lines, then th_profile_dump(PATH)
 *   tiny                blocks of 0-15 bytes (malloc and an explicit heap), run with every block sampled: each has
 *                       16 usable bytes of its own, checked after all are written; then th_profile_dump(PATH)
 *   explicit            explicit heaps (th_heap_create): a serialized heap fed by 4 threads at site_shared(), a
 *                       no-serialize heap at site_own() (small blocks, aligned blocks and 4 MiB ones), blocks
 *                       freed one by one at site_heap_freed(), a capped heap destroyed whole at site_destroyed();
 *                       "truth"/"allocated" lines, then th_profile_dump(PATH) */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "threadheap.h"

/* posix_memalign's request plus alignment near 1 MiB, threadheap's largest block in heap pages: a sampled
 * one, which needs room for its sample too, becomes a huge block. */
#define TH_BIG_ALIGNED (((size_t)1 << 20) - 64)

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

/* Under ThreadSanitizer the library does not replace malloc: the accuracy run calls it by its own names. */
#ifdef __SANITIZE_THREAD__
#define site_malloc th_malloc
#define site_free th_free
#else
#define site_malloc malloc
#define site_free free
#endif

static void *fill(size_t n) {
  unsigned char *p = site_malloc(n);
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
      site_free(f);
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
      site_free(p);
      pthread_mutex_lock(&queue_lock);
    }
    if (producers_left == 0) break;
    pthread_cond_wait(&queue_cond, &queue_lock);
  }
  pthread_mutex_unlock(&queue_lock);
  return NULL;
}

/* ---- many distinct stacks */

__attribute__((noipa)) void *site_deep(size_t n) { return fill(n); }

static volatile int deep_calls; /* written after each call, so that no call becomes a jump */
static size_t deep_bytes;
__attribute__((noipa)) static void deep_path(int depth, unsigned bits);
__attribute__((noipa)) static void deep_left(int depth, unsigned bits) { deep_path(depth, bits), deep_calls++; }
__attribute__((noipa)) static void deep_right(int depth, unsigned bits) { deep_path(depth, bits), deep_calls++; }

/* Each value of bits takes its own path of calls down to site_deep. */
__attribute__((noipa)) static void deep_path(int depth, unsigned bits) {
  if (depth == 0) {
    size_t n = (size_t)600 << 10;
    unsigned char *p = site_deep(n);
    if (p[n - 1] != 0x5a) abort();
    site_free(p);
    deep_bytes += n;
  } else if (bits & 1) {
    deep_left(depth - 1, bits >> 1);
  } else {
    deep_right(depth - 1, bits >> 1);
  }
  deep_calls++;
}

static int many_stacks(const char *path) {
  for (unsigned bits = 0; bits < (1u << 18); bits++) deep_path(18, bits);
  printf("allocated site_deep %zu\n", deep_bytes);
  if (th_profile_dump(path) != 0) {
    perror("th_profile_dump");
    return 1;
  }
  return 0;
}

/* ---- explicit heaps */

static void *heap_fill(th_heap_t *heap, size_t n, size_t align) {
  unsigned char *p = align ? th_heap_aligned_alloc(heap, align, n) : th_heap_malloc(heap, n);
  if (p == NULL || (align && (uintptr_t)p % align != 0)) abort();
  /* A sampled block is huge whatever its size; its usable size is still its own, not its segment's. */
  if (th_usable_size(p) < n || th_usable_size(p) > n + n / 4 + align + 8192) abort();
  memset(p, 0x6b, n < 4096 ? n : 4096);
  p[n - 1] = 0x6b;
  return p;
}

static bool heap_intact(const void *block, size_t n) {
  const unsigned char *p = block;
  return p[0] == 0x6b && p[(n < 4096 ? n : 4096) - 1] == 0x6b && p[n - 1] == 0x6b;
}

__attribute__((noipa)) void *site_shared(th_heap_t *h, size_t n) { return heap_fill(h, n, 0); }
__attribute__((noipa)) void *site_own(th_heap_t *h, size_t n, size_t align) { return heap_fill(h, n, align); }
__attribute__((noipa)) void *site_heap_freed(th_heap_t *h, size_t n) { return heap_fill(h, n, 0); }
__attribute__((noipa)) void *site_destroyed(th_heap_t *h, size_t n) { return heap_fill(h, n, 0); }

typedef struct shared_worker_s {
  th_heap_t *heap;
  uint64_t rng;
  list_t held;
  size_t kept, freed;
} shared_worker_t;

/* 16 MiB kept at site_shared, and as much allocated at site_heap_freed and freed at once, into one serialized
 * heap from each of 4 threads. */
static void *shared_worker(void *arg) {
  shared_worker_t *w = arg;
  while (w->kept < ((size_t)16 << 20)) {
    size_t n = random_size(&w->rng) / 16 + 16;
    keep(&w->held, site_shared(w->heap, n));
    w->kept += n;
    n = random_size(&w->rng) / 16 + 16;
    void *f = site_heap_freed(w->heap, n);
    if (!heap_intact(f, n)) abort();
    th_free(f);
    w->freed += n;
  }
  return NULL;
}

__attribute__((noipa)) void *site_aligned(th_heap_t *h, size_t align, size_t n) {
  void *p = NULL;
  if (h) p = th_heap_aligned_alloc(h, align, n);
  else if (posix_memalign(&p, align, n) != 0) p = NULL;
  if (p == NULL || (uintptr_t)p % align != 0 || th_usable_size(p) < n) abort();
  memset(p, 0x3c, n);
  return p;
}

__attribute__((noipa)) void *site_aligned_pairs(size_t align, size_t n) {
  void *p = NULL;
  if (posix_memalign(&p, align, n) != 0 || (uintptr_t)p % align != 0) abort();
  memset(p, 0x3c, n);
  return p;
}

static int aligned_blocks(const char *path) {
  th_heap_t *heap = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
  size_t bytes = 0;
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 4000; i++) {
    size_t align = (size_t)32 << (i % 8); /* 32 B .. 4 KiB */
    bool big = i % 10 == 0; /* about 1 MiB from malloc: sampled, it is a huge block */
    size_t n = big ? TH_BIG_ALIGNED - align : 16 + (size_t)(rng_next(&rng) % 16384);
    unsigned char *p = site_aligned(big ? NULL : heap, align, n);
    bytes += n;
    if (i % 3 == 0) { /* grown: the contents move with it */
      p = big ? realloc(p, n + 100) : th_heap_realloc(heap, p, n + 100);
      if (p == NULL || p[0] != 0x3c || p[n - 1] != 0x3c) return 3;
    } else if (p[0] != 0x3c || p[n - 1] != 0x3c) {
      return 3;
    }
    th_free(p);
  }
  th_heap_destroy(heap);
  printf("allocated site_aligned %zu\n", bytes);
  /* Aligned pairs at site_aligned_pairs: each free takes the slow path and empties the page, and the carry
   * of its free count must still reach the sampler. */
  size_t pair_bytes = 0;
  for (int i = 0; i < 20000; i++) {
    size_t align = (size_t)1024 << (i % 3), n = 2048 + (size_t)(rng_next(&rng) % 4096);
    unsigned char *p = site_aligned_pairs(align, n);
    if (p[n - 1] != 0x3c) return 3;
    free(p);
    pair_bytes += n + align + 16; /* what the library asks of its heap for it (alloc_aligned), and samples */
  }
  printf("allocated site_aligned_pairs %zu\n", pair_bytes);
  if (th_profile_dump(path) != 0) {
    perror("th_profile_dump");
    return 1;
  }
  return 0;
}

__attribute__((noipa)) unsigned char *site_tiny(th_heap_t *h, size_t n, int fill_byte) {
  unsigned char *p = h ? th_heap_malloc(h, n) : malloc(n);
  if (p != NULL) memset(p, fill_byte, 16); /* and not a tail call: the frame stays in the stack */
  return p;
}

static int tiny_blocks(const char *path) {
  enum { N = 3000 };
  static unsigned char *p[N];
  th_heap_t *heap = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
  for (int i = 0; i < N; i++) {
    p[i] = site_tiny(i % 2 ? heap : NULL, (size_t)(i % 16), i & 255);
    if (p[i] == NULL || th_usable_size(p[i]) < 16) return 3;
  }
  for (int i = 0; i < N; i++)
    for (int k = 0; k < 16; k++)
      if (p[i][k] != (i & 255)) return 4;
  for (int i = 0; i < N; i++) th_free(p[i]);
  th_heap_destroy(heap);
  if (th_profile_dump(path) != 0) return 1;
  return 0;
}

static int explicit_heaps(const char *path) {
  th_heap_t *shared = th_heap_create(0, 0, 0);
  th_heap_t *own = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
  th_heap_t *capped = th_heap_create(0, 0, (size_t)64 << 20);
  if (shared == NULL || own == NULL || capped == NULL) return 2;
  shared_worker_t w[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (shared_worker_t){.heap = shared, .rng = 0xD1B54A32D192ED03ull * (uint64_t)(i + 1)};
    pthread_create(&t[i], NULL, shared_worker, &w[i]);
  }
  /* Meanwhile, in the no-serialize heap: 12 MiB of small and aligned blocks, 4 blocks of 4 MiB. */
  list_t own_held = {0};
  size_t own_bytes = 0, destroyed_bytes = 0;
  uint64_t rng = 0x2545F4914F6CDD1Dull;
  while (own_bytes < ((size_t)12 << 20)) {
    size_t n = random_size(&rng) / 16 + 16;
    keep(&own_held, site_own(own, n, own_held.n % 3 == 0 ? 64 : 0));
    own_bytes += n;
  }
  for (int i = 0; i < 4; i++, own_bytes += (size_t)4 << 20) keep(&own_held, site_own(own, (size_t)4 << 20, 0));
  /* 32 MiB in the capped heap, then the heap destroyed with all of them. */
  while (destroyed_bytes < ((size_t)32 << 20)) {
    size_t n = random_size(&rng) / 16 + 16;
    site_destroyed(capped, n);
    destroyed_bytes += n;
  }
  th_heap_destroy(capped);
  size_t shared_kept = 0, freed = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    shared_kept += w[i].kept, freed += w[i].freed;
  }
  printf("truth site_shared %zu\ntruth site_own %zu\nallocated site_heap_freed %zu\nallocated site_destroyed %zu\n",
         shared_kept, own_bytes, freed, destroyed_bytes);
  /* Contents intact: the kept blocks, sampled or not, still hold their pattern. */
  for (int i = 0; i < 4; i++) {
    size_t k = 0;
    uint64_t r = 0xD1B54A32D192ED03ull * (uint64_t)(i + 1);
    for (size_t kept = 0; kept < w[i].kept; k++) {
      size_t n = random_size(&r) / 16 + 16;
      if (!heap_intact(w[i].held.p[k], n)) return 3;
      kept += n;
      (void)random_size(&r); /* the freed block's size */
    }
  }
  if (th_profile_dump(path) != 0) {
    perror("th_profile_dump");
    return 1;
  }
  return 0;
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
  for (size_t i = 0; i < 1024; i++) site_free(fill((size_t)64 << 10));
}

__attribute__((noipa)) void *child_site(size_t n) { return fill(n); }
__attribute__((noipa)) void *exiting_site(size_t n) { return fill(n); }

static void *exiting_thread(void *arg) {
  list_t *l = arg;
  for (int i = 0; i < 256; i++) keep(l, exiting_site((size_t)64 << 10));
  return NULL;
}

/* ---- when profiles are written: every THREADHEAP_PROFILE_INTERVAL, on SIGUSR2, on th_profile_dump */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Is PATH.<n> there? The library writes it from a malloc or free slow path of the thread that calls, so in a
 * program of one thread a file seen after a call returns is complete. */
static bool numbered_exists(unsigned n) {
  char path[4096];
  snprintf(path, sizeof path, "%s.%u", getenv("THREADHEAP_PROFILE"), n);
  return access(path, F_OK) == 0;
}

__attribute__((noipa)) void *site_grow(size_t n) { return fill(n); }
__attribute__((noipa)) void *site_signal(size_t n) { return fill(n); }
__attribute__((noipa)) void *site_churn(size_t n) { return fill(n); }

/* A live set that grows at one site, and the numbered profiles seen appear as it grows. */
typedef struct growing_s {
  list_t held;
  size_t live;          /* bytes held */
  unsigned next;        /* the numbered profile looked for */
  size_t live_at[8];    /* live when PATH.<n> appeared: the truth of that file */
  uint64_t rng;
} growing_t;

static void look(growing_t *g) {
  if (g->next < 8 && numbered_exists(g->next)) g->live_at[g->next++] = g->live;
}

static void grow(growing_t *g, void *(*site)(size_t), size_t bytes) {
  for (size_t added = 0; added < bytes;) {
    size_t n = 1024 + (size_t)(rng_next(&g->rng) % 7168);
    void *p = site(n);
    look(g); /* a profile written by this malloc was written before its block was counted */
    keep(&g->held, p);
    g->live += n, added += n;
  }
}

/* Allocates and frees blocks at site_churn until PATH.<n> appears, `limit` bytes went by (0: no limit) or the
 * timeout passes. Waiting, it sleeps 1 ms every 64 blocks: steady, but not a busy loop. Returns the bytes. */
static size_t churn(growing_t *g, unsigned n, size_t limit, double timeout_s) {
  double end = now_s() + timeout_s;
  size_t churned = 0;
  while (g->next <= n && (limit == 0 || churned < limit) && now_s() < end) {
    for (int i = 0; i < 64; i++) {
      size_t m = 1024 + (size_t)(rng_next(&g->rng) % 7168);
      site_free(site_churn(m));
      churned += m;
    }
    look(g);
    if (limit == 0) nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
  return churned;
}

/* Churns until PATH.<n> appears: 0, or 4 after 30 s. */
static int wait_for(growing_t *g, unsigned n, size_t *churned) {
  size_t bytes = churn(g, n, 0, 30.0);
  if (churned) *churned = bytes;
  if (g->next > n) return 0;
  printf("timeout: %s.%u was not written within 30 s\n", getenv("THREADHEAP_PROFILE"), n);
  return 4;
}

/* THREADHEAP_PROFILE_INTERVAL=1: 16 MiB more at site_grow after each PATH.<n> appears, so that PATH.1, .2, .3
 * hold 16, 32, 48 MiB whenever the library writes them; the program decides, not the clock. */
static int interval(void) {
  growing_t g = {.next = 1, .rng = 0x2545F4914F6CDD1Dull};
  for (unsigned n = 1; n <= 3; n++) {
    grow(&g, site_grow, (size_t)16 << 20);
    if (wait_for(&g, n, NULL)) return 4;
    printf("file %u live %zu\n", n, g.live_at[n]);
  }
  printf("exit live %zu\n", g.live);
  return 0;
}

/* THREADHEAP_PROFILE_SIGNAL=1: the program raises SIGUSR2 holding 16 MiB at site_signal; then, holding 32 MiB,
 * it says "ready" and the test sends SIGUSR2 from outside. */
static int signal_dump(void) {
  growing_t g = {.next = 1, .rng = 0x9E3779B97F4A7C15ull};
  grow(&g, site_signal, (size_t)16 << 20);
  if (g.next != 1) return printf("error: %s.1 was written before any signal\n", getenv("THREADHEAP_PROFILE")), 1;
  raise(SIGUSR2);
  size_t churned;
  if (wait_for(&g, 1, &churned)) return 4;
  printf("file 1 live %zu churned %zu\n", g.live_at[1], churned);
  grow(&g, site_signal, (size_t)16 << 20);
  printf("ready %d\n", (int)getpid());
  if (wait_for(&g, 2, NULL)) return 4;
  printf("file 2 live %zu\n", g.live_at[2]);
  return 0;
}

static volatile sig_atomic_t own_usr2_calls;
static void on_own_usr2(int sig) { (void)sig, own_usr2_calls++; }

static void install_own_usr2(void) {
  struct sigaction sa = {.sa_handler = on_own_usr2};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR2, &sa, NULL);
}

/* PROFILE_USR2=preinit: the program's handler is in place before any library's constructor, threadheap's too. */
static void own_usr2_early(int argc, char **argv, char **envp) {
  (void)argc, (void)argv;
  for (char **e = envp; e && *e; e++)
    if (strcmp(*e, "PROFILE_USR2=preinit") == 0) install_own_usr2();
}
__attribute__((section(".preinit_array"), used))
static void (*const preinit_usr2)(int, char **, char **) = own_usr2_early;

/* The program's own SIGUSR2 (PROFILE_USR2: preinit, main, or ignore, inherited as SIG_IGN) stays its own: three
 * signals, then 64 MiB of churn, far more than a dump needs, and no PATH.1. */
static int signal_own(const char *how) {
  bool ignored = strcmp(how, "ignore") == 0;
  if (strcmp(how, "main") == 0) install_own_usr2();
  growing_t g = {.next = 1, .rng = 0x9E3779B97F4A7C15ull};
  grow(&g, site_signal, (size_t)4 << 20);
  for (int i = 0; i < 3; i++) raise(SIGUSR2);
  size_t churned = churn(&g, 1, (size_t)64 << 20, 30.0);
  struct sigaction now;
  sigaction(SIGUSR2, NULL, &now);
  bool kept = ignored ? now.sa_handler == SIG_IGN : now.sa_handler == on_own_usr2;
  printf("handled %d churned %zu kept %d dumped %d\n", (int)own_usr2_calls, churned, kept, g.next > 1);
  return 0;
}

/* Four threads each keep a ring of 2,048 blocks of 1-3 KiB from site_worker, each block filled with its own
 * byte and checked whole before it is freed, while the main thread writes 20 profiles: the odd ones to files,
 * the even ones into a FIFO whose reader opens it only once every ring has moved on by 256 blocks since the
 * dump began, so that those dumps are certainly under way while the threads allocate (the reader copies them
 * to files). */
#define RING 2048
#define RING_THREADS 4

typedef struct ring_s {
  pthread_t thread;
  unsigned id;
  unsigned char *block[RING];
  size_t size[RING];
  unsigned char tag[RING];
  _Atomic(uint64_t) ops;
  _Atomic(size_t) live;
  size_t corrupt;
} ring_t;

static ring_t rings[RING_THREADS];
static _Atomic(int) rings_stop;

__attribute__((noipa)) void *site_worker(size_t n, unsigned char tag) {
  unsigned char *p = malloc(n);
  if (p == NULL) abort();
  memset(p, tag, n);
  return p;
}

static bool intact(const unsigned char *p, size_t n, unsigned char tag) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != tag) return false;
  return true;
}

static void *ring_run(void *arg) {
  ring_t *r = arg;
  uint64_t rng = 0x9E3779B97F4A7C15ull * (r->id + 1);
  size_t live = 0;
  for (uint64_t seq = 0; !atomic_load_explicit(&rings_stop, memory_order_relaxed); seq++) {
    size_t i = seq % RING;
    if (r->block[i]) {
      if (!intact(r->block[i], r->size[i], r->tag[i])) r->corrupt++;
      free(r->block[i]);
      live -= r->size[i];
    }
    r->size[i] = 1024 + (size_t)(rng_next(&rng) % 2048);
    r->tag[i] = (unsigned char)(r->id * 67 + seq);
    r->block[i] = site_worker(r->size[i], r->tag[i]);
    live += r->size[i];
    atomic_store_explicit(&r->live, live, memory_order_relaxed);
    atomic_store_explicit(&r->ops, seq + 1, memory_order_release);
  }
  return NULL;
}

/* Waits until every ring i has done `ahead` more operations than from[i]; false after 30 s. */
static bool rings_reach(const uint64_t *from, uint64_t ahead) {
  for (double end = now_s() + 30.0; now_s() < end; nanosleep(&(struct timespec){0, 200000}, NULL)) {
    int behind = 0;
    for (int i = 0; i < RING_THREADS; i++)
      behind += atomic_load_explicit(&rings[i].ops, memory_order_acquire) < from[i] + ahead;
    if (behind == 0) return true;
  }
  return false;
}

static void rings_now(uint64_t *ops, uint64_t *total, size_t *live) {
  *total = 0, *live = 0;
  for (int i = 0; i < RING_THREADS; i++) {
    ops[i] = atomic_load_explicit(&rings[i].ops, memory_order_relaxed);
    *total += ops[i];
    *live += atomic_load_explicit(&rings[i].live, memory_order_relaxed);
  }
}

typedef struct fifo_copy_s {
  char fifo[4096], out[4096];
  uint64_t from[RING_THREADS];
  bool ok;
} fifo_copy_t;

static void *fifo_copy(void *arg) {
  fifo_copy_t *c = arg;
  if (!rings_reach(c->from, 256)) return NULL; /* the dump then hangs in open: the alarm ends it */
  FILE *in = fopen(c->fifo, "rb"), *out = fopen(c->out, "wb");
  if (in == NULL || out == NULL) return NULL;
  char buf[65536];
  size_t n, total = 0;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) total += fwrite(buf, 1, n, out);
  c->ok = total > 0 && fclose(out) == 0;
  fclose(in);
  return NULL;
}

static int dump_threads(const char *path) {
  alarm(120);
  uint64_t ops[RING_THREADS] = {0}, ops0, ops1;
  size_t live0, live1;
  for (int i = 0; i < RING_THREADS; i++) {
    rings[i].id = (unsigned)i;
    pthread_create(&rings[i].thread, NULL, ring_run, &rings[i]);
  }
  int failed = !rings_reach(ops, RING); /* every ring full before the first profile */
  for (int d = 1; d <= 20 && !failed; d++) {
    static fifo_copy_t copy;
    pthread_t reader;
    bool fifo = d % 2 == 0;
    snprintf(copy.out, sizeof copy.out, "%s.%d", path, d);
    snprintf(copy.fifo, sizeof copy.fifo, "%s.%d.fifo", path, d);
    rings_now(copy.from, &ops0, &live0);
    if (fifo) {
      copy.ok = false;
      if (mkfifo(copy.fifo, 0600) != 0 || pthread_create(&reader, NULL, fifo_copy, &copy) != 0) return 1;
    }
    int rc = th_profile_dump(fifo ? copy.fifo : copy.out);
    int e = errno;
    if (fifo) pthread_join(reader, NULL), unlink(copy.fifo);
    rings_now(ops, &ops1, &live1);
    printf("dump %d rc %d errno %d fifo %d copied %d live %zu %zu during %llu\n", d, rc, rc ? e : 0, fifo,
           fifo && copy.ok, live0, live1, (unsigned long long)(ops1 - ops0));
    failed |= rc != 0 || (fifo && !copy.ok);
    if (!rings_reach(ops, 64)) failed = 1; /* the threads go on between dumps too */
  }
  if (failed) printf("error: a dump failed, or the threads made no progress in 30 s\n");
  atomic_store(&rings_stop, 1);
  size_t corrupt = 0;
  for (int i = 0; i < RING_THREADS; i++) {
    pthread_join(rings[i].thread, NULL);
    for (size_t k = 0; k < RING; k++) {
      if (rings[i].block[k] && !intact(rings[i].block[k], rings[i].size[k], rings[i].tag[k])) rings[i].corrupt++;
      free(rings[i].block[k]);
    }
    corrupt += rings[i].corrupt;
  }
  rings_now(ops, &ops1, &live1);
  printf("corrupt %zu ops %llu\n", corrupt, (unsigned long long)ops1);
  return failed || corrupt ? 1 : 0;
}

static int open_fds(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (d == NULL) return -1;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

static void try_dump(const char *name, const char *path) {
  errno = 0;
  int rc = th_profile_dump(path);
  printf("case %s rc %d errno %d\n", name, rc, rc ? errno : 0);
}

/* th_profile_dump's failures, in DIR (PROFILE_DUMP, where the test made an empty folder adir and a file afile):
 * with profiling off; with it on, paths it cannot create, then a good one, which a failure that kept the
 * writer's lock would hang (the alarm ends that). */
static int dump_errors(const char *dir, bool on) {
  alarm(30);
  char path[4096];
  int fds = open_fds();
  if (!on) {
    snprintf(path, sizeof path, "%s/off.pb.gz", dir);
    try_dump("off", path);
  } else {
    try_dump("null", NULL);
    try_dump("empty", "");
    snprintf(path, sizeof path, "%s/missing/x.pb.gz", dir);
    try_dump("missing_dir", path);
    snprintf(path, sizeof path, "%s/adir", dir);
    try_dump("directory", path);
    snprintf(path, sizeof path, "%s/afile/x.pb.gz", dir);
    try_dump("not_a_dir", path);
    snprintf(path, sizeof path, "%s/good.pb.gz", dir);
    try_dump("good", path);
  }
  printf("fds %d %d\n", fds, open_fds());
  return 0;
}

__attribute__((noipa)) void *site_many(size_t n) { return fill(n); }

static pthread_barrier_t many_done, many_dumped;

static void *many_thread(void *arg) {
  size_t *bytes = arg;
  for (size_t n = 0; n < ((size_t)16 << 20); n += 65536) {
    unsigned char *p = site_many(65536);
    if (p[65535] != 0x5a) abort();
    site_free(p);
    *bytes += 65536;
  }
  pthread_barrier_wait(&many_done);
  pthread_barrier_wait(&many_dumped); /* alive while the profile is written */
  return NULL;
}

static int many_threads(const char *path) {
  enum { N = 100 };
  pthread_t t[N];
  static size_t bytes[N];
  pthread_barrier_init(&many_done, NULL, N + 1);
  pthread_barrier_init(&many_dumped, NULL, N + 1);
  for (int i = 0; i < N; i++)
    if (pthread_create(&t[i], NULL, many_thread, &bytes[i]) != 0) return 3;
  pthread_barrier_wait(&many_done);
  int rc = th_profile_dump(path) == 0 ? 0 : 4;
  pthread_barrier_wait(&many_dumped);
  size_t total = 0;
  for (int i = 0; i < N; i++) pthread_join(t[i], NULL), total += bytes[i];
  printf("allocated site_many %zu\n", total);
  return rc;
}

__attribute__((noipa)) void *site_pairs(size_t n) { return fill(n); }
__attribute__((noipa)) void *site_batch(size_t n) { return fill(n); }

/* Phases of pairs and of batches, in three sizes, each phase shorter than a sample distance or longer. */
static int patterns(const char *path) {
  static const size_t sizes[3] = {64, 1024, 8192};
  size_t pairs = 0, batch = 0;
  void *held[200];
  for (int phase = 0; phase < 240; phase++) {
    size_t n = sizes[phase % 3];
    int rounds = 1 + phase % 7 * 40;
    if (phase % 2 == 0) {
      for (int i = 0; i < rounds * 200; i++) {
        void *p = site_pairs(n);
        if (((unsigned char *)p)[n - 1] != 0x5a) return 3;
        site_free(p);
        pairs += n;
      }
    } else {
      for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < 200; i++) held[i] = site_batch(n), batch += n;
        for (int i = 0; i < 200; i++) {
          if (((unsigned char *)held[i])[n - 1] != 0x5a) return 3;
          site_free(held[i]);
        }
      }
    }
  }
  printf("allocated site_pairs %zu\nallocated site_batch %zu\n", pairs, batch);
  return th_profile_dump(path) == 0 ? 0 : 4;
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
  if (strcmp(mode, "patterns") == 0) return patterns(path);
  if (strcmp(mode, "explicit") == 0) return explicit_heaps(path);
  if (strcmp(mode, "aligned") == 0) return aligned_blocks(path);
  if (strcmp(mode, "tiny") == 0) return tiny_blocks(path);
  if (strcmp(mode, "many_stacks") == 0) return many_stacks(path);
  if (strcmp(mode, "many_threads") == 0) return many_threads(path);
  if (strcmp(mode, "interval") == 0) return interval();
  if (strcmp(mode, "signal") == 0) return signal_dump();
  if (strcmp(mode, "signal_own") == 0 && argc > 2) return signal_own(argv[2]);
  if (strcmp(mode, "dump_threads") == 0) return dump_threads(path);
  if (strcmp(mode, "dump_errors") == 0 && argc > 2) return dump_errors(path, strcmp(argv[2], "on") == 0);
  fprintf(stderr, "usage: prog_profile accuracy [THREADS] | patterns | many_threads | leak | fork | dlopen LIB | thread_exit | interval |\n"
                  "       signal | signal_own preinit|main|ignore | dump_threads | dump_errors on|off\n");
  return 2;
}
