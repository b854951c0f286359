/* valgrind.c: explicit heaps told to valgrind's memcheck (the TH_VALGRIND build option), so that a program
 * run under `valgrind` sees leaks and uses after free of th_heap_* blocks as it does for malloc's.
 *
 * Each explicit heap is a memcheck memory pool: its blocks are pool chunks from the public allocation
 * functions to th_free (or th_heap_destroy, which frees the pool). A freed chunk is no-access to memcheck
 * except its first 16 bytes, which hold threadheap's list link and tag; memory that threadheap carves again
 * (a page or a segment made anew) is made defined first. Built only with -DTH_VALGRIND=ON; every hook is an
 * empty inline otherwise (internal.h). */
#include <valgrind/memcheck.h>

#include "internal.h"

static __thread bool in_realloc __attribute__((tls_model("initial-exec")));

/* The explicit heap (the pool) that p's block belongs to, or NULL. */
static th_heap_t *pool_of(const void *p) {
  th_segment_t *seg = p ? segment_lookup(p) : NULL;
  th_heap_t *h = seg ? atomic_load_explicit(&seg->heap, memory_order_relaxed) : NULL;
  return h != NULL && heap_is_explicit(h) ? heap_outer(h) : NULL;
}

/* The chunk memcheck knows: the block's start (an aligned block is handed out inside its block), or a huge
 * block's own address. */
static void *chunk_of(void *p) {
  th_segment_t *seg = segment_lookup(p);
  if (seg == NULL || seg->kind == TH_KIND_HUGE) return p;
  th_page_t *page = segment_page_of(seg, p);
  return page->block_size ? (uint8_t *)p - page_block_offset(page, p) : p;
}

void vg_heap_new(th_heap_t *heap) { VALGRIND_CREATE_MEMPOOL(heap, 0, 0); }

void vg_heap_gone(th_heap_t *heap) { VALGRIND_DESTROY_MEMPOOL(heap); }

void *vg_alloc(void *p, size_t size, bool zeroed) {
  th_heap_t *pool = pool_of(p);
  if (pool == NULL || in_realloc) return p;
  VALGRIND_MEMPOOL_ALLOC(pool, p, size);
  if (zeroed) VALGRIND_MAKE_MEM_DEFINED(p, size);
  return p;
}

void vg_free(void *p) {
  th_heap_t *pool = pool_of(p);
  if (pool == NULL || in_realloc) return;
  void *chunk = chunk_of(p);
  VALGRIND_MEMPOOL_FREE(pool, chunk);
  VALGRIND_MAKE_MEM_DEFINED(chunk, sizeof(th_block_t)); /* threadheap's link and tag */
  if (chunk != p) VALGRIND_MAKE_MEM_DEFINED((uintptr_t *)p - 1, sizeof(uintptr_t)); /* an aligned block's tag */
}

th_heap_t *vg_realloc_begin(void *p) {
  in_realloc = true;
  return pool_of(p);
}

/* After a realloc of p (from pool old) to q of size bytes: the chunk moves or changes size. */
void *vg_realloc_end(th_heap_t *old, void *p, void *q, size_t size) {
  in_realloc = false;
  void *chunk = old != NULL ? chunk_of(p) : p;
  if (q == NULL) { /* failed (p is unchanged), or size 0 (p was freed) */
    if (size == 0 && old != NULL) {
      VALGRIND_MEMPOOL_FREE(old, chunk);
      VALGRIND_MAKE_MEM_DEFINED(p, sizeof(th_block_t));
    }
    return q;
  }
  th_heap_t *pool = pool_of(q);
  if (q == p && old != NULL && pool == old) {
    VALGRIND_MEMPOOL_CHANGE(old, chunk, chunk, size + (size_t)((uint8_t *)p - (uint8_t *)chunk));
    return q;
  }
  if (old != NULL) {
    VALGRIND_MEMPOOL_FREE(old, chunk);
    VALGRIND_MAKE_MEM_DEFINED(chunk, sizeof(th_block_t));
  }
  if (pool != NULL) {
    VALGRIND_MEMPOOL_ALLOC(pool, q, size);
    VALGRIND_MAKE_MEM_DEFINED(q, size); /* the old contents were copied in (or moved with it) */
  }
  return q;
}

void vg_defined(void *p, size_t size) { VALGRIND_MAKE_MEM_DEFINED(p, size); }
