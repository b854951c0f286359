/* page.c: a page of one size class: set-up (page_init), carving (page_extend), and its three free lists,
 * including the lock-free thread_free stack that other threads push onto (page_push_remote in internal.h is
 * the one-CAS push; page_push_remote_chain here, the rest). */
#include <string.h>

#include "internal.h"
#include "os.h"

static inline void cpu_relax(void) { __builtin_ia32_pause(); }

static inline th_block_t *tf_block(uintptr_t tf) { return (th_block_t *)(tf & TH_TF_PTR_MASK); }
static inline uintptr_t tf_state(uintptr_t tf) { return tf & TH_TF_MASK; }
static inline size_t tf_count(uintptr_t tf) { return (size_t)(tf >> TH_TF_COUNT_SHIFT); }
/* The word for the stack of tf with a chain of n blocks from head pushed on top, in state. */
static inline uintptr_t tf_push(uintptr_t tf, th_block_t *head, size_t n, uintptr_t state) {
  return ((uintptr_t)(tf_count(tf) + n) << TH_TF_COUNT_SHIFT) | (uintptr_t)head | state;
}
/* The same stack in another state. */
static inline uintptr_t tf_with_state(uintptr_t tf, uintptr_t state) { return (tf & ~TH_TF_MASK) | state; }

uint8_t *page_area(const th_segment_t *seg, size_t index, size_t *size_out) {
  uint8_t *start = (uint8_t *)seg + (index << seg->page_shift);
  uint8_t *end = start + ((size_t)1 << (seg->page_shift < TH_SEGMENT_SHIFT ? seg->page_shift : TH_SEGMENT_SHIFT));
  if (index == 0) start += segment_header_size(seg->page_count, seg->is_secure);
  /* A secure segment's medium and large pages end with a guard page (secure.c). */
  if (seg->is_secure && (seg->kind == TH_KIND_MEDIUM || seg->kind == TH_KIND_LARGE)) end -= os_page_size();
  *size_out = (size_t)(end - start);
  return start;
}

void page_init(th_page_t *page, th_segment_t *seg, size_t index, size_t class_idx) {
  size_t area_size;
  uint8_t *area = page_area(seg, index, &area_size);
  vg_defined(area, area_size); /* under valgrind: freed blocks of the slot's last page were no-access */
  size_t bsize = class_size(class_idx);
  page->start = area;
  page->block_size = (uint32_t)bsize;
  unsigned shift = (unsigned)__builtin_ctzl(bsize);
  uint64_t d = bsize >> shift, inv = d; /* d * d == 1 mod 8; each step doubles the correct low bits */
  for (int i = 0; i < 5; i++) inv *= 2 - d * inv;
  th_assert(d * inv == 1);
  page->block_inv = inv;
  page->block_shift = (uint8_t)shift;
  page->reserved = (uint32_t)(area_size / bsize);
  __atomic_store_n(&page->capacity, 0, __ATOMIC_RELAXED);
  page->used_word = 0;
  page->tail_fresh = page->is_purged; /* untouched since mapped, or purged since last used */
  page->zero_blocks = page->is_zero;
  page->is_zero = 0; /* the slot is in use now: its memory will be written */
  page->owner_freed = 0;
  page->free = page->local_free = NULL;
  page->class_idx = (uint8_t)class_idx;
  page->in_full = 0;
  page->idle_free = NULL;
  page->idle_since_ms = 0;
  page->idle_used = 0;
  page->interior_purged = 0;
  __atomic_store_n(&page->has_aligned, 0, __ATOMIC_RELAXED);
  page->committed = 0;
  atomic_store_explicit(&page->thread_free, 0, memory_order_relaxed);
  th_assert(page->reserved >= 1);
}

/* The page slot no longer holds blocks: its lists are dropped, its poison lifted, and any pointer into it
 * fails the block-start test from now on (start NULL, capacity 0). The owner's bookkeeping (committed bytes,
 * queues, used_pages) is the caller's. */
void page_forget(th_page_t *page) {
  if (page->in_use) block_unpoison(page->start, (size_t)page->capacity * page->block_size);
  page->in_use = 0;
  page->class_idx = 0;
  page->free = page->local_free = NULL;
  page->start = NULL;
  page->block_size = 0;
  page->block_inv = 0;
  page->block_shift = 0;
  __atomic_store_n(&page->capacity, 0, __ATOMIC_RELAXED);
  page->reserved = 0;
  __atomic_store_n(&page->has_aligned, 0, __ATOMIC_RELAXED);
  atomic_store_explicit(&page->thread_free, 0, memory_order_relaxed);
}

/* Carve more blocks onto the free list: those that start in the OS page of the first uncarved block (at
 * most TH_EXTEND_BYTES of them), at least one. Carving writes each block's link word, at its start, so a
 * carve touches one OS page; a block that runs into the next page touches it when the program uses it.
 * Carving lazily keeps untouched memory out of RSS and the first touch of each OS page close to its first
 * use: a class of a few blocks costs one OS page (docs/design.md, "Resident size at start"). */
bool page_extend(th_heap_t *heap, th_page_t *page) {
  size_t bsize = page->block_size;
  uint8_t *first = page->start + (size_t)page->capacity * bsize;
  size_t ps = os_page_size();
  size_t span = ps - ((uintptr_t)first & (ps - 1)); /* bytes left in first's OS page */
  if (span > TH_EXTEND_BYTES) span = TH_EXTEND_BYTES;
  size_t n = (span + bsize - 1) / bsize; /* the blocks that start within span: at least one */
  if (n > page->reserved - page->capacity) n = page->reserved - page->capacity;
  if (n == 0) return false;
  uint8_t *end = first + n * bsize;
  /* A segment mapped lazily (segment.c) is made writable through the carve first. */
  th_segment_t *seg = segment_of_page(page);
  if (th_unlikely((size_t)(end - (uint8_t *)seg) > seg->commit_end) && !segment_commit(seg, end)) return false;
  uintptr_t base = (uintptr_t)page->start & ~(uintptr_t)(ps - 1);
  size_t committed = align_up((uintptr_t)end - base, ps);
  if (th_unlikely(heap->max_size != 0) && committed > page->committed) {
    /* A capped heap commits page by page: carve one block if a whole batch would pass the cap. */
    size_t room = heap->max_size - heap_committed(heap);
    if (committed - page->committed > room) {
      n = 1;
      committed = align_up((uintptr_t)first + bsize - base, ps);
      if (committed > page->committed && committed - page->committed > room) return false;
    }
  }
  if (committed > page->committed) {
    size_t delta = committed - page->committed;
    heap->stat.committed += delta;
    stats_committed((long)delta);
    page->committed = (uint32_t)committed;
  }
  if (th_unlikely(heap->secure != NULL)) {
    secure_carve(page, first, n); /* in random order, onto secure_free */
  } else {
    th_block_t *b = (th_block_t *)first;
    for (size_t i = 0; i + 1 < n; i++) {
      th_block_t *next = (th_block_t *)((uint8_t *)b + bsize);
      b->next = next;
      block_poison(b, bsize);
      b = next;
    }
    block_poison(b, bsize);
    b->next = page->free;
    page->free = (th_block_t *)first;
  }
  __atomic_store_n(&page->capacity, page->capacity + (uint32_t)n, __ATOMIC_RELAXED); /* read by remote frees */
  page->is_purged = 0;
  if (page->tail_fresh) {
    heap_count_fresh(heap, page->class_idx, n * bsize);
    if (th_unlikely(heap->sampler != NULL)) profile_fresh(n * bsize); /* the fresh_space profile */
  }
  return true;
}

/* Fold the blocks other threads freed into the page's lists. Owner only. Returns how many. The stack is not
 * walked when local_free is empty (callers on the malloc path empty it first): the thread that freed
 * the blocks wrote them last, and a walk is a chain of cache misses paid in one burst, where popping them one
 * by one lets each miss overlap the caller's work. Walking on purpose cost larson more than it gained
 * anywhere (docs/design.md). */
size_t page_collect(th_page_t *page) {
  uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
  if (tf_block(tf) == NULL) return 0;
  /* Keep the state bits: a remote free in FREEING retries its push against the emptied list. */
  while (!atomic_compare_exchange_weak_explicit(&page->thread_free, &tf, tf_state(tf), memory_order_acquire,
                                                memory_order_relaxed)) {
  }
  th_block_t *head = tf_block(tf);
  if (head == NULL) return 0;
  size_t n = tf_count(tf);
  if (th_unlikely(segment_of_page(page)->is_secure)) {
    /* checked, and on their way into the quarantine (still counted used: 0), or onto secure_free */
    n = secure_collect(page, head, n);
    if (n == 0) return 0;
  } else {
    if (page->local_free != NULL) { /* the stack goes in front: find its tail */
      size_t walked = 1;
      th_block_t *tail = head;
      while (tail->next) tail = tail->next, walked++;
      th_assert(walked == n);
      (void)walked;
      tail->next = page->local_free;
    }
    page->local_free = head;
  }
  th_assert(page_used(page) >= n);
  page->used_word -= (uint32_t)n;
  stats_add_remote(n);
  th_heap_t *heap = page_heap(page, memory_order_relaxed);
  if (heap) heap_count_frees(heap, page->class_idx, n);
  return n;
}

/* Owner only. Is every block free, counting the remote frees not yet collected? Their number is in the
 * thread_free word, so no block is read: a page in use keeps its remote frees until it runs dry (when
 * page_collect hands them to malloc), and an empty one is freed with its lists
 * dropped (page_discard_free). */
bool page_is_empty(const th_page_t *page) {
  return page_used(page) == tf_count(atomic_load_explicit(&page->thread_free, memory_order_relaxed));
}

/* A page parked as full whose blocks are all on thread_free, its notifying free done (NOTIFIED), and into
 * which its owner has not freed since parking it (the owner-free count still all ones; the owner's next free
 * carries to a slow path). used_word is read once: an owner's free between two reads could pair the count
 * before it with the used count after it. For a sweeper holding the heap (heap_sweep_ready). */
bool page_parked_is_empty(const th_page_t *page) {
  uint32_t used_word = __atomic_load_n(&page->used_word, __ATOMIC_RELAXED);
  uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
  return page->in_full && used_word >> TH_USED_BITS == (uint32_t)~TH_USED_MASK >> TH_USED_BITS &&
         tf_state(tf) == TH_TF_NOTIFIED && tf_count(tf) == (used_word & TH_USED_MASK);
}

/* Owner only, for a page about to be freed whose blocks are all free (page_is_empty): its lists are dropped
 * and its remote frees counted, without walking them. */
void page_discard_free(th_page_t *page) {
  uintptr_t tf = atomic_exchange_explicit(&page->thread_free, 0, memory_order_acquire);
  size_t n = tf_count(tf);
  th_assert(page_used(page) == n);
  page->used_word &= ~TH_USED_MASK;
  page->free = page->local_free = NULL;
  stats_add_remote(n);
  th_heap_t *heap = page_heap(page, memory_order_relaxed);
  if (heap) heap_count_frees(heap, page->class_idx, n);
  else attribution_count_frees(page->class_idx, n); /* an orphan's (its borrower entry cleared): no heap's */
}

/* Ask to be told about the next remote free. False when blocks arrived meanwhile: collect them instead. */
bool page_try_set_full(th_page_t *page) {
  uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
  do {
    if (tf_block(tf) != NULL) return false;
  } while (!atomic_compare_exchange_weak_explicit(&page->thread_free, &tf, (uintptr_t)TH_TF_FULL,
                                                  memory_order_acq_rel, memory_order_relaxed));
  return true;
}

/* The owner hands its full page off to the pool (pool_hand_off, under the pool's lock): it becomes an orphan
 * whose remote frees keep the FULL state, so that the free that brings its last block back sees it empty
 * (page_push_remote_chain). out is set before the state, which a remote free reads with acquire. False when
 * blocks arrived meanwhile: the owner collects them instead. */
bool page_try_set_orphan(th_page_t *page) {
  uint8_t was = page_out(page);
  __atomic_store_n(&page->out, TH_OUT_ORPHAN, __ATOMIC_RELAXED);
  if (page_try_set_full(page)) return true;
  __atomic_store_n(&page->out, was, __ATOMIC_RELAXED);
  return false;
}

/* A heap adopting a page handed off full (pool_adopt_orphan, under the pool's lock): back to NORMAL with its
 * remote frees, unless the free of its last block claimed it for the free slots (FREEING): false. */
bool page_try_claim_orphan(th_page_t *page) {
  uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
  for (;;) {
    if (tf_state(tf) == TH_TF_NORMAL) return true; /* an exited borrower's orphan: no free claims it */
    if (tf_state(tf) != TH_TF_FULL) return false;
    if (atomic_compare_exchange_weak_explicit(&page->thread_free, &tf, tf_with_state(tf, TH_TF_NORMAL),
                                              memory_order_acq_rel, memory_order_acquire))
      return true;
  }
}

/* Back to NORMAL: no remote free will name the owner heap after this returns. Owner only. */
void page_clear_delay(th_page_t *page) {
  uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
  for (;;) {
    if (tf_state(tf) == TH_TF_FREEING) {
      cpu_relax();
      tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
      continue;
    }
    if (tf_state(tf) == TH_TF_NORMAL) return;
    if (atomic_compare_exchange_weak_explicit(&page->thread_free, &tf, tf_with_state(tf, TH_TF_NORMAL),
                                              memory_order_acq_rel, memory_order_relaxed))
      return;
  }
}

/* Remote frees into a page, n blocks freed by one thread and linked from head to tail, where
 * page_push_remote_n's one CAS did not do: the first remote free into a page its owner parked as full also
 * puts the page on the owner heap's ready stack, so the owner finds it without scanning. */
void page_push_remote_chain(th_page_t *page, th_block_t *head, th_block_t *tail, size_t n) {
  uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
  for (;;) {
    uintptr_t state = tf_state(tf);
    if (state == TH_TF_FREEING) {
      cpu_relax();
      tf = atomic_load_explicit(&page->thread_free, memory_order_acquire);
      continue;
    }
    if (state == TH_TF_FULL && page_out(page) == TH_OUT_ORPHAN) {
      /* A page handed off full (pool.c): every block was handed out (used == reserved), so the push that
       * makes the count reserved brings the last one back. That push also claims the page for the pool's
       * free slots (state FREEING, with no one left to free into it), in the same CAS that a heap adopting
       * the page would have to win first (pool_adopt_orphan sets NORMAL). */
      bool last = tf_count(tf) + n == page->reserved;
      tail->next = tf_block(tf);
      if (!atomic_compare_exchange_weak_explicit(&page->thread_free, &tf,
                                                 tf_push(tf, head, n, last ? TH_TF_FREEING : TH_TF_FULL),
                                                 memory_order_acq_rel, memory_order_acquire))
        continue;
      if (last) pool_recycle(page);
      return;
    }
    if (state == TH_TF_FULL) {
      if (!atomic_compare_exchange_weak_explicit(&page->thread_free, &tf, tf_with_state(tf, TH_TF_FREEING),
                                                 memory_order_acq_rel, memory_order_relaxed))
        continue;
      /* While FREEING, the owner cannot abandon the heap (page_clear_delay waits), so heap stays valid. */
      th_heap_t *heap = page_heap(page, memory_order_acquire);
      heap_ready_push(heap, page, page);
      tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
      do {
        tail->next = tf_block(tf);
      } while (!atomic_compare_exchange_weak_explicit(&page->thread_free, &tf, tf_push(tf, head, n, TH_TF_NOTIFIED),
                                                      memory_order_release, memory_order_relaxed));
      return;
    }
    tail->next = tf_block(tf);
    if (atomic_compare_exchange_weak_explicit(&page->thread_free, &tf, tf_push(tf, head, n, state),
                                              memory_order_release, memory_order_relaxed))
      return;
  }
}

/* Owner only, for a page in use that no malloc or free has touched for the purge delay (heap_purge decides):
 * the whole OS pages inside its free blocks go back to the OS. A free block keeps its first 16 bytes (next
 * and tag), so its list and the double-free check are untouched; the rest comes back zeroed when the block
 * is used again. Blocks still on thread_free are left alone. The page's committed bytes still count them. */
void page_purge_free_blocks(th_page_t *page) {
  size_t ps = os_page_size();
  const th_block_t *lists[2] = {page->free, page->local_free};
  for (int l = 0; l < 2; l++) {
    for (const th_block_t *b = lists[l]; b; b = b->next) {
      uintptr_t lo = align_up((uintptr_t)b + sizeof(th_block_t), ps);
      uintptr_t hi = ((uintptr_t)b + page->block_size) & ~(uintptr_t)(ps - 1);
      if (hi > lo) os_purge((void *)lo, hi - lo);
    }
  }
}

/* Owner only, on a purge round, for a page in use whose uncarved rest may be resident (tail_fresh 0): it was
 * started in a page slot still committed (segment_page_alloc prefers those: no page faults), and carving
 * starts again from the slot's first byte, so what the slot's last page had touched past this page's carve
 * stayed resident, counted nowhere, for as long as this page lived. Past the round after it started, that
 * rest goes back to the OS and the page's later carves count as fresh. espresso, which starts pages in
 * reused slots all the time, held about 13% more so (docs/design.md, "Large blocks and purging"). Not in a
 * segment pinned by an explicit heap's initial_size, which stays committed. */
void page_purge_tail(th_page_t *page) {
  th_segment_t *seg = segment_of_page(page);
  if (seg->is_pinned) return;
  page->tail_fresh = 1;
  if (page->capacity == page->reserved) return;
  size_t size;
  uint8_t *area = page_area(seg, (size_t)(page - seg->pages), &size);
  size_t ps = os_page_size();
  /* committed counts from the start's OS page through the carve's last one (page_extend) */
  uintptr_t lo = ((uintptr_t)page->start & ~(uintptr_t)(ps - 1)) + page->committed;
  uintptr_t hi = ((uintptr_t)area + size) & ~(uintptr_t)(ps - 1);
  if (hi > lo) os_purge((void *)lo, hi - lo);
}

/* A free page slot's memory back to the OS, whole OS pages of it: is_zero when that was all of it. */
void page_purge_slot(th_page_t *page) {
  th_segment_t *seg = segment_of_page(page);
  size_t size;
  uint8_t *area = page_area(seg, (size_t)(page - seg->pages), &size);
  size_t ps = os_page_size();
  uintptr_t lo = align_up((uintptr_t)area, ps), hi = ((uintptr_t)area + size) & ~(uintptr_t)(ps - 1);
  if (hi > lo) os_purge((void *)lo, hi - lo);
  page->is_purged = 1;
  page->is_zero = lo == (uintptr_t)area && hi == (uintptr_t)area + size;
}

/* Is block on the page's free or local_free list? Owner only; the caller collects thread_free first. */
bool page_list_contains(const th_page_t *page, const th_block_t *block) {
  for (const th_block_t *b = page->free; b; b = b->next)
    if (b == block) return true;
  for (const th_block_t *b = page->local_free; b; b = b->next)
    if (b == block) return true;
  return false;
}

static size_t list_length(const th_page_t *page, const th_block_t *b, bool *ok) {
  size_t n = 0;
  for (; b; b = b->next) {
    if ((uint8_t *)b < page->start || (uint8_t *)b >= page->start + (size_t)page->capacity * page->block_size ||
        page_block_offset(page, b) != 0 || ++n > page->capacity) {
      *ok = false;
      return n;
    }
  }
  return n;
}

bool page_is_valid(const th_page_t *page) {
  if (!page->in_use) return page->free == NULL && page->local_free == NULL;
  bool ok = page->capacity <= page->reserved && page->block_size >= 16 && page->block_size % 16 == 0;
  size_t nfree = list_length(page, page->free, &ok);
  size_t nlocal = list_length(page, page->local_free, &ok);
  if (segment_of_page(page)->is_secure) { /* its free blocks wait on secure_free only */
    ok = ok && nfree == 0 && nlocal == 0;
    nfree = secure_free_count(page, &ok);
  }
  return ok && page_used(page) + nfree + nlocal == page->capacity;
}
