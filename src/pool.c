/* pool.c: free small page slots that thread heaps lend to each other.
 *
 * A page slot belongs to its segment's heap, and only whole segments change hands. When threads take turns
 * allocating what other threads free (producers and consumers), each producer's heap would keep the slots of
 * its own last peak, and the process would hold the sum of the threads' peaks. So on its purge rounds a
 * thread heap lends its free, still committed small page slots to this pool, and a thread heap short of a
 * slot borrows one before it faults in a purged one or maps a segment. A slot borrowed by its own segment's
 * heap is simply home again; one borrowed by another heap is that heap's page until it empties, when it comes
 * back to the pool (its segment's borrower table names the borrower meanwhile: page_heap). A borrower that
 * exits with blocks in a borrowed page leaves it here as an orphan, until other threads' frees empty it.
 * Slots that wait in the pool for the purge delay are purged in place, and borrowed as such.
 *
 * Every slot out of its heap counts in its segment's used_pages, so a segment with a slot out is never
 * released. Its state (th_page_t.out) and owner change under pool_lock, or, for a borrower's return and
 * orphaning and for a handed-off page's recycling, on their way onto the lock-free incoming stack.
 *
 * A small page a thread heap fills with no free of its own goes to this pool as it fills (pool_hand_off:
 * its blocks are for other threads), and the free of its last block makes it a free slot at once
 * (docs/design.md, "Full pages handed off"). */
#include "internal.h"
#include "os.h"

static th_mutex_t pool_lock = TH_MUTEX_INIT;
/* Free slots, newest first, linked by next/prev: committed ones, then purged ones. */
static th_page_queue_t pool_fresh, pool_purged;
/* Orphans per class, oldest first, linked by next/prev. */
static th_page_queue_t orphans[TH_CLASS_COUNT];
static _Atomic(th_page_t *) incoming; /* returns and orphans, linked by ready_next */
/* Free slots in the pool or on their way in (th_stats_t.pool_slots), and orphans: peeks without the lock. */
#define pool_free ((_Atomic(size_t) *)&th_stats_global.pool_slots)
static _Atomic(size_t) orphan_count;
static _Atomic(uint32_t) orphans_of[TH_CLASS_COUNT]; /* per class, for a look without the lock */

/* Under pool_lock: one orphan more or fewer in class c's list. */
static void orphan_listed(size_t c, int d) {
  atomic_fetch_add_explicit(&orphan_count, (size_t)(ptrdiff_t)d, memory_order_relaxed);
  atomic_fetch_add_explicit(&orphans_of[c], (uint32_t)d, memory_order_relaxed);
}

bool pool_eligible(const th_heap_t *heap) {
  return heap != &th_heap_empty && !heap_is_explicit(heap) && heap->secure == NULL && heap->sampler == NULL &&
         !(heap->flags & TH_HEAP_SAMPLES) && th_options.page_pool && th_options.lazy_commit <= 0;
}

static void queue_push_front(th_page_queue_t *q, th_page_t *page) {
  page->prev = NULL;
  page->next = q->first;
  if (q->first) q->first->prev = page;
  else q->last = page;
  q->first = page;
}

static void queue_remove(th_page_queue_t *q, th_page_t *page) {
  if (page->prev) page->prev->next = page->next;
  else q->first = page->next;
  if (page->next) page->next->prev = page->prev;
  else q->last = page->prev;
  page->next = page->prev = NULL;
}

static void queue_push_back(th_page_queue_t *q, th_page_t *page) {
  page->next = NULL;
  page->prev = q->last;
  if (q->last) q->last->next = page;
  else q->first = page;
  q->last = page;
}

static void incoming_push(th_page_t *page) {
  th_page_t *top = atomic_load_explicit(&incoming, memory_order_relaxed);
  do page->ready_next = top;
  while (!atomic_compare_exchange_weak_explicit(&incoming, &top, page, memory_order_release, memory_order_relaxed));
}

/* Under pool_lock: the orphan leaves its class's list. */
static void orphan_unlist(th_page_t *page) {
  queue_remove(&orphans[page->class_idx], page);
  orphan_listed(page->class_idx, -1);
}

/* Under pool_lock: an orphan whose blocks all came back, taken off its list, becomes a free committed slot.
 * Its borrower entry is cleared first, so that page_discard_free counts its frees in no heap's flow. */
static void orphan_to_slot(th_page_t *page, uint64_t now) {
  orphan_unlist(page);
  atomic_store_explicit(page_borrower(page), NULL, memory_order_relaxed);
  atomic_store_explicit(&page->owner, 0, memory_order_relaxed);
  page_discard_free(page);
  stats_committed(-(long)page->committed);
  page->committed = 0;
  page_forget(page);
  page->free_since_ms = now;
  __atomic_store_n(&page->out, TH_OUT_LENT, __ATOMIC_RELAXED);
  queue_push_front(&pool_fresh, page);
}

/* Under pool_lock: the returns, orphans and recycled orphans pushed since, into their lists. */
static void incoming_take(void) {
  if (atomic_load_explicit(&incoming, memory_order_relaxed) == NULL) return;
  th_page_t *page = atomic_exchange_explicit(&incoming, NULL, memory_order_acquire);
  uint64_t now = 0;
  while (page) {
    th_page_t *next = page->ready_next;
    uint8_t out = page_out(page);
    if (out == TH_OUT_ORPHAN) {
      queue_push_back(&orphans[page->class_idx], page);
      atomic_fetch_add_explicit(&orphans_of[page->class_idx], 1, memory_order_relaxed); /* (orphan_count: pool_orphan) */
    } else if (out == TH_OUT_RECYCLE) {
      if (now == 0) now = process_clock();
      orphan_to_slot(page, now); /* (counted in pool_free by pool_recycle) */
    } else {
      queue_push_front(page->is_purged ? &pool_purged : &pool_fresh, page);
    }
    page = next;
  }
}

/* Under pool_lock: the page out of the pool is heap's now, home if its segment is heap's, else borrowed. */
static void hand_to(th_heap_t *heap, th_page_t *page) {
  if (atomic_load_explicit(&segment_of_page(page)->heap, memory_order_relaxed) == heap) {
    __atomic_store_n(&page->out, TH_OUT_HOME, __ATOMIC_RELAXED);
  } else {
    atomic_store_explicit(page_borrower(page), heap, memory_order_relaxed);
    __atomic_store_n(&page->out, TH_OUT_BORROWED, __ATOMIC_RELAXED);
    stats_count(&th_stats_global.pages_borrowed);
  }
  atomic_store_explicit(&page->owner, heap->thread_id, memory_order_relaxed);
}

/* Under pool_lock: heap takes the orphan over (adoption, or its handing heap's reclaim), unless the free of its
 * last block claimed it first (page_try_claim_orphan). */
static bool orphan_take(th_heap_t *heap, th_page_t *page) {
  if (!page_try_claim_orphan(page)) return false;
  orphan_unlist(page);
  hand_to(heap, page);
  return true;
}

/* A slot for heap: committed, or (purged) any; NULL when the pool has none. Its segment counts it in use
 * already: the caller marks it in use and does not count it again. */
th_page_t *pool_borrow(th_heap_t *heap, bool purged) {
  if (atomic_load_explicit(pool_free, memory_order_relaxed) == 0) return NULL;
  if (!th_lock_unless_fork(&pool_lock)) return NULL;
  incoming_take();
  th_page_queue_t *q = pool_fresh.first ? &pool_fresh : purged ? &pool_purged : NULL;
  th_page_t *page = q ? q->first : NULL;
  if (page) {
    queue_remove(q, page);
    atomic_fetch_sub_explicit(pool_free, 1, memory_order_relaxed);
    hand_to(heap, page);
  }
  th_unlock(&pool_lock);
  return page;
}

/* The segment's owner takes back a slot it lent, if it is still in the pool and has waited there for delay
 * ms (any with force); false when a borrower has it. */
bool pool_take_back(th_page_t *page, uint64_t now, uint64_t delay, bool force) {
  if (!th_lock_unless_fork(&pool_lock)) return false;
  incoming_take();
  /* A slot lent by a borrower's pool_return is LENT before it is on the incoming stack (pool_lend): until
   * incoming_take lists it, it is in no queue, and taking it back then unlinked it from a queue it was not in
   * and let the late push list it as a free slot after its segment had counted it free (a count one short,
   * a slot used twice). Such a slot waits: its segment keeps counting it. */
  th_page_queue_t *q = page->is_purged ? &pool_purged : &pool_fresh;
  bool listed = page->prev != NULL || q->first == page;
  bool taken = page_out(page) == TH_OUT_LENT && listed && (force || clock_waited(now, page->free_since_ms, delay));
  if (taken) {
    queue_remove(q, page);
    atomic_fetch_sub_explicit(pool_free, 1, memory_order_relaxed);
    __atomic_store_n(&page->out, TH_OUT_HOME, __ATOMIC_RELAXED);
    atomic_store_explicit(&page->owner, atomic_load_explicit(&segment_of_page(page)->thread_id, memory_order_relaxed),
                          memory_order_relaxed);
  }
  th_unlock(&pool_lock);
  return taken;
}

bool pool_is_empty(void) { return atomic_load_explicit(pool_free, memory_order_relaxed) == 0; }

/* The segment's owner lends a free committed slot (segment.c counts it in used_pages). */
void pool_lend(th_page_t *page) {
  page->free_since_ms = process_clock();
  atomic_store_explicit(&page->owner, 0, memory_order_relaxed);
  __atomic_store_n(&page->out, TH_OUT_LENT, __ATOMIC_RELAXED);
  atomic_fetch_add_explicit(pool_free, 1, memory_order_relaxed);
  incoming_push(page);
}

/* A borrowed page emptied and forgotten by page_slot_free, which kept its borrower's counts: back to the
 * pool, where another heap may take it at once. */
void pool_return(th_page_t *page) {
  page->in_full = 0; /* (a sweep returns emptied pages parked as full) */
  atomic_store_explicit(page_borrower(page), NULL, memory_order_relaxed);
  pool_lend(page);
}

/* The borrower exits with blocks in the page: they come back through other threads' frees, pushed at once
 * (no thread collects them), until pool_round finds the page empty. Its remote-free state is NORMAL. */
void pool_orphan(th_heap_t *heap, th_page_t *page) {
  heap->stat.committed -= page->committed;
  if (page->class_idx != 0 && !page->in_full) heap_count_frees(heap, page->class_idx, page_owner_frees(page));
  page->used_word &= TH_USED_MASK;
  atomic_store_explicit(&page->owner, 0, memory_order_relaxed);
  atomic_store_explicit(page_borrower(page), NULL, memory_order_relaxed);
  __atomic_store_n(&page->out, TH_OUT_ORPHAN, __ATOMIC_RELAXED);
  atomic_fetch_add_explicit(&orphan_count, 1, memory_order_relaxed);
  stats_count(&th_stats_global.pages_orphaned);
  incoming_push(page);
}

/* The owner's full small page goes to the pool as an orphan instead of its full queue, while other threads
 * live: a thread that hands its blocks to others (a producer) otherwise keeps every page it filled until it
 * runs again and finds them emptied, and the process holds the sum of the producers' peaks. The other
 * threads' frees bring the blocks back; the one that brings the last makes the page a free slot for any heap
 * (pool_recycle); a heap short of blocks of the class adopts it before then. The owner's own frees into it
 * take the remote path. POOL_NO_LOCK: a fork is under way (the caller parks it as before). */
int pool_hand_off(th_heap_t *heap, th_page_queue_t *q, th_page_t *page) {
  if (!th_lock_unless_fork(&pool_lock)) return POOL_NO_LOCK;
  if (!page_try_set_orphan(page)) {
    th_unlock(&pool_lock);
    return POOL_BLOCKS_ARRIVED;
  }
  heap_queue_remove(heap, q, page);
  heap->stat.committed -= page->committed;
  heap_count_frees(heap, page->class_idx, page_owner_frees(page));
  page->used_word &= TH_USED_MASK;
  /* Its owner is the handing thread's id plus 1, no thread's: every free takes the remote path, where that
   * thread's own takes the page back (pool_reclaim) with no read but the owner word th_free read already. The
   * borrower table names the heap, for the count of who frees whose blocks (page_heap) and for that check. */
  atomic_store_explicit(&page->owner, heap->thread_id | TH_OWNER_HANDED, memory_order_relaxed);
  atomic_store_explicit(page_borrower(page), heap, memory_order_relaxed);
  queue_push_back(&orphans[page->class_idx], page);
  orphan_listed(page->class_idx, 1);
  stats_count(&th_stats_global.pages_handed_off);
  th_unlock(&pool_lock);
  return POOL_HANDED_OFF;
}

/* The remote free that brought a handed-off page's last block back, and claimed it (page_push_remote_chain):
 * the page goes to the free slots. */
void pool_recycle(th_page_t *page) {
  __atomic_store_n(&page->out, TH_OUT_RECYCLE, __ATOMIC_RELAXED);
  atomic_fetch_add_explicit(pool_free, 1, memory_order_relaxed);
  incoming_push(page);
}

/* A free by the heap that handed the page off (th_heap_tls, on the remote path: the page's owner is 0): the
 * page comes back to it, as mimalloc 3 takes back an abandoned page on its owner's free, so that a thread
 * that fills pages and frees its own blocks later (while other threads live) frees them on its fast path.
 * False when the page is another heap's to take, or already claimed. */
bool pool_reclaim(th_page_t *page) {
  th_heap_t *heap = th_heap_tls;
  if (heap == &th_heap_empty || atomic_load_explicit(page_borrower(page), memory_order_relaxed) != heap)
    return false;
  heap_slow_enter(heap);
  bool taken = false;
  if (th_lock_unless_fork(&pool_lock)) {
    taken = page_out(page) == TH_OUT_ORPHAN && atomic_load_explicit(page_borrower(page), memory_order_relaxed) == heap &&
            orphan_take(heap, page);
    th_unlock(&pool_lock);
  }
  if (taken) {
    heap->stat.committed += page->committed;
    heap_page_insert(heap, page);
  }
  heap_slow_exit(heap);
  return taken;
}

/* The heap ends: the pages it handed off name no heap from now on (its struct will serve another thread). */
void pool_forget_heap(th_heap_t *heap) {
  if (atomic_load_explicit(&orphan_count, memory_order_relaxed) == 0 || !th_lock_unless_fork(&pool_lock)) return;
  incoming_take();
  for (size_t c = 1; c < TH_CLASS_COUNT; c++)
    for (th_page_t *page = orphans[c].first; page; page = page->next)
      if (atomic_load_explicit(page_borrower(page), memory_order_relaxed) == heap)
        atomic_store_explicit(page_borrower(page), NULL, memory_order_relaxed);
  th_unlock(&pool_lock);
}

/* Is the orphan worth taking over: half of its blocks free (once its remote frees are collected), or any
 * block of an exited borrower's? Adopting a page for a block or two, filling it and handing it off again
 * cost a lock each way for those few blocks (make bench's xthread: 7.1-7.4 million blocks a second against
 * 7.7-8.0 before hand-off; with half, 7.8-8.3); a page left to gather frees is recycled whole when its last
 * comes back, or adopted once half have. */
static bool orphan_has_free(const th_page_t *page) {
  size_t frees = (size_t)(atomic_load_explicit(&page->thread_free, memory_order_relaxed) >> TH_TF_COUNT_SHIFT);
  if (page->free != NULL || page->local_free != NULL || page->capacity < page->reserved) return true;
  /* (an exited borrower's orphan has owner 0; a handed-off one its handing thread's id | 1) */
  return frees != 0 && (frees * 2 >= page->reserved ||
                        atomic_load_explicit(&page->owner, memory_order_relaxed) == 0);
}

#define ADOPT_LOOK_MAX 8 /* orphans of the class looked at, from the front */

/* An orphan of class c with a block to hand out, for heap to take over as its own page (or back home, if its
 * segment is heap's); NULL when there is none. Its lists and remote frees come with it, as an adopted
 * segment's pages do. */
th_page_t *pool_adopt_orphan(th_heap_t *heap, size_t c) {
  if (atomic_load_explicit(&orphans_of[c], memory_order_relaxed) == 0) return NULL;
  if (!th_lock_unless_fork(&pool_lock)) return NULL;
  incoming_take();
  th_page_t *page = NULL;
  uint32_t n = atomic_load_explicit(&orphans_of[c], memory_order_relaxed);
  for (uint32_t looked = 0; looked < n && looked < ADOPT_LOOK_MAX && orphans[c].first != NULL; looked++) {
    th_page_t *p = orphans[c].first;
    if (page_out(p) == TH_OUT_ORPHAN && orphan_has_free(p) && orphan_take(heap, p)) {
      page = p;
      break;
    }
    /* Looked at: to the back of the list, so that the next look sees others. The list is in the order the
     * pages were handed off, not the order their blocks come back: a page adopted for its first few frees
     * and handed off again joins the back with its oldest blocks, whose frees a look at the front alone
     * would never see (make bench's xthread held 155 MB against 108 so, the pages' frees unused). */
    queue_remove(&orphans[c], p);
    queue_push_back(&orphans[c], p);
  }
  th_unlock(&pool_lock);
  if (page != NULL) heap->stat.committed += page->committed;
  return page;
}

/* On any thread heap's purge round: orphans whose blocks all came back become free slots, and slots that
 * waited the delay are purged in place. */
void pool_round(uint64_t delay) {
  if (atomic_load_explicit(pool_free, memory_order_relaxed) == 0 &&
      atomic_load_explicit(&orphan_count, memory_order_relaxed) == 0)
    return;
  uint64_t now = process_clock();
  if (!th_trylock(&pool_lock)) return;
  incoming_take();
  for (size_t c = 1; c < TH_CLASS_COUNT && atomic_load_explicit(&orphan_count, memory_order_relaxed) != 0; c++) {
    for (th_page_t *page = orphans[c].first, *next; page; page = next) {
      next = page->next;
      /* An exited borrower's orphan (NORMAL); a page handed off full is claimed by its last free instead. */
      uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
      if (page_out(page) != TH_OUT_ORPHAN || (tf & TH_TF_MASK) != TH_TF_NORMAL || !page_is_empty(page)) continue;
      orphan_to_slot(page, now);
      atomic_fetch_add_explicit(pool_free, 1, memory_order_relaxed);
    }
  }
  while (pool_fresh.last && clock_waited(now, pool_fresh.last->free_since_ms, delay)) {
    th_page_t *page = pool_fresh.last;
    queue_remove(&pool_fresh, page);
    page_purge_slot(page);
    queue_push_front(&pool_purged, page);
  }
  th_unlock(&pool_lock);
}

void pool_lock_all(unsigned level) { thread_lock_for_fork(&pool_lock, level); }
void pool_unlock_all(unsigned level, bool child) { thread_unlock_after_fork(&pool_lock, level, child); }
