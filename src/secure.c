/* secure.c: secure mode (THREADHEAP_SECURE=1, or 2 for zero-on-free): blocks checked on their way in and
 * out. Free lists whose links are encoded and checked when popped, a canary and the requested size after
 * every block (checked by free and realloc), guard pages, fresh blocks handed out in random order, freed
 * blocks held back in a quarantine, and (2) freed blocks zeroed and found still zero when handed out again.
 * Main functions: secure_malloc, secure_free_fast.
 *
 * The fast paths are left as they are, not one instruction added (docs/design.md, "Secure mode"): a secure
 * heap's direct tables always name th_page_empty, and its pages keep free and local_free empty (their free
 * blocks wait on secure_free), so heap_malloc falls through to heap_malloc_queue, whose first test sends a
 * secure heap here (secure_malloc); and a secure segment's map entry is TH_MAP_SLOW, not 1, so th_free's
 * fast path fails its first test and its next sends the free here (secure_free_fast). Both serve the common
 * case themselves and leave the rest to the generic slow paths, which call back into secure_malloc_fill and
 * secure_free.
 *
 * A block of a heap page is laid out as [the size asked for][canary][4-byte trailer], the trailer being the
 * size asked for XOR a secret of the block, its most significant byte first: that byte is the secret's (sizes
 * are below 2^24) and never 0, so that an overflow that reaches only its first byte still leaves the size
 * readable. The canary is the CANARY bytes just past the size asked for: a request of n bytes takes the size
 * class of n + 8 (SLACK), so that both fit whatever n is, and free compares one word (requests of a multiple
 * of 8 bytes take the class they would take with the trailer alone). The usable size is n (a 16-byte block's
 * trailer shares the tag word, so a report on one already freed names 8). A huge block keeps its size in its
 * segment (huge_size): its canary runs to the end of its last OS page, and a guard page follows. */
#include <errno.h>
#include <string.h>

#include "internal.h"
#include "os.h"

#define TRAILER 4       /* bytes at the end of each block: the size asked for, encoded */
#define CANARY 4        /* canary bytes past the size asked for in a heap page's block */
#define SLACK (CANARY + TRAILER) /* a block's bytes past the size asked for, at least */
#define HUGE_CANARY 64  /* and past a huge block, up to the end of its last OS page */
/* Frees of a class before a freed block of it is handed out again: DELAY for blocks up to 4 KiB (small
 * pages), DELAY_LARGE past them (medium blocks up to 64 KiB, large ones up to 1 MiB), which the quarantine
 * would otherwise hold by the megabyte per class and thread (16 blocks of a 64 KiB class: 1 MiB; in
 * mimalloc-bench's espresso and glibc-thread a quarter of secure mode's peak RSS). Powers of two: a ring's
 * index wraps with a mask. */
#define DELAY 16
#define DELAY_LARGE 4
/* A ring has DELAY slots and a medium or large class's uses DELAY_LARGE of them (a build with DELAY 2 wrote
 * past its ring and crashed at once). */
_Static_assert(DELAY_LARGE <= DELAY && (DELAY & (DELAY - 1)) == 0 && (DELAY_LARGE & (DELAY_LARGE - 1)) == 0,
               "each ring's slots hold its class's delay, a power of two");

/* ---- keys and random numbers */

/* The process's key, behind the pages' keys and the huge blocks' secrets: random, and not th_key, which
 * an aligned block shows (XOR its address) in the word below it. Set once, before the first secure heap. */
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

/* wyrand (from wyhash), per thread, seeded at its first use: the order of fresh blocks, the pages' keys. */
static __thread uint64_t rng_state __attribute__((tls_model("initial-exec")));

static uint64_t rng_next(void) {
  if (th_unlikely(rng_state == 0)) rng_state = os_random() ^ thread_id();
  rng_state += 0xa0761d6478bd642full;
  __uint128_t m = (__uint128_t)(rng_state ^ 0xe7037ed1a0b428dbull) * rng_state;
  return (uint64_t)(m >> 64) ^ (uint64_t)m;
}

static uint32_t rng_below(uint32_t n) {
  return (uint32_t)(((rng_next() >> 32) * n) >> 32); /* uniform below n without a division (Lemire) */
}

/* A link is stored as next ^ the page's key ^ the address of the word that holds it (a link copied from one
 * page, or one slot, to another does not decode to a block; hardened allocators such as glibc's
 * safe-linking and scudo mix addresses into pointers in the same spirit). Decoding is the same. */
static inline th_block_t *link_code(const th_page_t *page, th_block_t *const *slot, const th_block_t *link) {
  return (th_block_t *)((uintptr_t)link ^ page->secure_key ^ (uintptr_t)slot);
}

/* A block's secret, from its address and its page's random key: one multiply by a 32-bit odd constant (an
 * immediate operand), so that each bit of the secret depends on the key's and the address's bits below it
 * and the trailer's key (the top half) on all of the low half. */
static inline uint64_t block_secret(const th_page_t *page, const void *b) {
  return ((uintptr_t)b ^ page->secure_key) * 0x7feb352dull;
}
static inline uint64_t huge_secret(const void *b) { return mix64(secure_key ^ (uintptr_t)b); }
static inline uint32_t trailer_key(uint64_t secret) { return (uint32_t)(secret >> 32) | 0x01000000u; }
/* The canary: the secret with no byte 0. */
static inline uint64_t canary_word(uint64_t secret) { return secret | 0x0101010101010101ull; }
/* A heap page block's canary: the word's low 4 bytes (one 32-bit OR with an immediate). */
static inline uint32_t canary32(uint64_t secret) { return (uint32_t)secret | 0x01010101u; }

/* ---- a heap page's block: canary and trailer */

static inline uint8_t *block_trailer(const th_page_t *page, const void *b) {
  return (uint8_t *)b + page->block_size - TRAILER;
}

/* A block of the page handed out for n bytes (at most its size less SLACK): its canary and trailer, two
 * stores and no branch on the size (a program of random sizes would mispredict it). */
static inline void block_mark(const th_page_t *page, uint8_t *b, size_t n) {
  uint64_t secret = block_secret(page, b);
  uint8_t *t = block_trailer(page, b);
  uint32_t w = canary32(secret);
  memcpy(b + n, &w, CANARY);
  uint32_t v = __builtin_bswap32((uint32_t)n ^ trailer_key(secret)); /* most significant byte first */
  memcpy(t, &v, 4);
}

/* The trailer decoded: the size asked for in its low 24 bits, and 0 above them unless it was overwritten. */
static inline uint32_t trailer_read(const th_page_t *page, const uint8_t *b, uint64_t secret) {
  uint32_t v;
  memcpy(&v, block_trailer(page, b), 4);
  return __builtin_bswap32(v) ^ trailer_key(secret);
}

/* The size the block was handed out for, as its trailer says; SIZE_MAX when the trailer's size is not one
 * that block_mark could have written for a block of the page. An overflow that changed only the trailer's
 * first byte (the secret's) leaves the size readable. */
static inline size_t block_size_asked(const th_page_t *page, const uint8_t *b, uint64_t secret) {
  size_t n = trailer_read(page, b, secret) & 0xffffff;
  return n <= page->block_size - SLACK ? n : SIZE_MAX;
}

/* Are the CANARY bytes past b + n as block_mark left them? */
static inline bool canary_intact(const uint8_t *b, size_t n, uint64_t secret) {
  uint32_t x;
  memcpy(&x, b + n, CANARY);
  return x == canary32(secret);
}

static size_t usable_from(const uint8_t *b, size_t n, const void *p) {
  const uint8_t *u = p;
  return b + n > u ? (size_t)(b + n - u) : 0;
}

/* The report of an overflow past block b (p: the pointer the program holds, inside b for an aligned block),
 * named with its usable size. When the overflow reached the trailer too, the size asked for is lost: the
 * report says so and names the most the program could have been given. */
TH_COLD _Noreturn static void report_overflow(const th_page_t *page, const uint8_t *b, const void *p) {
  size_t n = block_size_asked(page, b, block_secret(page, b));
  if (n == SIZE_MAX) report_block_lost("heap overflow past block", p, usable_from(b, page->block_size - SLACK, p));
  report_block("heap overflow past block", NULL, p, usable_from(b, n, p));
}

/* Are the bytes past the size asked for as block_mark left them? */
static inline bool block_intact(const th_page_t *page, const uint8_t *b) {
  uint64_t secret = block_secret(page, b);
  uint32_t v = trailer_read(page, b, secret); /* the size asked for, and 0 above it */
  return th_likely(v <= page->block_size - SLACK && canary_intact(b, v, secret));
}

size_t secure_usable_size(const th_page_t *page, const void *p) {
  if (page->block_size == 0) return usable_from(page->start, segment_of_page(page)->huge_size, p);
  const uint8_t *b = (const uint8_t *)p - page_block_offset(page, p);
  size_t n = block_size_asked(page, b, block_secret(page, b));
  return usable_from(b, n == SIZE_MAX ? page->block_size - SLACK : n, p);
}

TH_COLD _Noreturn static void report_write_after_free(const th_page_t *page, const th_block_t *b) {
  report_block("write after free", NULL, b, secure_usable_size(page, b));
}

/* The same stops for the common paths of malloc and free, where each is called last (`return stop_...()`),
 * so that the call is a jump: a call to a function known not to return keeps the stack aligned for it,
 * which cost those paths two instructions each. Hence neither declared _Noreturn nor seen through (noipa).
 * They never return. */
#ifdef __clang__
#define TH_STOP __attribute__((cold, noinline)) /* (the fuzzer's build: clang has no noipa) */
#else
#define TH_STOP __attribute__((cold, noinline, noipa))
#endif
TH_STOP static void *stop_overflow(const th_page_t *page, const uint8_t *b, const void *p) {
  report_overflow(page, b, p);
}
TH_STOP static void *stop_write_after_free(const th_page_t *page, const th_block_t *b) {
  report_write_after_free(page, b);
}

/* ---- a huge block's canary: from its size to the end of its last OS page (the guard page follows), at
 * most HUGE_CANARY bytes. The byte at address a is the word's byte a % 8, so whole aligned words are
 * written and compared at once. */

static inline uint8_t canary_byte(uint64_t word, const uint8_t *at) {
  return (uint8_t)(word >> (8 * ((uintptr_t)at & 7)));
}

static void huge_canary_write(uint8_t *from, const uint8_t *end, uint64_t secret) {
  uint64_t w = canary_word(secret);
  if (end > from + HUGE_CANARY) end = from + HUGE_CANARY;
  uint8_t *c = from;
  for (; c < end && ((uintptr_t)c & 7) != 0; c++) *c = canary_byte(w, c);
  for (; c + 8 <= end; c += 8) memcpy(c, &w, 8);
  for (; c < end; c++) *c = canary_byte(w, c);
}

static void huge_check(const th_segment_t *seg, const void *p) {
  const uint8_t *b = seg->pages[0].start, *end = (const uint8_t *)seg + seg->huge_committed;
  uint64_t w = canary_word(huge_secret(b));
  const uint8_t *c = b + seg->huge_size;
  if (end > c + HUGE_CANARY) end = c + HUGE_CANARY;
  for (; c < end; c++)
    if (*c != canary_byte(w, c)) report_block("heap overflow past block", NULL, p, usable_from(b, seg->huge_size, p));
}

/* ---- zero-on-free (THREADHEAP_SECURE=2): a free block is zero past its two list words, up to its trailer
 * (kept, so that a report of a second free still names the size). */

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

TH_COLD _Noreturn static void report_corrupted(const th_page_t *page, const th_block_t *b) {
  report_block("corrupted free list", page->start, b, page->block_size);
}

/* Zero-on-free: a block handed out again must still be zero. */
static void check_zero(const th_page_t *page, const th_block_t *b) {
  if (!block_is_zero(b, page->block_size)) report_write_after_free(page, b);
}

/* A free block, tagged free already, onto the page's list, its link encoded. */
static inline void list_push(th_page_t *page, th_block_t *b) {
  b->next = link_code(page, &b->next, page->secure_free);
  page->secure_free = b;
  free_poison(b, page->block_size);
}

/* The stop of block_out and chain_out for a bad link (TH_STOP, above). */
TH_STOP static void *stop_corrupted(const th_page_t *page, const th_block_t *b) { report_corrupted(page, b); }

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

/* q is the start of a block of some heap page. */
static bool is_block(const void *q) {
  th_segment_t *seg = segment_lookup(q);
  return seg != NULL && seg->kind != TH_KIND_HUGE && page_is_block(segment_page_of(seg, q), q);
}

/* A tagged block is free when its link is that of a list: plain on the remote stack, in the quarantine
 * (NULL) and among the remote frees waiting for it (a block of any page), encoded on secure_free. */
bool secure_is_free(const th_page_t *page, const th_block_t *b) {
  th_block_t *decoded = link_code(page, &b->next, b->next);
  return b->next == NULL || is_block(b->next) || decoded == NULL || page_is_block(page, decoded);
}

/* Fresh blocks in random order: page_extend carves at most TH_EXTEND_BYTES at a time, cut here into windows of
 * SHUFFLE_WINDOW blocks, each handed out in an order drawn for it (Fisher-Yates), the windows one after the
 * other in address order. Which block of its window comes next cannot be guessed from the addresses; the
 * windows keep what a program allocates together close together, which a shuffle of the whole batch did not
 * (a program that walks its objects in allocation order, as Python's garbage collector does, took 1.15 times
 * as long: docs/design.md, "Random order"). A page's first carve draws its key. */
#define SHUFFLE_WINDOW 8

void secure_carve(th_page_t *page, uint8_t *first, size_t n) {
  if (page->capacity == 0) page->secure_key = rng_next() ^ mix64(secure_key ^ (uintptr_t)page);
  bool zero = zero_on_free() && !page->tail_fresh; /* memory fresh from the OS is zero already */
  /* list_push makes the block pushed last the list's head: the last window goes first, so that the first is
   * handed out first. */
  for (size_t w = (n + SHUFFLE_WINDOW - 1) / SHUFFLE_WINDOW; w-- > 0;) {
    size_t lo = w * SHUFFLE_WINDOW, m = n - lo < SHUFFLE_WINDOW ? n - lo : SHUFFLE_WINDOW;
    uint8_t order[SHUFFLE_WINDOW];
    for (size_t i = 0; i < m; i++) order[i] = (uint8_t)i;
    for (size_t i = m; i-- > 1;) {
      uint32_t j = rng_below((uint32_t)i + 1);
      uint8_t t = order[i];
      order[i] = order[j], order[j] = t;
    }
    for (size_t i = 0; i < m; i++) {
      th_block_t *b = (th_block_t *)(first + (lo + order[i]) * page->block_size);
      if (zero) block_zero(b, page->block_size);
      b->tag = free_tag(b);
      list_push(page, b);
    }
  }
}

/* ---- the quarantine: per heap and class, the blocks freed into the heap lately, each held back until
 * DELAY more of its class came after it (DELAY_LARGE for classes past 4 KiB).
 * The owner's frees enter one by one, into the class's ring of blocks: the oldest leaves, back to its page,
 * when a new one takes its slot.
 * Remote frees (another thread's, and every free into a serialized heap) wait on their page's remote stack
 * until the owner collects it (page_collect, secure_collect), then enter whole, as the chain the freeing
 * threads linked, with no block read: its page, its top and its length, on the class's ring of chains,
 * still counted used by their page. A chain DELAY frees of its class behind (ring_frees) has served its
 * time: malloc hands its blocks out straight from it (chain_out), each checked as block_out checks a
 * page's (its link, plain here, names a block of the page, or is NULL exactly at the chain's end; its tag
 * still says free). A remote free thus costs the owner one read of the block, when malloc hands it out, as
 * in the default mode: walking each stack when it was collected read every block another core had just
 * written, a cache miss each, and took two thirds of xmalloc-test's time in secure mode.
 * Chains collected while heap_find_page walks a queue wait in `pending`, and enter at the next safe point
 * (secure_malloc_fill, heap_purge): a chain that enters a full ring sends the oldest back to its page block
 * by block, and a block leaving the quarantine may unpark or free its page. */

/* Remote frees into one page, linked by the threads that freed them. */
typedef struct chain_s {
  th_page_t *page;  /* every block's page */
  th_block_t *head; /* the next block to hand out */
  uint32_t n;       /* blocks left: the last one's link is NULL */
  uint32_t stamp;   /* its class's frees (ring_frees) once it had entered */
} chain_t;

/* Chains a class's ring holds: more than DELAY, so that a full ring's oldest chain has served its time. */
#define CHAINS 64
_Static_assert(CHAINS > DELAY && (CHAINS & (CHAINS - 1)) == 0, "a ring of chains outlasts the delay");

/* A block in the quarantine, with its page: leaving, it goes back to that page's list, and its address alone
 * would need its segment's header read first (often a cache miss by then). */
typedef struct held_s {
  th_block_t *block;
  th_page_t *page;
} held_t;

typedef struct ring_s {
  held_t slot[DELAY];
  uint32_t pushed;  /* blocks that entered the slots, ever: the oldest, next to be reused, is pushed & mask */
  uint32_t mask;    /* slots - 1: the delay, less one */
  uint32_t seen;    /* frees at the heap's last purge round */
  uint32_t quiet;   /* purge rounds since a block last entered */
  chain_t *chain;   /* its chains (th_secure_heap_t.chains), the oldest at first % CHAINS */
  uint32_t first, count;
  uint32_t chained; /* blocks that entered in chains, ever */
  uint32_t outs;    /* blocks malloc handed out from its chains, ever */
  uint32_t outs_seen; /* outs at the heap's last purge round */
} __attribute__((aligned(64))) ring_t; /* 320 bytes: a class's ring is found with a shift and an add */

/* The frees of the ring's class that entered the quarantine, ever (modulo 2^32). */
static inline uint32_t ring_frees(const ring_t *r) { return r->pushed + r->chained; }

#define PENDING_MAX 256 /* chains collected between two safe points; past them, blocks wait on incoming */

struct th_secure_heap_s {
  ring_t ring[TH_CLASS_COUNT];
  chain_t pending[PENDING_MAX]; /* chains collected, waiting to enter */
  size_t npending;
  th_block_t *incoming; /* remote frees collected with pending full: checked, linked plainly, waiting */
  bool on;              /* false: blocks go back to their pages at once */
  /* Last, and not cleared when a heap takes the struct (only the entries a ring counts are read): the
   * memory of a class's chains is touched once the class receives remote frees. */
  chain_t chains[TH_CLASS_COUNT][CHAINS];
};

/* For a heap whose quarantine could not be mapped. Never written. */
static th_secure_heap_t no_quarantine;

static th_page_t *block_page(const th_block_t *b) {
  th_segment_t *seg = (th_segment_t *)((uintptr_t)b & ~(uintptr_t)(TH_SEGMENT_SIZE - 1));
  return segment_page_of(seg, b);
}

/* A page's count carried (the clock tick, or a page parked as full): the heap acts, as it does for th_free.
 * It may make system calls (a purge): free keeps errno. */
TH_COLD static void release_tick(th_heap_t *heap, th_page_t *page) {
  int saved_errno = errno;
  heap_free_tick(heap, page);
  errno = saved_errno;
}

/* The block goes back to its page's list, counted free as th_free counts an owner's free (a page that
 * empties is found by heap_purge, as in the default mode). Its list words must be as the quarantine left
 * them: the link is about to be overwritten, so a write there is caught now; the tag is checked again when
 * the block is popped. */
static inline void release_in(th_heap_t *heap, th_page_t *page, th_block_t *b) {
  if (th_unlikely(b->next != NULL || b->tag != free_tag(b))) {
    (void)stop_write_after_free(page, b);
    return;
  }
  list_push(page, b);
  if (th_unlikely(page_count_free(page))) release_tick(heap, page);
}
static inline void release(th_heap_t *heap, th_block_t *b) { release_in(heap, block_page(b), b); }

/* A freed block (tagged, its link NULL) into the quarantine; the oldest of its class leaves. */
static inline void quarantine(th_heap_t *heap, th_secure_heap_t *q, th_page_t *page, th_block_t *b) {
  if (th_unlikely(!q->on)) {
    release_in(heap, page, b);
    return;
  }
  ring_t *r = &q->ring[page->class_idx];
  uint32_t i = r->pushed++ & r->mask;
  held_t oldest = r->slot[i];
  r->slot[i] = (held_t){b, page};
  if (oldest.block) release_in(heap, oldest.page, oldest.block);
}

/* Is next, the link of the chain's next block, as the freeing threads left it: another block of the page,
 * or NULL exactly at the chain's last block? */
static inline bool chain_link_ok(const chain_t *ch, const th_block_t *next) {
  return next == NULL ? ch->n == 1 : ch->n != 1 && page_is_block(ch->page, next);
}

/* The chain's next block, checked: its link (chain_link_ok), and its tag must still say free. Returned with
 * its link NULL, still tagged free. */
static inline th_block_t *chain_take(chain_t *ch) {
  th_page_t *page = ch->page;
  th_block_t *b = ch->head;
  block_unpoison(b, page->block_size);
  th_block_t *next = b->next;
  if (th_unlikely(!chain_link_ok(ch, next))) report_corrupted(page, b);
  if (th_unlikely(b->tag != free_tag(b))) report_write_after_free(page, b);
  b->next = NULL;
  ch->head = next;
  ch->n--;
  return b;
}

/* Every block of a chain, taken off its ring, back to its page. */
static void chain_release(th_heap_t *heap, chain_t ch) {
  while (ch.n) release_in(heap, ch.page, chain_take(&ch));
}

/* The ring's i-th chain, the oldest first (i < count). */
static inline chain_t *chain_at(const ring_t *r, uint32_t i) { return &r->chain[(r->first + i) & (CHAINS - 1)]; }

/* Has the ring's i-th chain served its time: DELAY frees of its class after it? */
static inline bool chain_served(const ring_t *r, uint32_t i) {
  return ring_frees(r) - chain_at(r, i)->stamp > r->mask;
}

/* Has the class's oldest chain served its time? */
static inline bool chain_ready(const ring_t *r) { return r->count != 0 && chain_served(r, 0); }

/* The oldest chain off the ring. */
static chain_t chain_shift(ring_t *r) {
  chain_t ch = *chain_at(r, 0);
  r->first++;
  r->count--;
  return ch;
}

/* A chain onto its class's ring. A full ring's oldest chain has served its time (each chain after it brought
 * a block at least, this one too) and goes back to its page first: taken off before its blocks leave, so
 * that a purge the leaving blocks start finds the ring whole. */
static void chain_enter(th_heap_t *heap, chain_t ch) {
  ring_t *r = &heap->secure->ring[ch.page->class_idx];
  chain_t old = {0};
  if (r->count == CHAINS) old = chain_shift(r);
  r->chained += ch.n;
  ch.stamp = ring_frees(r);
  *chain_at(r, r->count) = ch;
  r->count++;
  if (old.n) chain_release(heap, old);
}

/* Chains that have served their time, past the oldest, go back to their pages, at a purge round that found
 * no block handed out from the class's chains since the last one: more would hold pages' worth of blocks
 * in a class the thread may not allocate again (a main thread whose workers free what it once allocated
 * held 64 chains of such a class for good). Not sooner: a chain goes back block by block, each block read
 * (a cache miss: another core wrote it), where malloc takes them one at a time anyway; trimming as each
 * chain entered took a quarter of xmalloc-test's time in secure mode. */
static void ring_trim(th_heap_t *heap, ring_t *r) {
  while (r->count >= 2 && chain_served(r, 1)) chain_release(heap, chain_shift(r));
}

/* The remote frees collected so far enter the quarantine. */
static void incoming_enter(th_heap_t *heap) {
  th_secure_heap_t *q = heap->secure;
  if (!q->on) return; /* (no_quarantine is never written) */
  /* One at a time: a block leaving the quarantine may start a purge, which collects more. */
  while (q->npending) {
    chain_t ch = q->pending[--q->npending];
    chain_enter(heap, ch);
  }
  th_block_t *b = q->incoming;
  q->incoming = NULL;
  while (b) {
    th_block_t *next = b->next;
    b->next = NULL;
    quarantine(heap, q, block_page(b), b);
    b = next;
  }
}

/* The remote stacks of every page in class c's queue, taken (secure_collect: into pending, or incoming when
 * pending is full; incoming_enter puts them in the quarantine). */
static void collect_pages(th_heap_t *heap, size_t c) {
  for (th_page_t *page = heap->queues[c].first; page; page = page->next) page_collect(page);
}

/* The remote frees of every class's pages enter the quarantine. Pages parked as full that received some go
 * back to their queues first. (A malloc collects one class, only as far as it needs: collect_class.) */
static void collect_remote(th_heap_t *heap) {
  heap_collect_ready(heap);
  for (size_t c = 1; c < TH_CLASS_COUNT; c++) collect_pages(heap, c);
  incoming_enter(heap);
}

/* Remote frees of class c enter the quarantine, page by page from the front of its queue, until the class's
 * oldest chain has served its time: a chain a page, and collecting every page at once (hundreds, where
 * threads free what this one allocates) would fill the ring and send the oldest chains back to their pages
 * block by block (chain_enter). The chain of each page enters at once, and no block leaves while the queue
 * is walked: while the oldest has not served its time the ring is not full (a full ring's oldest has
 * CHAINS - 1 frees or more behind it). */
static void collect_class(th_heap_t *heap, size_t c) {
  heap_collect_ready(heap);
  incoming_enter(heap);
  th_secure_heap_t *q = heap->secure;
  ring_t *r = &q->ring[c];
  for (th_page_t *page = heap->queues[c].first; page && !chain_ready(r); page = page->next) {
    page_collect(page);
    if (q->npending) chain_enter(heap, q->pending[--q->npending]);
  }
}

/* Every block of the ring back to its page. */
static void ring_flush(th_heap_t *heap, ring_t *r) {
  for (uint32_t i = 0; i <= r->mask; i++) {
    held_t h = r->slot[i];
    r->slot[i] = (held_t){NULL, NULL};
    if (h.block) release_in(heap, h.page, h.block);
  }
  while (r->count) chain_release(heap, chain_shift(r));
}

/* Rounds of heap_purge (at least a quarter of the purge delay apart) with no free of a class, after which
 * its ring empties: a class the program stopped freeing would otherwise pin up to DELAY pages (of up to
 * 2 MiB each) for good. */
#define QUIET_ROUNDS 4

/* heap_purge's round (not a forced one): remote frees into the quarantine, so that their pages are not freed
 * with them, and the chains past the oldest back to their pages, for each class that malloc took no block
 * of a chain from since the last round (a class that malloc takes chains of collects its pages as it needs
 * them, collect_class: collecting them all here filled its ring, whose oldest chains then went back block
 * by block); the rings of classes that saw no free for QUIET_ROUNDS rounds back to their pages. */
void secure_purge(th_heap_t *heap) {
  th_secure_heap_t *q = heap->secure;
  if (!q->on) {
    collect_remote(heap);
    return;
  }
  heap_collect_ready(heap);
  incoming_enter(heap);
  for (size_t c = 1; c < TH_CLASS_COUNT; c++) {
    ring_t *r = &q->ring[c];
    if (r->outs == r->outs_seen) {
      collect_pages(heap, c);
      incoming_enter(heap);
      ring_trim(heap, r);
    }
    r->outs_seen = r->outs;
    if (ring_frees(r) != r->seen) {
      r->seen = ring_frees(r);
      r->quiet = 0;
    } else if (++r->quiet == QUIET_ROUNDS) {
      ring_flush(heap, r);
    }
  }
}

/* The remote stack, taken whole by page_collect (n blocks from head): into the quarantine as a chain, no
 * block read; checked block by block when it leaves (chain_take). With no room for it in pending, or no
 * quarantine, it is checked now: each block must be one of the page, tagged free by the thread that freed
 * it (which checked its canary, and zeroed it with zero-on-free), and it waits on incoming or goes back to
 * the page at once. Returns how many blocks the page now counts free: 0 when they wait in the quarantine. */
size_t secure_collect(th_page_t *page, th_block_t *head, size_t n) {
  th_heap_t *heap = atomic_load_explicit(&segment_of_page(page)->heap, memory_order_relaxed);
  th_secure_heap_t *q = heap->secure;
  if (q->on && q->npending < PENDING_MAX) {
    q->pending[q->npending++] = (chain_t){page, head, (uint32_t)n, 0};
    stats_add_remote(n);
    return 0;
  }
  th_block_t *prev = head;
  size_t k = 0;
  for (th_block_t *b = head, *next; b; prev = b, b = next, k++) {
    if (k == n || !page_is_block(page, b)) report_block("corrupted free list", page->start, prev, page->block_size);
    if (b->tag != free_tag(b)) report_write_after_free(page, b);
    next = b->next;
    if (!q->on) list_push(page, b);
  }
  if (k != n) report_block("corrupted free list", page->start, prev, page->block_size);
  if (!q->on) return n;
  prev->next = q->incoming;
  q->incoming = head;
  stats_add_remote(n);
  return 0;
}

void secure_heap_attach(th_heap_t *heap) {
  key_init();
  heap->secure = &no_quarantine;
  if (heap->secure_spare == NULL)
    heap->secure_spare = os_map_aligned(align_up(sizeof(th_secure_heap_t), os_page_size()), os_page_size());
  th_secure_heap_t *q = heap->secure_spare;
  if (q == NULL) return; /* out of memory: no quarantine, the other checks stay */
  memset(q, 0, offsetof(th_secure_heap_t, chains));
  for (size_t c = 1; c < TH_CLASS_COUNT; c++) {
    q->ring[c].mask = (class_kind(c) == TH_KIND_SMALL ? DELAY : DELAY_LARGE) - 1;
    q->ring[c].chain = q->chains[c];
  }
  q->on = true;
  heap->secure = q;
}

/* Everything the quarantine holds goes back to its pages, with the remote frees collected on the way (a
 * block leaving may unpark a page, whose remote frees then arrive): until all is empty. */
void secure_flush(th_heap_t *heap) {
  th_secure_heap_t *q = heap->secure;
  if (!q->on) return;
  heap_collect_ready(heap);
  for (;;) {
    for (size_t c = 1; c < TH_CLASS_COUNT; c++) ring_flush(heap, &q->ring[c]);
    if (q->npending) {
      chain_release(heap, q->pending[--q->npending]);
      continue;
    }
    th_block_t *b = q->incoming;
    if (b == NULL) return;
    q->incoming = NULL;
    for (th_block_t *next; b; b = next) {
      next = b->next;
      b->next = NULL;
      release(heap, b);
    }
  }
}

/* ---- malloc and free */

/* The first block of the page's list, handed out for size bytes: checked first, its link must decode to
 * NULL or a block of the page, its tag must still say free, and with zero-on-free the rest must still be
 * zero. */
static inline void *block_out(th_page_t *page, size_t size, bool zero) {
  th_assert(page_is_valid(page));
  th_block_t *b = page->secure_free;
  th_assert(b != NULL && page->free == NULL && page->local_free == NULL);
  block_unpoison(b, page->block_size);
  th_block_t *next = link_code(page, &b->next, b->next);
  if (th_unlikely(next != NULL && !page_is_block(page, next))) return stop_corrupted(page, b);
  if (th_unlikely(b->tag != free_tag(b))) return stop_write_after_free(page, b);
  if (zero) check_zero(page, b);
  page->secure_free = next;
  page->used_word++;
  b->next = NULL;
  b->tag = 0;
  block_mark(page, (uint8_t *)b, size);
  return b;
}

/* With zero-on-free: apart, so that the common path makes no call and saves no registers. */
TH_NOINLINE static void *block_out_zero(th_page_t *page, size_t size) { return block_out(page, size, true); }

/* A block of the class's oldest chain, which has served its time, handed out for size bytes: checked, and
 * counted as a free collected (its page's count of blocks in use never moved). */
static inline void *chain_out(th_heap_t *heap, ring_t *r, size_t c, size_t size, bool zero) {
  chain_t *ch = chain_at(r, 0);
  th_page_t *page = ch->page;
  th_block_t *b = ch->head;
  block_unpoison(b, page->block_size);
  th_block_t *next = b->next;
  /* chain_take's checks, with the stops last (TH_STOP) */
  if (th_unlikely(!chain_link_ok(ch, next))) return stop_corrupted(page, b);
  if (th_unlikely(b->tag != free_tag(b))) return stop_write_after_free(page, b);
  if (zero) check_zero(page, b);
  b->next = NULL;
  b->tag = 0;
  ch->head = next;
  if (--ch->n == 0) (void)chain_shift(r);
  r->outs++;
  heap_count_frees(heap, c, 1);
  block_mark(page, (uint8_t *)b, size);
  return b;
}

/* With zero-on-free: apart, so that the common path makes no call and saves no registers. */
TH_NOINLINE static void *chain_out_zero(th_heap_t *heap, ring_t *r, size_t c, size_t size) {
  return chain_out(heap, r, c, size, true);
}

/* secure_malloc's first page of class c had no free block: the class's oldest chain of remote frees, once
 * it has served its time, or the generic slow path. Apart, so that the common path saves no registers. */
TH_NOINLINE static void *secure_malloc_chain(th_heap_t *heap, size_t size, size_t c) {
  ring_t *r = &heap->secure->ring[c];
  if (chain_ready(r)) {
    if (th_unlikely(zero_on_free())) return chain_out_zero(heap, r, c, size);
    return chain_out(heap, r, c, size, false);
  }
  return heap_malloc_slow(heap, size);
}

/* The size class of a request of size bytes (at most TH_LARGE_MAX - SLACK): that of size + SLACK, which
 * is never below 16, so the small classes' test for 16 bytes or less is left out. */
static inline size_t secure_class(size_t size) {
  size_t n = size + SLACK;
  return n <= 128 ? (n + 15) >> 4 : size_class(n);
}

/* heap_malloc_queue on a secure heap: the first page of the class has a free block
 * (the common case), or the oldest chain of remote frees of the class has served its time; else the generic
 * slow path runs (purge clock, sampling, a page to find), and comes back to secure_malloc_fill. */
void *secure_malloc(th_heap_t *heap, size_t size) {
  if (th_likely(size <= TH_LARGE_MAX - SLACK) && th_likely(!th_profile_on)) {
    size_t c = secure_class(size);
    th_page_t *page = heap->queues[c].first;
    if (th_likely(page != NULL && page->secure_free != NULL)) {
      if (th_unlikely(zero_on_free())) return block_out_zero(page, size);
      return block_out(page, size, false);
    }
    return secure_malloc_chain(heap, size, c);
  }
  return heap_malloc_slow(heap, size);
}

/* heap_malloc_fill on a secure heap: remote frees collected enter the quarantine, then a chain that has
 * served its time, or a page with a free block. */
void *secure_malloc_fill(th_heap_t *heap, size_t size) {
  if (size > TH_LARGE_MAX - SLACK) return heap_malloc_huge(heap, size); /* huge_alloc guards it */
  size_t c = secure_class(size);
  th_page_t *page;
  do { /* a page whose remote frees arrived while it was being parked has none on secure_free: again */
    collect_class(heap, c);
    ring_t *r = &heap->secure->ring[c];
    if (chain_ready(r)) return chain_out(heap, r, c, size, zero_on_free());
    page = heap_page_with_free(heap, c);
    if (page == NULL) return NULL;
  } while (page->secure_free == NULL);
  return block_out(page, size, zero_on_free());
}

/* A remote free waits in this thread's batch for its page, or on the page's remote stack, until the owner
 * collects it into its quarantine (free.c's path). Apart, so that the owner's path keeps its registers. */
TH_NOINLINE static void free_remote_push(th_segment_t *seg, th_page_t *page, th_block_t *b) {
  free_poison(b, page->block_size);
  free_remote_send(seg, page, b);
}

/* A block of a heap page, checked by free_checked or secure_free_fast (a live block start): p the pointer the
 * program holds. Checked, and held back: in the owner heap's quarantine, or on the page's remote stack
 * until its owner collects it into its own. */
static inline void free_block(th_segment_t *seg, th_page_t *page, th_block_t *b, const void *p, bool zero) {
  if (!block_intact(page, (const uint8_t *)b)) {
    (void)stop_overflow(page, (const uint8_t *)b, p);
    return;
  }
  size_t bsize = page->block_size;
  if (zero) block_zero(b, bsize);
  b->tag = free_tag(b);
  if (atomic_load_explicit(&seg->thread_id, memory_order_relaxed) != thread_id()) {
    free_remote_push(seg, page, b);
    return;
  }
  th_heap_t *heap = atomic_load_explicit(&seg->heap, memory_order_relaxed);
  b->next = NULL; /* plain in the quarantine (secure_is_free) */
  free_poison(b, bsize);
  quarantine(heap, heap->secure, page, b);
}

/* With zero-on-free: apart, so that the common path makes no call and saves no registers. */
TH_NOINLINE static void free_block_zero(th_segment_t *seg, th_page_t *page, th_block_t *b, const void *p) {
  free_block(seg, page, b, p, true);
}

/* th_free found p's region to be a TH_MAP_SLOW segment's first. A block start of a secure
 * heap page, not tagged free, is freed here; everything else (huge and aligned blocks, sampled ones, tagged
 * or invalid pointers) takes the generic path, which checks and reports. */
void secure_free_fast(void *p) {
  th_segment_t *seg = (th_segment_t *)((uintptr_t)p & ~(uintptr_t)(TH_SEGMENT_SIZE - 1));
  th_page_t *page = segment_page_of(seg, p);
  th_block_t *b = p;
  /* (A huge block's page has capacity 0: never a block start here.) */
  if (th_likely(seg->is_secure && !seg->is_sampled && page_is_block(page, p) && b->tag != free_tag(b))) {
    if (th_unlikely(zero_on_free())) free_block_zero(seg, page, b, p);
    else free_block(seg, page, b, p, false);
  } else
    free_checked(p);
}

void secure_free(th_segment_t *seg, th_page_t *page, th_block_t *b, const void *p) {
  if (seg->kind != TH_KIND_HUGE) {
    free_block(seg, page, b, p, zero_on_free());
    return;
  }
  huge_check(seg, p);
  if (zero_on_free()) { /* the kernel zeroes it: cheaper than writing it, and its memory goes back */
    const uint8_t *start = page->start;
    os_purge((void *)start, (size_t)((const uint8_t *)seg + seg->huge_committed - start));
  }
  huge_free(seg, p, TH_OP_FREE);
}

bool secure_realloc(th_segment_t *seg, th_page_t *page, void *p, size_t size) {
  if (seg->kind == TH_KIND_HUGE) {
    huge_check(seg, p);
    return false;
  }
  uint8_t *b = (uint8_t *)p - page_block_offset(page, p);
  if (!block_intact(page, b)) report_overflow(page, b, p);
  if ((uint8_t *)p != b || size > page->block_size - SLACK || secure_class(size) != page->class_idx)
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
  seg->guards = (uint8_t)(seg->kind + 1);
}

void secure_segment_release(th_segment_t *seg) {
  os_protect(seg, seg->size, true);
  seg->guards = 0;
  seg->guard_end = 0;
}

/* huge_alloc left room for the guard page after the block's last OS page: one is there already when the
 * segment last held a block that ended there. */
void secure_huge_alloc(th_segment_t *seg, void *p, size_t size) {
  size_t ps = os_page_size();
  if (seg->guard_end != seg->huge_committed) {
    if (seg->guard_end != 0) os_protect((uint8_t *)seg + seg->guard_end, ps, true);
    os_protect((uint8_t *)seg + seg->huge_committed, ps, false);
    seg->guard_end = seg->huge_committed;
  }
  huge_canary_write((uint8_t *)p + size, (uint8_t *)seg + seg->huge_committed, huge_secret(p));
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
