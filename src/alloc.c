/* alloc.c: the allocation entry points: th_malloc (the fast path), calloc, realloc, and aligned allocation. */
#include <errno.h>
#include <string.h>

#include "internal.h"
#include "os.h"

/* A word written just below a block handed out at an offset for alignment, so that free can tell such a
 * pointer from an interior pointer. */
#define TH_ALIGN_SALT ((uintptr_t)0x5a17a11c0ffee5edULL)

/* The fast path on the thread's heap (heap_malloc in internal.h). */
TH_API TH_HOT void *th_malloc(size_t size) { return heap_malloc(th_heap_tls, size); }
#ifdef TH_OVERRIDE
TH_API TH_MALLOC_ATTR void *malloc(size_t size) __attribute__((alias("th_malloc")));
extern const char override_anchor;
__attribute__((used)) static const char *const keep_override = &override_anchor;
#endif

#ifdef TH_OVERRIDE
/* C++'s operator new(size_t) and new[](size_t), under their C++ names (new.cpp has the other forms): the
 * malloc fast path itself, inline, so that a C++ program's `new T` costs what malloc does (a wrapper in
 * new.cpp that called th_malloc through the PLT and tested its result took 14 instructions more a new+delete
 * pair: bench/callgrind.sh with API=new). A slow path's NULL goes on to new.cpp's loop of new_handler calls
 * and std::bad_alloc, which may throw through these frames (C frames carry unwind tables on x86-64). */
void *alloc_new_failed(size_t size); /* new.cpp */

static TH_NOINLINE void *alloc_new_slow(th_heap_t *heap, size_t size) {
  void *p = heap_malloc_queue(heap, size);
  return th_likely(p != NULL) ? p : alloc_new_failed(size);
}

TH_HOT void *alloc_new(size_t size) { return heap_malloc_or(th_heap_tls, size, alloc_new_slow); }
TH_API void *_Znwm(size_t size) __attribute__((alias("alloc_new")));
TH_API void *_Znam(size_t size) __attribute__((alias("alloc_new")));
#endif

bool alloc_too_large(size_t size) { return size > (size_t)PTRDIFF_MAX - 2 * TH_SEGMENT_SIZE; }

/* The first n bytes of a block of bsize bytes zeroed. A block of up to 128 bytes (bsize a multiple of 16 and
 * n at most bsize) is zeroed whole with two, four or eight 16-byte stores, the last ones overlapping the
 * first when bsize is not a power of two; past that, memset. glibc's memset for the small ones, through the
 * PLT and its size dispatch, made calloc+free of 64 bytes 12 instructions longer than mimalloc 3.4.3's
 * (bench/callgrind.sh with API=calloc). */
typedef struct { uint64_t lo, hi; } __attribute__((aligned(16), may_alias)) zero16_t; /* the program's types later */
__attribute__((always_inline)) static inline void zero_block(void *p, size_t n, size_t bsize) {
  if (bsize > 128) {
    memset(p, 0, n);
    return;
  }
  uint8_t *b = p, *end = b + bsize;
  const zero16_t z = {0, 0};
  if (bsize > 32) {
    if (bsize > 64) {
      *(zero16_t *)(b + 32) = z;
      *(zero16_t *)(b + 48) = z;
      *(zero16_t *)(end - 64) = z;
      *(zero16_t *)(end - 48) = z;
    }
    *(zero16_t *)(b + 16) = z;
    *(zero16_t *)(end - 32) = z;
  }
  *(zero16_t *)b = z;
  *(zero16_t *)(end - 16) = z;
}

/* A block from the page, zeroed. A block never handed out, from a page whose memory was zero when it was
 * carved, is zero but for its link word: the memset would only write zeros over zeros (and fault in pages
 * the program may never touch). */
static inline void *calloc_pop(th_page_t *page, size_t total) {
  bool zero = page->zero_blocks && page->free->tag == 0;
  th_block_t *b = page_pop(page);
  if (zero) b->next = NULL;
  else zero_block(b, total, page->block_size);
  return b;
}

/* The first page of the class had no free block: the malloc slow path. */
TH_NOINLINE static void *calloc_refill(size_t total) {
  void *p = th_malloc(total);
  if (p) memset(p, 0, total);
  return p;
}

/* calloc past TH_DIRECT_MAX (SIZE_MAX: the product overflowed). */
TH_NOINLINE static void *calloc_large(size_t total) {
  if (alloc_too_large(total)) {
    errno = ENOMEM;
    return NULL;
  }
  if (total > TH_LARGE_MAX) return huge_alloc(NULL, total, 16, true);
  th_page_t *page = heap_page_for_size(th_heap_tls, total);
  if (page->free != NULL) return calloc_pop(page, total);
  return calloc_refill(total);
}

/* calloc's own fast path, as malloc's for sizes up to TH_DIRECT_MAX: a lookup, a pop and the zeroing. */
TH_API void *th_calloc(size_t count, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) total = SIZE_MAX; /* (a conditional move) */
  if (th_unlikely(total > TH_DIRECT_MAX)) return calloc_large(total);
  th_page_t *page = heap_direct_small(th_heap_tls, total);
  if (th_unlikely(page->free == NULL)) return calloc_refill(total);
  return calloc_pop(page, total);
}
#ifdef TH_OVERRIDE
TH_API TH_MALLOC_ATTR void *calloc(size_t count, size_t size) __attribute__((alias("th_calloc")));
#endif

/* A block that realloc grows past TH_REALLOC_HUGE_MIN in this thread's default heap, default mode, becomes a
 * huge block, a segment of its own: from then on it grows in place (huge_realloc: within its segment the
 * pages are only counted, past it mremap moves them), where a block of a size class is copied to the next
 * class at each step, and each class keeps the block it left. A buffer grown by half each time from 4 KiB to
 * 2 MiB took 2.7 times less time so (docs/design.md, "Large blocks and purging"). NULL when it cannot be had
 * (the OS refuses a segment): the caller takes a block of a class, as before, with errno as it was. */
TH_NOINLINE static void *alloc_grown(size_t usable, size_t size) {
  if (size <= usable || size > TH_LARGE_MAX) return NULL;
  if (th_options.secure || th_heap_tls->secure != NULL) return NULL; /* a block of a class keeps its checks */
  int saved = errno;
  void *q = huge_alloc(NULL, size, 16, false);
  if (q == NULL) errno = saved;
  return q;
}

/* A copy of p's first size bytes (at most usable, its usable size) in a new block of dest (NULL: this
 * thread's default heap), then p freed; NULL with p left as it was when there is no room. */
static inline void *alloc_move_usable(th_heap_t *dest, void *p, size_t usable, size_t size) {
  void *q = NULL;
  if (th_unlikely(size > TH_REALLOC_HUGE_MIN) && dest == NULL) q = alloc_grown(usable, size);
  if (q == NULL) q = dest ? th_heap_malloc(dest, size) : th_malloc(size);
  if (q == NULL) return NULL;
  memcpy(q, p, size < usable ? size : usable);
  th_free(p);
  return q;
}

void *alloc_move(th_heap_t *dest, void *p, const th_page_t *page, size_t size) {
  return alloc_move_usable(dest, p, free_usable_size(page, p), size);
}

/* A realloc to size bytes of a block with usable bytes stays in place while the block is big enough and not
 * more than twice too big (never for size 0: every block has at least 16 usable bytes). */
static inline bool realloc_fits(size_t size, size_t usable) { return size <= usable && size >= usable / 2; }

/* th_realloc past its in-place case: page is p's when block_page_fast found it (a live block start of a
 * default-mode page, whose usable size is its block's), NULL when the full checks must decide. */
TH_NOINLINE static void *realloc_move(void *p, th_page_t *page, size_t size) {
  th_segment_t *seg;
  if (page != NULL) {
    seg = segment_of_page(page);
    /* A thread heap's block (or an abandoned one) moves to this thread's heap, as alloc_realloc_checked
     * would move it, with the usable size known; an explicit heap's goes on there, which keeps it home. */
    th_heap_t *home = atomic_load_explicit(&seg->heap, memory_order_relaxed);
    if (size != 0 && (home == NULL || !heap_is_explicit(home))) {
      th_heap_t *pool = vg_realloc_begin(p); /* explicit heaps under valgrind (TH_VALGRIND); nothing otherwise */
      return vg_realloc_end(pool, p, alloc_move_usable(NULL, p, page->block_size, size), size);
    }
  } else {
    free_check_block(p, TH_OP_REALLOC, &seg, &page);
  }
  th_heap_t *pool = vg_realloc_begin(p);
  return vg_realloc_end(pool, p, alloc_realloc_checked(p, seg, page, size), size);
}

TH_API void *th_realloc(void *p, size_t size) {
  if (p == NULL) return th_malloc(size);
  th_page_t *page = block_page_fast(p);
  if (th_likely(page != NULL)) {
    /* In place under alloc_realloc_checked's rule, here without its other cases, none of which applies to
     * such a block. */
    if (realloc_fits(size, page->block_size)) {
      th_heap_t *pool = vg_realloc_begin(p);
      return vg_realloc_end(pool, p, p, size);
    }
  }
  return realloc_move(p, page, size);
}
#ifdef TH_OVERRIDE
TH_API void *realloc(void *p, size_t size) __attribute__((alias("th_realloc")));
#endif

/* th_realloc of a block free_check_block has passed. */
void *alloc_realloc_checked(void *p, th_segment_t *seg, th_page_t *page, size_t size) {
  if (size == 0) { /* glibc: realloc(p, 0) frees p and returns NULL */
    th_free(p);
    return NULL;
  }
  if (alloc_too_large(size)) {
    errno = ENOMEM;
    return NULL;
  }
  /* A sampled block (profile.c) moves: the new block is an allocation of its own, sampled or not. */
  if (seg->is_sampled) return alloc_move(NULL, p, page, size);
  /* Secure mode checks the block first, and resizes it in place only within its size class (its canary and
   * size are rewritten); a huge block is remapped as in the default mode (huge_realloc moves its guards). */
  bool secure = seg->is_secure;
  if (th_unlikely(secure) && secure_realloc(seg, page, p, size)) return p;
  size_t usable = free_usable_size(page, p);
  /* A block stays in its explicit heap; a no-serialize heap's block moves to this thread's default heap
   * when another thread reallocates it. */
  th_heap_t *home = atomic_load_explicit(&seg->heap, memory_order_relaxed);
  if (home != NULL && (!heap_is_explicit(home) ||
                       ((home->flags & TH_HEAP_NO_SERIALIZE) && home->thread_id != thread_id())))
    home = NULL;
  /* A thread's huge block stays huge down to TH_REALLOC_HUGE_MIN (alloc_grown), shrunk in place. */
  if (seg->kind == TH_KIND_HUGE && size > (home == NULL && !secure ? TH_REALLOC_HUGE_MIN : TH_LARGE_MAX)) {
    if (home == NULL) {
      huge_disown(seg);
      return huge_realloc(seg, p, size);
    }
    return explicit_huge_realloc(home, seg, p, size);
  }
  if (!secure && realloc_fits(size, usable)) return p;
  return alloc_move(home ? heap_outer(home) : NULL, p, page, size);
}

TH_API void *th_reallocarray(void *p, size_t count, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(count, size, &total)) {
    errno = ENOMEM;
    return NULL;
  }
  return th_realloc(p, total);
}

/* alignment is a power of two greater than 16. Blocks that fit a heap page are taken with room to spare and
 * handed out at an aligned offset of at least 32 bytes (the word below says so); the rest are huge blocks. */
void *alloc_aligned(th_heap_t *heap, size_t alignment, size_t size) {
  if (alloc_too_large(size) || alignment > ((size_t)1 << 40)) {
    errno = ENOMEM;
    return NULL;
  }
  /* Every block has 16 usable bytes. It also keeps p inside b: p <= b + 32 + alignment - 16, so with size 0
   * p could land on the end of b, the start of the next block. */
  if (size < 16) size = 16;
  if (alignment <= TH_LARGE_MAX / 4 && size + alignment + 16 <= TH_LARGE_MAX) {
    uint8_t *b = heap ? th_heap_malloc(heap, size + alignment + 16) : th_malloc(size + alignment + 16);
    if (b == NULL || ((uintptr_t)b & (alignment - 1)) == 0) return b;
    uintptr_t p = ((uintptr_t)b + 32 + alignment - 1) & ~(uintptr_t)(alignment - 1);
    alloc_mark_aligned(b, (void *)p);
    return (void *)p;
  }
  return heap ? explicit_huge_alloc(heap, size, alignment, false) : huge_alloc(NULL, size, alignment, false);
}

void alloc_mark_aligned(void *b, void *p) {
  th_segment_t *seg = segment_lookup(b);
  __atomic_store_n(&segment_page_of(seg, b)->has_aligned, 1, __ATOMIC_RELAXED);
  ((uintptr_t *)p)[-1] = th_key ^ (uintptr_t)p ^ TH_ALIGN_SALT;
}

bool alloc_is_aligned_tag(const void *p) {
  return ((const uintptr_t *)p)[-1] == (th_key ^ (uintptr_t)p ^ TH_ALIGN_SALT);
}

/* glibc's memalign: alignments up to 16 are plain mallocs, others round up to a power of two. */
void *alloc_memalign(th_heap_t *heap, size_t alignment, size_t size) {
  if (alignment <= 16) return heap ? th_heap_malloc(heap, size) : th_malloc(size);
  if (alignment > SIZE_MAX / 2 + 1) {
    errno = EINVAL;
    return NULL;
  }
  if (alignment & (alignment - 1)) alignment = (size_t)1 << (64 - __builtin_clzl(alignment));
  return alloc_aligned(heap, alignment, size);
}

TH_API void *th_memalign(size_t alignment, size_t size) { return alloc_memalign(NULL, alignment, size); }

/* glibc 2.36's aligned_alloc is memalign. */
TH_API void *th_aligned_alloc(size_t alignment, size_t size) { return th_memalign(alignment, size); }

TH_API int th_posix_memalign(void **out, size_t alignment, size_t size) {
  if (alignment % sizeof(void *) != 0 || (alignment & (alignment - 1)) != 0 || alignment == 0) return EINVAL;
  void *p = alignment <= 16 ? th_malloc(size) : alloc_aligned(NULL, alignment, size);
  if (p == NULL) return ENOMEM;
  *out = p;
  return 0;
}
