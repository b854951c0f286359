/* attribution.c: where the memory threadheap holds goes (attribution_compute): in blocks the program holds,
 * in free blocks of pages in use, in empty page slots, in the cache, in metadata, or not resident at all.
 *
 * Nothing on the fast paths counts this: it is computed when read, from the page descriptors every segment
 * header already keeps (a page's used count, its thread_free count) and what the kernel says is resident
 * (mincore, a call per segment: a free slot or block keeps the pages it touched until purged, which no
 * counter follows exactly, so the walk asks rather than estimates). The walk visits
 * the map entries of segment starts; other threads may unmap or reuse a segment meanwhile, so each header
 * is copied with os_read_self, which fails instead of faulting on memory gone, and what is copied is
 * checked for sense before it counts. A segment reused during the walk reads as whichever state the copy
 * caught; the owner threads' concurrent mallocs and frees make the numbers of their pages a moment old. */
#include <errno.h>
#include <string.h>

#include "internal.h"
#include "os.h"

/* Flows of heaps that have ended (attribution_fold) and of huge blocks: [0] allocated, [1] freed. */
static _Atomic(uint64_t) done_frees[TH_CLASS_COUNT], done_fresh[TH_CLASS_COUNT];
static _Atomic(uint64_t) huge_blocks[2], huge_bytes[2], huge_fresh;
static _Atomic(uint64_t) done_lock[2]; /* destroyed explicit heaps' lock acquisitions and waits */
/* Bytes of live huge blocks, and the small, medium and large blocks' part of in_use at the last walk: at
 * each huge allocation their sum is a candidate for in_use_peak, so that a program of short-lived huge
 * blocks, which no walk may catch live, still shows its peak. */
static _Atomic(uint64_t) huge_live, paged_in_use;

static void add(_Atomic(uint64_t) *c, uint64_t n) { atomic_fetch_add_explicit(c, n, memory_order_relaxed); }
static uint64_t get(_Atomic(uint64_t) *c) { return atomic_load_explicit(c, memory_order_relaxed); }

void attribution_count_frees(size_t c, uint64_t n) { add(&done_frees[c], n); }

void attribution_fold(th_heap_t *heap) {
  th_heap_flow_t *f = &heap->flow;
  for (size_t c = 0; c < TH_CLASS_COUNT; c++) {
    add(&done_frees[c], get(&f->frees[c]));
    add(&done_fresh[c], get(&f->fresh[c]));
    atomic_store_explicit(&f->frees[c], 0, memory_order_relaxed);
    atomic_store_explicit(&f->fresh[c], 0, memory_order_relaxed);
  }
  for (size_t i = 0; i < 2; i++) {
    add(&huge_blocks[i], get(&f->huge_blocks[i]));
    add(&huge_bytes[i], get(&f->huge_bytes[i]));
    atomic_store_explicit(&f->huge_blocks[i], 0, memory_order_relaxed);
    atomic_store_explicit(&f->huge_bytes[i], 0, memory_order_relaxed);
  }
  add(&huge_fresh, get(&f->huge_fresh));
  atomic_store_explicit(&f->huge_fresh, 0, memory_order_relaxed);
  add(&done_lock[0], get(&heap->lock_acquires));
  add(&done_lock[1], get(&heap->lock_waits));
  atomic_store_explicit(&heap->lock_acquires, 0, memory_order_relaxed);
  atomic_store_explicit(&heap->lock_waits, 0, memory_order_relaxed);
}

/* Counted in the calling thread's own heap (no locked instruction: the huge path is a few dozen ns when the
 * cache serves it), or process-wide for a thread without one. Live huge bytes, for in_use_peak, are one
 * shared counter. */
void attribution_huge(bool alloc, size_t size, bool fresh) {
  th_heap_t *me = th_heap_tls;
  if (me != &th_heap_empty) {
    count_add(&me->flow.huge_blocks[!alloc], 1);
    count_add(&me->flow.huge_bytes[!alloc], size);
    if (alloc && fresh) count_add(&me->flow.huge_fresh, size);
  } else {
    add(&huge_blocks[!alloc], 1);
    add(&huge_bytes[!alloc], size);
    if (alloc && fresh) add(&huge_fresh, size);
  }
  if (!alloc) {
    atomic_fetch_sub_explicit(&huge_live, size, memory_order_relaxed);
    return;
  }
  uint64_t live = atomic_fetch_add_explicit(&huge_live, size, memory_order_relaxed) + size;
  stats_peak_in_use((size_t)(live + get(&paged_in_use)));
}

/* What the walk adds to the folded flows, per class: a live page's allocations not yet folded (used and its
 * owner-free count) and its frees not yet folded (the owner-free count and the remote frees pending). With
 * `only` set, the walk counts the segments of that explicit heap (and its shards) alone. */
typedef struct walk_flow_s {
  uint64_t allocs[TH_CLASS_COUNT], frees[TH_CLASS_COUNT];
  const th_heap_t *only;
  size_t huge_in_use;
} walk_flow_t;

/* Is h the heap `only` or one of its shards? Heap structs are never unmapped, so h may be read. */
static bool heap_in(const th_heap_t *h, const th_heap_t *only) {
  return only == NULL || (h != NULL && (h == only || h->parent == only));
}

/* Header and descriptors of the largest paged segment: 64 small pages. */
#define WALK_PAGES_MAX (TH_SEGMENT_SIZE >> TH_SMALL_PAGE_SHIFT)
/* Room for a copy of the header of the largest paged segment, aligned as a segment is (its page
 * descriptors start at a fixed offset). */
typedef struct walk_buf_s {
  _Alignas(128) unsigned char bytes[offsetof(th_segment_t, pages) + WALK_PAGES_MAX * sizeof(th_page_t)];
  uint8_t resident[TH_SEGMENT_SIZE / 4096]; /* os_resident's vector: a byte per OS page (4 KiB or more) */
} walk_buf_t;

/* Resident bytes of the OS pages of [from, to), offsets in a segment whose vector is vec. */
static size_t resident_in(const uint8_t *vec, size_t from, size_t to, size_t ps) {
  size_t bytes = 0;
  for (size_t i = from / ps; i < to / ps; i++) bytes += (vec[i] & 1) * ps;
  return bytes;
}

static size_t pages_of_kind(unsigned kind) {
  return kind == TH_KIND_SMALL ? WALK_PAGES_MAX
       : kind == TH_KIND_MEDIUM ? TH_SEGMENT_SIZE >> TH_MEDIUM_PAGE_SHIFT : 1;
}

static void walk_segment(const th_segment_t *at, walk_buf_t *b, th_stats_t *out, walk_flow_t *flow) {
  size_t ps = os_page_size();
  size_t head = offsetof(th_segment_t, pages);
  th_segment_t *copy = (th_segment_t *)b->bytes;
  if (os_read_self(copy, at, head + sizeof(th_page_t)) != head + sizeof(th_page_t)) return;
  const th_segment_t *seg = copy;
  if (seg->kind > TH_KIND_HUGE || seg->size == 0 || seg->size % TH_SEGMENT_SIZE != 0 || seg->in_cache) return;
  if (!heap_in(atomic_load_explicit(&seg->heap, memory_order_relaxed), flow->only)) return;
  if (flow->only) out->mapped += seg->size;
  if (seg->kind == TH_KIND_HUGE) {
    const th_page_t *page = &copy->pages[0];
    size_t offset = (size_t)(page->start - (const uint8_t *)at);
    if (atomic_load_explicit(&seg->huge_live, memory_order_relaxed) != 1 || offset >= seg->size ||
        seg->huge_committed < offset || seg->huge_committed > seg->size)
      return;
    if (seg->huge_size > seg->huge_committed - offset) return;
    /* The header shares the block's first OS page; the rest of the block's last page is slack. */
    out->metadata += offset < ps ? 0 : align_up(offset, ps) - ps;
    out->in_use += seg->huge_size;
    flow->huge_in_use += seg->huge_size;
    out->free_in_pages += seg->huge_committed - offset - seg->huge_size;
    return;
  }
  size_t n = pages_of_kind(seg->kind);
  if (seg->page_count != n) return;
  if (n > 1 && os_read_self(&copy->pages[1], &at->pages[1], (n - 1) * sizeof(th_page_t)) != (n - 1) * sizeof(th_page_t))
    return;
  size_t header = segment_header_size(n, seg->is_secure);
  /* What is resident, page by page (mincore): a slot holds what its pages last touched until purged, carved
   * by this page or by an earlier one (a page started in a committed slot carves from the slot's start). */
  uint8_t *vec = b->resident;
  os_resident(at, TH_SEGMENT_SIZE, vec);
  size_t hdr = align_up(header, ps);
  out->metadata += resident_in(vec, 0, hdr, ps);
  for (size_t i = 0; i < n; i++) {
    const th_page_t *page = &copy->pages[i];
    size_t from = i == 0 ? hdr : i << seg->page_shift, to = (i + 1) << seg->page_shift;
    size_t resident = resident_in(vec, from, to, ps);
    if (!page->in_use) {
      out->empty_pages += resident;
      continue;
    }
    if (page->block_size == 0 || page->capacity > page->reserved || page->class_idx == 0 ||
        page->class_idx >= TH_CLASS_COUNT)
      continue;
    /* The program holds the blocks handed out and not freed, less those freed by other threads and waiting
     * on thread_free (used counts them until collected). */
    uint32_t used = page_used(page), owner_frees = page->in_full ? 0 : page_owner_frees(page);
    size_t remote = (size_t)(atomic_load_explicit(&page->thread_free, memory_order_relaxed) >> TH_TF_COUNT_SHIFT);
    size_t live_blocks = used > remote ? used - remote : 0;
    flow->allocs[page->class_idx] += used + owner_frees;
    flow->frees[page->class_idx] += owner_frees + remote;
    size_t live = live_blocks * page->block_size;
    out->in_use += live;
    out->free_in_pages += resident > live ? resident - live : 0;
  }
}

/* Allocations and frees per class: the folded flows (every heap struct's, and those of heaps that ended)
 * plus what the walk found in live pages; then per range, with the huge blocks. */
static void flow_compute(th_stats_t *out, walk_flow_t *flow) {
  uint64_t frees[TH_CLASS_COUNT], fresh[TH_CLASS_COUNT];
  for (size_t c = 0; c < TH_CLASS_COUNT; c++) {
    frees[c] = flow->only ? 0 : get(&done_frees[c]);
    fresh[c] = flow->only ? 0 : get(&done_fresh[c]);
  }
  out->heap_lock_acquires = flow->only ? 0 : get(&done_lock[0]);
  out->heap_lock_waits = flow->only ? 0 : get(&done_lock[1]);
  /* Huge blocks: counted per thread, so only process-wide (an explicit heap's are in the walk's in_use). */
  uint64_t hb[2] = {0, 0}, hy[2] = {0, 0}, hf = 0;
  if (flow->only == NULL) {
    hb[0] = get(&huge_blocks[0]), hb[1] = get(&huge_blocks[1]);
    hy[0] = get(&huge_bytes[0]), hy[1] = get(&huge_bytes[1]);
    hf = get(&huge_fresh);
  }
  for (th_heap_t *h = thread_heaps_all(); h; h = h->all_next) {
    if (flow->only && !heap_in(h, flow->only)) continue;
    for (size_t c = 0; c < TH_CLASS_COUNT; c++) {
      frees[c] += get(&h->flow.frees[c]);
      fresh[c] += get(&h->flow.fresh[c]);
    }
    out->heap_lock_acquires += get(&h->lock_acquires);
    out->heap_lock_waits += get(&h->lock_waits);
    if (flow->only) continue;
    for (size_t i = 0; i < 2; i++) hb[i] += get(&h->flow.huge_blocks[i]), hy[i] += get(&h->flow.huge_bytes[i]);
    hf += get(&h->flow.huge_fresh);
  }
  memset(out->range_allocs, 0, sizeof out->range_allocs);
  memset(out->range_frees, 0, sizeof out->range_frees);
  memset(out->range_alloc_bytes, 0, sizeof out->range_alloc_bytes);
  memset(out->range_free_bytes, 0, sizeof out->range_free_bytes);
  memset(out->range_fresh_bytes, 0, sizeof out->range_fresh_bytes);
  for (size_t c = 1; c < TH_CLASS_COUNT; c++) {
    size_t r = class_kind(c), size = class_size(c);
    uint64_t allocs = frees[c] + flow->allocs[c], freed = frees[c] + flow->frees[c];
    out->range_allocs[r] += allocs;
    out->range_frees[r] += freed;
    out->range_alloc_bytes[r] += allocs * size;
    out->range_free_bytes[r] += freed * size;
    out->range_fresh_bytes[r] += fresh[c];
  }
  out->range_allocs[TH_KIND_HUGE] = hb[0];
  out->range_frees[TH_KIND_HUGE] = hb[1];
  out->range_alloc_bytes[TH_KIND_HUGE] = hy[0];
  out->range_free_bytes[TH_KIND_HUGE] = hy[1];
  out->range_fresh_bytes[TH_KIND_HUGE] = hf;
  out->allocs = out->frees = out->alloc_bytes = out->free_bytes = out->fresh_bytes = 0;
  for (size_t r = 0; r < 4; r++) {
    out->allocs += out->range_allocs[r];
    out->frees += out->range_frees[r];
    out->alloc_bytes += out->range_alloc_bytes[r];
    out->free_bytes += out->range_free_bytes[r];
    out->fresh_bytes += out->range_fresh_bytes[r];
  }
  out->reused_bytes = out->alloc_bytes > out->fresh_bytes ? out->alloc_bytes - out->fresh_bytes : 0;
}

/* out's mapped is set (process-wide: from the counters; a heap: 0, and the walk adds it); cached is measured
 * here (process-wide; a heap: 0). */
static void compute(th_stats_t *out, const th_heap_t *only) {
  out->in_use = out->free_in_pages = out->empty_pages = out->metadata = out->purged = 0;
  size_t lo, hi;
  segment_map_range(&lo, &hi);
  walk_buf_t b;
  walk_flow_t flow;
  memset(&flow, 0, sizeof flow);
  flow.only = only;
  for (size_t i = lo; i < hi && i < TH_MAP_ENTRIES; i++) {
    uint8_t entry = atomic_load_explicit(&th_segment_map[i], memory_order_relaxed);
    if (entry != 1 && entry != TH_MAP_SLOW) continue;
    walk_segment((const th_segment_t *)(i << TH_SEGMENT_SHIFT), &b, out, &flow);
  }
  flow_compute(out, &flow);
  if (only == NULL) {
    out->cached = segment_cache_resident();
    atomic_store_explicit(&paged_in_use, out->in_use - flow.huge_in_use, memory_order_relaxed);
  }
  size_t ps = os_page_size();
  size_t map_bytes = only || hi <= lo ? 0 : align_up(hi, ps) - (lo & ~(ps - 1));
  size_t structs = 0;
  if (only) {
    for (uint32_t i = 0; i < only->nshards || i == 0; i++) structs += align_up(sizeof(th_heap_t), 64);
  } else {
    structs = thread_struct_bytes();
  }
  out->metadata += structs;
  size_t resident = out->in_use + out->free_in_pages + out->empty_pages + out->cached + out->metadata;
  /* Everything else that is mapped is not resident; the segment map is in metadata but not in mapped. */
  out->metadata += map_bytes;
  if (only) out->mapped += structs;
  out->purged = out->mapped > resident ? out->mapped - resident : 0;
}

void attribution_compute(th_stats_t *out) { compute(out, NULL); }

TH_API int th_heap_stats_get(th_heap_t *heap, th_stats_t *out) {
  if (heap == NULL || out == NULL) {
    errno = EINVAL;
    return -1;
  }
  if (heap->magic != TH_HEAP_LIVE_MAGIC || !heap_is_explicit(heap) || heap->parent != NULL)
    report_heap_misuse("th_heap_stats_get", "of a destroyed heap (or not a heap)", heap);
  memset(out, 0, sizeof *out);
  compute(out, heap);
  size_t committed = 0;
  for (uint32_t i = 0; i < heap->nshards || i == 0; i++) {
    th_heap_t *shard = i == 0 ? heap : heap->shard[i];
    committed += atomic_load_explicit((_Atomic(size_t) *)&shard->stat.committed, memory_order_relaxed) +
                 atomic_load_explicit(&shard->huge_bytes, memory_order_relaxed);
  }
  out->committed = committed;
  out->in_use_peak = out->in_use;
  return 0;
}
