/* export.c: the live export (export_tick): with THREADHEAP_STATS_INTERVAL set, the counters are published
 * in /dev/shm/threadheap.<pid> for other processes (threadheap top) to read while the program runs.
 *
 * No thread of its own: the slow paths call export_tick, and the thread that finds the interval passed
 * claims the publication with one CAS and writes it. The file is mapped shared; a sequence number, odd
 * while the writer is at work, lets readers take a consistent copy (docs/live-export.md has the layout). */
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "os.h"

#define EXPORT_SIZE 4096
#define EXPORT_NAME_LEN 24
#define EXPORT_HEADER 64

typedef struct export_header_s {
  char magic[8];             /* "THSTATS1" */
  uint32_t version;          /* 1 */
  uint32_t size;             /* EXPORT_SIZE */
  _Atomic(uint64_t) seq;     /* odd while being written */
  uint64_t pid;
  uint64_t time_ns;          /* last publication, CLOCK_REALTIME */
  uint64_t interval_ms;
  uint32_t counters;
  uint32_t pairs;
  uint64_t start_ns;
} export_header_t;
_Static_assert(sizeof(export_header_t) == EXPORT_HEADER, "the layout of docs/live-export.md");

typedef struct export_counter_s {
  char name[EXPORT_NAME_LEN];
  uint64_t value;
} export_counter_t;

typedef struct export_pair_s {
  uint32_t free_tid, owner_tid;
  char free_name[16], owner_name[16];
  uint64_t interval, total;
} export_pair_t;
_Static_assert(sizeof(export_pair_t) == 56, "the layout of docs/live-export.md");

#define EXPORT_PAIRS 16
/* The totals of the last publication, for each pair's frees in the interval. */
static th_remote_pair_t export_last[EXPORT_PAIRS * 2];
static size_t export_last_len;

static _Atomic(uint64_t) export_next_ms;
static _Atomic(int) export_state; /* 0: not open, 1: open, -1: failed or finished (never again) */
static _Atomic(int) export_busy;  /* a publication is being written */
static export_header_t *export_area;
static long export_pid;
static char export_path[64];

static bool export_open(void) {
  export_pid = os_process_id();
  snprintf(export_path, sizeof export_path, "/dev/shm/threadheap.%ld", export_pid);
  void *area = os_export_open(export_path, EXPORT_SIZE);
  if (area == NULL) {
    options_verbose("cannot create the live export %s; THREADHEAP_STATS_INTERVAL is off", export_path);
    return false;
  }
  export_header_t *h = area;
  memcpy(h->magic, "THSTATS1", 8);
  h->version = 1;
  h->size = EXPORT_SIZE;
  h->pid = (uint64_t)export_pid;
  h->interval_ms = (uint64_t)th_options.stats_interval;
  h->start_ns = os_realtime_ns();
  export_area = h;
  return true;
}

static void export_publish(void) {
  int state = atomic_load_explicit(&export_state, memory_order_acquire);
  if (state < 0) return;
  if (state == 0) {
    if (!export_open()) {
      atomic_store_explicit(&export_state, -1, memory_order_release);
      return;
    }
    atomic_store_explicit(&export_state, 1, memory_order_release);
  }
  th_stats_t s;
  th_stats_get(&s);
  export_header_t *h = export_area;
  export_counter_t *c = (export_counter_t *)((uint8_t *)h + EXPORT_HEADER);
  const size_t *v = (const size_t *)&s;
  size_t n = sizeof(th_stats_t) / sizeof(size_t);
  /* Odd first: the acquire half keeps the writes below from moving above it (a seqlock's writer side). */
  uint64_t seq = atomic_fetch_add_explicit(&h->seq, 1, memory_order_acq_rel);
  for (size_t i = 0; i < n; i++) {
    memset(c[i].name, 0, EXPORT_NAME_LEN);
    strncpy(c[i].name, stats_names[i], EXPORT_NAME_LEN - 1);
    c[i].value = v[i];
  }
  h->counters = (uint32_t)n;
  th_remote_pair_t pairs[EXPORT_PAIRS];
  size_t np = th_stats_remote_pairs(pairs, EXPORT_PAIRS);
  export_pair_t *p = (export_pair_t *)(c + n);
  _Static_assert(EXPORT_HEADER + 64 * 32 + EXPORT_PAIRS * sizeof(export_pair_t) <= EXPORT_SIZE, "room");
  for (size_t i = 0; i < np; i++) {
    uint64_t before = 0;
    for (size_t j = 0; j < export_last_len; j++)
      if (export_last[j].free_tid == pairs[i].free_tid && export_last[j].owner_tid == pairs[i].owner_tid)
        before = export_last[j].frees;
    p[i].free_tid = (uint32_t)pairs[i].free_tid;
    p[i].owner_tid = (uint32_t)pairs[i].owner_tid;
    os_thread_name((uint32_t)pairs[i].free_tid, p[i].free_name);
    if (pairs[i].owner_tid) os_thread_name((uint32_t)pairs[i].owner_tid, p[i].owner_name);
    else memset(p[i].owner_name, 0, sizeof p[i].owner_name);
    p[i].total = pairs[i].frees;
    p[i].interval = pairs[i].frees >= before ? pairs[i].frees - before : pairs[i].frees;
  }
  memcpy(export_last, pairs, np * sizeof pairs[0]);
  export_last_len = np;
  h->pairs = (uint32_t)np;
  h->time_ns = os_realtime_ns();
  atomic_store_explicit(&h->seq, seq + 2, memory_order_release);
}

void export_tick(uint64_t now_ms) {
  long interval = th_options.stats_interval;
  if (th_likely(interval == 0)) return;
  uint64_t next = atomic_load_explicit(&export_next_ms, memory_order_relaxed);
  if (now_ms < next) return;
  if (!atomic_compare_exchange_strong_explicit(&export_next_ms, &next, now_ms + (uint64_t)interval,
                                               memory_order_relaxed, memory_order_relaxed))
    return; /* another thread publishes this round */
  if (atomic_exchange_explicit(&export_busy, 1, memory_order_acquire)) return;
  export_publish();
  atomic_store_explicit(&export_busy, 0, memory_order_release);
}

void export_done(void) {
  if (atomic_exchange_explicit(&export_state, -1, memory_order_acq_rel) == 1 && export_pid == os_process_id())
    os_export_remove(export_path);
}

/* The child shares the parent's mapping of the parent's file: it must not write there. It makes its own file
 * at its first publication. */
void export_fork_child(void) {
  export_area = NULL;
  export_last_len = 0;
  atomic_store_explicit(&export_busy, 0, memory_order_relaxed);
  atomic_store_explicit(&export_next_ms, 0, memory_order_relaxed);
  if (atomic_load_explicit(&export_state, memory_order_relaxed) == 1)
    atomic_store_explicit(&export_state, 0, memory_order_relaxed);
}
