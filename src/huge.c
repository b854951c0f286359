/* huge.c: blocks above TH_LARGE_MAX, each a segment of its own (huge_alloc): kept committed in the segment
 * cache when freed, and grown or moved with mremap rather than copied. */
#include <errno.h>
#include <string.h>

#include "internal.h"
#include "os.h"

/* Bytes from the segment start to the end of a block of size bytes at offset, in whole OS pages. */
static size_t committed_for(size_t offset, size_t size) { return align_up(offset + size, os_page_size()); }

static size_t huge_committed(const th_segment_t *seg, const void *p, size_t size) {
  return committed_for((size_t)((const uint8_t *)p - (const uint8_t *)seg), size);
}

/* Lazy commit (segment.c): a huge block fresh from the OS (not secure mode's) is writable from its segment's
 * start to its end rounded up to LAZY_STEP (lazy_end), the rest with no access, so that strict overcommit
 * charges about the block rather than its segment; a growing block is made writable a step at a time (one
 * mprotect per 256 KiB of growth, not per realloc). */
#define LAZY_STEP ((size_t)256 << 10)
static size_t lazy_end(size_t segment_size, size_t committed) {
  size_t end = align_up(committed, LAZY_STEP);
  return end < segment_size ? end : segment_size;
}

/* An explicit heap's huge blocks are linked to it, so that th_heap_destroy finds them and its cap counts them.
 * Any thread may free one, hence the lock; it is never held across a system call. */
static void owner_link(th_heap_t *owner, th_segment_t *seg) {
  th_lock(&owner->huge_lock);
  seg->prev = NULL;
  seg->next = owner->huge;
  if (owner->huge) owner->huge->prev = seg;
  owner->huge = seg;
  atomic_fetch_add_explicit(&owner->huge_bytes, seg->huge_committed, memory_order_relaxed);
  th_unlock(&owner->huge_lock);
}

static void owner_unlink(th_heap_t *owner, th_segment_t *seg) {
  th_lock(&owner->huge_lock);
  if (seg->prev) seg->prev->next = seg->next;
  else owner->huge = seg->next;
  if (seg->next) seg->next->prev = seg->prev;
  seg->next = seg->prev = NULL;
  atomic_fetch_sub_explicit(&owner->huge_bytes, seg->huge_committed, memory_order_relaxed);
  th_unlock(&owner->huge_lock);
}

static bool owner_has_room(th_heap_t *owner, size_t bytes) {
  return owner == NULL || owner->max_size == 0 ||
         (heap_committed(owner) <= owner->max_size && bytes <= owner->max_size - heap_committed(owner));
}

void *huge_alloc(th_heap_t *owner, size_t size, size_t alignment, bool zero) {
  if (size < 16) size = 16;
  bool secure = owner ? owner->secure != NULL : th_options.secure != 0;
  size_t header = segment_header_size(1, secure);
  size_t offset = align_up(header, alignment);
  if (size > (size_t)PTRDIFF_MAX - offset - 2 * TH_SEGMENT_SIZE) {
    errno = ENOMEM;
    return NULL;
  }
  if (!owner_has_room(owner, committed_for(offset, size))) {
    heap_collect_remote(owner); /* blocks other threads freed into the heap may make room */
    if (!owner_has_room(owner, committed_for(offset, size))) {
      errno = ENOMEM;
      return NULL;
    }
  }
  /* In secure mode a guard page follows the block's last page (secure_huge_alloc). */
  size_t total = align_up(offset + size + (secure ? os_page_size() : 0), TH_SEGMENT_SIZE);
  bool lazy = th_options.lazy_commit > 0 && !secure && !(owner && (owner->flags & TH_HEAP_SAMPLES)); /* lazy_end */
  th_segment_t *seg;
  if (alignment <= TH_SEGMENT_SIZE) {
    seg = segment_map_new(total, TH_KIND_HUGE, secure, lazy ? lazy_end(total, committed_for(offset, size)) : 0);
  } else {
    /* Rare: a block aligned beyond a segment is mapped at that alignment and never comes from the cache. */
    seg = os_map_aligned(total, alignment);
    if (seg) {
      segment_map_set(seg, total, true);
      segment_init(seg, total, TH_KIND_HUGE, true, secure);
    }
  }
  if (seg == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  uint8_t *p = (uint8_t *)seg + offset;
  th_page_t *page = &seg->pages[0];
  page->start = p;
  page->in_use = 1;
  seg->huge_committed = huge_committed(seg, p, size);
  seg->huge_size = size;
  if (secure) secure_huge_alloc(seg, p, size);
  atomic_store_explicit(&seg->huge_live, 1, memory_order_release);
  stats_committed((long)seg->huge_committed);
  stats_count(&th_stats_global.huge_allocs);
  attribution_huge(true, size, seg->is_zero);
  if (th_unlikely(th_profile_on)) profile_huge_alloc(seg, size, seg->is_zero);
  if (owner) {
    atomic_store_explicit(&seg->heap, owner, memory_order_relaxed);
    owner_link(owner, seg);
  }
  if (zero && !seg->is_zero) memset(p, 0, size);
  return p;
}

/* The last huge blocks freed, for the misuse report only: a freed huge block whose segment was unmapped at
 * once (no segment cache, THREADHEAP_PURGE_DELAY=0, or a block past THREADHEAP_CACHE_MAX) is no longer in
 * the segment map, and its second free would otherwise be named an invalid pointer, not a double free.
 * Writers race only with each other and a reader gets a stale or torn pair at worst: the wording of a
 * report that stops the process anyway. */
#define FREED_RING 64
static _Atomic(uintptr_t) freed_block[FREED_RING];
static _Atomic(size_t) freed_size[FREED_RING];
static _Atomic(unsigned) freed_next;

static void huge_remember_freed(const void *p, size_t usable) {
  unsigned i = atomic_fetch_add_explicit(&freed_next, 1, memory_order_relaxed) % FREED_RING;
  atomic_store_explicit(&freed_size[i], usable, memory_order_relaxed);
  atomic_store_explicit(&freed_block[i], (uintptr_t)p, memory_order_relaxed);
}

bool huge_recently_freed(const void *p, size_t *usable) {
  for (unsigned i = 0; i < FREED_RING; i++) {
    if (atomic_load_explicit(&freed_block[i], memory_order_relaxed) == (uintptr_t)p) {
      *usable = atomic_load_explicit(&freed_size[i], memory_order_relaxed);
      return true;
    }
  }
  return false;
}

void huge_free(th_segment_t *seg, const void *p, th_op_t op) {
  size_t usable = free_usable_size(&seg->pages[0], p);
  if (atomic_exchange_explicit(&seg->huge_live, 0, memory_order_acq_rel) != 1)
    report_misuse(TH_MISUSE_FREED, op, p, p, usable);
  huge_remember_freed(p, usable);
  profile_huge_free(seg);
  th_heap_t *owner = atomic_load_explicit(&seg->heap, memory_order_relaxed);
  if (owner) owner_unlink(owner, seg);
  stats_committed(-(long)seg->huge_committed);
  attribution_huge(false, seg->huge_size, false);
  seg->is_zero = 0;
  segment_release(seg);
}

/* guard: room to leave after the block's last OS page (secure mode's guard page). */
static void *huge_remap(th_segment_t *seg, void *p, size_t size, size_t guard) {
  size_t offset = (size_t)((uint8_t *)p - (uint8_t *)seg);
  size_t need = align_up(offset + size + guard, TH_SEGMENT_SIZE);
  size_t old = seg->size;
  long committed_before = (long)seg->huge_committed;
  th_heap_t *owner = atomic_load_explicit(&seg->heap, memory_order_relaxed);
  size_t new_committed = huge_committed(seg, p, size);
  if (owner && new_committed > seg->huge_committed && !owner_has_room(owner, new_committed - seg->huge_committed)) {
    errno = ENOMEM;
    return NULL;
  }
  /* Lazy commit: the block's new pages become writable first, and so does the rest of the segment when it
   * grows past it (mremap resizes or moves one mapping); what lies past lazy_end is made inaccessible again
   * below. On failure the block is as it was, its segment perhaps writable further. */
  bool lazy = seg->is_lazy;
  size_t writable = lazy ? lazy_end(old, (size_t)committed_before) : old; /* writable from the start, after this */
  if (lazy && new_committed > writable) {
    size_t upto = need > old ? old : lazy_end(old, new_committed);
    if (!os_make_writable((uint8_t *)seg + writable, upto - writable)) {
      errno = ENOMEM;
      return NULL;
    }
    writable = upto;
  }
  if (owner) owner_unlink(owner, seg); /* the segment may move; relinked below */
  if (need < old) {
    /* Shrink in place: the tail goes back to the OS. */
    segment_map_set((th_segment_t *)((uint8_t *)seg + need), old - need, false);
    os_unmap((uint8_t *)seg + need, old - need);
    seg->size = need;
    if (writable > need) writable = need;
  } else if (need > old) {
    if (os_remap(seg, old, need, NULL) != NULL) { /* grown in place */
      segment_map_set(seg, need, true);
      stats_os_map(need - old);
      stats_count(&th_stats_global.remaps_in_place);
      stats_add(&th_stats_global.remap_bytes_not_copied, seg->huge_size);
    } else {
      /* Move: reserve an aligned range, then let the kernel move the pages there (no copy). */
      void *dest = os_map_aligned(need, TH_SEGMENT_SIZE);
      if (dest == NULL) {
        if (owner) owner_link(owner, seg);
        errno = ENOMEM;
        return NULL;
      }
      stats_os_unmap(need);  /* the reservation is replaced, not added */
      /* The old range's map entries go before the move, not after: once the kernel has moved the pages, the
       * old range is free, and another thread's new segment may be mapped there and enter the map at once;
       * clearing the entries then would erase that segment's, and its blocks would look foreign. No other
       * thread looks this block up meanwhile: it is being reallocated. */
      segment_map_set(seg, old, false);
      /* (A segment gathered from cached pieces spans several kernel mappings: os_move, region by region.) */
      if (os_remap(seg, old, need, dest) == NULL && !os_move(seg, old, dest, TH_SEGMENT_SIZE)) {
        segment_map_set(seg, old, true);
        os_unmap(dest, need);
        if (owner) owner_link(owner, seg);
        errno = ENOMEM;
        return NULL;
      }
      seg = dest;
      segment_map_set(seg, need, true);
      stats_os_map(need - old);
      stats_count(&th_stats_global.remaps_moved);
      stats_add(&th_stats_global.remap_bytes_not_copied, seg->huge_size);
    }
    seg->size = need;
    writable = need;
  } else if (size > seg->huge_size) { /* grown within its segment: nothing to map, nothing copied */
    stats_count(&th_stats_global.remaps_in_place);
    stats_add(&th_stats_global.remap_bytes_not_copied, seg->huge_size);
  }
  if ((long)new_committed < committed_before) {
    /* Shrunk: the pages past the block's new end go back to the OS, as far as the segment still reaches (a
     * tail of whole regions was unmapped above). Left resident, they would count nowhere. */
    size_t end = (size_t)committed_before < need ? (size_t)committed_before : need;
    if (end > new_committed) os_purge((uint8_t *)seg + new_committed, end - new_committed);
  }
  size_t lazy_to = lazy_end(need, new_committed);
  if (lazy && writable > lazy_to) os_protect((uint8_t *)seg + lazy_to, writable - lazy_to, false);
  p = (uint8_t *)seg + offset;
  seg->pages[0].start = p;
  seg->huge_committed = new_committed;
  attribution_huge(false, seg->huge_size, false); /* a realloc counts as a free and an allocation */
  attribution_huge(true, size, false);
  profile_huge_free(seg); /* and so does it in a profile */
  if (th_unlikely(th_profile_on)) profile_huge_alloc(seg, size, false);
  seg->huge_size = size;
  stats_committed((long)seg->huge_committed - committed_before);
  if (owner) owner_link(owner, seg);
  return p;
}

void *huge_realloc(th_segment_t *seg, void *p, size_t size) {
  if (!seg->is_secure) return huge_remap(seg, p, size, 0);
  /* Secure mode: mremap moves one mapping, so the guard pages are lifted, and set again where the block (moved,
   * resized, or left as it was) ends. */
  size_t offset = (size_t)((uint8_t *)p - (uint8_t *)seg), old = seg->huge_size;
  secure_segment_release(seg);
  void *q = huge_remap(seg, p, size, os_page_size());
  uint8_t *b = q ? q : p;
  th_segment_t *now = (th_segment_t *)(b - offset);
  secure_segment_init(now);
  secure_huge_alloc(now, b, q ? size : old);
  return q;
}

/* The block leaves its explicit heap (th_realloc by a thread that may not allocate from the heap). */
void huge_disown(th_segment_t *seg) {
  th_heap_t *owner = atomic_load_explicit(&seg->heap, memory_order_relaxed);
  if (owner == NULL) return;
  owner_unlink(owner, seg);
  atomic_store_explicit(&seg->heap, NULL, memory_order_relaxed);
}

/* th_heap_destroy: every huge block of the heap goes back at once; a later free of one is a double free. */
void huge_release_all(th_heap_t *owner) {
  th_lock(&owner->huge_lock);
  th_segment_t *seg = owner->huge;
  owner->huge = NULL;
  atomic_store_explicit(&owner->huge_bytes, 0, memory_order_relaxed);
  th_unlock(&owner->huge_lock);
  while (seg) {
    th_segment_t *next = seg->next;
    atomic_store_explicit(&seg->huge_live, 0, memory_order_release);
    seg->pages[0].in_use = 0; /* a later free names an invalid pointer, not a double free */
    profile_huge_free(seg);     /* a sampled block leaves the live set with its heap */
    stats_committed(-(long)seg->huge_committed);
    attribution_huge(false, seg->huge_size, false);
    seg->is_zero = 0;
    seg->next = seg->prev = NULL;
    segment_release(seg);
    seg = next;
  }
}
