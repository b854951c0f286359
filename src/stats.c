/* stats.c: process-wide counters (th_stats_get, th_stats_print). Slow paths only update them. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "os.h"

th_stats_t th_stats_global;

/* The fields are plain size_t in the public struct; inside the library they are updated with relaxed
 * atomic operations through this cast, which is sound on every target threadheap supports. */
#define COUNTER(f) ((_Atomic(size_t) *)&th_stats_global.f)

static void add(_Atomic(size_t) *c, long delta) {
  atomic_fetch_add_explicit(c, (size_t)delta, memory_order_relaxed);
}

void stats_os_map(size_t size) {
  add(COUNTER(os_maps), 1);
  add(COUNTER(mapped), (long)size);
}

void stats_os_unmap(size_t size) {
  add(COUNTER(os_unmaps), 1);
  add(COUNTER(mapped), -(long)size);
}

void stats_os_purge(size_t size) {
  add(COUNTER(os_purges), 1);
  add(COUNTER(purged_bytes), (long)size);
}

void stats_committed(long delta) {
  size_t now = atomic_fetch_add_explicit(COUNTER(committed), (size_t)delta, memory_order_relaxed) + (size_t)delta;
  size_t peak = atomic_load_explicit(COUNTER(committed_peak), memory_order_relaxed);
  while (delta > 0 && now > peak &&
         !atomic_compare_exchange_weak_explicit(COUNTER(committed_peak), &peak, now, memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
}

void stats_cached(long delta) { add(COUNTER(cached), delta); }

void stats_count(size_t *counter) { add((_Atomic(size_t) *)counter, 1); }

void stats_add(size_t *counter, size_t n) { add((_Atomic(size_t) *)counter, (long)n); }

/* Remote frees are counted when their page is collected, which a serialized explicit heap does about once
 * per allocation: one shared counter bumped by every thread was a hot spot there (docs/design.md, "Seeing
 * where the memory goes"). Each thread counts in its own word and adds to the shared one in batches, when it
 * reads the counters, and when it exits (thread_done; a thread that never had a default heap is signed up
 * for that when it starts a batch). */
#define REMOTE_BATCH 1024
static __thread size_t remote_pending __attribute__((tls_model("initial-exec")));

void stats_add_remote(size_t n) {
  if (th_unlikely(remote_pending == 0)) thread_flush_stats_at_exit();
  remote_pending += n;
  if (th_unlikely(remote_pending >= REMOTE_BATCH)) stats_flush_thread();
}

void stats_flush_thread(void) {
  if (remote_pending == 0) return;
  add(COUNTER(remote_frees), (long)remote_pending);
  remote_pending = 0;
}

const char *const stats_names[] = {
    "committed", "committed_peak", "mapped", "cached", "os_maps", "os_unmaps", "os_purges",
    "purged_bytes", "cache_hits", "cache_misses", "huge_allocs", "remote_frees", "heaps_created",
    "heaps_abandoned", "segments_adopted", "threads_live", "segments_waiting", "os_calls", "os_call_ns",
    "in_use", "free_in_pages", "empty_pages", "metadata", "purged", "in_use_peak",
    "allocs", "frees", "alloc_bytes", "free_bytes", "fresh_bytes", "reused_bytes",
#define RANGES(what) "small_" what, "medium_" what, "large_" what, "huge_" what
    RANGES("alloc_blocks"), RANGES("free_blocks"), RANGES("alloc_bytes"), RANGES("free_bytes"),
    RANGES("fresh_bytes"), "heap_lock_acquires", "heap_lock_waits", "remaps_in_place", "remaps_moved",
    "remap_bytes_not_copied", "pool_slots", "pages_borrowed", "pages_orphaned",
    "pages_handed_off"};
#undef RANGES
_Static_assert(sizeof stats_names / sizeof stats_names[0] == sizeof(th_stats_t) / sizeof(size_t),
               "a name per counter");

void stats_os_call(uint64_t ns) {
  add(COUNTER(os_calls), 1);
  add(COUNTER(os_call_ns), (long)ns);
}

void stats_peak_in_use(size_t in_use) {
  size_t peak = atomic_load_explicit(COUNTER(in_use_peak), memory_order_relaxed);
  while (in_use > peak && !atomic_compare_exchange_weak_explicit(COUNTER(in_use_peak), &peak, in_use,
                                                                  memory_order_relaxed, memory_order_relaxed)) {
  }
}

void th_stats_get(th_stats_t *out) {
  if (out == NULL) return;
  free_remote_flush(); /* the caller's own frees count as freed (other threads' batches: free.c) */
  stats_flush_thread();
  size_t *dst = (size_t *)out;
  _Atomic(size_t) *src = (_Atomic(size_t) *)&th_stats_global;
  for (size_t i = 0; i < sizeof(th_stats_t) / sizeof(size_t); i++)
    dst[i] = atomic_load_explicit(&src[i], memory_order_relaxed);
  attribution_compute(out);
  stats_peak_in_use(out->in_use);
  out->in_use_peak = atomic_load_explicit(COUNTER(in_use_peak), memory_order_relaxed);
}

/* th_stats_print's text into buf, its length returned: where the memory goes, as a table with a share of
 * the resident total for each part, then every counter as "threadheap: <name> <value>". */
static size_t stats_format(char *buf, size_t size) {
  th_stats_t s;
  th_stats_get(&s);
  const char *const *names = stats_names;
  size_t n = 0;
#define EMIT(...)                                                          \
  do {                                                                     \
    int w_ = n < size ? snprintf(buf + n, size - n, __VA_ARGS__) : 0;      \
    if (w_ > 0) n += (size_t)w_ < size - n ? (size_t)w_ : size - n - 1;    \
  } while (0)
  const char *part[] = {"in use by the program", "free in pages in use", "empty pages", "cached",
                        "metadata"};
  size_t bytes[] = {s.in_use, s.free_in_pages, s.empty_pages, s.cached, s.metadata};
  size_t resident = 0;
  for (size_t i = 0; i < 5; i++) resident += bytes[i];
  EMIT("threadheap: where the memory goes            MiB   share\n");
  for (size_t i = 0; i < 5; i++)
    EMIT("threadheap:   %-26s %10.1f  %5.1f%%\n", part[i], (double)bytes[i] / 1048576.0,
         resident ? 100.0 * (double)bytes[i] / (double)resident : 0.0);
  EMIT("threadheap:   %-26s %10.1f\n", "resident, total", (double)resident / 1048576.0);
  EMIT("threadheap:   %-26s %10.1f\n", "mapped, not resident", (double)s.purged / 1048576.0);
  th_remote_pair_t pairs[5];
  size_t np = th_stats_remote_pairs(pairs, 5);
  if (np) EMIT("threadheap: who frees whose memory (remote frees, thread ids)\n");
  for (size_t i = 0; i < np; i++)
    EMIT("threadheap:   %7d frees into %-7d %12zu\n", pairs[i].free_tid, pairs[i].owner_tid, pairs[i].frees);
  const size_t *v = (const size_t *)&s;
  for (size_t i = 0; i < sizeof(th_stats_t) / sizeof(size_t); i++)
    EMIT("threadheap: %-17s %zu\n", names[i], v[i]);
#undef EMIT
  return n;
}

#define STATS_TEXT_MAX 4096

/* Not a cancellation point (write is one): a thread with a cancellation pending still prints everything. */
void th_stats_print(void) {
  int old_state;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old_state);
  char buf[STATS_TEXT_MAX];
  os_write_err(buf, stats_format(buf, sizeof buf));
  pthread_setcancelstate(old_state, NULL);
}

/* Runs from the library's destructor, while other threads may still allocate: it reads the counters and
 * writes, and neither allocates nor tears anything down. THREADHEAP_STATS_PID keeps the children of the
 * named process (which inherit the environment) quiet. */
static bool stats_printer(void) {
  return th_options.show_stats && (th_options.stats_pid == 0 || th_options.stats_pid == os_process_id());
}

/* Programs may close stderr in their own exit handlers (coreutils do), which run before the library's
 * destructor: keep a copy of it from the start. */
void stats_init(void) {
  if (stats_printer() && th_options.stats_file == NULL) os_keep_stderr();
}

void stats_print_at_exit(void) {
  if (!stats_printer()) return;
  char buf[STATS_TEXT_MAX];
  size_t n = stats_format(buf, sizeof buf);
  if (th_options.stats_file == NULL) {
    os_write_err_late(buf, n);
  } else if (!os_write_file(th_options.stats_file, buf, n)) {
    const char *path = th_options.stats_file;
    os_write_err_late("threadheap: cannot write the statistics to ", 43);
    os_write_err_late(path, strlen(path));
    os_write_err_late("; here they are\n", 16);
    os_write_err_late(buf, n);
  }
}
