/* secure.c: secure mode (THREADHEAP_SECURE=1, or 2 for zero-on-free): blocks checked on slow paths. Free
 * lists whose links are encoded and checked when popped, a canary and the requested size after every block
 * (checked by free and realloc), guard pages, fresh blocks handed out in random order, freed blocks held
 * back in a quarantine, and (2) freed blocks zeroed and found still zero when handed out again. Main
 * functions: secure_malloc, secure_free.
 *
 * The fast paths are left as they are, not one instruction added (docs/design.md, "Secure mode"): a secure
 * heap's direct tables always name th_page_empty, and its pages keep free and local_free empty (their free
 * blocks wait on secure_free), so heap_malloc and heap_malloc_queue both fall through to heap_malloc_slow,
 * whose heap_malloc_fill comes here; and a secure segment's map entry is TH_MAP_SLOW, not 1, so th_free
 * sends every free to free_slow, which comes here, as it does for the profiler's sampled blocks.
 *
 * A block of a heap page is laid out as [the size asked for][canary][4-byte trailer], the trailer being
 * the size asked for XOR a secret of the block, its most significant byte first: that byte is the secret's
 * (sizes are below 2^24) and never 0, so that the first byte past the program's bytes is always checked
 * exactly, whether canary or trailer, and an off-by-one NUL is always caught. A request of n bytes takes the
 * size class of n + 4. The usable size is n (a 16-byte block's trailer shares the tag word, so a report on
 * one already freed names 12). A huge block keeps its size in its segment (huge_size): its
 * canary runs to the end of its last OS page, and a guard page follows. */
#include <errno.h>
#include <string.h>

#include "internal.h"
#include "os.h"

#define TRAILER 4     /* bytes at the end of each block: the size asked for, encoded */
#define CANARY_MAX 64 /* canary bytes written and checked past the size asked for, at most */
/* Frees of a class before a freed block of it is handed out again; fewer for large blocks (up to 1 MiB
 * each), which the quarantine would otherwise hold by the tens of megabytes. */
#define DELAY 16
#define DELAY_LARGE 4

/* ---- keys and random numbers */

/* The key of the list encoding and of the blocks' secrets: random per process, and not th_key, which every
 * free block shows (XOR its address) in its tag word. Set once, before the first secure heap. */
static uintptr_t secure_key;

static void key_init(void) {
  if (__atomic_load_n(&secure_key, __ATOMIC_ACQUIRE) != 0) return;
  uintptr_t none = 0, key = (uintptr_t)os_random(); /* never 0 */
  __atomic_compare_exchange_n(&secure_key, &none, key, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

/* MurmurHash3's 64-bit finaliser. */
static inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

/* A link is stored as next ^ the page's key ^ the address of the word that holds it (the per-page key: a
 * link copied from one page, or one slot, to another does not decode to a block; hardened allocators such
 * as glibc's safe-linking and scudo mix addresses into pointers in the same spirit). Decoding is the same. */
static inline th_block_t *link_code(const th_page_t *page, th_block_t *const *slot, const th_block_t *link) {
  return (th_block_t *)((uintptr_t)link ^ secure_key ^ mix64((uintptr_t)page) ^ (uintptr_t)slot);
}

static inline uint64_t block_secret(const void *b) { return mix64(secure_key ^ (uintptr_t)b); }
static inline uint32_t trailer_key(uint64_t secret) { return (uint32_t)secret | 0x01000000u; }
/* The canary repeats a word of the secret whose bytes are never 0 either: the byte at an address a is the
 * word's byte a % 8, so whole aligned words are written and compared at once. */
static inline uint64_t canary_word(uint64_t secret) {
  return (secret >> 32 | secret << 32) | 0x0101010101010101ull;
}
static inline uint8_t canary_byte(uint64_t word, const uint8_t *at) {
  return (uint8_t)(word >> (8 * ((uintptr_t)at & 7)));
}

/* wyrand (from wyhash), per thread, seeded at its first use: the order of fresh blocks. */
static __thread uint64_t rng_state __attribute__((tls_model("initial-exec")));

static uint32_t rng_below(uint32_t n) {
  if (th_unlikely(rng_state == 0)) rng_state = os_random() ^ thread_id();
  rng_state += 0xa0761d6478bd642full;
  __uint128_t m = (__uint128_t)(rng_state ^ 0xe7037ed1a0b428dbull) * rng_state;
  uint64_t r = (uint64_t)(m >> 64) ^ (uint64_t)m;
  return (uint32_t)(((r >> 32) * n) >> 32); /* uniform below n without a division (Lemire) */
}

/* ---- the canary and the trailer */

static void canary_write(uint8_t *from, const uint8_t *end, uint64_t secret) {
  uint64_t w = canary_word(secret);
  if (end > from + CANARY_MAX) end = from + CANARY_MAX;
  uint8_t *c = from;
  for (; c < end && ((uintptr_t)c & 7) != 0; c++) *c = canary_byte(w, c);
  for (; c + 8 <= end; c += 8) memcpy(c, &w, 8);
  for (; c < end; c++) *c = canary_byte(w, c);
}

static bool canary_intact(const uint8_t *from, const uint8_t *end, uint64_t secret) {
  uint64_t w = canary_word(secret), v;
  if (end > from + CANARY_MAX) end = from + CANARY_MAX;
  const uint8_t *c = from;
  for (; c < end && ((uintptr_t)c & 7) != 0; c++)
    if (*c != canary_byte(w, c)) return false;
  for (; c + 8 <= end; c += 8)
    if (memcpy(&v, c, 8), v != w) return false;
  for (; c < end; c++)
    if (*c != canary_byte(w, c)) return false;
  return true;
}

/* A block of the page handed out for n bytes: its canary and trailer. */
static void block_mark(const th_page_t *page, uint8_t *b, size_t n) {
  uint64_t secret = block_secret(b);
  uint8_t *t = b + page->block_size - TRAILER;
  uint32_t v = (uint32_t)n ^ trailer_key(secret);
  t[0] = (uint8_t)(v >> 24), t[1] = (uint8_t)(v >> 16), t[2] = (uint8_t)(v >> 8), t[3] = (uint8_t)v;
  canary_write(b + n, t, secret);
}

/* The size the block was handed out for, as its trailer says; SIZE_MAX when the trailer is not one that
 * block_mark wrote for a block of the page's class. */
static size_t block_size_asked(const th_page_t *page, const uint8_t *b, uint64_t secret) {
  const uint8_t *t = b + page->block_size - TRAILER;
  uint32_t v = (uint32_t)t[0] << 24 | (uint32_t)t[1] << 16 | (uint32_t)t[2] << 8 | t[3];
  size_t n = v ^ trailer_key(secret);
  if (n > page->block_size - TRAILER || size_class(n + TRAILER) != page->class_idx) return SIZE_MAX;
  return n;
}

static size_t usable_from(const uint8_t *b, size_t n, const void *p) {
  const uint8_t *u = p;
  return b + n > u ? (size_t)(b + n - u) : 0;
}

/* Stops the process unless the bytes past the size asked for are as block_mark left them. p: the pointer
 * the program holds (inside b for an aligned block), named in the report with its usable size; when the
 * overflow reached the trailer too, the size asked for is lost, and the report names the largest. */
static void block_check(const th_page_t *page, const uint8_t *b, const void *p) {
  uint64_t secret = block_secret(b);
  size_t n = block_size_asked(page, b, secret);
  const uint8_t *t = b + page->block_size - TRAILER;
  if (n == SIZE_MAX) report_block("heap overflow past block", NULL, p, usable_from(b, (size_t)(t - b), p));
  if (!canary_intact(b + n, t, secret))
    report_block("heap overflow past block", NULL, p, usable_from(b, n, p));
}

/* A huge block's canary: from its size to the end of its last OS page (the guard page follows). */
static void huge_check(const th_segment_t *seg, const void *p) {
  const uint8_t *b = seg->pages[0].start, *end = (const uint8_t *)seg + seg->huge_committed;
  if (!canary_intact(b + seg->huge_size, end, block_secret(b)))
    report_block("heap overflow past block", NULL, p, usable_from(b, seg->huge_size, p));
}

size_t secure_usable_size(const th_page_t *page, const void *p) {
  if (page->block_size == 0) return usable_from(page->start, segment_of_page(page)->huge_size, p);
  const uint8_t *b = (const uint8_t *)p - page_block_offset(page, p);
  size_t n = block_size_asked(page, b, block_secret(b));
  return usable_from(b, n == SIZE_MAX ? page->block_size - TRAILER : n, p);
}

/* THREADHEAP_SECURE=2: a free block is zero past its two list words, up to its trailer (kept, so that a
 * report of a second free still names the size). */
static void block_zero(th_block_t *b, size_t block_size) {
  if (block_size > sizeof(th_block_t) + TRAILER)
    memset((uint8_t *)b + sizeof(th_block_t), 0, block_size - sizeof(th_block_t) - TRAILER);
}

static bool block_is_zero(const th_block_t *b, size_t block_size) {
  const uint8_t *c = (const uint8_t *)b + sizeof(th_block_t), *end = (const uint8_t *)b + block_size - TRAILER;
  for (; c + 8 <= end; c += 8) {
    uint64_t w;
    memcpy(&w, c, 8);
    if (w != 0) return false;
  }
  for (; c < end; c++)
    if (*c != 0) return false;
  return true;
}

static inline bool zero_on_free(void) { return th_options.secure >= 2; }

/* (AddressSanitizer builds) A free block is poisoned short of its trailer, which a report on it reads. */
static inline void free_poison(th_block_t *b, size_t block_size) { block_poison(b, block_size - TRAILER); }

/* ---- the pages' encoded free lists */

/* A free block, tagged free already, onto the page's list, its link encoded. */
static void list_push(th_page_t *page, th_block_t *b) {
  b->next = link_code(page, &b->next, page->secure_free);
  page->secure_free = b;
  free_poison(b, page->block_size);
}

/* The first block of the page's list, checked: its link must decode to NULL or a block of the page, its tag
 * must still say free, and with zero-on-free the rest must still be zero. */
static th_block_t *list_pop(th_page_t *page) {
  th_block_t *b = page->secure_free;
  th_assert(b != NULL && page->free == NULL && page->local_free == NULL);
  block_unpoison(b, page->block_size);
  th_block_t *next = link_code(page, &b->next, b->next);
  if (next != NULL && !page_is_block(page, next)) report_block("corrupted free list", page->start, b, page->block_size);
  if (b->tag != free_tag(b) || (zero_on_free() && !block_is_zero(b, page->block_size)))
    report_block("write after free", NULL, b, secure_usable_size(page, b));
  page->secure_free = next;
  page->used_word++;
  b->next = NULL;
  b->tag = 0;
  return b;
}

size_t secure_free_count(const th_page_t *page, bool *ok) {
  size_t n = 0;
  for (th_block_t *b = page->secure_free; b != NULL; b = link_code(page, &b->next, b->next)) {
    if (!page_is_block(page, b) || ++n > page->capacity) {
      *ok = false;
      break;
    }
  }
  return n;
}

/* A tagged block is free when its link is that of a list: plain on the remote stack and in the quarantine,
 * encoded on secure_free. */
bool secure_is_free(const th_page_t *page, const th_block_t *b) {
  th_block_t *decoded = link_code(page, &b->next, b->next);
  return b->next == NULL || page_is_block(page, b->next) || decoded == NULL || page_is_block(page, decoded);
}

/* Fresh blocks, shuffled (Fisher-Yates) so that the order in which a page hands them out cannot be guessed
 * from their addresses. page_extend carves at most TH_EXTEND_BYTES / 16 at a time. */
void secure_carve(th_page_t *page, uint8_t *first, size_t n) {
  uint16_t order[TH_EXTEND_BYTES / 16];
  th_assert(n <= sizeof order / sizeof order[0]);
  for (size_t i = 0; i < n; i++) order[i] = (uint16_t)i;
  for (size_t i = n; i-- > 1;) {
    uint32_t j = rng_below((uint32_t)i + 1);
    uint16_t t = order[i];
    order[i] = order[j], order[j] = t;
  }
  bool zero = zero_on_free() && !page->tail_fresh; /* memory fresh from the OS is zero already */
  for (size_t i = 0; i < n; i++) {
    th_block_t *b = (th_block_t *)(first + (size_t)order[i] * page->block_size);
    if (zero) block_zero(b, page->block_size);
    b->tag = free_tag(b);
    list_push(page, b);
  }
}

/* The remote stack, taken whole by page_collect: each block must be one of the page, tagged free by the
 * thread that freed it (which checked its canary, and zeroed it with zero-on-free). n: the stack's length. */
void secure_collect(th_page_t *page, th_block_t *head, size_t n) {
  th_block_t *prev = head;
  size_t k = 0;
  for (th_block_t *b = head, *next; b; prev = b, b = next, k++) {
    if (k == n || !page_is_block(page, b)) report_block("corrupted free list", page->start, prev, page->block_size);
    if (b->tag != free_tag(b)) report_block("write after free", NULL, b, secure_usable_size(page, b));
    next = b->next;
    list_push(page, b);
  }
  if (k != n) report_block("corrupted free list", page->start, prev, page->block_size);
}

/* ---- the quarantine: per heap and class, the last DELAY blocks the owner freed, oldest out first */

struct th_secure_heap_s {
  struct {
    th_block_t *slot[DELAY];
    uint32_t next; /* the oldest slot, next to be reused */
  } ring[TH_CLASS_COUNT];
  bool on; /* false: blocks go back to their pages at once */
};

/* For a serialized heap (every free of its blocks is remote, so none is quarantined) and for a heap whose
 * quarantine could not be mapped. Never written. */
static th_secure_heap_t no_quarantine;

static inline uint32_t class_delay(size_t c) { return class_kind(c) == TH_KIND_LARGE ? DELAY_LARGE : DELAY; }

static th_page_t *block_page(const th_block_t *b) {
  th_segment_t *seg = (th_segment_t *)((uintptr_t)b & ~(uintptr_t)(TH_SEGMENT_SIZE - 1));
  return segment_page_of(seg, b);
}

/* The block goes back to its page's list, as free_slow's owner path does with a free: counted, and the page
 * unparked or retired when that is due. Its list words must be as secure_free left them: the link is
 * about to be overwritten, so a write there is caught now; the tag is checked again when it is popped. */
static void release(th_heap_t *heap, th_block_t *b) {
  th_page_t *page = block_page(b);
  if (b->next != NULL || b->tag != free_tag(b))
    report_block("write after free", NULL, b, secure_usable_size(page, b));
  list_push(page, b);
  if (page_count_free(page)) heap_free_tick(heap, page);
  else if (page_used(page) == 0) heap_free_local(heap, page);
}

void secure_heap_attach(th_heap_t *heap) {
  key_init();
  heap->secure = &no_quarantine;
  if (heap->thread_id == TH_OWNER_SHARED) return; /* a serialized heap */
  if (heap->secure_spare == NULL)
    heap->secure_spare = os_map_aligned(align_up(sizeof(th_secure_heap_t), os_page_size()), os_page_size());
  th_secure_heap_t *q = heap->secure_spare;
  if (q == NULL) return; /* out of memory: no quarantine, the other checks stay */
  memset(q, 0, sizeof *q);
  q->on = true;
  heap->secure = q;
}

void secure_flush(th_heap_t *heap) {
  th_secure_heap_t *q = heap->secure;
  if (!q->on) return;
  for (size_t c = 1; c < TH_CLASS_COUNT; c++) {
    uint32_t d = class_delay(c);
    for (uint32_t k = 0, i = q->ring[c].next; k < d; k++, i = i + 1 == d ? 0 : i + 1) {
      th_block_t *b = q->ring[c].slot[i];
      q->ring[c].slot[i] = NULL;
      if (b) release(heap, b);
    }
    q->ring[c].next = 0;
  }
}

/* ---- malloc and free */

void *secure_malloc(th_heap_t *heap, size_t size) {
  if (size > TH_LARGE_MAX - TRAILER) return heap_malloc_huge(heap, size); /* huge_alloc guards it */
  th_page_t *page = heap_page_with_free(heap, size_class(size + TRAILER));
  if (page == NULL) return NULL;
  th_assert(page_is_valid(page));
  th_block_t *b = list_pop(page);
  block_mark(page, (uint8_t *)b, size);
  return b;
}

void secure_free(th_segment_t *seg, th_page_t *page, th_block_t *b, const void *p) {
  if (seg->kind == TH_KIND_HUGE) {
    huge_check(seg, p);
    if (zero_on_free()) { /* the kernel zeroes it: cheaper than writing it, and its memory goes back */
      const uint8_t *start = page->start;
      os_purge((void *)start, (size_t)((const uint8_t *)seg + seg->huge_committed - start));
    }
    huge_free(seg, p, TH_OP_FREE);
    return;
  }
  block_check(page, (const uint8_t *)b, p);
  size_t bsize = page->block_size;
  if (zero_on_free()) block_zero(b, bsize);
  b->tag = free_tag(b);
  if (atomic_load_explicit(&seg->thread_id, memory_order_relaxed) != thread_id()) {
    /* Checked here, in the freeing thread; the owner collects it onto its list when the page runs dry. */
    free_poison(b, bsize);
    page_push_remote(page, b);
    return;
  }
  th_heap_t *heap = atomic_load_explicit(&seg->heap, memory_order_relaxed);
  th_secure_heap_t *q = heap->secure;
  b->next = NULL; /* plain in the quarantine (secure_is_free) */
  if (q == NULL || !q->on) {
    release(heap, b);
    return;
  }
  free_poison(b, bsize);
  size_t c = page->class_idx;
  uint32_t i = q->ring[c].next, d = class_delay(c);
  th_block_t *oldest = q->ring[c].slot[i];
  q->ring[c].slot[i] = b;
  q->ring[c].next = i + 1 == d ? 0 : i + 1;
  if (oldest) release(heap, oldest);
}

bool secure_realloc(th_segment_t *seg, th_page_t *page, void *p, size_t size) {
  if (seg->kind == TH_KIND_HUGE) {
    huge_check(seg, p);
    return false;
  }
  uint8_t *b = (uint8_t *)p - page_block_offset(page, p);
  block_check(page, b, p);
  if ((uint8_t *)p != b || size > page->block_size - TRAILER || size_class(size + TRAILER) != page->class_idx)
    return false;
  block_mark(page, b, size);
  return true;
}

/* ---- guard pages */

void secure_segment_init(th_segment_t *seg) {
  size_t ps = os_page_size();
  os_protect((uint8_t *)seg + segment_header_size(seg->page_count, true) - ps, ps, false);
  if (seg->kind == TH_KIND_MEDIUM || seg->kind == TH_KIND_LARGE)
    for (size_t i = 0; i < seg->page_count; i++)
      os_protect((uint8_t *)seg + ((i + 1) << seg->page_shift) - ps, ps, false);
}

void secure_segment_release(th_segment_t *seg) { os_protect(seg, seg->size, true); }

/* huge_alloc left room for the guard page after the block's last OS page. */
void secure_huge_alloc(th_segment_t *seg, void *p, size_t size) {
  uint8_t *end = (uint8_t *)seg + seg->huge_committed;
  os_protect(end, os_page_size(), false);
  canary_write((uint8_t *)p + size, end, block_secret(p));
}

/* ---- start */

/* The options were read just now. A heap never changes mode (its pages are laid out for one), so a thread
 * whose heap was made before, in the other mode (allocations before the library constructor: the loader's,
 * other constructors'), starts over with a new heap; the old one keeps serving the frees of its blocks. */
void secure_start(void) {
  if (th_options.secure) key_init();
  th_heap_t *heap = th_heap_tls;
  if (heap == &th_heap_empty || (heap->secure != NULL) == (th_options.secure != 0)) return;
  th_heap_tls = &th_heap_empty;
  if (thread_heap_init() != NULL) /* the same thread, counted once */
    atomic_fetch_sub_explicit((_Atomic(size_t) *)&th_stats_global.threads_live, 1, memory_order_relaxed);
}
