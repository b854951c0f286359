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

void stats_add_remote(size_t n) { add(COUNTER(remote_frees), (long)n); }

void th_stats_get(th_stats_t *out) {
  if (out == NULL) return;
  size_t *dst = (size_t *)out;
  _Atomic(size_t) *src = (_Atomic(size_t) *)&th_stats_global;
  for (size_t i = 0; i < sizeof(th_stats_t) / sizeof(size_t); i++)
    dst[i] = atomic_load_explicit(&src[i], memory_order_relaxed);
}

void th_stats_print(void) {
  th_stats_t s;
  th_stats_get(&s);
  static const char *names[] = {
      "committed", "committed_peak", "mapped", "cached", "os_maps", "os_unmaps", "os_purges",
      "purged_bytes", "cache_hits", "cache_misses", "huge_allocs", "remote_frees", "heaps_created",
      "heaps_abandoned", "segments_adopted", "threads_live", "segments_waiting"};
  _Static_assert(sizeof names / sizeof names[0] == sizeof(th_stats_t) / sizeof(size_t), "a name per counter");
  const size_t *v = (const size_t *)&s;
  char line[96];
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    int n = snprintf(line, sizeof line, "threadheap: %-17s %zu\n", names[i], v[i]);
    if (n > 0) os_write_err(line, (size_t)n);
  }
}
