/* test_sweep.c: pages that other threads empty in the heap of a thread that only waits go back to the OS,
 * freed by those other threads (src/sweep.c), and nothing the owner still holds or does is disturbed.
 *
 * Default: the owner allocates 32 MiB of small and medium blocks with a pattern in each, frees one block
 * in 32 itself (so that most of its pages sit in its queues, not parked as full), hands the rest to a
 * worker and waits for it on a condition variable. --full: the owner frees none itself, so every page it
 * filled is parked as full and reaches the sweep on the ready stack (the remote frees' notifications). The worker checks every pattern, frees every block (all
 * remote frees), then works in batches of its own, which runs its purge rounds. It passes when threadheap's
 * committed bytes fall below the value before the burst plus 8 MiB within 10 s while the owner waits
 * (CTest sets THREADHEAP_PURGE_DELAY=100), and when the owner, woken, allocates, fills and checks a second
 * burst in its swept heap. Before sweeping, the owner's pages stayed committed until its next slow path.
 *
 * --race S: for S seconds, an owner alternates bursts (blocks handed to two workers, which check and free
 * them while they run batches of their own, and so sweep; pages of the burst's second half are all handed
 * over, so they reach the sweep parked as full) with quiet spells of twice the purge delay in
 * which it frees its own remaining blocks one at a time, every free on its fast path, and allocates a few:
 * a heap that counts as idle while its owner's fast paths run, the case the sweep must leave alone. Every
 * block is checked before it is freed, by whichever thread frees it. */
#define _GNU_SOURCE
#include <linux/membarrier.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "threadheap.h"

#define MiB ((size_t)1 << 20)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

/* Three of four blocks small (16 B-1 KiB), the rest medium (8-40 KiB). */
static size_t block_size(uint64_t r) {
  return (r & 3) ? 16 + (size_t)(r >> 8) % 1009 : 8192 + (size_t)(r >> 8) % (32 * 1024);
}

/* A block's pattern: every 64th byte, the middle and the last, from a tag the block carries. */
static unsigned char pattern(uint64_t tag, size_t k) { return (unsigned char)(tag * 131u + k * 7u + 1u); }

static void fill(unsigned char *p, size_t s, uint64_t tag) {
  for (size_t k = 0; k < s; k += 64) p[k] = pattern(tag, k);
  p[s / 2] = pattern(tag, s / 2);
  p[s - 1] = pattern(tag, s - 1);
}

static bool intact(const unsigned char *p, size_t s, uint64_t tag) {
  for (size_t k = 0; k < s; k += 64)
    if (p[k] != pattern(tag, k)) return false;
  return p[s / 2] == pattern(tag, s / 2) && p[s - 1] == pattern(tag, s - 1);
}

typedef struct {
  unsigned char *p;
  size_t size;
  uint64_t tag;
} block_t;

/* Batches of the calling thread's own: its slow paths and purge rounds (and so its sweeps) run. */
static void own_work(void) {
  enum { BATCH = 300 };
  unsigned char *work[BATCH];
  for (int i = 0; i < BATCH; i++) {
    work[i] = th_malloc(2000);
    if (work[i]) fill(work[i], 2000, (uint64_t)i);
  }
  for (int i = 0; i < BATCH; i++) {
    if (work[i] && !intact(work[i], 2000, (uint64_t)i)) CHECK_MSG(0, "a worker's own block lost its pattern");
    th_free(work[i]);
  }
}

/* ---- default: a waiting owner's emptied pages */

static struct {
  block_t *blocks;
  size_t n;
  size_t committed_limit;
  pthread_mutex_t m;
  pthread_cond_t c;
  bool done;
  size_t bad;
  double seconds;
  size_t committed_after;
} handoff = {.m = PTHREAD_MUTEX_INITIALIZER, .c = PTHREAD_COND_INITIALIZER};

static void *worker(void *arg) {
  (void)arg;
  for (size_t i = 0; i < handoff.n; i++) {
    block_t *b = &handoff.blocks[i];
    if (b->p == NULL) continue;
    if (!intact(b->p, b->size, b->tag)) handoff.bad++;
    th_free(b->p);
  }
  double t0 = now_s();
  th_stats_t s;
  for (;;) {
    th_stats_get(&s);
    handoff.seconds = now_s() - t0;
    if (s.committed < handoff.committed_limit || handoff.seconds > 10.0) break;
    own_work();
  }
  handoff.committed_after = s.committed;
  pthread_mutex_lock(&handoff.m);
  handoff.done = true;
  pthread_cond_signal(&handoff.c);
  pthread_mutex_unlock(&handoff.m);
  return NULL;
}

/* The owner's bursts: n blocks, each filled (small ones only: medium: also medium); returns the bytes. */
static size_t burst(block_t *blocks, size_t n, uint64_t *rng, uint64_t tag0, bool medium) {
  size_t bytes = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = rng_next(rng);
    size_t s = block_size(medium ? r : r | 1);
    blocks[i] = (block_t){th_malloc(s), s, tag0 + i};
    if (!CHECK(blocks[i].p != NULL)) return bytes;
    fill(blocks[i].p, s, tag0 + i);
    bytes += s;
  }
  return bytes;
}

static int run_waiting_owner(bool owner_frees) {
  size_t cap = 32 * MiB / 512; /* small blocks, 520 bytes on average: about 32 MiB */
  block_t *blocks = calloc(cap, sizeof *blocks);
  if (!CHECK(blocks != NULL)) return check_summary();
  own_work();
  th_stats_t before, peak;
  th_stats_get(&before);
  uint64_t rng = 0x9e3779b97f4a7c15ULL;
  size_t bytes = burst(blocks, cap, &rng, 1, false);
  th_stats_get(&peak);
  CHECK_MSG(peak.committed >= before.committed + 24 * MiB, "the burst did not raise committed (%zu -> %zu)",
            before.committed, peak.committed);
  /* One block in 32 freed by the owner: its pages leave the full queue for their class queues. */
  for (size_t i = 0; owner_frees && i < cap; i += 32) {
    th_free(blocks[i].p);
    blocks[i].p = NULL;
  }
  handoff.blocks = blocks;
  handoff.n = cap;
  handoff.committed_limit = before.committed + 8 * MiB;
  pthread_t t;
  if (!CHECK(pthread_create(&t, NULL, worker, NULL) == 0)) return check_summary();
  pthread_mutex_lock(&handoff.m); /* the owner waits: no malloc, no free */
  while (!handoff.done) pthread_cond_wait(&handoff.c, &handoff.m);
  pthread_mutex_unlock(&handoff.m);
  pthread_join(t, NULL);
  printf("burst: %zu blocks, %zu MiB, freed by another thread while their owner waited (%s); committed %zu KiB "
         "before, %zu KiB at peak, %zu KiB after %.3f s\n",
         cap, bytes / MiB, owner_frees ? "pages in their queues" : "pages parked as full", before.committed >> 10, peak.committed >> 10, handoff.committed_after >> 10,
         handoff.seconds);
  CHECK_MSG(handoff.bad == 0, "%zu blocks had lost their pattern when the worker freed them", handoff.bad);
  CHECK_MSG(handoff.committed_after < handoff.committed_limit,
            "committed %zu KiB is still above %zu KiB after %.1f s: the waiting owner's pages were not swept",
            handoff.committed_after >> 10, handoff.committed_limit >> 10, handoff.seconds);
  /* The owner, woken, works in its swept heap again. */
  burst(blocks, cap, &rng, 1u << 30, true);
  size_t bad = 0;
  for (size_t i = 0; i < cap; i++) {
    if (blocks[i].p && !intact(blocks[i].p, blocks[i].size, blocks[i].tag)) bad++;
    th_free(blocks[i].p);
  }
  CHECK_MSG(bad == 0, "%zu blocks of the owner's second burst lost their pattern", bad);
  free(blocks);
  return check_summary();
}

/* ---- --fork: the owner is a thread the forked child does not have */

static struct {
  block_t *blocks;
  size_t n;
  th_stats_t before;
  int ready[2], go[2];
} forked;

/* The parent's thread X: a burst, one block in 32 freed, then it waits through the fork and the child's
 * run; woken, it checks and frees its blocks, which the child's frees must not have touched. */
static void *fork_owner(void *arg) {
  (void)arg;
  own_work();
  th_stats_get(&forked.before);
  uint64_t rng = 0x9e3779b97f4a7c15ULL;
  burst(forked.blocks, forked.n, &rng, 1, false);
  for (size_t i = 0; i < forked.n; i += 32) {
    th_free(forked.blocks[i].p);
    forked.blocks[i].p = NULL;
  }
  char c = 1;
  if (write(forked.ready[1], &c, 1) != 1 || read(forked.go[0], &c, 1) != 1) return NULL;
  size_t bad = 0;
  for (size_t i = 0; i < forked.n; i++) {
    if (forked.blocks[i].p && !intact(forked.blocks[i].p, forked.blocks[i].size, forked.blocks[i].tag)) bad++;
    th_free(forked.blocks[i].p);
  }
  CHECK_MSG(bad == 0, "%zu of the parent's blocks lost their pattern while its child ran", bad);
  return NULL;
}

/* In the child, X's heap has no thread: the main thread frees X's blocks (remote frees into pages nobody
 * collects) and works in batches of its own, whose purge rounds sweep X's heap as idle. Passes when
 * committed falls below its value before X's burst plus 8 MiB within 10 s, as in the default mode. */
static int run_fork(void) {
  forked.n = 32 * MiB / 512;
  forked.blocks = calloc(forked.n, sizeof *forked.blocks);
  if (!CHECK(forked.blocks != NULL) || !CHECK(pipe(forked.ready) == 0 && pipe(forked.go) == 0))
    return check_summary();
  pthread_t x;
  if (!CHECK(pthread_create(&x, NULL, fork_owner, NULL) == 0)) return check_summary();
  char c;
  if (!CHECK(read(forked.ready[0], &c, 1) == 1)) return check_summary();
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    handoff.blocks = forked.blocks;
    handoff.n = forked.n;
    handoff.committed_limit = forked.before.committed + 8 * MiB;
    worker(NULL);
    printf("fork: the child freed %zu blocks of a thread it does not have; committed %zu KiB before its burst, "
           "%zu KiB after %.3f s\n",
           forked.n, forked.before.committed >> 10, handoff.committed_after >> 10, handoff.seconds);
    CHECK_MSG(handoff.bad == 0, "%zu blocks had lost their pattern when the child freed them", handoff.bad);
    CHECK_MSG(handoff.committed_after < handoff.committed_limit,
              "committed %zu KiB is still above %zu KiB after %.1f s: the absent thread's pages were not swept",
              handoff.committed_after >> 10, handoff.committed_limit >> 10, handoff.seconds);
    fflush(stdout);
    _exit(check_summary());
  }
  int status = 0;
  if (CHECK(pid > 0) && CHECK(waitpid(pid, &status, 0) == pid))
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child: status %#x", status);
  c = 1;
  if (CHECK(write(forked.go[1], &c, 1) == 1)) pthread_join(x, NULL);
  free(forked.blocks);
  return check_summary();
}

/* ---- --race: an owner idle by the clock while its fast paths run */

enum { RACE_WORKERS = 2, RACE_BURST = 20000, RACE_RING = 1 << 16 };

static struct {
  block_t ring[RACE_RING]; /* the owner's blocks on their way to the workers */
  size_t head, tail;       /* under m */
  pthread_mutex_t m;
  bool stop;
  size_t bad;
} race = {.m = PTHREAD_MUTEX_INITIALIZER};

static void *race_worker(void *arg) {
  (void)arg;
  for (;;) {
    block_t got[64];
    size_t n = 0;
    pthread_mutex_lock(&race.m);
    while (n < 64 && race.tail != race.head) got[n++] = race.ring[race.tail++ % RACE_RING];
    bool stop = race.stop && n == 0;
    pthread_mutex_unlock(&race.m);
    if (stop) return NULL;
    for (size_t i = 0; i < n; i++) {
      if (!intact(got[i].p, got[i].size, got[i].tag)) __atomic_fetch_add(&race.bad, 1, __ATOMIC_RELAXED);
      th_free(got[i].p);
    }
    own_work();
  }
}

static int run_race(double seconds) {
  long delay_ms = 250;
  const char *d = getenv("THREADHEAP_PURGE_DELAY");
  if (d) delay_ms = atol(d);
  pthread_t t[RACE_WORKERS];
  for (int i = 0; i < RACE_WORKERS; i++)
    if (!CHECK(pthread_create(&t[i], NULL, race_worker, NULL) == 0)) return check_summary();
  static block_t kept[RACE_BURST];
  uint64_t rng = 0x2545f4914f6cdd1dULL, tag = 1;
  size_t own_bad = 0, rounds = 0, quiet_frees = 0;
  double t0 = now_s();
  while (now_s() - t0 < seconds) {
    /* A burst: every block but one in eight of its first half goes to the workers, the rest stays with the
     * owner. Pages of the second half hold no kept block: parked as full, emptied by the workers, swept from
     * the ready stack while the owner frees its kept blocks into the others. */
    size_t nkept = 0;
    for (size_t i = 0; i < RACE_BURST; i++) {
      size_t s = block_size(rng_next(&rng));
      block_t b = {th_malloc(s), s, tag++};
      if (!CHECK(b.p != NULL)) break;
      fill(b.p, s, b.tag);
      if ((i & 7) == 0 && i < RACE_BURST / 2) {
        kept[nkept++] = b;
        continue;
      }
      for (;;) {
        pthread_mutex_lock(&race.m);
        bool room = race.head - race.tail < RACE_RING;
        if (room) race.ring[race.head++ % RACE_RING] = b;
        pthread_mutex_unlock(&race.m);
        if (room) break;
        sleep_ms(1);
      }
    }
    /* A quiet spell of about three times the delay: the owner frees its kept blocks one by one, each
     * into its own page (often the page's last live block), and takes and returns a few small blocks of
     * its first pages, spread evenly and without a pause: all on its fast paths, and too few frees a page
     * to tick its clock, so that the workers' purge rounds find the heap idle and sweep it meanwhile. */
    double spell = (3.0 * (double)delay_ms + 10.0) / 1000.0, q0 = now_s();
    enum { RING = 16 };
    block_t ring[RING] = {{0}};
    size_t k = 0;
    for (; k < nkept; k++) {
      if (!intact(kept[k].p, kept[k].size, kept[k].tag)) own_bad++;
      th_free(kept[k].p);
      quiet_frees++;
      block_t *r = &ring[k % RING];
      if (r->p) {
        if (!intact(r->p, r->size, r->tag)) own_bad++;
        th_free(r->p);
      }
      *r = (block_t){th_malloc(48), 48, tag++};
      if (r->p) fill(r->p, 48, r->tag);
      while (now_s() - q0 < spell * (double)(k + 1) / (double)nkept) {
      }
    }
    for (int i = 0; i < RING; i++) {
      if (ring[i].p && !intact(ring[i].p, ring[i].size, ring[i].tag)) own_bad++;
      th_free(ring[i].p);
    }
    rounds++;
  }
  pthread_mutex_lock(&race.m);
  race.stop = true;
  pthread_mutex_unlock(&race.m);
  for (int i = 0; i < RACE_WORKERS; i++) pthread_join(t[i], NULL);
  printf("race: %zu rounds in %.1f s, %zu frees by the owner in quiet spells\n", rounds, now_s() - t0,
         quiet_frees);
  CHECK_MSG(race.bad == 0, "%zu blocks lost their pattern before a worker freed them", race.bad);
  CHECK_MSG(own_bad == 0, "%zu of the owner's blocks lost their pattern", own_bad);
  CHECK(rounds > 0);
  return check_summary();
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--race")) return run_race(atof(argv[2]));
  bool full = argc == 2 && !strcmp(argv[1], "--full");
  bool fork_mode = argc == 2 && !strcmp(argv[1], "--fork");
  if (argc != 1 && !full && !fork_mode) {
    fprintf(stderr, "usage: test_sweep [--full | --fork | --race SECONDS]\n");
    return 2;
  }
  /* Without the kernel's barrier nothing is swept (docs/design.md): skipped, not failed. */
  long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (cmds < 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED)) {
    printf("skipped: the kernel offers no private expedited membarrier\n");
    return 77;
  }
  return fork_mode ? run_fork() : run_waiting_owner(!full);
}
