/* test_stats_live.c: the RSS attribution of th_stats_get and the live export (THREADHEAP_STATS_INTERVAL).
 *
 *  - exact: one thread allocates blocks of class sizes (16 B to 1 MiB) and huge blocks; in_use grows by
 *    exactly what it holds, and falls by exactly what it frees; no part is negative and the parts add up to
 *    what is mapped plus at most the segment map.
 *  - threads: four threads allocate, exchange and free blocks, each keeping a known set; after they exit
 *    in_use has grown by exactly the blocks they kept.
 *  - sparse: medium blocks written only in their first OS page (those kept: whole), most then freed: the free
 *    blocks count what
 *    they hold resident (their first pages, mincore), not their size, so the parts fit in what the process's
 *    RSS grew by.
 *  - concurrent: while two threads allocate and free without pause, in_use is within 1% of the truth.
 *  - export: the test runs itself with THREADHEAP_STATS_INTERVAL=50 as a child that holds 64 MiB and then
 *    only allocates and frees four small blocks in turn (every malloc and free on its fast path). The file
 *    /dev/shm/threadheap.<pid> appears (replacing a stale one the child left there first), has the layout of
 *    docs/live-export.md, reports in_use within 1%, keeps being updated (its sequence number grows),
 *    reads consistently while being written, and is gone once the child exits. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "threadheap.h"

static const size_t sizes[] = {16, 48, 128, 640, 1024, 4096, 12288, 49152, 65536, 262144, 1048576};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static bool parts_ok(const th_stats_t *s) {
  size_t sum = s->in_use + s->free_in_pages + s->empty_pages + s->cached + s->metadata + s->purged;
  /* every part is a size_t: a negative one would show as a sum far past mapped */
  return sum >= s->mapped && sum - s->mapped <= ((size_t)32 << 20) && s->in_use_peak >= s->in_use;
}

static void test_exact(void) {
  th_stats_t a, b, c;
  th_stats_get(&a);
  enum { PER = 40 };
  void *held[NSIZES][PER];
  size_t total = 0;
  for (size_t i = 0; i < NSIZES; i++)
    for (int k = 0; k < PER; k++) {
      held[i][k] = th_malloc(sizes[i]);
      memset(held[i][k], 7, sizes[i]);
      total += sizes[i];
    }
  void *huge[3];
  size_t huge_sizes[3] = {(size_t)3 << 20, ((size_t)5 << 20) + 4096, (size_t)9 << 20};
  for (int k = 0; k < 3; k++) {
    huge[k] = th_malloc(huge_sizes[k]);
    memset(huge[k], 1, huge_sizes[k]);
    total += huge_sizes[k];
  }
  th_stats_get(&b);
  CHECK_MSG(b.in_use - a.in_use == total, "in_use grew by %zu, the blocks held are %zu", b.in_use - a.in_use, total);
  CHECK_MSG(parts_ok(&b), "in_use %zu free %zu empty %zu cached %zu meta %zu purged %zu mapped %zu", b.in_use,
            b.free_in_pages, b.empty_pages, b.cached, b.metadata, b.purged, b.mapped);
  size_t freed = 0;
  for (size_t i = 0; i < NSIZES; i++)
    for (int k = 0; k < PER; k += 2) {
      th_free(held[i][k]);
      freed += sizes[i];
    }
  th_free(huge[1]);
  freed += huge_sizes[1];
  th_stats_get(&c);
  CHECK_MSG(b.in_use - c.in_use == freed, "in_use fell by %zu, the blocks freed are %zu", b.in_use - c.in_use, freed);
  CHECK_MSG(c.free_in_pages > b.free_in_pages, "free_in_pages %zu after freeing half (was %zu)", c.free_in_pages,
            b.free_in_pages);
  CHECK(parts_ok(&c));
  for (size_t i = 0; i < NSIZES; i++)
    for (int k = 1; k < PER; k += 2) th_free(held[i][k]);
  th_free(huge[0]);
  th_free(huge[2]);
  th_stats_get(&c);
  CHECK_MSG(c.in_use == a.in_use, "in_use %zu after freeing everything, %zu before", c.in_use, a.in_use);
  CHECK(c.in_use_peak >= b.in_use);
}

/* ---- threads that exchange blocks and keep a known set */

#define XTHREADS 4
#define XBLOCKS 4000
static void *_Atomic xslots[XTHREADS][XBLOCKS];

static void *exchanger(void *arg) {
  int me = (int)(intptr_t)arg;
  uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)(me + 1);
  for (int round = 0; round < 20; round++) {
    for (int i = 0; i < XBLOCKS; i++) { /* put a block in a slot of the next thread, free what was there */
      r = r * 6364136223846793005ull + 1442695040888963407ull;
      size_t size = sizes[(r >> 33) % (NSIZES - 2)];
      void *p = th_malloc(size);
      memset(p, me, 16);
      th_free(atomic_exchange(&xslots[(me + 1) % XTHREADS][i], p));
    }
  }
  /* Some blocks of every size in the thread's own slots; the main thread counts what the slots hold. */
  for (int i = 0; i < XBLOCKS; i += 3) {
    void *p = th_malloc(sizes[i % NSIZES]);
    memset(p, 1, sizes[i % NSIZES]);
    th_free(atomic_exchange(&xslots[me][i], p));
  }
  return NULL;
}

static size_t rss_bytes(void) { return check_statm_bytes(1); }

static void test_sparse(void) {
  enum { N = 200, KEEP = 25 };
  const size_t size = 60 * 1024, ps = (size_t)sysconf(_SC_PAGESIZE);
  static void *blocks[N];
  th_collect(); /* every free slot purged: what follows starts from untouched memory */
  th_stats_t a, b;
  th_stats_get(&a);
  size_t rss0 = rss_bytes();
  for (int i = 0; i < N; i++) {
    blocks[i] = th_malloc(size);
    if (!CHECK(blocks[i] != NULL)) return;
    if (i % KEEP == 0) memset(blocks[i], i, size); /* kept: written whole, resident as in_use counts it */
    ((volatile unsigned char *)blocks[i])[8] = (unsigned char)i;
  }
  for (int i = 0; i < N; i++)
    if (i % KEEP) th_free(blocks[i]);
  th_stats_get(&b);
  size_t rss1 = rss_bytes();
  size_t held0 = a.free_in_pages + a.empty_pages, held1 = b.free_in_pages + b.empty_pages;
  size_t held = held1 > held0 ? held1 - held0 : 0, grown = rss1 > rss0 ? rss1 - rss0 : 0;
  size_t freed = N - (N + KEEP - 1) / KEEP;
  CHECK_MSG(held <= grown + ((size_t)256 << 10), "sparse: free and empty grew %zu bytes, RSS %zu", held, grown);
  CHECK_MSG(held >= freed * ps / 2, "sparse: free and empty grew %zu bytes for %zu freed blocks", held, freed);
  for (int i = 0; i < N; i += KEEP) {
    CHECK(((volatile unsigned char *)blocks[i])[8] == (unsigned char)i);
    th_free(blocks[i]);
  }
  printf("sparse: %zu blocks of %zu KiB freed (first OS page written): free and empty +%zu KiB, RSS +%zu KiB\n",
         freed, size >> 10, held >> 10, grown >> 10);
}

static void *idle(void *arg) { return arg; }

static void test_threads(void) {
  th_stats_t a, b;
  pthread_t t[XTHREADS];
  /* glibc keeps each thread's TLS vector (a malloc'd block) with its cached stack: threads made once first,
   * so that the threads below reuse those and hold nothing the test does not count. */
  for (int i = 0; i < XTHREADS; i++) pthread_create(&t[i], NULL, idle, NULL);
  for (int i = 0; i < XTHREADS; i++) pthread_join(t[i], NULL);
  th_stats_get(&a);
  for (int i = 0; i < XTHREADS; i++) pthread_create(&t[i], NULL, exchanger, (void *)(intptr_t)i);
  for (int i = 0; i < XTHREADS; i++) pthread_join(t[i], NULL);
  size_t live = 0;
  for (int i = 0; i < XTHREADS; i++)
    for (int k = 0; k < XBLOCKS; k++) {
      void *p = atomic_load(&xslots[i][k]);
      if (p) live += th_usable_size(p);
    }
  th_stats_get(&b);
  CHECK_MSG(b.in_use - a.in_use == live, "after the threads: in_use grew by %zu, blocks held %zu",
            b.in_use - a.in_use, live);
  CHECK(parts_ok(&b));
  for (int i = 0; i < XTHREADS; i++)
    for (int k = 0; k < XBLOCKS; k++) th_free(atomic_exchange(&xslots[i][k], NULL));
  th_stats_get(&b);
  CHECK_MSG(b.in_use == a.in_use, "in_use %zu after all freed, %zu before", b.in_use, a.in_use);
}

/* ---- concurrent reads */

static atomic_int churn_stop;
static void *churner(void *arg) {
  (void)arg;
  void *ring[8] = {0};
  unsigned i = 0;
  while (!atomic_load(&churn_stop)) {
    th_free(ring[i % 8]);
    ring[i % 8] = th_malloc(16 + (i % 64) * 16);
    i++;
  }
  for (int k = 0; k < 8; k++) th_free(ring[k]);
  return NULL;
}

static void test_concurrent(void) {
  th_stats_t a, b;
  th_stats_get(&a);
  enum { N = 1024 };
  static void *held[N];
  size_t total = 0;
  for (int i = 0; i < N; i++) {
    held[i] = th_malloc(65536);
    memset(held[i], 3, 65536);
    total += 65536;
  }
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, churner, NULL);
  int worst = 0;
  for (int r = 0; r < 50; r++) {
    th_stats_get(&b);
    double off = ((double)(b.in_use - a.in_use) - (double)total) / (double)total;
    if (off < 0) off = -off;
    if (off > 0.01) worst++;
  }
  atomic_store(&churn_stop, 1);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  CHECK_MSG(worst == 0, "%d of 50 reads off by more than 1%% while two threads allocated", worst);
  for (int i = 0; i < N; i++) th_free(held[i]);
}

/* ---- allocations and frees counted without counting them (th_heap_flow_t) */

static void *_Atomic remote_batch[2000];
static atomic_int remote_go, remote_done;

static void *remote_freer(void *arg) {
  (void)arg;
  while (!atomic_load(&remote_go)) sched_yield();
  for (int i = 0; i < 2000; i++) th_free(atomic_load(&remote_batch[i]));
  atomic_store(&remote_done, 1);
  return NULL;
}

static void test_flow(void) {
  pthread_t t;
  pthread_create(&t, NULL, remote_freer, NULL); /* made before the first reading: creating allocates */
  th_stats_t a, b;
  th_stats_get(&a);
  size_t allocs = 0, frees = 0, small_bytes = 0;
  enum { HELD = 10000 };
  static void *held[HELD];
  for (int i = 0; i < HELD; i++) held[i] = th_malloc(48), allocs++, small_bytes += 48;
  for (int i = 0; i < 5000; i++) th_free(held[i]), frees++;           /* the owner frees */
  for (int i = 0; i < 2000; i++) atomic_store(&remote_batch[i], held[5000 + i]);
  atomic_store(&remote_go, 1);
  while (!atomic_load(&remote_done)) sched_yield();
  frees += 2000;                                                      /* another thread's, not collected */
  for (int i = 0; i < 200000; i++) th_free(th_malloc(64)), allocs++, frees++, small_bytes += 64; /* ticks */
  /* Blocks handed out inside a larger one (aligned): their free takes the slow path, whose ticks count too,
   * also when the free empties the page. th_malloc(4096 + 1024 + 16) is what th_aligned_alloc asks for. */
  for (int i = 0; i < 20000; i++) {
    void *p = th_aligned_alloc(1024, 4096);
    if (p == NULL || (uintptr_t)p % 1024 != 0) CHECK_MSG(0, "th_aligned_alloc(1024, 4096) gave %p", p);
    th_free(p), allocs++, frees++; /* a medium block: not in small_bytes */
  }
  /* Pages of 1 KiB blocks run full (parked), then one block of each is freed (the free that unparks). */
  enum { FULL = 64 * 3 };
  static void *full[FULL];
  for (int i = 0; i < FULL; i++) full[i] = th_malloc(1024), allocs++, small_bytes += 1024;
  for (int i = 0; i < FULL; i += 64) th_free(full[i]), frees++;
  void *h1 = th_malloc((size_t)3 << 20), *h2 = th_malloc((size_t)5 << 20);
  allocs += 2;
  h1 = th_realloc(h1, (size_t)7 << 20); /* a huge realloc: a free and an allocation */
  allocs++, frees++;
  th_free(h1), th_free(h2);
  frees += 2;
  th_stats_get(&b);
  CHECK_MSG(b.allocs - a.allocs == allocs, "allocs grew by %zu, the test made %zu", b.allocs - a.allocs, allocs);
  CHECK_MSG(b.frees - a.frees == frees, "frees grew by %zu, the test made %zu", b.frees - a.frees, frees);
  CHECK_MSG(b.range_alloc_bytes[0] - a.range_alloc_bytes[0] == small_bytes, "small bytes allocated %zu, made %zu",
            b.range_alloc_bytes[0] - a.range_alloc_bytes[0], small_bytes);
  CHECK_MSG(b.range_allocs[3] - a.range_allocs[3] == 3 && b.range_frees[3] - a.range_frees[3] == 3 &&
                b.range_alloc_bytes[3] - a.range_alloc_bytes[3] == ((size_t)15 << 20),
            "huge: %zu allocs, %zu frees, %zu bytes", b.range_allocs[3] - a.range_allocs[3],
            b.range_frees[3] - a.range_frees[3], b.range_alloc_bytes[3] - a.range_alloc_bytes[3]);
  CHECK_MSG(b.fresh_bytes >= a.fresh_bytes && b.fresh_bytes - a.fresh_bytes <= b.alloc_bytes - a.alloc_bytes &&
                b.reused_bytes > a.reused_bytes,
            "fresh %zu reused %zu of %zu allocated", b.fresh_bytes - a.fresh_bytes, b.reused_bytes - a.reused_bytes,
            b.alloc_bytes - a.alloc_bytes);
  CHECK_MSG(b.remaps_in_place + b.remaps_moved - a.remaps_in_place - a.remaps_moved == 1 &&
                b.remap_bytes_not_copied - a.remap_bytes_not_copied == ((size_t)3 << 20),
            "the huge realloc from 3 to 7 MiB: %zu remaps, %zu bytes not copied",
            b.remaps_in_place + b.remaps_moved - a.remaps_in_place - a.remaps_moved,
            b.remap_bytes_not_copied - a.remap_bytes_not_copied);
  for (int i = 7000; i < HELD; i++) th_free(held[i]);
  for (int i = 0; i < FULL; i++)
    if (i % 64) th_free(full[i]);
  pthread_join(t, NULL);
}

/* ---- who frees whose memory: two producers, one consumer that frees everything and exits */

#define PAIR_N1 30000
#define PAIR_N2 12000
static void *pair_blocks[PAIR_N1 + PAIR_N2];
static atomic_int pair_stage; /* 1: producers filled, 2: consumer done */
static atomic_int pair_tids[3];

static void *pair_producer(void *arg) {
  int which = (int)(intptr_t)arg;
  atomic_store(&pair_tids[which], (int)gettid());
  int from = which == 0 ? 0 : PAIR_N1, n = which == 0 ? PAIR_N1 : PAIR_N2;
  for (int i = 0; i < n; i++) pair_blocks[from + i] = th_malloc(32 + (size_t)(i % 8) * 16);
  atomic_fetch_add(&pair_stage, 1);
  while (atomic_load(&pair_stage) < 3) sched_yield(); /* stays alive: its blocks keep their owner */
  return NULL;
}

static void *pair_consumer(void *arg) {
  (void)arg;
  atomic_store(&pair_tids[2], (int)gettid());
  for (int i = 0; i < PAIR_N1 + PAIR_N2; i++) th_free(pair_blocks[i]);
  return NULL;
}

static void test_pairs(void) {
  pthread_t p1, p2, c;
  pthread_create(&p1, NULL, pair_producer, (void *)0);
  pthread_create(&p2, NULL, pair_producer, (void *)1);
  while (atomic_load(&pair_stage) < 2) sched_yield();
  pthread_create(&c, NULL, pair_consumer, NULL);
  pthread_join(c, NULL); /* the consumer has exited: its pairs are in the table of exited threads */
  th_remote_pair_t pairs[64];
  size_t n = th_stats_remote_pairs(pairs, 64);
  if (getenv("THREADHEAP_REMOTE_PAIRS") == NULL) { /* off by default: counted only when asked for */
    CHECK_MSG(n == 0, "%zu pairs counted with THREADHEAP_REMOTE_PAIRS unset", n);
    atomic_store(&pair_stage, 3);
    pthread_join(p1, NULL);
    pthread_join(p2, NULL);
    return;
  }
  size_t to1 = 0, to2 = 0;
  for (size_t i = 0; i < n; i++) {
    if (pairs[i].free_tid != atomic_load(&pair_tids[2])) continue;
    if (pairs[i].owner_tid == atomic_load(&pair_tids[0])) to1 += pairs[i].frees;
    if (pairs[i].owner_tid == atomic_load(&pair_tids[1])) to2 += pairs[i].frees;
  }
  CHECK_MSG(to1 == PAIR_N1 && to2 == PAIR_N2, "consumer -> producer 1: %zu (made %d), -> producer 2: %zu (made %d)",
            to1, PAIR_N1, to2, PAIR_N2);
  CHECK_MSG(n >= 2 && pairs[0].frees >= pairs[1].frees, "pairs sorted by frees");
  atomic_store(&pair_stage, 3);
  pthread_join(p1, NULL);
  pthread_join(p2, NULL);
}

/* ---- explicit heaps: the same numbers per heap, and a serialized heap's lock */

static th_heap_t *locked_heap;
#define LOCKED_OPS 50000
static void *locked_user(void *arg) {
  (void)arg;
  for (int i = 0; i < LOCKED_OPS; i++) th_free(th_heap_malloc(locked_heap, 64));
  return NULL;
}

static void test_heap_stats(void) {
  th_stats_t whole_a, whole_b, h, e;
  th_heap_t *mine = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
  th_heap_t *shared = th_heap_create(0, 0, 0);
  th_stats_get(&whole_a);
  size_t mine_bytes = 0, shared_bytes = 0;
  enum { N = 3000 };
  static void *a[N], *b[N];
  for (int i = 0; i < N; i++) {
    a[i] = th_heap_malloc(mine, sizes[i % NSIZES]);
    mine_bytes += sizes[i % NSIZES];
    b[i] = th_heap_malloc(shared, 256);
    shared_bytes += 256;
  }
  void *big = th_heap_malloc(mine, (size_t)6 << 20);
  mine_bytes += (size_t)6 << 20;
  CHECK(th_heap_stats_get(mine, &h) == 0);
  CHECK_MSG(h.in_use == mine_bytes, "no-serialize heap: in_use %zu, held %zu", h.in_use, mine_bytes);
  CHECK_MSG(h.range_allocs[0] + h.range_allocs[1] + h.range_allocs[2] == N, "its allocations: %zu",
            h.range_allocs[0] + h.range_allocs[1] + h.range_allocs[2]);
  CHECK_MSG(h.mapped >= h.in_use + h.free_in_pages + h.metadata && h.committed >= h.in_use,
            "mapped %zu committed %zu in_use %zu", h.mapped, h.committed, h.in_use);
  CHECK(th_heap_stats_get(shared, &e) == 0);
  CHECK_MSG(e.in_use == shared_bytes, "serialized heap: in_use %zu, held %zu", e.in_use, shared_bytes);
  CHECK_MSG(e.heap_lock_acquires == N, "lock acquisitions %zu for %d allocations", e.heap_lock_acquires, N);
  th_stats_get(&whole_b);
  CHECK_MSG(whole_b.in_use - whole_a.in_use == mine_bytes + shared_bytes, "process-wide in_use grew by %zu",
            whole_b.in_use - whole_a.in_use);
  for (int i = 0; i < N; i++) th_free(a[i]), th_free(b[i]);
  th_free(big);
  CHECK(th_heap_stats_get(mine, &h) == 0 && h.in_use == 0);
  errno = 0;
  CHECK(th_heap_stats_get(NULL, &h) == -1 && errno == EINVAL);
  th_heap_destroy(mine);
  th_heap_destroy(shared);

  /* One lock (a cap keeps a single shard), four threads: some allocations wait. On a loaded machine the
   * threads may run one after another for a while, so rounds go on (at most 40) until one has waited. */
  locked_heap = th_heap_create(0, 0, (size_t)64 << 20);
  int rounds = 0;
  do {
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, locked_user, NULL);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    CHECK(th_heap_stats_get(locked_heap, &e) == 0);
  } while (++rounds < 40 && e.heap_lock_waits == 0);
  CHECK_MSG(e.heap_lock_acquires == (size_t)rounds * 4 * LOCKED_OPS && e.heap_lock_waits > 0 &&
                e.heap_lock_waits <= e.heap_lock_acquires,
            "one lock, four threads, %d rounds: %zu acquisitions, %zu waits", rounds, e.heap_lock_acquires,
            e.heap_lock_waits);
  printf("serialized heap, one lock, 4 threads: %zu of %zu allocations waited\n", e.heap_lock_waits,
         e.heap_lock_acquires);
  th_heap_destroy(locked_heap);
}

/* ---- the live export, read as another process would */

typedef struct {
  uint64_t seq, pid, counters;
  uint64_t in_use;
  bool ok;
} export_view_t;

static export_view_t read_export(const char *path) {
  export_view_t v = {0};
  for (int attempt = 0; attempt < 100; attempt++) {
    unsigned char buf[4096];
    int fd = open(path, O_RDONLY);
    if (fd < 0) return v;
    ssize_t n = pread(fd, buf, sizeof buf, 0);
    uint64_t seq_after = 0;
    ssize_t m = pread(fd, &seq_after, 8, 16);
    close(fd);
    if (n < 64 || m != 8) return v;
    uint64_t seq;
    memcpy(&seq, buf + 16, 8);
    if ((seq & 1) || seq != seq_after) { /* being written: again, and past ten tries give the writer a
                                            * millisecond each (preempted mid-publication on a busy machine) */
      if (attempt >= 10) usleep(1000);
      continue;
    }
    uint32_t version, size, counters;
    memcpy(&version, buf + 8, 4);
    memcpy(&size, buf + 12, 4);
    memcpy(&counters, buf + 48, 4);
    if (memcmp(buf, "THSTATS1", 8) != 0 || version != 1 || size != 4096 || 64 + 32 * (size_t)counters > (size_t)n)
      return v;
    v.seq = seq;
    memcpy(&v.pid, buf + 24, 8);
    v.counters = counters;
    for (uint32_t i = 0; i < counters; i++) {
      const unsigned char *c = buf + 64 + 32 * i;
      if (strncmp((const char *)c, "in_use", 24) == 0) memcpy(&v.in_use, c + 24, 8), v.ok = true;
    }
    return v;
  }
  return v;
}

#define CHILD_LIVE ((size_t)64 << 20)

static int export_child(int ready_fd, int quit_fd) {
  char path[64];
  snprintf(path, sizeof path, "/dev/shm/threadheap.%d", (int)getpid());
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600); /* a stale file of a dead process with our pid */
  if (fd >= 0) {
    (void)!write(fd, "stale!", 6);
    close(fd);
  }
  void *hold[CHILD_LIVE / 32768];
  for (size_t i = 0; i < CHILD_LIVE / 32768; i++) {
    hold[i] = th_malloc(32768);
    memset(hold[i], 9, 32768);
  }
  (void)!write(ready_fd, "r", 1);
  fcntl(quit_fd, F_SETFL, O_NONBLOCK);
  void *ring[4] = {0};
  for (unsigned long i = 0;; i++) { /* steady state: four 64-byte blocks in turn, fast paths only */
    th_free(ring[i & 3]);
    ring[i & 3] = th_malloc(64);
    if ((i & 0xffff) == 0) {
      char c;
      if (read(quit_fd, &c, 1) >= 0) break; /* a byte or EOF: time to go */
    }
  }
  for (size_t i = 0; i < CHILD_LIVE / 32768; i++) th_free(hold[i]);
  return 0;
}

static void test_export(const char *self) {
  int ready[2], quit[2];
  if (!CHECK(pipe(ready) == 0 && pipe(quit) == 0)) return;
  pid_t pid = fork();
  if (pid == 0) {
    close(ready[0]);
    close(quit[1]);
    char rfd[16], qfd[16];
    snprintf(rfd, sizeof rfd, "%d", ready[1]);
    snprintf(qfd, sizeof qfd, "%d", quit[0]);
    setenv("THREADHEAP_STATS_INTERVAL", "50", 1);
    execl(self, self, "--export-child", rfd, qfd, (char *)NULL);
    _exit(127);
  }
  close(ready[1]);
  close(quit[0]);
  char c;
  CHECK(read(ready[0], &c, 1) == 1);
  char path[64];
  snprintf(path, sizeof path, "/dev/shm/threadheap.%d", (int)pid);
  export_view_t v = {0};
  for (int i = 0; i < 100 && !(v.ok && v.in_use >= CHILD_LIVE); i++) { /* up to 5 s for the first publication */
    usleep(50000);
    v = read_export(path);
  }
  CHECK_MSG(v.ok, "no readable export at %s", path);
  CHECK_MSG(v.pid == (uint64_t)pid, "the export names pid %llu, the child is %d", (unsigned long long)v.pid, (int)pid);
  double off = ((double)v.in_use - (double)CHILD_LIVE) / (double)CHILD_LIVE;
  CHECK_MSG(off > -0.01 && off < 0.01, "exported in_use %llu, the child holds %zu", (unsigned long long)v.in_use,
            CHILD_LIVE);
  /* Many reads while the writer publishes every 50 ms: each consistent, and the sequence keeps growing. */
  uint64_t first_seq = v.seq;
  int unread = 0, off_reads = 0;
  unsigned long long off_value = 0;
  export_view_t w = v;
  for (int i = 0; i < 400 && w.seq < first_seq + 6; i++) {
    usleep(5000);
    w = read_export(path);
    if (!w.ok) unread++;
    else if (w.in_use < CHILD_LIVE || w.in_use > CHILD_LIVE + CHILD_LIVE / 100) off_reads++, off_value = w.in_use;
  }
  CHECK_MSG(w.seq >= first_seq + 6, "the export was not updated: sequence %llu, then %llu",
            (unsigned long long)first_seq, (unsigned long long)w.seq);
  CHECK_MSG(unread == 0, "%d reads found no consistent copy in 100 tries", unread);
  CHECK_MSG(off_reads == 0, "%d reads had in_use off (the last %llu, the child holds %zu)", off_reads, off_value,
            CHILD_LIVE);
  close(quit[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK_MSG(access(path, F_OK) != 0, "%s is still there after the child exited", path);
  close(ready[0]);
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--export-child") == 0) return export_child(atoi(argv[2]), atoi(argv[3]));
  test_exact();
  test_sparse();
  test_threads();
  test_concurrent();
  test_flow();
  test_pairs();
  test_heap_stats();
  test_export(argv[0]);
  return check_summary();
}
