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
 * orphaning, on their way onto the lock-free incoming stack. */
#include "internal.h"
#include "os.h"

static th_mutex_t pool_lock = TH_MUTEX_INIT;
/* Free slots, newest first, linked by next/prev: committed ones, then purged ones. */
static th_page_queue_t pool_fresh, pool_purged;
static th_page_t *orphans; /* linked by next */
static _Atomic(th_page_t *) incoming; /* returns and orphans, linked by ready_next */
/* Free slots in the pool or on their way in (th_stats_t.pool_slots), and orphans: peeks without the lock. */
#define pool_free ((_Atomic(size_t) *)&th_stats_global.pool_slots)
static _Atomic(size_t) orphan_count;

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

static void incoming_push(th_page_t *page) {
  th_page_t *top = atomic_load_explicit(&incoming, memory_order_relaxed);
  do page->ready_next = top;
  while (!atomic_compare_exchange_weak_explicit(&incoming, &top, page, memory_order_release, memory_order_relaxed));
}

/* Under pool_lock: the returns and orphans pushed since, into their lists. */
static void incoming_take(void) {
  if (atomic_load_explicit(&incoming, memory_order_relaxed) == NULL) return;
  th_page_t *page = atomic_exchange_explicit(&incoming, NULL, memory_order_acquire);
  while (page) {
    th_page_t *next = page->ready_next;
    if (page_out(page) == TH_OUT_ORPHAN) {
      page->next = orphans;
      orphans = page;
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
  bool taken = page_out(page) == TH_OUT_LENT && (force || clock_waited(now, page->free_since_ms, delay));
  if (taken) {
    queue_remove(page->is_purged ? &pool_purged : &pool_fresh, page);
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

/* An orphan of class c, for heap to take over as its own page (or back home, if its segment is heap's);
 * NULL when there is none. Its lists and remote frees come with it, as an adopted segment's pages do. */
th_page_t *pool_adopt_orphan(th_heap_t *heap, size_t c) {
  if (atomic_load_explicit(&orphan_count, memory_order_relaxed) == 0) return NULL;
  if (!th_lock_unless_fork(&pool_lock)) return NULL;
  incoming_take();
  th_page_t *page = NULL;
  for (th_page_t **link = &orphans; *link != NULL; link = &(*link)->next) {
    if ((*link)->class_idx != c) continue;
    page = *link;
    *link = page->next;
    page->next = NULL;
    atomic_fetch_sub_explicit(&orphan_count, 1, memory_order_relaxed);
    hand_to(heap, page);
    break;
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
  for (th_page_t **link = &orphans, *page; (page = *link) != NULL;) {
    if (!page_is_empty(page)) {
      link = &page->next;
      continue;
    }
    *link = page->next;
    page_discard_free(page);
    stats_committed(-(long)page->committed);
    page->committed = 0;
    page_forget(page);
    page->free_since_ms = now;
    __atomic_store_n(&page->out, TH_OUT_LENT, __ATOMIC_RELAXED);
    atomic_fetch_sub_explicit(&orphan_count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(pool_free, 1, memory_order_relaxed);
    queue_push_front(&pool_fresh, page);
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
