/* explicit.c: heaps the program makes itself (th_heap_create ... th_heap_destroy), on the same pages and
 * segments as the thread heaps. A no-serialize heap is a thread heap owned by its creator; a serialized heap
 * belongs to no thread (owner TH_OWNER_SHARED): every allocation holds a lock, and every free, even by an
 * allocating thread, is a lock-free remote free that the next allocation under the lock collects. A
 * serialized heap with no cap and no initial size is split into shards (up to two per CPU), each with its
 * own lock and pages; an allocation takes the first free lock from a start that depends on the thread. */
#include <errno.h>
#include <string.h>

#include "internal.h"
#include "os.h"

/* Live explicit heaps, so that fork can take every heap lock. */
static th_mutex_t explicit_list_lock = TH_MUTEX_INIT;
static th_heap_t *explicit_list;

static void list_push(th_heap_t *heap) {
  th_lock(&explicit_list_lock);
  heap->explicit_prev = NULL;
  heap->explicit_next = explicit_list;
  if (explicit_list) explicit_list->explicit_prev = heap;
  explicit_list = heap;
  th_unlock(&explicit_list_lock);
}

static void list_remove(th_heap_t *heap) {
  th_lock(&explicit_list_lock);
  if (heap->explicit_prev) heap->explicit_prev->explicit_next = heap->explicit_next;
  else explicit_list = heap->explicit_next;
  if (heap->explicit_next) heap->explicit_next->explicit_prev = heap->explicit_prev;
  heap->explicit_next = heap->explicit_prev = NULL;
  th_unlock(&explicit_list_lock);
}

static inline bool is_serialized(const th_heap_t *heap) { return !(heap->flags & TH_HEAP_NO_SERIALIZE); }

TH_COLD static void report_bad_heap(th_heap_t *heap, const char *op) {
  if (heap->magic != TH_HEAP_LIVE_MAGIC || !heap_is_explicit(heap))
    report_heap_misuse(op, "of a destroyed heap (or not a heap)", heap);
  report_heap_misuse(op, "from a thread that does not own the TH_HEAP_NO_SERIALIZE heap", heap);
}

/* Before allocating: the heap to allocate from. A no-serialize heap is checked to be the calling thread's,
 * which also catches a destroyed one (its owner id is cleared); a serialized heap gives one of its shards,
 * locked: the first whose lock is free, starting from one picked by the thread, else that one, waited for. */
static inline th_heap_t *heap_enter(th_heap_t *heap, const char *op) {
  if (heap->flags & TH_HEAP_NO_SERIALIZE) {
    if (th_unlikely(heap->thread_id != thread_id())) report_bad_heap(heap, op);
    return heap;
  }
  if (th_unlikely(heap->magic != TH_HEAP_LIVE_MAGIC || heap->parent != NULL)) report_bad_heap(heap, op);
  uint32_t n = heap->nshards;
  uint32_t first = n == 1 ? 0 : (uint32_t)(((uint64_t)thread_id() * 0x9E3779B97F4A7C15ull) >> 40) % n;
  th_heap_t *shard = NULL;
  for (uint32_t i = 0; i < n && shard == NULL; i++) {
    th_heap_t *s = n == 1 ? heap : heap->shard[(first + i) % n];
    if (th_trylock(&s->lock)) shard = s;
  }
  if (shard == NULL) { /* every shard busy: wait for the first, and count the wait */
    shard = n == 1 ? heap : heap->shard[first];
    th_lock(&shard->lock);
    count_add(&shard->lock_waits, 1); /* under the shard's lock */
  }
  count_add(&shard->lock_acquires, 1);
  return shard;
}

/* After allocating from what heap_enter gave. */
static inline void heap_leave(th_heap_t *shard) {
  if (!(shard->flags & TH_HEAP_NO_SERIALIZE)) th_unlock(&shard->lock);
}

/* A heap struct made live as an explicit heap (parent NULL) or as a shard of parent. */
static void explicit_init(th_heap_t *heap, unsigned flags, th_heap_t *parent) {
  heap_init(heap);
  heap->flags = flags | TH_HEAP_EXPLICIT;
  heap->thread_id = (flags & TH_HEAP_NO_SERIALIZE) ? thread_id() : TH_OWNER_SHARED;
  th_mutex_init(&heap->lock);
  th_mutex_init(&heap->huge_lock);
  heap->magic = TH_HEAP_LIVE_MAGIC;
  heap->parent = parent;
  atomic_store_explicit(&heap->tid, os_thread_tid(), memory_order_relaxed);
  if (th_options.secure) secure_heap_attach(heap);
}

th_heap_t *explicit_create_samples(void) {
  th_heap_t *heap = thread_struct_alloc();
  if (heap == NULL) return NULL;
  explicit_init(heap, 0, NULL);
  heap->flags |= TH_HEAP_SAMPLES;
  heap->nshards = 1;
  heap->shard[0] = heap;
  list_push(heap);
  return heap;
}

TH_API th_heap_t *th_heap_create(unsigned flags, size_t initial_size, size_t max_size) {
  if ((flags & ~TH_HEAP_NO_SERIALIZE) != 0 || (max_size != 0 && initial_size > max_size) ||
      alloc_too_large(initial_size)) {
    errno = EINVAL;
    return NULL;
  }
  process_init();
  th_heap_t *heap = thread_struct_alloc();
  if (heap == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  explicit_init(heap, flags, NULL);
  heap->max_size = max_size;
  heap->nshards = 1;
  heap->shard[0] = heap;
  /* Shards only where nothing is counted across them: no cap, no pinned initial memory. */
  size_t want = 2 * os_cpu_count();
  if (want > TH_SHARDS_MAX) want = TH_SHARDS_MAX;
  if (!(flags & TH_HEAP_NO_SERIALIZE) && max_size == 0 && initial_size == 0) {
    while (heap->nshards < want) {
      th_heap_t *shard = thread_struct_alloc();
      if (shard == NULL) break; /* fewer shards is still a heap */
      explicit_init(shard, flags, heap);
      heap->shard[heap->nshards++] = shard;
    }
  }
  list_push(heap);
  /* The initial size is committed and touched now, in whole segments kept by the heap (pinned): the first
   * pages carved from them take no page faults, and they are never purged while the heap lives. */
  for (size_t done = 0; done < initial_size; done += TH_SEGMENT_SIZE) {
    th_segment_t *seg = segment_map_new(TH_SEGMENT_SIZE, TH_KIND_SMALL, heap->secure != NULL, 0);
    if (seg == NULL) {
      th_heap_destroy(heap);
      errno = ENOMEM;
      return NULL;
    }
    /* The header's pages were touched by segment_init: commit the rest (a secure header ends with a guard). */
    size_t ps = os_page_size();
    size_t head = align_up(segment_header_size(TH_SEGMENT_SIZE >> TH_SMALL_PAGE_SHIFT, seg->is_secure), ps);
    size_t n = align_up(initial_size - done < TH_SEGMENT_SIZE ? initial_size - done : TH_SEGMENT_SIZE, ps);
    if (n > head) os_commit((uint8_t *)seg + head, n - head);
    segment_set_owner(seg, heap->thread_id);
    atomic_store_explicit(&seg->heap, heap, memory_order_relaxed);
    seg->is_pinned = 1;
    seg->next = heap->reserve;
    heap->reserve = seg;
  }
  stats_count(&th_stats_global.heaps_created);
  vg_heap_new(heap);
  return heap;
}

/* Every page of the segment forgets its blocks, so that a stale pointer into it reads as invalid, and the
 * segment goes to the cache (or the OS). */
static void segment_discard(th_heap_t *heap, th_segment_t *seg) {
  for (size_t i = 0; i < seg->page_count; i++) {
    th_page_t *page = &seg->pages[i];
    if (page->in_use && page->class_idx != 0) /* every block left is freed with the heap */
      heap_count_frees(heap, page->class_idx, (page->in_full ? 0 : page_owner_frees(page)) + page_used(page));
    page_forget(page);
  }
  seg->used_pages = 0;
  seg->is_pinned = 0;
  seg->next = seg->prev = NULL;
  segment_release(seg);
}

static void destroy_one(th_heap_t *heap);

/* Time proportional to the heap's segments and pages, not to its blocks. */
TH_API void th_heap_destroy(th_heap_t *heap) {
  if (heap == NULL) return;
  if (heap->magic != TH_HEAP_LIVE_MAGIC || !heap_is_explicit(heap) || heap->parent != NULL)
    report_heap_misuse("th_heap_destroy", "of a destroyed heap (or not a heap)", heap);
  vg_heap_gone(heap);
  list_remove(heap);
  for (uint32_t i = 1; i < heap->nshards; i++) destroy_one(heap->shard[i]);
  heap->nshards = 1;
  destroy_one(heap);
}

static void destroy_one(th_heap_t *heap) {
  bool locked = is_serialized(heap);
  if (locked) th_lock(&heap->lock);
  heap->magic = 0;
  heap->thread_id = 0;
  heap->sampler = NULL; /* the pages go now: nothing to cut (the state stays in sampler_spare) */
  for (size_t k = 0; k < TH_KINDS_PAGED; k++) {
    for (th_segment_t *seg = heap->segments[k], *next; seg; seg = next) {
      next = seg->next;
      segment_discard(heap, seg);
    }
    heap->segments[k] = NULL;
  }
  for (th_segment_t *seg = heap->reserve, *next; seg; seg = next) {
    next = seg->next;
    segment_discard(heap, seg);
  }
  heap->reserve = NULL;
  huge_release_all(heap);
  stats_committed(-(long)heap->stat.committed);
  heap->stat.committed = 0;
  if (locked) th_unlock(&heap->lock);
  pthread_mutex_destroy(&heap->lock.m);
  pthread_mutex_destroy(&heap->huge_lock.m);
  heap->flags = 0;
  heap->parent = NULL;
  attribution_fold(heap);
  thread_struct_free(heap);
}

/* Everything but the owner of a no-serialize heap: a NULL heap, a serialized heap (locked), misuse. */
TH_NOINLINE static void *heap_malloc_other(th_heap_t *heap, size_t size) {
  if (heap == NULL) {
    errno = EINVAL;
    return NULL;
  }
  th_heap_t *shard = heap_enter(heap, "th_heap_malloc");
  void *p = heap_malloc(shard, size);
  heap_leave(shard);
  return p;
}

/* The owner of a no-serialize heap takes th_malloc's path on the heap's own direct table: a serialized heap's
 * owner id (TH_OWNER_SHARED) and a destroyed heap's (0) are no thread's, so both go the other way. */
TH_API void *th_heap_malloc(th_heap_t *heap, size_t size) {
  if (th_likely(heap != NULL && heap->thread_id == thread_id())) return vg_alloc(heap_malloc(heap, size), size, false);
  return vg_alloc(heap_malloc_other(heap, size), size, false);
}

void *explicit_huge_alloc(th_heap_t *heap, size_t size, size_t alignment, bool zero) {
  th_heap_t *shard = heap_enter(heap, "th_heap_malloc");
  void *p = huge_alloc(shard, size, alignment, zero);
  heap_leave(shard);
  return vg_alloc(p, size, zero);
}

/* shard: the heap (or shard) the huge block belongs to; its lock guards the cap's count. */
void *explicit_huge_realloc(th_heap_t *shard, th_segment_t *seg, void *p, size_t size) {
  if (shard->flags & TH_HEAP_NO_SERIALIZE) {
    if (th_unlikely(shard->thread_id != thread_id())) report_bad_heap(shard, "th_realloc");
    return huge_realloc(seg, p, size);
  }
  if (th_unlikely(shard->magic != TH_HEAP_LIVE_MAGIC)) report_bad_heap(shard, "th_realloc");
  th_lock(&shard->lock);
  void *q = huge_realloc(seg, p, size);
  th_unlock(&shard->lock);
  return q;
}

TH_API void *th_heap_calloc(th_heap_t *heap, size_t count, size_t size) {
  size_t total;
  if (heap == NULL) {
    errno = EINVAL;
    return NULL;
  }
  if (__builtin_mul_overflow(count, size, &total) || alloc_too_large(total)) {
    errno = ENOMEM;
    return NULL;
  }
  if (total > TH_LARGE_MAX) return explicit_huge_alloc(heap, total, 16, true);
  void *p = th_heap_malloc(heap, total);
  if (p) memset(p, 0, total);
  if (p) vg_defined(p, total);
  return p;
}

TH_API void *th_heap_aligned_alloc(th_heap_t *heap, size_t alignment, size_t size) {
  if (heap == NULL) {
    errno = EINVAL;
    return NULL;
  }
  return alloc_memalign(heap, alignment, size);
}

TH_API void *th_heap_realloc(th_heap_t *heap, void *p, size_t size) {
  if (heap == NULL) {
    errno = EINVAL;
    return NULL;
  }
  if (p == NULL) return th_heap_malloc(heap, size);
  th_segment_t *seg;
  th_page_t *page;
  free_check_block(p, TH_OP_REALLOC, &seg, &page);
  th_heap_t *home = atomic_load_explicit(&seg->heap, memory_order_relaxed);
  th_heap_t *pool = vg_realloc_begin(p);
  void *q;
  if (home != NULL && heap_outer(home) == heap) {
    q = alloc_realloc_checked(p, seg, page, size);
  } else if (size == 0) {
    th_free(p);
    q = NULL;
  } else {
    q = alloc_move(heap, p, page, size);
  }
  return vg_realloc_end(pool, p, q, size);
}

/* ---- fork: every explicit heap's locks, after the list lock; released (or reset in the child) after. */

void explicit_lock_all(unsigned level) {
  thread_lock_for_fork(&explicit_list_lock, level);
  for (th_heap_t *h = explicit_list; h; h = h->explicit_next) {
    for (uint32_t i = 0; i < h->nshards; i++) {
      thread_lock_for_fork(&h->shard[i]->lock, level);
      thread_lock_for_fork(&h->shard[i]->huge_lock, level);
    }
  }
}

void explicit_unlock_all(unsigned level, bool child) {
  for (th_heap_t *h = explicit_list; h; h = h->explicit_next) {
    for (uint32_t i = 0; i < h->nshards; i++) {
      thread_unlock_after_fork(&h->shard[i]->huge_lock, level, child);
      thread_unlock_after_fork(&h->shard[i]->lock, level, child);
    }
  }
  thread_unlock_after_fork(&explicit_list_lock, level, child);
}
