/* heap.c: a heap's page queues per size class and its direct table; the malloc slow path (heap_malloc_slow)
 * that finds or makes a page with free blocks; retiring empty pages and purging them after the delay. */
#include <errno.h>
#include <string.h>

#include "internal.h"
#include "os.h"

/* The heap every thread starts with: each direct slot names a page with no free block, so the first malloc
 * of a thread takes the slow path, which gives the thread a heap of its own. */
th_page_t th_page_empty;
th_heap_t th_heap_empty = {.direct = {[0 ... TH_DIRECT_SLOTS - 1] = &th_page_empty},
                            .direct_medium = {[0 ... TH_DIRECT_MEDIUM_SLOTS - 1] = &th_page_empty},
                            .direct_large = {[0 ... TH_DIRECT_LARGE_SLOTS - 1] = &th_page_empty},
                            /* no owner is this heap: free_remote's pair test fails, and the thread gets a
                             * heap of its own to count in (pairs_note_owner) */
                            .remote = {[0] = {.owner = &th_heap_empty}}};

void heap_init(th_heap_t *heap) {
  memset(heap, 0, offsetof(th_heap_t, flow)); /* flow and all_next stay (see th_heap_t) */
  for (size_t i = 0; i < TH_DIRECT_SLOTS; i++) heap->direct[i] = &th_page_empty;
  for (size_t i = 0; i < TH_DIRECT_MEDIUM_SLOTS; i++) heap->direct_medium[i] = &th_page_empty;
  for (size_t i = 0; i < TH_DIRECT_LARGE_SLOTS; i++) heap->direct_large[i] = &th_page_empty;
}

/* Keep the direct tables pointing at the first page of each class (the invariants in types.h): the slots of
 * class c are those of the sizes above class c-1's, up to its own, in the table of c's range. */
static th_page_t **direct_slots(th_heap_t *heap, size_t c, size_t *lo, size_t *hi) {
  size_t size = class_size(c), below = c == 1 ? 0 : class_size(c - 1);
  unsigned shift = size <= TH_DIRECT_MAX ? 4 : size <= TH_MEDIUM_MAX ? 8 : 14;
  *lo = c == 1 ? 0 : (below >> shift) + 1;
  *hi = size >> shift;
  return size <= TH_DIRECT_MAX ? heap->direct : size <= TH_MEDIUM_MAX ? heap->direct_medium : heap->direct_large;
}

/* The page the direct slots of class c name: its first page; the empty page in a secure heap, so that every
 * malloc takes the slow path (secure.c). */
static th_page_t *heap_direct_page(const th_heap_t *heap, size_t c) {
  return heap->queues[c].first && heap->secure == NULL ? heap->queues[c].first : &th_page_empty;
}

static void heap_direct_update(th_heap_t *heap, size_t c) {
  th_page_t *page = heap_direct_page(heap, c);
  size_t lo, hi;
  th_page_t **table = direct_slots(heap, c, &lo, &hi);
  for (size_t w = lo; w <= hi; w++) table[w] = page;
  if (th_unlikely(heap->sampler != NULL)) profile_first_changed(heap, c); /* its lists are cut to a budget */
}

/* The direct-table invariant of class c (types.h), for th_assert. */
__attribute__((unused)) static bool heap_direct_is_valid(th_heap_t *heap, size_t c) {
  th_page_t *page = heap_direct_page(heap, c);
  size_t lo, hi;
  th_page_t **table = direct_slots(heap, c, &lo, &hi);
  for (size_t w = lo; w <= hi; w++)
    if (table[w] != page) return false;
  return true;
}

static bool is_class_queue(const th_heap_t *heap, const th_page_queue_t *q) {
  return q >= &heap->queues[0] && q < &heap->queues[TH_CLASS_COUNT];
}

/* Only the owner in a slow path, or a sweeper that holds the heap, changes its queues (sweep.c). */
__attribute__((unused)) static bool heap_is_held(const th_heap_t *heap) {
  return heap_is_explicit(heap) || atomic_load_explicit(&heap->in_slow, memory_order_relaxed) != 0 ||
         atomic_load_explicit(&heap->sweeping, memory_order_relaxed) != 0;
}

void heap_queue_remove(th_heap_t *heap, th_page_queue_t *q, th_page_t *page) {
  th_assert(heap_is_held(heap));
  bool was_first = q->first == page;
  if (page->prev) page->prev->next = page->next;
  else q->first = page->next;
  if (page->next) page->next->prev = page->prev;
  else q->last = page->prev;
  page->next = page->prev = NULL;
  if (was_first && is_class_queue(heap, q)) heap_direct_update(heap, (size_t)(q - heap->queues));
}

void heap_queue_push_front(th_heap_t *heap, th_page_queue_t *q, th_page_t *page) {
  th_assert(heap_is_held(heap));
  page->prev = NULL;
  page->next = q->first;
  if (q->first) q->first->prev = page;
  else q->last = page;
  q->first = page;
  if (is_class_queue(heap, q)) heap_direct_update(heap, (size_t)(q - heap->queues));
}

void heap_queue_push_back(th_heap_t *heap, th_page_queue_t *q, th_page_t *page) {
  if (q->first == NULL) {
    heap_queue_push_front(heap, q, page);
    return;
  }
  page->next = NULL;
  page->prev = q->last;
  q->last->next = page;
  q->last = page;
}

void heap_page_insert(th_heap_t *heap, th_page_t *page) {
  page->in_full = 0;
  heap_queue_push_back(heap, &heap->queues[page->class_idx], page);
}

/* A page parked as full goes back to its queue with its remote frees. Its owner-free count was folded into
 * the flow when it was parked and set to all ones: it starts again from 0. */
static void heap_unpark(th_heap_t *heap, th_page_t *page) {
  heap_queue_remove(heap, &heap->full, page);
  page_clear_delay(page);
  page->used_word &= TH_USED_MASK;
  if (th_likely(heap->secure == NULL)) page_collect(page); /* a secure heap collects as it needs (secure.c) */
  heap_page_insert(heap, page);
}

/* Pages that other threads freed into while they sat in the full queue go back to their class queue.
 * Called before any page is parked as full or retired, so that no page is on ready twice or after it is
 * freed (see page_push_remote_chain). */
void heap_collect_ready(th_heap_t *heap) {
  if (atomic_load_explicit(&heap->ready, memory_order_relaxed) == NULL) return;
  th_page_t *page = atomic_exchange_explicit(&heap->ready, NULL, memory_order_acquire);
  while (page) {
    th_page_t *next = page->ready_next;
    if (page->in_full) heap_unpark(heap, page);
    page = next;
  }
}

/* An empty page goes back to its segment, except the last page of its class, which is kept (one page per
 * class, against thrashing when a program frees its last block and allocates again); heap_purge frees that
 * one too once it has been empty for the purge delay. */
void heap_page_retire(th_heap_t *heap, th_page_t *page) {
  th_page_queue_t *q = &heap->queues[page->class_idx];
  if (q->first == page && page->next == NULL) return; /* heap_purge times how long it stays empty */
  heap_queue_remove(heap, q, page);
  segment_page_free(heap, page);
}

/* The slow half of a free by the owner: the page was parked as full, or it became empty. */
void heap_free_local(th_heap_t *heap, th_page_t *page) {
  heap_slow_enter(heap);
  heap_collect_ready(heap);
  if (page->in_full) heap_unpark(heap, page);
  if (page_used(page) == 0) heap_page_retire(heap, page);
  heap_slow_exit(heap);
}

/* The owner's free count carried (page_count_free). Into a page parked as full: it goes back to its queue.
 * Otherwise it is the clock's tick, once every 4,096 frees of a page: the purge runs if its time has come,
 * so that memory freed before a steady state that never leaves the fast paths still goes back after the
 * purge delay. */
void heap_free_tick(th_heap_t *heap, th_page_t *page) {
  heap_slow_enter(heap);
  th_assert(!page->in_full || page->used_word >> TH_USED_BITS == 0); /* parked: the count was all ones */
  page->owner_freed = 1;
  if (page->in_full) {
    heap_count_frees(heap, page->class_idx, 1); /* the one free that carried out of the all-ones count */
    heap_free_local(heap, page);
  } else {
    heap_count_frees(heap, page->class_idx, TH_FREE_COUNT_WRAP);
    if (th_unlikely(heap->sampler != NULL)) profile_free_tick(heap, page); /* the budget's free bound */
    heap_purge(heap, false);
  }
  heap_slow_exit(heap);
}

/* A page of a class queue whose blocks are all free (page_is_empty) goes back to its segment; with
 * keep_segment (a sweep), a segment left with no page in use stays with the heap (segment_page_free_kept). */
static void page_free_empty_as(th_heap_t *heap, th_page_t *page, bool keep_segment) {
  page_discard_free(page);
  heap_queue_remove(heap, &heap->queues[page->class_idx], page);
  if (keep_segment) segment_page_free_kept(heap, page);
  else segment_page_free(heap, page);
}

static void page_free_empty(th_heap_t *heap, th_page_t *page) { page_free_empty_as(heap, page, false); }

/* Segments a sweep left with no page in use (heap_sweep) leave the heap: on the owner's next purge round, or
 * at its exit. */
static void heap_release_swept(th_heap_t *heap) {
  if (th_likely(!heap->sweep_kept)) return;
  heap->sweep_kept = false;
  segment_release_unused(heap);
}

/* A page in use of blocks past TH_PURGE_BLOCK_MIN (each spans whole OS pages) that saw no malloc or free for
 * the delay has the insides of its free blocks purged, once (page_purge_free_blocks): a heap whose medium blocks
 * were mostly freed, but not all of any one page, still gives the memory back. `used_word` (which counts the
 * owner's frees too, so a malloc/free pair that leaves `used` and the head as they were still shows) and the
 * free list's head, compared from one round to the next, tell whether anything happened. */
static void heap_purge_idle_page(th_page_t *page, uint64_t now, uint64_t delay, bool force) {
  if (segment_of_page(page)->is_pinned) return; /* an explicit heap's initial_size stays committed */
  if (page->idle_used != page->used_word || page->idle_free != page->free) {
    page->idle_used = page->used_word;
    page->idle_free = page->free;
    page->idle_since_ms = (uint32_t)now;
    page->interior_purged = 0;
    if (!force) return;
  }
  if (page->interior_purged || (!force && (uint32_t)now - page->idle_since_ms < delay)) return;
  page_purge_free_blocks(page);
  if (!page->tail_fresh) page_purge_tail(page);
  page->interior_purged = 1;
}

/* The latest stamp on the clock at now that has waited age ms (0 when none has). */
static inline uint64_t clock_before(uint64_t now, uint64_t age) { return now > age ? now - age : 0; }

/* A free page slot on the purge queue returned to the OS. */
static void slot_purge(th_heap_t *heap, th_page_t *page) {
  heap_queue_remove(heap, &heap->purge, page);
  page->purge_pending = 0;
  page_purge_slot(page);
}

/* The free page slots on the purge queue (oldest first) stamped at or before upto (heap_clock) are returned
 * to the OS. */
static void heap_purge_slots(th_heap_t *heap, uint64_t upto) {
  while (heap->purge.first && heap->purge.first->free_since_ms <= upto) slot_purge(heap, heap->purge.first);
}

/* Did the heap's thread run through the pause in progress (heap_pause_pending): it never blocked since the
 * last round (no voluntary context switch: busy, if on a machine with more runnable threads than cores),
 * or its CPU time was a quarter of the gap or more? Then the process was busy, on fast paths that reach no
 * round (a program that fills and reads its own caches), and the gap is no pause on the process clock:
 * segments cached before it waited that long, and go now (process_clock_round). The heap's own clock still
 * takes the gap for a pause: its free slots and pages are the thread's, reused as it allocates again.
 * Thread heaps only: an explicit heap's rounds run on whichever thread uses it, whose usage says nothing
 * of the gap. One getrusage a round, from a heap's second round on (the first has no gap before it: a
 * thread that lives for one round, as programs that start thousands of short threads have, makes no system
 * call for this). */
static bool heap_ran_through(th_heap_t *heap, uint64_t pause, uint64_t round) {
  if (heap_is_explicit(heap) || heap->next_purge_ms == 0) return false;
  uint64_t cpu, blocked, last = heap->round_cpu_ms, last_blocked = heap->round_blocked;
  if (!os_thread_usage(&cpu, &blocked)) return false;
  cpu++; /* kept plus one: 0 says "not read", also for a thread that has used under 1 ms so far */
  heap->round_cpu_ms = cpu;
  heap->round_blocked = blocked;
  /* last == 0: the first round did not read it, and the gap since is taken for a pause, as before. */
  if (pause == 0 || last == 0 || cpu < last) return false;
  return blocked == last_blocked || (cpu - last) * 4 >= pause + round; /* pause + round: the gap */
}

/* Return memory unused for the purge delay (everything with force): free page slots are purged, kept empty
 * pages are freed, the free blocks of idle pages in use are purged inside, and the process-wide segment
 * cache is trimmed. Runs on slow paths only. */
void heap_purge(th_heap_t *heap, bool force) {
  uint64_t now = os_now_ms();
  export_tick(now); /* the live export rides on the same clock */
  if (th_unlikely(th_profile_on)) profile_tick(now); /* and so do periodic heap profiles */
  uint64_t delay = (uint64_t)th_options.purge_delay;
  if (!force && now < heap->next_purge_ms) return;
  heap_release_swept(heap);
  uint64_t round = purge_round_ms(delay);
  uint64_t pause = heap_pause_pending(heap, now);
  bool ran = heap_ran_through(heap, pause, round);
  bool paused = pause != 0;
  heap->paused_ms += pause; /* the gap counted as one round interval */
  process_clock_round(now, round, ran);
  uint64_t clock = now - heap->paused_ms;
  /* Sweepers read it (sweep.c): a relaxed atomic store, a plain mov. */
  __atomic_store_n(&heap->next_purge_ms, now + round, __ATOMIC_RELAXED);
  /* Remote frees into a secure heap wait in its quarantine, not on pages this round may free, and classes
   * no longer freed let theirs go (secure.c). */
  if (th_unlikely(heap->secure != NULL) && !force) secure_purge(heap);
  if (th_unlikely(heap->sampler != NULL)) profile_settle_all(heap); /* before pages change */
  /* Pages emptied by remote frees, in classes this thread no longer allocates, would wait forever: look at
   * every page. One still in use keeps its remote frees for when it runs dry: collecting them now gains
   * nothing, and would walk them (a cache miss per block) whenever local_free holds blocks. */
  for (size_t c = 1; c < TH_CLASS_COUNT; c++) {
    for (th_page_t *page = heap->queues[c].first, *next; page; page = next) {
      next = page->next;
      if (!page_is_empty(page)) {
        page->free_since_ms = 0; /* in use: the empty clock starts again from the next round */
        /* A page started in a committed slot: its uncarved rest goes once it stops growing for a round
         * (pages of larger blocks: once idle for the delay, below), or now with force (th_collect,
         * malloc_trim). idle_used holds its last capacity. A round after a pause is not such a round. */
        if (!page->tail_fresh && page->block_size <= TH_PURGE_BLOCK_MIN && heap->secure == NULL) {
          if (force || (page->idle_used == page->capacity && !paused)) page_purge_tail(page);
          else page->idle_used = (uint32_t)page->capacity;
        }
        /* (A secure page's free blocks are on secure_free, where idle_free would be.) */
        if (page->block_size > TH_PURGE_BLOCK_MIN && heap->secure == NULL)
          heap_purge_idle_page(page, clock, delay, force);
        continue;
      }
      if (page != heap->queues[c].first || page->next != NULL || force) {
        page_free_empty(heap, page);
      } else if (page->free_since_ms == 0) {
        page->free_since_ms = clock; /* the kept page of its class: freed once empty for the delay */
      } else if (clock_waited(clock, page->free_since_ms, delay)) {
        page_free_empty(heap, page);
      }
    }
  }
  if (pool_eligible(heap)) segment_take_back_slots(heap, force);
  heap_purge_slots(heap, force ? UINT64_MAX : clock_before(clock, delay));
  /* What is left committed of the small slots serves every thread heap (pool.c). */
  bool threads = atomic_load_explicit((_Atomic(size_t) *)&th_stats_global.threads_live, memory_order_relaxed) > 1;
  if (threads && pool_eligible(heap)) segment_lend_slots(heap);
  if (heap != &th_heap_empty) pool_round(force ? 0 : delay);
  /* The process-wide cache keeps its own clock even when this heap purges everything (thread exit):
   * other threads' large blocks stay cached. th_collect empties it. */
  segment_cache_purge(false);
  /* Abandoned segments whose blocks other threads keep freeing would otherwise hold their memory until some
   * thread runs short of pages: a live heap takes a few over on every purge round and frees what is empty,
   * once they have waited the purge delay. Until then they are left to the thread that replaces the exited
   * one, which adopts the oldest when it first runs short; a round that took them sooner left that thread
   * carving fresh pages while the blocks it freed emptied pages of another heap (docs/design.md). */
  if (!force && heap != &th_heap_empty && !heap_is_explicit(heap)) {
    int adopted = 0;
    for (size_t k = 0; k < TH_KINDS_PAGED; k++)
      while (adopted < 4 && segment_try_adopt(heap, (th_kind_t)k, delay)) adopted++;
    /* And pages that other threads emptied in heaps whose threads only wait (sweep.c); with one thread
     * there is nothing to look at. */
    if (atomic_load_explicit((_Atomic(size_t) *)&th_stats_global.threads_live, memory_order_relaxed) > 1)
      sweep_idle_heaps(heap, now);
  }
}

/* A sweeper's part of the ready stack: pages parked as full that other threads' frees emptied while the owner
 * waited. The first remote free into a full page put it on the stack, so every such page is there. One that
 * page_parked_is_empty holds nothing the owner can touch (its next free into it would carry to a slow path,
 * which waits for the sweep), and goes back to its segment; the rest go back on the stack for the owner. */
static void heap_sweep_ready(th_heap_t *heap) {
  th_page_t *page = atomic_exchange_explicit(&heap->ready, NULL, memory_order_acquire);
  th_page_t *keep = NULL, *keep_last = NULL;
  while (page) {
    th_page_t *next = page->ready_next;
    if (page_parked_is_empty(page)) {
      bool borrowed = page_out(page) == TH_OUT_BORROWED; /* the pool's once freed: not touched after */
      heap_queue_remove(heap, &heap->full, page);
      page_discard_free(page);
      segment_page_free_kept(heap, page);
      if (!borrowed) {
        if (page->purge_pending) slot_purge(heap, page); /* handed away whole: purged at once (heap_sweep) */
        page->in_full = 0;
        heap->sweep_kept = true;
      }
    } else {
      page->ready_next = keep;
      keep = page;
      if (keep_last == NULL) keep_last = page;
    }
    page = next;
  }
  if (keep != NULL) heap_ready_push(heap, keep, keep_last);
}

/* A sweeper's pass over a thread heap, which sweep.c holds: its owner is in none of its slow paths. The
 * owner's fast paths run on, and they touch only the first page of each class (malloc) and pages where the
 * owner frees a block it holds: an empty page has none. So the empty pages after the first of their class
 * go back to their segments, as the owner's own purge round would free them, and so do the emptied pages
 * parked as full (heap_sweep_ready, above). A page whose blocks all came back by other threads' frees (the
 * owner handed them away: a producer's) has its slot purged at once. One the owner freed blocks into itself
 * was being worked in: its slot waits, as do the others, until it was already free at the heap's last sweep
 * or has waited the purge delay on its clock (the next sweep, a delay later at the soonest), so that a
 * thread that only paused (it freed its blocks, slept, and is about to allocate them again) finds them
 * committed if it runs again before then; purging them at once had it fault them in again as it woke.
 * Then the segments left with no page in use leave
 * the heap, for any thread to use: a free pushes before it counts (free_push_local), so the page of the
 * owner's last live block is empty only once the free is done with it, but for a free whose count carried:
 * it reads the segment on its way to heap_free_tick. Such a page reads used_word == 0 (no block used, the
 * free count just wrapped), and while the sweep freed one, its segments stay with the heap until the owner's
 * next purge round or its exit (segment_release_unused). */
void heap_sweep(th_heap_t *heap, uint64_t now) {
  bool carried = false;
  heap_sweep_ready(heap);
  for (size_t c = 1; c < TH_CLASS_COUNT; c++) {
    th_page_t *first = heap->queues[c].first;
    if (first == NULL) continue;
    for (th_page_t *page = first->next, *next; page; page = next) {
      next = page->next;
      if (!page_is_empty(page)) continue;
      bool carry = __atomic_load_n(&page->used_word, __ATOMIC_RELAXED) == 0;
      carried |= carry;
      /* A borrowed page goes back to the pool, where another heap may take it at once: not while the owner's
       * carry may still read its heap (page_heap, in th_free after the count). */
      bool borrowed = page_out(page) == TH_OUT_BORROWED;
      if (borrowed && carry) continue;
      bool handed_away = page_handed_away(page);
      page_free_empty_as(heap, page, true);
      if (!borrowed && handed_away && page->purge_pending) slot_purge(heap, page);
      heap->sweep_kept = true;
    }
  }
  uint64_t clock = heap_clock(heap, now);
  uint64_t upto = clock_before(clock, (uint64_t)th_options.purge_delay);
  heap_purge_slots(heap, upto > heap->swept_clock ? upto : heap->swept_clock);
  heap->swept_clock = clock;
  if (!carried) heap_release_swept(heap);
}

/* Full pages revisited, pages emptied by remote frees freed: what a capped heap does before failing (and
 * heap_collect, so th_collect and thread exit). */
void heap_collect_remote(th_heap_t *heap) {
  /* Short of memory, blocks held back are worth more as memory: the quarantine empties (secure.c). */
  if (th_unlikely(heap->secure != NULL)) secure_flush(heap);
  heap_collect_ready(heap);
  for (th_page_t *page = heap->full.first, *next; page; page = next) {
    next = page->next;
    heap_queue_remove(heap, &heap->full, page);
    page_clear_delay(page);
    heap_page_insert(heap, page);
  }
  for (size_t c = 1; c < TH_CLASS_COUNT; c++) {
    for (th_page_t *page = heap->queues[c].first, *next; page; page = next) {
      next = page->next;
      if (page_is_empty(page)) page_free_empty(heap, page);
    }
  }
}

/* Thread exit, before the segments are abandoned: every empty page goes back to its segment (segments left
 * with no page go to the cache, on its clock). The slots freed in the last eighth of the purge delay stay
 * committed and leave the purge queue: the heap that adopts their segment, often the thread that replaces
 * this one, gets them without page faults and purges them on its own clock (segment_try_adopt queues
 * them); older ones are purged now. Purging them all cost a program that starts and ends threads all the
 * time a page fault per 4 KiB its next threads carved; keeping every slot of the delay held up to 25% more
 * memory where 8 threads kept exiting (docs/design.md, "Thread exit and adoption"). */
void heap_exit(th_heap_t *heap) {
  if (th_unlikely(heap->sampler != NULL)) profile_settle_all(heap);
  heap_release_swept(heap);
  heap_collect_remote(heap);
  segment_take_back_slots(heap, true); /* its slots in the pool, before its segments are abandoned */
  pool_forget_heap(heap);
  /* Borrowed pages still holding blocks stay in the pool until other threads' frees empty them. */
  for (size_t c = 1; c < TH_CLASS_COUNT; c++) {
    for (th_page_t *page = heap->queues[c].first, *next; page; page = next) {
      next = page->next;
      if (page_out(page) != TH_OUT_BORROWED) continue;
      heap_queue_remove(heap, &heap->queues[c], page);
      pool_orphan(heap, page);
    }
  }
  heap_purge_slots(heap, clock_before(heap_clock(heap, os_now_ms()), (uint64_t)th_options.purge_delay / 8));
  while (heap->purge.first) {
    th_page_t *page = heap->purge.first;
    heap_queue_remove(heap, &heap->purge, page);
    page->purge_pending = 0;
    page->free_since_ms += heap->paused_ms; /* to wall time: the adopter's clock starts from it */
  }
  segment_cache_purge(false);
}

/* Everything that can be given back now: the above, then every free page slot purged. */
void heap_collect(th_heap_t *heap) {
  heap_slow_enter(heap);
  if (th_unlikely(heap->sampler != NULL)) profile_settle_all(heap);
  heap_collect_remote(heap);
  heap_purge(heap, true);
  heap_slow_exit(heap);
}

/* Has the page a block to hand out? A secure heap's pages keep theirs on secure_free (secure.c). */
static inline bool page_has_free(const th_heap_t *heap, const th_page_t *page) {
  return page->free != NULL || (heap->secure != NULL && page->secure_free != NULL);
}

/* A page of class c with a free block, moved to the front of its queue; NULL when out of memory. Each page
 * looked at is either used or parked as full, so the scan is paid for by the allocations it enables. */
static th_page_t *heap_find_page(th_heap_t *heap, size_t c) {
  heap_collect_ready(heap);
  th_page_queue_t *q = &heap->queues[c];
  bool tried_adopt = false;
  /* While other threads live, a small page that filled up with no free of the owner's into it (its blocks
   * are for other threads: a producer's) goes to the pool rather than the full queue (pool.c). A page the
   * owner frees into as it fills (larson's threads, which free their own blocks at random) is parked as
   * before: handed off, its next free by the owner would take it back, a lock each way. */
  bool hand_off = class_kind(c) == TH_KIND_SMALL && pool_eligible(heap) &&
                  atomic_load_explicit((_Atomic(size_t) *)&th_stats_global.threads_live, memory_order_relaxed) > 1;
  int handed;
  for (;;) {
    for (th_page_t *page = q->first, *next; page; page = next) {
      next = page->next;
      if (!page_has_free(heap, page)) {
        /* Blocks collected earlier (heap_collect_ready) first; the remote stack then joins an empty
         * local_free, so page_collect need not walk it to find its tail. */
        page_free_from_local(page);
        page_collect(page);
        if (page->free == NULL) page_free_from_local(page);
        if (page_has_free(heap, page)) {
          /* blocks freed by the owner or by other threads */
        } else if (page->capacity < page->reserved && page_extend(heap, page)) {
          /* carved more blocks */
        } else if (page->capacity < page->reserved) {
          continue; /* a capped heap at its cap, or lazy commit refused: another page may still have blocks */
        } else if (hand_off && page_handed_away(page) && (handed = pool_hand_off(heap, q, page)) != POOL_NO_LOCK) {
          if (handed == POOL_HANDED_OFF) continue;
          page_collect(page); /* blocks arrived while it was being handed off: local_free was empty */
          page_free_from_local(page);
        } else if (page_try_set_full(page)) {
          heap_queue_remove(heap, q, page);
          heap_queue_push_back(heap, &heap->full, page);
          page->in_full = 1;
          heap_count_frees(heap, c, page_owner_frees(page));
          page->used_word |= ~TH_USED_MASK; /* the owner's next free into it carries (page_count_free) */
          continue;
        } else {
          page_collect(page); /* blocks arrived while it was being parked: local_free was empty */
          page_free_from_local(page);
        }
      }
      if (q->first != page) {
        heap_queue_remove(heap, q, page);
        heap_queue_push_front(heap, q, page);
      }
      return page;
    }
    if (tried_adopt || heap_is_explicit(heap)) break; /* explicit heaps own only what they allocated */
    /* A page of the class that an exited thread borrowed and left with blocks in it (pool.c). */
    th_page_t *orphan = pool_eligible(heap) ? pool_adopt_orphan(heap, c) : NULL;
    if (orphan != NULL) {
      heap_page_insert(heap, orphan);
      continue;
    }
    tried_adopt = true;
    th_kind_t kind = class_kind(c);
    if (heap->segments[kind] != NULL && heap->segments[kind]->used_pages < heap->segments[kind]->page_count)
      break; /* a free slot of our own comes before adopting */
    if (!segment_try_adopt(heap, kind, 0)) break;
  }
  th_page_t *page = segment_page_alloc(heap, class_kind(c));
  if (page == NULL) return NULL;
  th_segment_t *seg = segment_of_page(page);
  page_init(page, seg, (size_t)(page - seg->pages), c);
  if (!page_extend(heap, page)) { /* a capped heap at its cap, or lazy commit refused (segment_commit) */
    segment_page_free(heap, page);
    return NULL;
  }
  heap_queue_push_front(heap, q, page);
  return page;
}

/* Every malloc the direct tables' pop does not serve: huge sizes, and a first page whose free list ran dry.
 * That page may still hold remote frees collected onto local_free earlier (moved over with no lock, no
 * atomic). It makes no call but the tail call to the slow path, so it saves no registers (about 20
 * instructions). Every malloc of a secure heap comes here (its direct tables name th_page_empty) and goes
 * straight on to its own (secure.c): two instructions more for the default mode's page refills, 15 fewer
 * for each secure malloc. */
TH_HOT void *heap_malloc_queue(th_heap_t *heap, size_t size) {
  if (th_unlikely(heap->secure != NULL)) return secure_malloc(heap, size);
  if (th_likely(size <= TH_LARGE_MAX)) {
    th_page_t *page = heap->queues[size_class(size)].first;
    if (th_likely(page != NULL)) {
      if (page->free == NULL) {
        /* While profiling, local_free holds what the sampling budget cut off: the slow path decides. */
        if (th_unlikely(heap->sampler != NULL)) return heap_malloc_slow(heap, size);
        page_free_from_local(page);
      }
      if (th_likely(page->free != NULL)) return page_pop(page);
    }
  }
  return heap_malloc_slow(heap, size);
}

/* The first page of the class has no free block (or there is none), or the block is huge: a heap for the
 * thread, the purge clock, sampling, then a page with a free block. A secure heap has a malloc of its own
 * (secure.c, which heap_malloc_queue calls first), which comes back here when it needs the rest. */
TH_NOINLINE void *heap_malloc_slow(th_heap_t *heap, size_t size) {
  if (th_unlikely(heap == &th_heap_empty)) {
    if (thread_exited()) return thread_late_malloc(size);
    heap = thread_heap_init();
    if (heap == NULL) {
      errno = ENOMEM;
      return NULL;
    }
  }
  heap_slow_enter(heap);
  free_remote_flush(); /* what this thread holds for other threads' pages goes before it takes more */
  bool sampled = th_unlikely(th_profile_on) && !(heap->flags & TH_HEAP_SAMPLES);
  if ((++heap->stat.slow_calls & 15) == 0) heap_purge(heap, false);
  void *p = sampled ? profile_malloc(heap, size) : heap_malloc_fill(heap, size);
  heap_slow_exit(heap);
  return p;
}

/* A huge block for the heap (an explicit heap's own, or nobody's for a thread heap). */
void *heap_malloc_huge(th_heap_t *heap, size_t size) {
  th_heap_t *owner = heap_is_explicit(heap) ? heap : NULL;
  void *p = huge_alloc(owner, size, 16, false);
  if (p == NULL && owner == NULL) { /* out of address space: empty pages may give segments back */
    heap_collect_remote(heap);
    p = huge_alloc(owner, size, 16, false);
  }
  /* A program of huge blocks (alloc, touch, free) is seen with its block live: publish after it. */
  if (th_unlikely(th_options.stats_interval != 0)) export_tick(os_now_ms());
  return p;
}

/* A page of class c with a free block, first in its queue; NULL with errno ENOMEM when there is none. */
th_page_t *heap_page_with_free(th_heap_t *heap, size_t c) {
  th_page_t *page = heap_find_page(heap, c);
  if (page == NULL) {
    /* At an explicit heap's cap, or out of address space: empty pages of other classes and remote frees
     * may give a segment back, which segment_map_new can then unmap and map again. */
    heap_collect_remote(heap);
    page = heap_find_page(heap, c);
  }
  if (page == NULL) errno = ENOMEM;
  return page;
}

/* The rest of the slow path: a huge block, or a page of the class with a free block, and its first block.
 * profile_malloc calls it for the allocations it does not sample. */
void *heap_malloc_fill(th_heap_t *heap, size_t size) {
  if (th_unlikely(heap->secure != NULL)) return secure_malloc_fill(heap, size); /* checked blocks, from secure_free */
  if (size > TH_LARGE_MAX) return heap_malloc_huge(heap, size);
  th_page_t *page = heap_page_with_free(heap, size_class(size));
  if (page == NULL) return NULL;
  th_assert(page_is_valid(page));
  th_assert(heap_direct_is_valid(heap, size_class(size)));
  return page_pop(page);
}
