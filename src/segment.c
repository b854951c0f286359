/* segment.c: segments, the 4 MiB aligned regions that heaps carve into pages (segment_page_alloc), the map
 * from address to segment, the process-wide cache of free segments, and the list of abandoned segments. */
#include <errno.h>
#include <string.h>

#include "internal.h"
#include "os.h"

/* 32 MiB of zero-initialised address space; only the bytes for regions we map are ever touched. */
_Atomic(uint8_t) th_segment_map[TH_MAP_ENTRIES];

/* The cache keeps free segments committed (newest first) so that a huge block or a new segment of a similar
 * size costs no mmap, no page faults and no kernel zeroing. Entries older than the purge delay, or past the
 * byte cap, are unmapped, always after the lock is released. While a fork is under way the cache is passed
 * by (th_lock_unless_fork): a take maps, a release unmaps, a purge waits for the next round. */
static th_mutex_t cache_lock = TH_MUTEX_INIT;
static th_segment_t *cache_first;
static size_t cache_bytes;
static _Atomic(size_t) cache_count; /* for a lock-free peek: a stale zero only costs a map */
static _Atomic(uint64_t) cache_next_purge_ms;

/* The clock of the cache and of abandoned segments, process-wide: wall time less the process's pauses, the
 * gaps between purge rounds of any heap past two round intervals, each counted as one interval (a heap's own
 * clock, th_heap_t.paused_ms, does the same for its slots and pages), unless the thread whose round ends the
 * gap ran through its own (ran: heap_ran_through). A program whose threads all slept finds its free segments
 * cached as it left them, instead of unmapped by its first round; one that ran on its fast paths alone has
 * them unmapped at its first round once they waited the delay, instead of keeping them beside the new
 * memory it takes meanwhile. */
static _Atomic(uint64_t) process_last_round_ms, process_paused_ms;

void process_clock_round(uint64_t now, uint64_t round, bool ran) {
  uint64_t last = atomic_exchange_explicit(&process_last_round_ms, now, memory_order_relaxed);
  uint64_t pause = ran ? 0 : pause_since(last, now, round);
  if (pause != 0) atomic_fetch_add_explicit(&process_paused_ms, pause, memory_order_relaxed);
}

/* With a pause in progress taken out, as heap_clock does: a segment cached in a pause, before the round that
 * counts it, is stamped with the time that round will read (a stamp ahead of the clock after it kept the
 * segment for the pause's length of the program's running time). */
uint64_t process_clock(void) {
  uint64_t now = os_now_ms(), round = purge_round_ms((uint64_t)th_options.purge_delay);
  uint64_t pending = pause_since(atomic_load_explicit(&process_last_round_ms, memory_order_relaxed), now, round);
  return now - atomic_load_explicit(&process_paused_ms, memory_order_relaxed) - pending;
}

/* Abandoned segments, one list per page kind; a thread short of pages adopts from here before mapping. An
 * exiting thread pushes its segments on abandoned_incoming without a lock (a thread may exit while another
 * forks); an adopter, under the lock, moves them to the lists. abandoned_count counts both. */
static th_mutex_t abandoned_lock = TH_MUTEX_INIT;
static th_segment_t *abandoned[TH_KINDS_PAGED];      /* newest first */
static th_segment_t *abandoned_last[TH_KINDS_PAGED]; /* oldest: adopted first, its blocks most likely freed */
static _Atomic(th_segment_t *) abandoned_incoming;   /* linked through next, newest first */
static _Atomic(size_t) abandoned_count;

th_segment_t *segment_lookup_slow(uintptr_t region, uint8_t back) {
  while (back == 255) {
    if (region < TH_MAP_BACK_MAX) return NULL;
    region -= TH_MAP_BACK_MAX;
    back = atomic_load_explicit(&th_segment_map[region], memory_order_relaxed);
  }
  if (back == TH_MAP_SLOW) return (th_segment_t *)(region << TH_SEGMENT_SHIFT);
  if (back == 0 || region < (uintptr_t)back - 1) return NULL;
  return (th_segment_t *)((region - (back - 1)) << TH_SEGMENT_SHIFT);
}

/* The range of map entries ever set: the attribution walk reads only these. */
static _Atomic(size_t) map_lo = TH_MAP_ENTRIES, map_hi;

void segment_map_range(size_t *lo, size_t *hi) {
  *lo = atomic_load_explicit(&map_lo, memory_order_relaxed);
  *hi = atomic_load_explicit(&map_hi, memory_order_relaxed);
}

/* The page map (internal.h): 2^31 words, 16 GiB of address space, reserved read-only at the first segment
 * (untouched, it reads as zero and costs no memory, nor any commit charge under strict overcommit); each
 * 4 KiB page of it, 32 MiB of address space, is made writable when a segment there is first laid out in
 * pages (page_map_prepare). Until then, and for good if the OS refuses the space (an address-space limit,
 * ulimit -v), the map is page_map_none with mask 0: th_free finds the stand-in for every pointer and sends
 * every free to the checked path, slower but whole. */
#define PAGE_MAP_ENTRIES ((size_t)1 << (TH_ADDRESS_BITS - TH_PAGE_MAP_SHIFT))
#define PAGE_MAP_BYTES (PAGE_MAP_ENTRIES * sizeof(uintptr_t))
#define PAGE_MAP_PAGE 4096
static uintptr_t page_map_none[sizeof(th_page_t) / sizeof(uintptr_t)]; /* entry 0's stand-in until reserved */
th_page_t th_page_map_slow; /* the stand-in of secure and sampled segments' pages */
_Alignas(64) th_page_map_t th_page_map = {page_map_none, 0};
/* Bit i: the map's page i is writable. 512 KiB of zeros, touched only where segments are. */
static _Atomic(uint64_t) page_map_writable[PAGE_MAP_BYTES / PAGE_MAP_PAGE / 64];
static _Atomic(int) page_map_state; /* 0 not tried, 1 reserved, 2 refused */

/* The map, reserved at the first call; NULL when the OS refused it. Threads that get here at once each
 * reserve, and all but the first give theirs back. */
static uintptr_t *page_map_reserve(void) {
  int state = atomic_load_explicit(&page_map_state, memory_order_acquire);
  if (th_likely(state == 1)) return atomic_load_explicit(&th_page_map.map, memory_order_relaxed);
  if (state == 2) return NULL;
  uintptr_t *map = os_reserve_zero(PAGE_MAP_BYTES);
  if (map == NULL) {
    int none = 0;
    if (atomic_compare_exchange_strong_explicit(&page_map_state, &none, 2, memory_order_acq_rel, memory_order_acquire)) {
      size_t limit = os_address_limit();
      options_verbose("the OS refused the page map's %zu GiB of address space (address-space limit: %zu MiB): "
                      "every free takes the checked path", PAGE_MAP_BYTES >> 30,
                      limit == SIZE_MAX ? (size_t)0 : limit >> 20);
    }
    return none == 1 ? atomic_load_explicit(&th_page_map.map, memory_order_relaxed) : NULL;
  }
  uintptr_t *none = page_map_none;
  if (!atomic_compare_exchange_strong_explicit(&th_page_map.map, &none, map, memory_order_acq_rel,
                                               memory_order_acquire)) {
    os_unreserve(map, PAGE_MAP_BYTES);
    return none;
  }
  __atomic_store_n(&th_page_map.mask, PAGE_MAP_ENTRIES - 1, __ATOMIC_RELEASE);
  atomic_store_explicit(&page_map_state, 1, memory_order_release);
  return map;
}

static inline uintptr_t page_map_index(const void *p) {
  return ((uintptr_t)p >> TH_PAGE_MAP_SHIFT) & (PAGE_MAP_ENTRIES - 1);
}

/* The map's page that holds entry i, and whether page_map_prepare made it writable. */
static inline size_t page_map_page_of(uintptr_t i) { return i * sizeof(uintptr_t) / PAGE_MAP_PAGE; }
static inline bool page_map_page_writable(size_t page) {
  return (atomic_load_explicit(&page_map_writable[page / 64], memory_order_acquire) >> (page & 63)) & 1;
}

/* Make the map's entries for [seg, seg + size) writable; false when the OS refuses (no memory). */
static bool page_map_prepare(const th_segment_t *seg, size_t size) {
  uintptr_t *map = page_map_reserve();
  if (map == NULL) return true; /* no map: nothing to write */
  uintptr_t first = page_map_index(seg);
  for (size_t page = page_map_page_of(first); page <= page_map_page_of(first + (size >> TH_PAGE_MAP_SHIFT) - 1);
       page++) {
    if (page_map_page_writable(page)) continue;
    if (!os_make_writable((uint8_t *)map + page * PAGE_MAP_PAGE, PAGE_MAP_PAGE)) return false;
    atomic_fetch_or_explicit(&page_map_writable[page / 64], (uint64_t)1 << (page & 63), memory_order_release);
  }
  return true;
}

/* The page map's entries for [seg, seg + size) (page_map_prepare made them writable): when seg is laid out
 * in pages (paged, page_count != 0), its pages' descriptors, or th_page_map_slow for a secure or sampled
 * segment; otherwise 0. Only entries that change are written, so that clearing never writes a page of the
 * map that was never made writable. */
static void page_map_update(const th_segment_t *seg, size_t size, bool paged) {
  uintptr_t *map = page_map_reserve();
  if (map == NULL) return;
  uintptr_t first = page_map_index(seg);
  size_t n = size >> TH_PAGE_MAP_SHIFT;
  paged = paged && seg->page_count != 0;
  bool slow = seg->is_secure || seg->is_sampled;
  for (size_t i = 0; i < n; i++) {
    size_t page = page_map_page_of(first + i);
    if (!paged && !page_map_page_writable(page)) { /* never written: its entries are all 0 already */
      i = (page + 1) * PAGE_MAP_PAGE / sizeof(uintptr_t) - first - 1; /* on to the map's next page, unread */
      continue;
    }
    uintptr_t v = 0;
    if (paged) {
      const void *p = (const uint8_t *)seg + (i << TH_PAGE_MAP_SHIFT);
      v = (slow ? (uintptr_t)&th_page_map_slow : (uintptr_t)segment_page_of((th_segment_t *)seg, p)) - (uintptr_t)map;
    }
    if (__atomic_load_n(&map[first + i], __ATOMIC_RELAXED) != v) __atomic_store_n(&map[first + i], v, __ATOMIC_RELAXED);
  }
}

/* The owner of a segment and of each of its pages (th_free reads it from the page). */
void segment_set_owner(th_segment_t *seg, uintptr_t thread_id) {
  for (uint32_t i = 0; i < seg->page_count; i++)
    if (page_out(&seg->pages[i]) == TH_OUT_HOME) /* a slot out is the pool's, or its borrower's (pool.c) */
      atomic_store_explicit(&seg->pages[i].owner, thread_id, memory_order_relaxed);
  atomic_store_explicit(&seg->thread_id, thread_id, memory_order_release);
}

/* The segment's first map entry: TH_MAP_SLOW for a segment of sampled blocks or a secure one, so that
 * th_free sends their frees to secure_free_fast (which passes sampled blocks on to the checks). */
static void segment_map_mark(const th_segment_t *seg) {
  atomic_store_explicit(&th_segment_map[(uintptr_t)seg >> TH_SEGMENT_SHIFT],
                        seg->is_sampled || seg->is_secure ? TH_MAP_SLOW : 1, memory_order_release);
}

void segment_map_set(th_segment_t *seg, size_t size, bool mapped) {
  uintptr_t first = (uintptr_t)seg >> TH_SEGMENT_SHIFT;
  size_t n = size >> TH_SEGMENT_SHIFT;
  if (mapped) {
    size_t lo = atomic_load_explicit(&map_lo, memory_order_relaxed);
    while (first < lo && !atomic_compare_exchange_weak_explicit(&map_lo, &lo, first, memory_order_relaxed,
                                                                memory_order_relaxed)) {
    }
    size_t hi = atomic_load_explicit(&map_hi, memory_order_relaxed);
    while (first + n > hi && !atomic_compare_exchange_weak_explicit(&map_hi, &hi, first + n, memory_order_relaxed,
                                                                    memory_order_relaxed)) {
    }
  }
  for (size_t i = 0; i < n; i++) {
    /* Past TH_MAP_BACK_MAX regions an entry says 255: "look again TH_MAP_BACK_MAX regions back". */
    uint8_t v = !mapped ? 0 : i < TH_MAP_BACK_MAX ? (uint8_t)(i + 1) : 255;
    atomic_store_explicit(&th_segment_map[first + i], v, memory_order_relaxed);
  }
  if (mapped) segment_map_mark(seg); /* (a huge block remapped keeps its mark) */
  page_map_update(seg, size, false); /* laid out in pages by segment_init, not before */
}

/* A segment of the profiler's sample heap, or one leaving it (a paged segment spans one region). */
static void segment_set_sampled(th_segment_t *seg, bool sampled) {
  seg->is_sampled = sampled;
  segment_map_mark(seg);
  page_map_update(seg, TH_SEGMENT_SIZE, true);
}

/* The segment struct and its page descriptors. A secure segment's header ends on an OS page boundary with a
 * guard page (secure.c): a write just past the metadata, or just before page 0's blocks, faults. */
static size_t borrower_table_size(size_t page_count) { return page_count > 1 ? page_count * sizeof(th_heap_t *) : 0; }

size_t segment_header_size(size_t page_count, bool secure) {
  size_t meta = sizeof(th_segment_t) + page_count * sizeof(th_page_t) + borrower_table_size(page_count);
  return secure ? align_up(meta, os_page_size()) + os_page_size() : align_up(meta, 256);
}

/* ---- the cache */

static void cache_unlink(th_segment_t *seg) {
  if (seg->prev) seg->prev->next = seg->next;
  else cache_first = seg->next;
  if (seg->next) seg->next->prev = seg->prev;
  seg->next = seg->prev = NULL;
  seg->in_cache = 0;
  atomic_fetch_sub_explicit(&cache_count, 1, memory_order_relaxed);
  cache_bytes -= seg->size;
  stats_cached(-(long)seg->size);
}

/* A live segment writable only in part (lazy commit, below): a paged one short of commit_end, a lazy huge one
 * short of its block's end (huge_committed, in commit_end's place). Any other huge block's segment is writable
 * whole; its huge_committed stays for a late double free's report. Every cached segment is writable whole. */
static inline bool partly_writable(const th_segment_t *s) {
  return (s->kind != TH_KIND_HUGE || s->is_lazy) && s->commit_end < s->size;
}

/* Do a's and b's ranges touch? */
static bool segments_adjacent(const th_segment_t *a, const th_segment_t *b) {
  const uint8_t *pa = (const uint8_t *)a, *pb = (const uint8_t *)b;
  return pa + a->size == pb || pb + b->size == pa;
}

/* Has the cache a segment without guard pages right before or after seg's range? (Under the lock.) */
static bool cache_neighbour(const th_segment_t *seg) {
  for (const th_segment_t *s = cache_first; s; s = s->next)
    if (s->guards == 0 && segments_adjacent(s, seg)) return true;
  return false;
}

/* Into the list, at its front (cache_unlink's inverse; no merge, no eviction). */
static void cache_push(th_segment_t *seg) {
  seg->in_cache = 1;
  seg->prev = NULL;
  seg->next = cache_first;
  if (cache_first) cache_first->prev = seg;
  cache_first = seg;
  atomic_fetch_add_explicit(&cache_count, 1, memory_order_relaxed);
  cache_bytes += seg->size;
  stats_cached((long)seg->size);
}

static void segment_unmap(th_segment_t *seg) {
  size_t size = seg->size;
  segment_map_set(seg, size, false);
  os_unmap(seg, size);
}

/* Secure mode's guard pages of seg, which is in no list, lifted outside the cache's lock (a system call) and
 * the lock taken again. False, with seg unmapped, when it cannot be (a fork's prepare holds it). */
static bool cache_lift_guards(th_segment_t *seg) {
  th_unlock(&cache_lock);
  secure_segment_release(seg);
  if (th_lock_unless_fork(&cache_lock)) return true;
  segment_unmap(seg);
  return false;
}

/* Unmap a chain linked through next (built under the lock, unmapped outside it). */
static void unmap_chain(th_segment_t *seg) {
  while (seg) {
    th_segment_t *next = seg->next;
    segment_unmap(seg);
    seg = next;
  }
}

/* Split a cached segment under the cache lock: its first size bytes stay `seg`, the rest becomes a cached
 * segment of its own just after it in the list (a segment is any 4 MiB-aligned range with a header at its
 * start: splitting is bookkeeping, no system call). */
static void cache_split(th_segment_t *seg, size_t size) {
  th_segment_t *rest = (th_segment_t *)((uint8_t *)seg + size);
  size_t rest_size = seg->size - size;
  vg_defined(rest, sizeof *rest);
  memset(rest, 0, sizeof *rest);
  rest->size = rest_size;
  rest->commit_end = rest_size; /* (only a segment writable whole is split) */
  rest->cached_since_ms = seg->cached_since_ms;
  rest->in_cache = 1;
  segment_map_set(rest, rest_size, true); /* its regions now point back to it, not to seg */
  rest->prev = seg;
  rest->next = seg->next;
  if (seg->next) seg->next->prev = rest;
  seg->next = rest;
  seg->size = size;
  /* One more entry; cache_bytes stays, and loses seg's size when it leaves. */
  atomic_fetch_add_explicit(&cache_count, 1, memory_order_relaxed);
}

/* A cached segment for a request of size bytes; NULL if none. First one of at least size bytes and not
 * much more, taken as it is. Failing that, the smallest larger one is split and its first size bytes serve
 * the request. Its memory is resident, so the request takes no fault and no kernel zeroing, where a cache
 * of near sizes alone missed whenever a program's large blocks varied in size, and mapped fresh memory
 * beside what it held (tcmalloc's page heap splits its free spans the same way; docs/design.md, "Large
 * blocks and purging"). */
static th_segment_t *cache_take(size_t size) {
  if (atomic_load_explicit(&cache_count, memory_order_relaxed) == 0) return NULL;
  th_segment_t *found = NULL, *larger = NULL;
  if (!th_lock_unless_fork(&cache_lock)) return NULL;
  for (th_segment_t *s = cache_first; s; s = s->next) {
    if (s->size >= size && s->size <= size + size / 4) {
      found = s;
      if (s->size == size) break;
    } else if (s->size > size && (larger == NULL || s->size < larger->size)) {
      larger = s;
    }
  }
  if (found == NULL && larger != NULL && larger->guards != 0) {
    /* Secure mode's guard pages would land inside the block or the rest: lifted first, while the segment is
     * out of the list. */
    cache_unlink(larger);
    if (!cache_lift_guards(larger)) return NULL;
    cache_push(larger);
  }
  if (found == NULL && larger != NULL) {
    found = larger;
    cache_split(larger, size);
  }
  if (found) cache_unlink(found);
  th_unlock(&cache_lock);
  return found;
}

/* A request larger than any cached segment: the cached segments, largest first, are moved (mremap: their
 * page tables, no copy) side by side into a fresh range of size bytes, the last one split if it holds more
 * than the rest needs (not one with secure mode's guard pages, which are lifted outside the lock, before
 * the move, from the ones taken whole); what they do not cover stays fresh. Without it, memory freed
 * as several smaller blocks stayed resident in the cache while a larger request faulted in new memory
 * beside it: a program whose large blocks vary in size held both. NULL, with the cache as it was, when it
 * holds nothing to move or the range cannot be mapped. */
static th_segment_t *cache_gather(size_t size) {
  if (atomic_load_explicit(&cache_count, memory_order_relaxed) == 0) return NULL;
  th_segment_t *pieces = NULL, **tail = &pieces;
  if (!th_lock_unless_fork(&cache_lock)) return NULL;
  for (size_t need = size; need > 0;) {
    th_segment_t *largest = NULL;
    for (th_segment_t *s = cache_first; s; s = s->next)
      if ((s->guards == 0 || s->size <= need) && (largest == NULL || s->size > largest->size)) largest = s;
    if (largest == NULL) break;
    if (largest->size > need) cache_split(largest, need);
    cache_unlink(largest);
    need -= largest->size;
    *tail = largest;
    tail = &largest->next;
  }
  th_unlock(&cache_lock);
  if (pieces == NULL) return NULL;
  uint8_t *dest = os_map_aligned(size, TH_SEGMENT_SIZE);
  for (size_t offset = 0; pieces; ) {
    th_segment_t *piece = pieces;
    pieces = piece->next;
    size_t piece_size = piece->size;
    if (dest == NULL) { /* back to the cache, as they were */
      piece->next = NULL;
      segment_release(piece);
      continue;
    }
    if (piece->guards != 0) secure_segment_release(piece);
    segment_map_set(piece, piece_size, false);
    if (os_move(piece, piece_size, dest + offset, TH_SEGMENT_SIZE)) stats_os_unmap(piece_size); /* (replaced) */
    else os_unmap(piece, piece_size); /* that part of the range stays fresh */
    offset += piece_size;
  }
  if (dest == NULL) return NULL;
  th_segment_t *seg = (th_segment_t *)dest;
  seg->size = size;
  seg->guards = 0; /* (a fresh first part reads zero already) */
  seg->guard_end = 0;
  segment_map_set(seg, size, true);
  return seg;
}

/* ---- lazy commit (THREADHEAP_LAZY_COMMIT; on by default under strict overcommit, vm.overcommit_memory = 2,
 * where the kernel charges every writable private mapping against its commit limit whole, MAP_NORESERVE or
 * not). A heap's segment fresh from the OS (not secure mode's) is reserved with no access and made writable
 * from its start as its pages are carved (page_extend), LAZY_GRANULE at a time: it is charged for its carved
 * prefix instead of 4 MiB. The writable part only grows while the segment lives (a purge returns memory, not
 * the charge). A huge block fresh from the OS is likewise writable only to about its end (is_lazy, huge.c).
 * Released, a segment is made writable whole for the cache (charged for the purge delay at most), and a lazy
 * request of pages that takes it from there gives back the charge past its first bytes (segment_map_new). */
#define LAZY_GRANULE ((size_t)64 << 10)

/* A fresh segment from the OS: writable whole, or (lazy) its first `lazy` bytes only. NULL on failure. */
static th_segment_t *map_fresh(size_t size, size_t lazy) {
  if (lazy == 0) return os_map_aligned(size, TH_SEGMENT_SIZE);
  th_segment_t *seg = os_reserve_aligned(size, TH_SEGMENT_SIZE);
  if (seg != NULL && !os_make_writable(seg, lazy)) {
    int saved = errno;
    os_unmap(seg, size);
    errno = saved;
    seg = NULL;
  }
  return seg;
}

bool segment_commit(th_segment_t *seg, const void *end) {
  size_t want = align_up((size_t)((const uint8_t *)end - (const uint8_t *)seg), LAZY_GRANULE);
  if (want > seg->size) want = seg->size;
  if (want <= seg->commit_end) return true;
  uint8_t *from = (uint8_t *)seg + seg->commit_end;
  if (!os_make_writable(from, want - seg->commit_end)) {
    /* The cached segments are writable whole: what they are charged may be what is missing. */
    if (atomic_load_explicit(&cache_count, memory_order_relaxed) == 0) return false;
    segment_cache_purge(true);
    if (!os_make_writable(from, want - seg->commit_end)) return false;
  }
  seg->commit_end = want;
  return true;
}

th_segment_t *segment_map_new(size_t size, th_kind_t kind, bool secure, size_t lazy) {
  bool fresh = false;
  th_segment_t *seg = cache_take(size);
  if (seg) {
    stats_count(&th_stats_global.cache_hits);
  } else {
    stats_count(&th_stats_global.cache_misses);
    seg = cache_gather(size);
  }
  if (seg == NULL) {
    seg = map_fresh(size, lazy);
    if (seg == NULL && atomic_load_explicit(&cache_count, memory_order_relaxed) != 0) {
      segment_cache_purge(true); /* address space short (RLIMIT_AS): cached segments go first */
      seg = map_fresh(size, lazy);
    }
    if (seg == NULL && sweep_all_heaps(th_heap_tls)) { /* then what other threads' heaps hold empty */
      segment_cache_purge(true);
      seg = map_fresh(size, lazy);
    }
    if (seg == NULL) return NULL;
    fresh = true;
    if (th_options.huge_pages) os_advise_huge(seg, size);
  }
  if (kind != TH_KIND_HUGE && !page_map_prepare(seg, TH_SEGMENT_SIZE)) { /* the OS is out of memory */
    if (fresh) os_unmap(seg, size);
    else segment_release(seg);
    return NULL;
  }
  /* A cached segment (writable whole) for a lazy request of pages keeps its first `lazy` bytes writable; the rest
   * loses its charge, not its pages, which the carve finds resident again. A huge block takes it writable whole
   * (charged already, and a change of protection over resident pages costs a walk of their page tables:
   * mimalloc-bench's malloc-large took 1.2 times as long narrowing them too). */
  size_t commit = fresh ? (lazy ? lazy : size) : lazy && kind != TH_KIND_HUGE ? lazy : seg->size;
  if (commit < seg->size && !fresh) os_protect((uint8_t *)seg + commit, seg->size - commit, false);
  if (fresh) segment_map_set(seg, size, true);
  segment_init(seg, fresh ? size : seg->size, kind, fresh, secure);
  seg->commit_end = commit; /* (a huge block's: until huge_alloc sets huge_committed, the same field) */
  seg->is_lazy = kind == TH_KIND_HUGE && commit < seg->size;
  return seg;
}

/* Lay out a mapped segment's header for pages of one kind. untouched: its memory is fresh from the OS.
 * secure: for a secure heap, or a huge block made in secure mode (guard pages, secure.c). */
void segment_init(th_segment_t *seg, size_t size, th_kind_t kind, bool untouched, bool secure) {
  size_t pages = kind == TH_KIND_SMALL ? TH_SEGMENT_SIZE >> TH_SMALL_PAGE_SHIFT
               : kind == TH_KIND_MEDIUM ? TH_SEGMENT_SIZE >> TH_MEDIUM_PAGE_SHIFT : 1;
  /* A segment keeps secure mode's guard pages when it is released (cached, or an explicit heap's pinned
   * one): laid out again the same way, it needs no system call; otherwise they are lifted first. */
  uint8_t guards = untouched ? 0 : seg->guards;
  size_t guard_end = untouched ? 0 : seg->guard_end;
  if (guards != 0 && guards != (secure ? kind + 1 : 0)) {
    secure_segment_release(seg);
    guards = 0;
    guard_end = 0;
  }
  vg_defined(seg, size); /* under valgrind: a reused segment's freed blocks were no-access */
  memset(seg, 0, sizeof(th_segment_t) + pages * sizeof(th_page_t) + borrower_table_size(pages));
  seg->size = size;
  seg->commit_end = size; /* writable whole (segment_map_new narrows a lazy one's; huge_committed for huge) */
  seg->kind = (uint8_t)kind;
  seg->page_shift = kind == TH_KIND_SMALL ? TH_SMALL_PAGE_SHIFT
                  : kind == TH_KIND_MEDIUM ? TH_MEDIUM_PAGE_SHIFT
                  : kind == TH_KIND_LARGE ? TH_SEGMENT_SHIFT : 63;
  seg->page_count = (uint32_t)pages;
  seg->page_index_shift = (uint8_t)(seg->page_shift - 7);
  seg->page_index_mask = (uint64_t)(pages - 1) << 7;
  seg->is_zero = untouched;
  for (size_t i = 0; i < pages; i++) seg->pages[i].is_purged = seg->pages[i].is_zero = untouched;
  seg->is_secure = secure;
  segment_map_mark(seg);
  page_map_update(seg, size, kind != TH_KIND_HUGE);
  seg->guards = guards;
  seg->guard_end = guard_end;
  if (secure && guards == 0) secure_segment_init(seg);
}

/* The cache's byte cap when a segment of `size` bytes enters it: THREADHEAP_CACHE_MAX, but never more than
 * the heaps held committed with that segment still in use (and always CACHE_FLOOR). The cache serves a
 * program's swings in memory: holding more than the program itself does is a waste, while a program that
 * frees and allocates one large buffer again and again keeps it cached whatever its size (docs/design.md,
 * "Large blocks and purging"). */
#define CACHE_FLOOR ((size_t)64 << 20)
static size_t cache_limit(size_t size) {
  size_t held = atomic_load_explicit((_Atomic(size_t) *)&th_stats_global.committed, memory_order_relaxed) + size;
  size_t cap = held > CACHE_FLOOR ? held : CACHE_FLOOR;
  return cap < (size_t)th_options.cache_max ? cap : (size_t)th_options.cache_max;
}

/* Give a segment with no live block back: into the cache, or to the OS when the cache cannot hold it. */
void segment_release(th_segment_t *seg) {
  if (seg->is_sampled) segment_set_sampled(seg, false);
  segment_set_owner(seg, 0);
  atomic_store_explicit(&seg->heap, NULL, memory_order_relaxed);
  /* Lazy commit: a segment enters the cache writable whole (and charged so, for the purge delay at most),
   * so that the cache may split, merge and move it for any next use; or, refused, it is unmapped. */
  bool partial = partly_writable(seg);
  if (seg->size > (size_t)th_options.cache_max || th_options.purge_delay == 0 ||
      (partial && !os_make_writable((uint8_t *)seg + seg->commit_end, seg->size - seg->commit_end))) {
    segment_unmap(seg);
    return;
  }
  if (partial) {
    if (seg->kind != TH_KIND_HUGE) seg->commit_end = seg->size;
    seg->is_lazy = 0; /* (a huge block's huge_committed stays for a late double free's report) */
  }
  th_segment_t *evict = NULL;
  if (!th_lock_unless_fork(&cache_lock)) {
    segment_unmap(seg);
    return;
  }
  /* Secure mode's guard pages (secure.c) stay for the segment's next use: taken whole for the same layout (a
   * paged segment of the same kind, a huge block of the same size) it needs no system call, and cache_take
   * and cache_gather lift them before they split or move it. But a huge block's segment with a cached
   * neighbour without guard pages has them lifted now (cache_lift_guards), and merges: a program whose large
   * blocks vary in size takes them from merged ranges, as in the default mode. */
  if (seg->guards != 0 && seg->size > TH_SEGMENT_SIZE && cache_neighbour(seg) && !cache_lift_guards(seg))
    return;
  size_t released = seg->size;
  /* Cached neighbours without guard pages merge with it, so a request up to their sum takes them as one (or
   * split); only the rest of a segment whose guard pages cache_take lifted to split it may touch one
   * unmerged. A segment is any aligned range with a header at its start: bookkeeping only. */
  bool merged = false;
  for (th_segment_t *s = cache_first, *next; s && seg->guards == 0; s = next) {
    next = s->next;
    if (s->guards != 0) continue;
    if (segments_adjacent(s, seg)) {
      cache_unlink(s);
      size_t total = s->size + seg->size;
      if (s < seg) seg = s;
      seg->size = total;
      merged = true;
    }
  }
  if (merged) {
    if (seg->kind != TH_KIND_HUGE) seg->commit_end = seg->size;
    segment_map_set(seg, seg->size, true);
  }
  seg->cached_since_ms = process_clock();
  cache_push(seg);
  /* Read before the unlock: from then on another thread may take the segment. */
  uint64_t due = seg->cached_since_ms + (uint64_t)th_options.purge_delay;
  size_t limit = cache_limit(released);
  while (cache_bytes > limit) {
    th_segment_t *last = cache_first;
    while (last->next) last = last->next;
    cache_unlink(last);
    last->next = evict;
    evict = last;
  }
  th_unlock(&cache_lock);
  unmap_chain(evict);
  uint64_t cur = atomic_load_explicit(&cache_next_purge_ms, memory_order_relaxed);
  if (cur == 0 || due < cur) atomic_store_explicit(&cache_next_purge_ms, due, memory_order_relaxed);
}

/* The resident bytes of the cached segments (for the attribution). The ranges are read under the lock and
 * measured after it (mincore is a system call); a segment taken from the cache meanwhile may be counted here
 * and by its new owner's walk, one unmapped counts nothing. Past the first 256 segments, each counts whole. */
size_t segment_cache_resident(void) {
  struct { const void *at; size_t size; } r[256];
  size_t n = 0, whole = 0;
  if (!th_lock_unless_fork(&cache_lock)) return 0;
  for (th_segment_t *s = cache_first; s; s = s->next) {
    if (n < sizeof r / sizeof r[0]) r[n].at = s, r[n++].size = s->size;
    else whole += s->size;
  }
  th_unlock(&cache_lock);
  for (size_t i = 0; i < n; i++) whole += os_resident(r[i].at, r[i].size, NULL);
  return whole;
}

/* Unmap cached segments unused for the purge delay (all of them with force). Cheap when nothing is due. */
void segment_cache_purge(bool force) {
  uint64_t now = process_clock();
  uint64_t due = atomic_load_explicit(&cache_next_purge_ms, memory_order_relaxed);
  if (!force && (due == 0 || now < due)) return;
  th_segment_t *expired = NULL;
  uint64_t next_due = 0;
  if (!th_lock_unless_fork(&cache_lock)) return;
  th_segment_t *s = cache_first;
  while (s) {
    th_segment_t *next = s->next;
    uint64_t s_due = s->cached_since_ms + (uint64_t)th_options.purge_delay;
    if (force || s_due <= now) {
      cache_unlink(s);
      s->next = expired;
      expired = s;
    } else if (next_due == 0 || s_due < next_due) {
      next_due = s_due;
    }
    s = next;
  }
  atomic_store_explicit(&cache_next_purge_ms, next_due, memory_order_relaxed);
  th_unlock(&cache_lock);
  unmap_chain(expired);
}

/* ---- page slots of a heap's segments */

static void heap_segment_link_front(th_heap_t *heap, th_segment_t *seg) {
  th_segment_t **head = &heap->segments[seg->kind];
  seg->prev = NULL;
  seg->next = *head;
  if (*head) (*head)->prev = seg;
  *head = seg;
}

static void heap_segment_unlink(th_heap_t *heap, th_segment_t *seg) {
  if (seg->prev) seg->prev->next = seg->next;
  else heap->segments[seg->kind] = seg->next;
  if (seg->next) seg->next->prev = seg->prev;
  seg->next = seg->prev = NULL;
}

/* Segments with a free page slot stay at the front of the heap's list: a full one moves to the back. */
static void heap_segment_move_back(th_heap_t *heap, th_segment_t *seg) {
  if (seg->next == NULL) return;
  heap_segment_unlink(heap, seg);
  th_segment_t *last = heap->segments[seg->kind];
  while (last->next) last = last->next;
  last->next = seg;
  seg->prev = last;
}

static void heap_segment_own(th_heap_t *heap, th_segment_t *seg) {
  if (heap->flags & TH_HEAP_SAMPLES) segment_set_sampled(seg, true);
  atomic_store_explicit(&seg->remote_batch, !heap_is_explicit(heap) && seg->kind == TH_KIND_SMALL,
                        memory_order_relaxed);
  atomic_store_explicit(&seg->heap, heap, memory_order_release);
  segment_set_owner(seg, heap->thread_id);
  heap_segment_link_front(heap, seg);
}

/* A free slot of the segment, a committed one if it has one; NULL when none is free. */
static th_page_t *segment_free_slot(th_segment_t *seg) {
  th_page_t *page = NULL;
  for (size_t i = 0; i < seg->page_count; i++) {
    th_page_t *p = &seg->pages[i];
    if (page_out(p) != TH_OUT_HOME || p->in_use) continue; /* (a borrower writes in_use of a slot out) */
    if (!p->is_purged) return p;
    if (page == NULL) page = p;
  }
  return page;
}

th_page_t *segment_page_alloc(th_heap_t *heap, th_kind_t kind) {
  th_segment_t *seg = heap->segments[kind];
  bool pool = kind == TH_KIND_SMALL && pool_eligible(heap);
  if (pool) {
    /* The pool's committed slots come before a slot that faults in or a new segment, its purged ones
     * before a new segment. */
    th_page_t *own = seg != NULL && seg->used_pages < seg->page_count ? segment_free_slot(seg) : NULL;
    if (own == NULL || own->is_purged) {
      th_page_t *p = NULL;
      for (p = heap->purge.first; p; p = p->next)
        if (segment_of_page(p)->kind == kind) break;
      if (p == NULL) {
        p = pool_borrow(heap, own == NULL);
        if (p != NULL) {
          p->in_use = 1;
          return p;
        }
      }
    }
  }
  if (seg == NULL || seg->used_pages == seg->page_count) {
    if (heap->reserve != NULL) { /* an explicit heap's committed, touched initial memory comes first */
      seg = heap->reserve;
      heap->reserve = seg->next;
      segment_init(seg, TH_SEGMENT_SIZE, kind, false, heap->secure != NULL);
      seg->is_pinned = 1;
    } else {
      /* Lazy commit, but for secure mode (its guard pages are laid out at once) and the profiler's heap; an
       * explicit heap's initial_size comes from pinned segments, touched whole (above). */
      bool lazy = th_options.lazy_commit > 0 && heap->secure == NULL && !(heap->flags & TH_HEAP_SAMPLES);
      seg = segment_map_new(TH_SEGMENT_SIZE, kind, heap->secure != NULL, lazy ? LAZY_GRANULE : 0);
      if (seg == NULL) return NULL;
    }
    heap_segment_own(heap, seg);
  }
  /* Prefer a slot whose memory is still committed: it takes no page faults. */
  th_page_t *page = segment_free_slot(seg);
  th_assert(page != NULL);
  if (page->is_purged) {
    /* None in this segment: the oldest committed slot of the kind in another of the heap's segments, which
     * would otherwise be purged while this one faults in (the purge queue holds them, oldest first). */
    int looked = 0;
    for (th_page_t *p = heap->purge.first; p && looked < 8; p = p->next, looked++) {
      th_segment_t *other = segment_of_page(p);
      if (other->kind == kind && other != seg) {
        page = p;
        seg = other;
        break;
      }
    }
  }
  if (page->purge_pending) {
    heap_queue_remove(heap, &heap->purge, page);
    page->purge_pending = 0;
  }
  page->in_use = 1;
  if (++seg->used_pages == seg->page_count) heap_segment_move_back(heap, seg);
  return page;
}

/* A segment of the heap with no page in use leaves it: to its reserve when pinned, else to the cache. */
static void segment_leave_heap(th_heap_t *heap, th_segment_t *seg) {
  for (size_t i = 0; i < seg->page_count; i++) {
    if (seg->pages[i].purge_pending) {
      heap_queue_remove(heap, &heap->purge, &seg->pages[i]);
      seg->pages[i].purge_pending = 0;
    }
  }
  heap_segment_unlink(heap, seg);
  if (seg->is_pinned) { /* stays committed with its heap, for the next segment the heap needs */
    seg->next = heap->reserve;
    heap->reserve = seg;
    return;
  }
  segment_release(seg);
}

static void page_slot_free(th_heap_t *heap, th_page_t *page, bool release_unused) {
  th_segment_t *seg = segment_of_page(page);
  th_assert(page->in_use && page_used(page) == 0);
  if (page->class_idx != 0 && !page->in_full) heap_count_frees(heap, page->class_idx, page_owner_frees(page));
  heap->stat.committed -= page->committed;
  stats_committed(-(long)page->committed);
  page->committed = 0;
  page_forget(page);
  if (page_out(page) == TH_OUT_BORROWED) { /* another heap's slot: back to the pool, not touched again */
    pool_return(page);
    return;
  }
  bool was_full = seg->used_pages == seg->page_count;
  if (--seg->used_pages == 0 && release_unused) {
    segment_leave_heap(heap, seg);
    return;
  }
  if (was_full) {
    heap_segment_unlink(heap, seg);
    heap_segment_link_front(heap, seg);
  }
  if (!page->is_purged && !seg->is_pinned) {
    page->free_since_ms = heap_clock(heap, os_now_ms());
    page->purge_pending = 1;
    heap_queue_push_back(heap, &heap->purge, page);
  }
}

void segment_page_free(th_heap_t *heap, th_page_t *page) { page_slot_free(heap, page, true); }

/* The heap's slots that waited in the pool for the purge delay (every one with force) come back as free
 * slots: purged already, or on the purge queue stamped when they were lent; a segment left with no page in
 * use leaves the heap. Owner only. */
void segment_take_back_slots(th_heap_t *heap, bool force) {
  if (pool_is_empty()) return;
  uint64_t now = process_clock();
  uint64_t delay = (uint64_t)th_options.purge_delay;
  for (th_segment_t *seg = heap->segments[TH_KIND_SMALL], *next; seg; seg = next) {
    next = seg->next;
    for (size_t i = 0; i < seg->page_count; i++) {
      th_page_t *page = &seg->pages[i];
      if (page_out(page) != TH_OUT_LENT || !pool_take_back(page, now, delay, force)) continue;
      bool was_full = seg->used_pages == seg->page_count;
      if (--seg->used_pages == 0) {
        segment_leave_heap(heap, seg);
        break;
      }
      if (was_full) {
        heap_segment_unlink(heap, seg);
        heap_segment_link_front(heap, seg);
      }
      if (!page->is_purged) { /* waited the delay: purged this round; with force (thread exit) kept for the adopter */
        page->free_since_ms = force ? heap_clock(heap, os_now_ms()) : 1;
        page->purge_pending = 1;
        heap_queue_push_front(heap, &heap->purge, page);
      }
    }
  }
}

/* The heap's free committed small slots go to the pool (pool.c), counted in use by their segments while out. */
void segment_lend_slots(th_heap_t *heap) {
  for (th_page_t *page = heap->purge.first, *next; page; page = next) {
    next = page->next;
    th_segment_t *seg = segment_of_page(page);
    if (seg->kind != TH_KIND_SMALL || page->is_purged) continue;
    heap_queue_remove(heap, &heap->purge, page);
    page->purge_pending = 0;
    if (++seg->used_pages == seg->page_count) heap_segment_move_back(heap, seg);
    pool_lend(page);
  }
}

/* A sweeper's free (heap_sweep): the segment stays with its heap even with no page in use, since the owner
 * may still be writing its last free into the page (a free counts first, then pushes), which must not land
 * in a segment another thread has taken from the cache. The owner releases it (segment_release_unused). */
void segment_page_free_kept(th_heap_t *heap, th_page_t *page) { page_slot_free(heap, page, false); }

/* The heap's segments with no page in use leave it (after a sweep). Owner only. */
void segment_release_unused(th_heap_t *heap) {
  for (size_t k = 0; k < TH_KINDS_PAGED; k++) {
    for (th_segment_t *seg = heap->segments[k], *next; seg; seg = next) {
      next = seg->next;
      if (seg->used_pages == 0) segment_leave_heap(heap, seg);
    }
  }
}

/* ---- abandon and adopt */

void segment_abandon(th_segment_t *seg) {
  /* No owner collects its remote frees until a heap adopts it, and a page held back from emptying makes
   * the adopter carve elsewhere: frees into it are pushed at once (free.c), until heap_segment_own. */
  atomic_store_explicit(&seg->remote_batch, 0, memory_order_relaxed);
  segment_set_owner(seg, 0);
  atomic_store_explicit(&seg->heap, NULL, memory_order_release);
  seg->cached_since_ms = process_clock();
  seg->prev = NULL;
  th_segment_t *top = atomic_load_explicit(&abandoned_incoming, memory_order_relaxed);
  do seg->next = top;
  while (!atomic_compare_exchange_weak_explicit(&abandoned_incoming, &top, seg, memory_order_release,
                                                memory_order_relaxed));
  atomic_fetch_add_explicit(&abandoned_count, 1, memory_order_relaxed);
  stats_count(&th_stats_global.segments_waiting);
}

/* Under abandoned_lock: the segments pushed since the last adoption join the lists, as their newest. */
static void abandoned_take_incoming(void) {
  th_segment_t *seg = atomic_exchange_explicit(&abandoned_incoming, NULL, memory_order_acquire);
  th_segment_t *order = NULL; /* the pushes oldest first, so that each goes to the front in turn */
  while (seg) {
    th_segment_t *next = seg->next;
    seg->next = order;
    order = seg;
    seg = next;
  }
  while (order) {
    th_segment_t *next = order->next;
    order->prev = NULL;
    order->next = abandoned[order->kind];
    if (order->next) order->next->prev = order;
    else abandoned_last[order->kind] = order;
    abandoned[order->kind] = order;
    order = next;
  }
}

/* Take over the oldest abandoned segment of this kind, if abandoned at least min_age_ms ago: its live pages
 * join the heap's queues, its empty pages are freed. False when none is waiting. */
bool segment_try_adopt(th_heap_t *heap, th_kind_t kind, uint64_t min_age_ms) {
  if (atomic_load_explicit(&abandoned_count, memory_order_relaxed) == 0) return false;
  if (!th_lock_unless_fork(&abandoned_lock)) return false;
  abandoned_take_incoming();
  th_segment_t *seg = abandoned_last[kind];
  /* Only a segment made in the heap's own mode: secure pages keep their free blocks elsewhere (secure.c).
   * The mode changes only when the options are read at start (secure_start), so the other kind is rare. */
  if (seg && seg->is_secure != (heap->secure != NULL)) seg = NULL;
  if (seg && min_age_ms != 0 && !clock_waited(process_clock(), seg->cached_since_ms, min_age_ms)) seg = NULL;
  if (seg) {
    abandoned_last[kind] = seg->prev;
    if (seg->prev) seg->prev->next = NULL;
    else abandoned[kind] = NULL;
    seg->prev = seg->next = NULL;
    atomic_fetch_sub_explicit(&abandoned_count, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit((_Atomic(size_t) *)&th_stats_global.segments_waiting, 1, memory_order_relaxed);
  }
  th_unlock(&abandoned_lock);
  if (seg == NULL) return false;
  stats_count(&th_stats_global.segments_adopted);
  heap_segment_own(heap, seg);
  /* Free slots the exiting thread left committed (heap_exit) join this heap's purge queue with the clock they
   * already had, at its front: they were mostly freed before anything on it, and one that was not keeps the
   * slots behind it waiting at most one delay more. */
  for (size_t i = seg->is_pinned ? 0 : seg->page_count; i-- > 0;) { /* (a pinned one's slots stay committed) */
    th_page_t *page = &seg->pages[i];
    if (page_out(page) != TH_OUT_HOME || page->in_use || page->is_purged || page->purge_pending) continue;
    /* Wall time (heap_exit) to this heap's clock: a slot freed before this heap's pauses looks older. */
    uint64_t freed = page->free_since_ms, wall = os_now_ms();
    if (freed == 0 || freed > wall) freed = wall;
    page->free_since_ms = freed > heap->paused_ms ? heap_clock(heap, freed) : 1;
    page->purge_pending = 1;
    heap_queue_push_front(heap, &heap->purge, page);
  }
  for (size_t i = 0; i < seg->page_count; i++) {
    th_page_t *page = &seg->pages[i];
    if (page_out(page) != TH_OUT_HOME || !page->in_use) continue;
    if (page->in_full) page->used_word &= TH_USED_MASK; /* its count was folded when it was parked */
    page->in_full = 0;
    page_clear_delay(page);
    heap->stat.committed += page->committed;
    if (page_is_empty(page)) { /* a page in use keeps its remote frees until it runs dry */
      page_discard_free(page);
      bool last = seg->used_pages == 1;
      segment_page_free(heap, page);
      if (last) return true; /* the segment was released whole: do not touch it again */
    } else {
      heap_page_insert(heap, page);
    }
  }
  if (seg->used_pages == seg->page_count) heap_segment_move_back(heap, seg);
  return true;
}

/* ---- fork: the slow-path locks, taken before fork and released (or reset) after it */

void segment_lock_all(unsigned level) {
  thread_lock_for_fork(&abandoned_lock, level);
  thread_lock_for_fork(&cache_lock, level);
  pool_lock_all(level);
}

void segment_unlock_all(unsigned level, bool child) {
  pool_unlock_all(level, child);
  thread_unlock_after_fork(&cache_lock, level, child);
  thread_unlock_after_fork(&abandoned_lock, level, child);
}
