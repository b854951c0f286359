/* sweep.c: the empty pages of an idle thread's heap, freed by another thread (sweep_idle_heaps).
 *
 * Only a heap's owner changes its queues and segments, on its slow paths. A thread that allocated, handed
 * its blocks to others and now only waits (a main thread that filled a table for its workers, which free
 * it) would keep the pages they emptied for as long as it waits: no slow path of its own frees them. So a
 * thread on its purge round looks at the other thread heaps; one that has passed no purge round for the
 * purge delay is idle. The sweeper holds it (sweeping = 1), has every thread pass a memory barrier
 * (os_fence_all_threads), and goes on only when the owner is in none of its slow paths (in_slow == 0): an
 * owner that enters one meanwhile sees sweeping and waits (heap_slow_enter, heap_slow_wait), since one of
 * the two always sees the other's store. The owner's fast paths run on; heap_sweep frees only pages they do
 * not touch, and gives back the segments they leave with no page in use. One sweeper at a time (sweep_lock,
 * never waited for), a few heaps a round, each heap at most once a delay; but a thread the OS refuses a
 * map sweeps every heap at once (sweep_all_heaps). docs/design.md, "Sweeping idle heaps", has the argument
 * and the measurements. */
#include "internal.h"
#include "os.h"

#define SWEEP_HEAPS_MAX 4 /* heaps swept in one round */

static th_mutex_t sweep_lock = TH_MUTEX_INIT;

#ifndef TH_TSAN
static _Atomic(uint64_t) sweep_next_ms;
static _Atomic(bool) sweep_off; /* the kernel refused the barrier (no membarrier, a seccomp filter) */

/* No purge round for the purge delay: its owner allocates nothing, or only on fast paths that never reach
 * the clock. A heap that has had no round yet is not idle. */
static bool heap_is_idle(const th_heap_t *heap, uint64_t now, uint64_t delay) {
  uint64_t next = __atomic_load_n(&heap->next_purge_ms, __ATOMIC_RELAXED);
  return next != 0 && now >= next + delay;
}

/* A live thread heap in the default mode, not profiled, and (unless any) idle and not swept within the
 * delay. Read before the heap is held (owner fields, read racily: only a hint), and again once it is. */
static bool sweepable(const th_heap_t *h, uint64_t now, uint64_t delay, bool any) {
  return h != &th_heap_empty && __atomic_load_n(&h->thread_id, __ATOMIC_RELAXED) != 0 &&
         !(__atomic_load_n(&h->flags, __ATOMIC_RELAXED) & TH_HEAP_EXPLICIT) &&
         __atomic_load_n(&h->secure, __ATOMIC_RELAXED) == NULL &&
         __atomic_load_n(&h->sampler, __ATOMIC_RELAXED) == NULL &&
         (any || (heap_is_idle(h, now, delay) && now >= h->swept_ms + delay));
}

static bool sweep_heap(th_heap_t *h, uint64_t now, uint64_t delay, bool any) {
  atomic_store_explicit(&h->sweeping, 1, memory_order_relaxed);
  bool fenced = os_fence_all_threads();
  if (!fenced) atomic_store_explicit(&sweep_off, true, memory_order_relaxed);
  /* Acquire: the owner left its last slow path with a release store, so its changes are seen here. */
  bool held = fenced && atomic_load_explicit(&h->in_slow, memory_order_acquire) == 0 &&
              sweepable(h, now, delay, any);
  if (held) {
    h->swept_ms = now;
    heap_sweep(h, now);
  }
  atomic_store_explicit(&h->sweeping, 0, memory_order_release);
  return held;
}

void sweep_idle_heaps(th_heap_t *self, uint64_t now) {
  uint64_t delay = (uint64_t)th_options.purge_delay;
  uint64_t due = atomic_load_explicit(&sweep_next_ms, memory_order_relaxed);
  if (now < due || atomic_load_explicit(&sweep_off, memory_order_relaxed)) return;
  if (!atomic_compare_exchange_strong_explicit(&sweep_next_ms, &due, now + purge_round_ms(delay),
                                               memory_order_relaxed, memory_order_relaxed))
    return;
  if (!th_trylock(&sweep_lock)) return;
  size_t swept = 0;
  for (th_heap_t *h = thread_heaps_all(); h && swept < SWEEP_HEAPS_MAX; h = h->all_next)
    if (h != self && sweepable(h, now, delay, false) && sweep_heap(h, now, delay, false)) swept++;
  th_unlock(&sweep_lock);
}

/* The OS refused a map (an address-space limit): every other thread heap is swept at once, idle or not, so
 * that the segments their threads emptied go back to the cache, which the caller then empties before it
 * tries again. Memory a thread freed thus serves the others without waiting for its next slow path or for
 * the purge delay. False when nothing was swept (another sweep under way, or none possible). */
bool sweep_all_heaps(th_heap_t *self) {
  if (atomic_load_explicit(&sweep_off, memory_order_relaxed) || !th_trylock(&sweep_lock)) return false;
  uint64_t now = os_now_ms(), delay = (uint64_t)th_options.purge_delay;
  size_t swept = 0;
  for (th_heap_t *h = thread_heaps_all(); h; h = h->all_next)
    if (h != self && sweepable(h, now, delay, true) && sweep_heap(h, now, delay, true)) swept++;
  th_unlock(&sweep_lock);
  return swept != 0;
}
#else
/* ThreadSanitizer cannot see the barrier that orders the owner's side, and would report the sweep's
 * accesses: its builds do not sweep. */
void sweep_idle_heaps(th_heap_t *self, uint64_t now) { (void)self, (void)now; }
bool sweep_all_heaps(th_heap_t *self) { return (void)self, false; }
#endif

/* heap_slow_enter found a sweeper holding the heap: the owner steps back out and waits for it, then enters
 * again (a sweep frees a few hundred pages at most). */
void heap_slow_wait(th_heap_t *heap) {
  do {
    heap_slow_exit(heap);
    while (atomic_load_explicit(&heap->sweeping, memory_order_acquire) != 0) os_yield();
    heap_slow_mark(heap);
  } while (atomic_load_explicit(&heap->sweeping, memory_order_acquire) != 0);
}

/* fork: no sweep is under way in another thread while the child is made (one interrupted in the forking
 * thread by a signal handler finishes in both processes). */
void sweep_lock_all(unsigned level) { thread_lock_for_fork(&sweep_lock, level); }
void sweep_unlock_all(unsigned level, bool child) { thread_unlock_after_fork(&sweep_lock, level, child); }
