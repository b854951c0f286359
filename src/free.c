/* free.c: th_free (the fast path for the owner thread), the remote path for every other thread, and the
 * checks that stop the process on a double free, an invalid or an interior pointer (free_check_block). */
#include <errno.h>

#include "internal.h"
#include "os.h"

/* A free by the owner: pushed on the page's free list, so the next malloc of the class gets it back while it
 * is still in cache (LIFO, like a per-thread cache), instead of a block freed long ago (docs/design.md, "Free
 * lists and remote frees", has the measurements). Tagged free and counted; no lock, no atomic.
 * Pushed first, counted last: a sweeper (sweep.c) that sees the page empty sees the push done too (x86-64
 * keeps stores in order; the compiler barrier keeps the compiler from moving them), so it may give the
 * page's segment away. Only the carry's path reads the segment after the count, and a page it may leave
 * empty reads used_word == 0, which keeps its segment with the heap (heap_sweep). */
static inline bool free_push_local(th_page_t *page, th_block_t *b) {
  b->tag = free_tag(b);
  b->next = page->free;
  page->free = b;
  block_poison(b, page->block_size);
  atomic_signal_fence(memory_order_seq_cst);
  return page_count_free(page);
}

/* ---- the remote batches: a thread's frees into other thread heaps' pages, held per page and pushed as one
 * chain. A thread that frees what another allocated mostly frees blocks the other allocated one after the
 * other, so they come back to the few pages that thread was carving from (one per size class), and a CAS
 * on the page's thread_free word per block made the two cores pass that word's cache line back and forth
 * for every free. The thread's heap holds TH_REMOTE_BATCHES batches, a slot per page (the page's index in
 * its segment picks it); a batch is pushed with one CAS when a free into another page takes its slot, at
 * its 64th block, at the thread's next malloc slow path, in th_collect and th_stats_get, and at its exit.
 * Held blocks count as used: their page cannot be freed or reused meanwhile, so only small pages' blocks
 * (up to 4 KiB, 64 KiB pages) are held, at most 63 per slot: a thread that stops freeing holds less than
 * 2 MiB until it allocates, collects or exits. Only thread heaps' segments (seg->remote_batch): an explicit
 * heap may be destroyed as soon as the free returns. A thread with no heap gets one at such a free (and
 * so its exit hook); after its exit, its frees are pushed at once. */
#define REMOTE_BATCH_MAX 64

static inline th_remote_batch_t *remote_batch_of(th_remote_batches_t *t, const th_page_t *page) {
  return &t->slot[((uintptr_t)page / sizeof(th_page_t)) & (TH_REMOTE_BATCHES - 1)];
}

static void remote_batches_push(th_remote_batches_t *t) {
  for (uint64_t held = t->held; held; held &= held - 1) {
    th_remote_batch_t *s = &t->slot[__builtin_ctzll(held)];
    page_push_remote_n(s->page, s->head, s->tail, s->n);
    s->page = NULL;
  }
  t->held = 0;
}

void free_remote_flush(void) {
  th_heap_t *heap = th_heap_tls;
  if (heap->remote_batches.held != 0) remote_batches_push(&heap->remote_batches); /* (never the empty heap's) */
}

/* A free by a thread with no heap: one for it, unless it has exited; this free is pushed at once. */
TH_COLD static void remote_batch_first(th_page_t *page, th_block_t *b) {
  if (!thread_exited()) thread_heap_init(); /* NULL (no memory) leaves it pushing at once */
  page_push_remote(page, b);
}

/* A free into a page whose slot holds another page's batch, a full one, or nothing: the batch held is
 * pushed (last, inline with a tail call for its slow path, so that this saves no registers) and b starts
 * the slot's next. */
TH_NOINLINE static void remote_batch_next(th_remote_batches_t *t, th_remote_batch_t *s, th_page_t *page,
                                          th_block_t *b) {
  th_page_t *held = s->page;
  th_block_t *head = s->head, *tail = s->tail;
  size_t n = s->n;
  b->next = NULL;
  s->page = page;
  s->head = s->tail = b;
  s->n = 1;
  if (held == NULL) {
    t->held |= (uint64_t)1 << (s - t->slot);
    return;
  }
  page_push_remote_n(held, head, tail, n);
}

/* A block of seg's page, tagged free by a thread that does not own the segment, on its way to the owner:
 * it joins its page's batch, or is pushed with one CAS. */
static inline void free_remote_hold(th_segment_t *seg, th_page_t *page, th_block_t *b) {
  if (th_likely(atomic_load_explicit(&seg->remote_batch, memory_order_relaxed))) {
    th_heap_t *heap = th_heap_tls;
    if (th_likely(heap != &th_heap_empty)) {
      th_remote_batches_t *t = &heap->remote_batches;
      th_remote_batch_t *s = remote_batch_of(t, page);
      if (th_likely(s->page == page && s->n < REMOTE_BATCH_MAX)) { /* one more for the page */
        b->next = s->head;
        s->head = b;
        s->n++;
        return;
      }
      remote_batch_next(t, s, page, b);
      return;
    }
    remote_batch_first(page, b);
    return;
  }
  page_push_remote(page, b);
}

/* The same for secure mode's remote frees (secure.c), which check and tag the block themselves. */
void free_remote_send(th_segment_t *seg, th_page_t *page, th_block_t *b) { free_remote_hold(seg, page, b); }

/* Every free th_free's page map does not take: a secure segment's block (or a sampled one) goes to
 * secure_free_fast, the rest (NULL, huge blocks, foreign pointers, misuse) to free_checked. */
TH_NOINLINE static void free_other(void *p) {
  uintptr_t region = (uintptr_t)p >> TH_SEGMENT_SHIFT;
  if (region < TH_MAP_ENTRIES && atomic_load_explicit(&th_segment_map[region], memory_order_relaxed) == TH_MAP_SLOW) {
    secure_free_fast(p);
    return;
  }
  free_checked(p);
}

/* A free by a thread that does not own the segment (or of a serialized heap's block, or an abandoned one),
 * with th_free's segment lookup passed on: a block start of a live page (a free page slot or a huge block
 * has capacity 0 and fails page_is_block) that is not tagged free joins its page's batch, or is pushed with
 * one CAS; the rest go to free_checked, which checks everything. Kept out of th_free so the owner's path stays
 * short. */
static inline void free_remote_push(th_page_t *page, th_block_t *b) {
  if (th_likely(page_is_block(page, b) && b->tag != free_tag(b))) {
    /* A page this thread's heap handed off full comes back to it (pool.c), and the free is the owner's. */
    if (th_unlikely((atomic_load_explicit(&page->owner, memory_order_relaxed) ^ thread_id()) == TH_OWNER_HANDED) &&
        pool_reclaim(page)) {
      th_free(b);
      return;
    }
    b->tag = free_tag(b);
    block_poison(b, page->block_size);
    free_remote_hold(segment_of_page(page), page, b);
    return;
  }
  free_other(b);
}

/* The remote free when pairs are counted (THREADHEAP_REMOTE_PAIRS): one more free to the same owner as the
 * last one, or a new pair (pairs.c), then the same push. A block that is not a live block start goes on to
 * free_checked uncounted. */
TH_COLD static void free_remote_count_pair(th_page_t *page, th_block_t *b) {
  if (page_is_block(page, b) && b->tag != free_tag(b)) {
    th_heap_t *owner = page_heap(page, memory_order_relaxed);
    th_remote_pair_slot_t *last = &th_heap_tls->remote[0];
    if (atomic_load_explicit(&last->owner, memory_order_relaxed) == owner) pairs_count_one(&last->count);
    else pairs_note_owner(owner);
  }
  free_remote_push(page, b);
}

/* Counting who frees whose memory is one test at the top, so that the push's code is the same with it off:
 * a branch inside made the compiler address the page twice, and counting inline, even in three
 * instructions, slowed the producer/consumer benchmark (docs/design.md). */
TH_NOINLINE TH_HOT static void free_remote(th_block_t *b, th_page_t *page) {
  if (th_unlikely(page == &th_page_map_slow)) {
    /* A pointer into a secure segment, or a sampled one, unless bits past the 47 the map reads are set. */
    if (th_likely((uintptr_t)b >> TH_ADDRESS_BITS == 0)) secure_free_fast(b);
    else free_checked(b);
    return;
  }
  if (th_unlikely(th_options.remote_pairs)) {
    free_remote_count_pair(page, b);
    return;
  }
  free_remote_push(page, b);
}

/* The fast path: owner thread, a block start, not tagged as free. No lock, no atomic read-modify-write;
 * every way out is a tail call, so the path saves no registers (a page parked as full is caught by the
 * same carry test as the purge clock's tick, see page_count_free).
 * A page that empties is not retired here: heap_purge finds empty pages on its rounds, and a malloc/free
 * loop that empties its page again and again pays nothing for it. */
TH_API TH_HOT void th_free(void *p) {
  vg_free(p); /* explicit heaps under valgrind (TH_VALGRIND); nothing otherwise */
  th_page_t *page = page_map_lookup(p);
  th_block_t *b = p;
  if (th_unlikely(atomic_load_explicit(&page->owner, memory_order_relaxed) != thread_id())) {
    free_remote(b, page); /* the stand-ins go there too (owner 0); b first, where th_free has it */
    return;
  }
  if (th_likely(page_is_block_owner(page, p) && b->tag != free_tag(b))) {
    /* The free count carried: once every 4,096 frees of the page, and at the first free into a page
     * parked as full. The owner is the thread's default heap or one of its no-serialize explicit heaps. */
    if (th_unlikely(free_push_local(page, b)))
      heap_free_tick(page_heap(page, memory_order_relaxed), page);
    return;
  }
  free_checked(p);
}
#ifdef TH_OVERRIDE
/* The standard name is the same function, not a call to it. */
TH_API void free(void *p) __attribute__((alias("th_free")));
/* So is C++'s operator delete, every form, under its C++ name: the size a sized delete is given is a hint
 * the compiler passes, not a fact (a wrong one must not corrupt the heap), and an aligned block is found by
 * its tag, so every form is th_free, whose one parameter is the first the forms share (the ABI passes the
 * rest in registers th_free does not read). A wrapper in new.cpp calling th_free cost 5 instructions a
 * delete. */
TH_API void _ZdlPv(void *p) __attribute__((alias("th_free")));                               /* delete(void*) */
TH_API void _ZdaPv(void *p) __attribute__((alias("th_free")));                               /* delete[] */
TH_API void _ZdlPvm(void *p) __attribute__((alias("th_free")));                              /* sized */
TH_API void _ZdaPvm(void *p) __attribute__((alias("th_free")));
TH_API void _ZdlPvRKSt9nothrow_t(void *p) __attribute__((alias("th_free")));                 /* nothrow */
TH_API void _ZdaPvRKSt9nothrow_t(void *p) __attribute__((alias("th_free")));
TH_API void _ZdlPvSt11align_val_t(void *p) __attribute__((alias("th_free")));                /* aligned */
TH_API void _ZdaPvSt11align_val_t(void *p) __attribute__((alias("th_free")));
TH_API void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p) __attribute__((alias("th_free")));  /* aligned, nothrow */
TH_API void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p) __attribute__((alias("th_free")));
TH_API void _ZdlPvmSt11align_val_t(void *p) __attribute__((alias("th_free")));               /* sized, aligned */
TH_API void _ZdaPvmSt11align_val_t(void *p) __attribute__((alias("th_free")));
#endif

/* Every free th_free does not do (a pointer it cannot take as an owner's or another thread's block start,
 * or one whose checks failed): the checks, then the free. */
TH_NOINLINE void free_checked(void *p) {
  if (p == NULL) return;
  int saved_errno = errno; /* free never changes errno, even when it unmaps */
  th_segment_t *seg;
  th_page_t *page;
  th_block_t *b = free_check_block(p, TH_OP_FREE, &seg, &page);
  if (seg->is_sampled) profile_free_sampled(b); /* a sampled block leaves the live set; freed below */
  if (th_unlikely(seg->is_secure)) {
    secure_free(seg, page, b, p); /* checked, and held back (secure.c) */
  } else if (seg->kind == TH_KIND_HUGE) {
    huge_free(seg, p, TH_OP_FREE);
  } else if (atomic_load_explicit(&page->owner, memory_order_relaxed) == thread_id()) {
    th_heap_t *heap = page_heap(page, memory_order_relaxed);
    /* Inside the heap's slow path: no sweeper frees the page while this reads it after the count.
     * A carry is always taken, as on the fast path: it holds 4,096 frees for the counts, and the heap
     * profiler's bound on what the fast paths serve (heap_free_tick also unparks a full page). */
    heap_slow_enter(heap);
    if (free_push_local(page, b)) heap_free_tick(heap, page);
    else if (page_used(page) == 0) heap_free_local(heap, page);
    heap_slow_exit(heap);
  } else {
    b->tag = free_tag(b);
    block_poison(b, page->block_size);
    page_push_remote(page, b);
  }
  errno = saved_errno;
}

/* A free block's next word is NULL or another block of the same page: the second witness that a tagged
 * block is really free, for threads that may not walk the owner's lists. */
static bool next_is_plausible(const th_page_t *page, const th_block_t *b) {
  return b->next == NULL || page_is_block(page, b->next);
}

/* Was p, offset bytes inside its block, handed out by aligned allocation (alloc_mark_aligned)? */
static bool handed_out_aligned(const th_page_t *page, const void *p, size_t offset) {
  return __atomic_load_n(&page->has_aligned, __ATOMIC_RELAXED) && offset >= 32 && ((uintptr_t)p & 15) == 0 &&
         alloc_is_aligned_tag(p);
}

/* p is no block: unless it was a huge block freed lately, whose segment may be gone (unmapped) or reused
 * (taken from the segment cache, or split there for a smaller segment): then it is freed twice. */
static _Noreturn void report_invalid(th_op_t op, const void *p) {
  size_t usable;
  if (huge_recently_freed(p, &usable)) report_misuse(TH_MISUSE_FREED, op, p, p, usable);
  report_misuse(TH_MISUSE_INVALID, op, p, NULL, 0);
}

th_block_t *free_check_block(const void *p, th_op_t op, th_segment_t **seg_out, th_page_t **page_out) {
  th_segment_t *seg = segment_lookup(p);
  if (seg == NULL) report_invalid(op, p);
  *seg_out = seg;
  if (seg->kind == TH_KIND_HUGE) {
    th_page_t *page = &seg->pages[0];
    *page_out = page;
    if (!page->in_use) report_invalid(op, p); /* its heap was destroyed */
    /* An aligned block may lie inside a huge one: a sampled block is huge whatever its size (profile.c). */
    const uint8_t *u = p;
    bool aligned = u > page->start && u < page->start + seg->huge_size &&
                   handed_out_aligned(page, p, (size_t)(u - page->start));
    if (p != page->start && !aligned)
      report_misuse(TH_MISUSE_INTERIOR, op, p, page->start, free_usable_size(page, page->start));
    if (atomic_load_explicit(&seg->huge_live, memory_order_acquire) != 1)
      report_misuse(TH_MISUSE_FREED, op, p, p, free_usable_size(page, p));
    return (th_block_t *)p;
  }
  th_page_t *page = segment_page_of(seg, p);
  *page_out = page;
  uint32_t capacity = __atomic_load_n(&page->capacity, __ATOMIC_RELAXED);
  const uint8_t *u = p;
  if (!page->in_use || capacity == 0) {
    /* A page freed after all its blocks were: a block start that still carries its tag was freed twice.
     * Read only inside the slot's blocks: in secure mode a guard page may follow them (or precede them). */
    size_t area_size;
    const uint8_t *area = page_area(seg, (size_t)(page - seg->pages), &area_size);
    if (((uintptr_t)p & 15) == 0 && u >= area && u + sizeof(th_block_t) <= area + area_size &&
        ((const th_block_t *)p)->tag == free_tag(p))
      report_misuse(TH_MISUSE_FREED, op, p, p, 0);
    report_invalid(op, p);
  }
  if (u < page->start || u >= page->start + (size_t)capacity * page->block_size) report_invalid(op, p);
  size_t rem = page_block_offset(page, p);
  th_block_t *b = (th_block_t *)(u - rem);
  /* An interior pointer, unless aligned allocation handed it out. */
  if (rem != 0 && !handed_out_aligned(page, p, rem))
    report_misuse(TH_MISUSE_INTERIOR, op, p, b, free_usable_size(page, b));
  if (th_unlikely(b->tag == free_tag(b))) {
    bool freed;
    if (seg->is_secure) {
      freed = secure_is_free(page, b); /* its lists stay empty: the owner has nothing to walk */
    } else if (atomic_load_explicit(&page->owner, memory_order_relaxed) == thread_id()) {
      page_collect(page); /* the owner may look at all three lists */
      freed = page_list_contains(page, b);
    } else {
      freed = next_is_plausible(page, b);
    }
    if (freed) report_misuse(TH_MISUSE_FREED, op, p, b, free_usable_size(page, p));
  }
  return b;
}

size_t free_usable_size(const th_page_t *page, const void *p) {
  if (th_unlikely(segment_of_page(page)->is_secure)) return secure_usable_size(page, p); /* the size asked for */
  if (page->block_size == 0) { /* huge: to the end of its committed pages, as much as a write may touch */
    const th_segment_t *seg = segment_of_page(page);
    return (size_t)((const uint8_t *)seg + seg->huge_committed - (const uint8_t *)p);
  }
  const uint8_t *block = (const uint8_t *)p - page_block_offset(page, p);
  return (size_t)(block + page->block_size - (const uint8_t *)p);
}

/* th_usable_size of everything but a live block start: apart, so that the common path saves no registers. */
TH_NOINLINE static size_t usable_size_checked(const void *p) {
  if (p == NULL) return 0;
  th_segment_t *seg;
  th_page_t *page;
  free_check_block(p, TH_OP_USABLE_SIZE, &seg, &page);
  return free_usable_size(page, p);
}

TH_API size_t th_usable_size(const void *p) {
  th_page_t *page = block_page_fast(p);
  if (th_likely(page != NULL)) return page->block_size; /* a block start: its whole block */
  return usable_size_checked(p);
}
#ifdef TH_OVERRIDE
TH_API size_t malloc_usable_size(void *p) __attribute__((alias("th_usable_size")));
#endif

/* ---- messages: one line on stderr, written with write(2) and no allocation, then abort() */

typedef struct line_s {
  char buf[200];
  size_t n;
} line_t;

static void put_str(line_t *l, const char *s) {
  while (*s && l->n < sizeof l->buf - 1) l->buf[l->n++] = *s++;
}

static void put_hex(line_t *l, uintptr_t v) {
  char tmp[20];
  size_t n = 0;
  do {
    tmp[n++] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v);
  put_str(l, "0x");
  while (n > 0 && l->n < sizeof l->buf - 1) l->buf[l->n++] = tmp[--n];
}

static void put_dec(line_t *l, size_t v) {
  char tmp[24];
  size_t n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  while (n > 0 && l->n < sizeof l->buf - 1) l->buf[l->n++] = tmp[--n];
}

/* "<p> (<what><size>)": how the reports name a block ("size " for the size). */
static void put_block(line_t *l, const void *p, const char *what, size_t size) {
  put_hex(l, (uintptr_t)p);
  put_str(l, " (");
  put_str(l, what);
  put_dec(l, size);
  put_str(l, ")");
}

static _Noreturn void finish(line_t *l) {
  l->buf[l->n++] = '\n';
  os_write_err(l->buf, l->n);
  os_abort();
}

_Noreturn void report_misuse(th_misuse_t kind, th_op_t op, const void *p, const void *block, size_t size) {
  static const char *op_names[] = {"free", "realloc", "malloc_usable_size"};
  line_t l = {.n = 0};
  put_str(&l, "threadheap: ");
  if (kind == TH_MISUSE_FREED) {
    if (op == TH_OP_FREE) {
      put_str(&l, "double free at ");
    } else {
      put_str(&l, op_names[op]);
      put_str(&l, " of a freed block at ");
    }
    put_block(&l, p, "size ", size);
  } else if (kind == TH_MISUSE_INVALID) {
    put_str(&l, op_names[op]);
    put_str(&l, " of invalid pointer ");
    put_hex(&l, (uintptr_t)p);
    put_str(&l, " (not allocated by threadheap)");
  } else {
    put_str(&l, op_names[op]);
    put_str(&l, " of interior pointer ");
    put_hex(&l, (uintptr_t)p);
    put_str(&l, " (block ");
    put_hex(&l, (uintptr_t)block);
    put_str(&l, ", size ");
    put_dec(&l, size);
    put_str(&l, ")");
  }
  finish(&l);
}

/* "threadheap: <problem> [in page <page>] at <p> (<what><size>)": secure mode's reports (secure.c). */
static _Noreturn void report_block_as(const char *problem, const void *page, const void *p, const char *what,
                                      size_t size) {
  line_t l = {.n = 0};
  put_str(&l, "threadheap: ");
  put_str(&l, problem);
  if (page) {
    put_str(&l, " in page ");
    put_hex(&l, (uintptr_t)page);
  }
  put_str(&l, " at ");
  put_block(&l, p, what, size);
  finish(&l);
}

_Noreturn void report_block(const char *problem, const void *page, const void *p, size_t size) {
  report_block_as(problem, page, p, "size ", size);
}

_Noreturn void report_block_lost(const char *problem, const void *p, size_t most) {
  report_block_as(problem, NULL, p, "its size record overwritten too; usable size at most ", most);
}

_Noreturn void report_heap_misuse(const char *op, const char *problem, const void *heap) {
  line_t l = {.n = 0};
  put_str(&l, "threadheap: ");
  put_str(&l, op);
  put_str(&l, " ");
  put_str(&l, problem);
  put_str(&l, " ");
  put_hex(&l, (uintptr_t)heap);
  finish(&l);
}

/* operator new out of memory with no C++ runtime to throw from (see new.cpp). */
_Noreturn void th_new_out_of_memory(void) { report_fatal("operator new: out of memory, and no std::bad_alloc to throw"); }

_Noreturn void report_fatal(const char *msg) {
  line_t l = {.n = 0};
  put_str(&l, "threadheap: ");
  put_str(&l, msg);
  finish(&l);
}

_Noreturn void report_assert(const char *cond, const char *file, int line) {
  line_t l = {.n = 0};
  put_str(&l, "threadheap: assertion failed: ");
  put_str(&l, cond);
  put_str(&l, " at ");
  put_str(&l, file);
  put_str(&l, ":");
  put_dec(&l, (size_t)line);
  finish(&l);
}
