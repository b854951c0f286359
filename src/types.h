/* types.h: threadheap's glossary, its data structures, and the invariants each field keeps. */
#ifndef TH_TYPES_H
#define TH_TYPES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Glossary
 *
 *  block    what malloc returns: at least 16 bytes, 16-byte aligned. A free block holds `next` in its first
 *           word and the double-free tag (free_tag: the address plus a constant) in its second.
 *  page     a run of memory holding blocks of one size class, with three free lists (free, local_free,
 *           thread_free). Small pages are 64 KiB (blocks up to 4 KiB), medium 2 MiB (up to 64 KiB), a large
 *           page is a whole segment.
 *  segment  a 4 MiB region, aligned to 4 MiB, owned by one heap, carved into pages of one kind; its header
 *           (th_segment_t) holds the page descriptors. A huge block is a segment of its own, of any multiple
 *           of 4 MiB. The segment map finds the segment of any pointer in O(1).
 *  heap     per size class, a queue of pages; a thread's default heap is reached through an initial-exec
 *           TLS pointer. When the thread exits its segments are abandoned; another thread adopts them.
 *  class    a size class: multiples of 16 up to 128 bytes, then four classes per power of two up to 1 MiB.
 */

#define TH_SEGMENT_SHIFT 22
#define TH_SEGMENT_SIZE ((size_t)1 << TH_SEGMENT_SHIFT)
#define TH_SMALL_PAGE_SHIFT 16  /* 64 KiB pages, blocks up to 4 KiB */
#define TH_MEDIUM_PAGE_SHIFT 21 /* 2 MiB pages, blocks up to 64 KiB (see docs/design.md for why so large) */
#define TH_SMALL_MAX ((size_t)4 << 10)  /* past it, blocks come from medium pages (see docs/design.md) */
#define TH_MEDIUM_MAX ((size_t)64 << 10)
#define TH_LARGE_MAX ((size_t)1 << 20) /* the largest block served from heap pages; above it: huge */
/* A realloc that grows a block past this makes it huge, whatever its size: later growth is remapped in place
 * instead of copied (alloc.c; glibc's default mmap threshold). */
#define TH_REALLOC_HUGE_MIN ((size_t)128 << 10)
#define TH_DIRECT_MAX 1024             /* malloc(n) for n <= this is a table lookup and a pop */
#define TH_DIRECT_SLOTS (TH_DIRECT_MAX / 16 + 1)
/* Past TH_DIRECT_MAX, every class size up to TH_MEDIUM_MAX is a multiple of 256, and every one past that a
 * multiple of 16 KiB: two more tables, a slot per 256 bytes and per 16 KiB, make every malloc up to
 * TH_LARGE_MAX a lookup and a pop. */
#define TH_DIRECT_MEDIUM_SLOTS (TH_MEDIUM_MAX / 256 + 1)
#define TH_DIRECT_LARGE_SLOTS (TH_LARGE_MAX / 16384 + 1)
#define TH_CLASS_COUNT 61 /* classes 1..60; class 60 is exactly TH_LARGE_MAX */
#define TH_ADDRESS_BITS 47
/* Address map entries (segment.c): 0 not ours; k in 1..253: the segment starts k-1 regions back; 255: look
 * again 253 regions back; TH_MAP_SLOW: a segment starts here whose every free takes secure_free_fast
 * (th_free's test for 1 fails): a segment of sampled blocks (profile.c) or a secure-mode segment (secure.c). */
#define TH_MAP_SLOW 254
#define TH_MAP_BACK_MAX 253
#define TH_MAP_ENTRIES ((size_t)1 << (TH_ADDRESS_BITS - TH_SEGMENT_SHIFT))
#define TH_EXTEND_BYTES 4096 /* a page is carved this many bytes (or one block) at a time */
#define TH_PURGE_BLOCK_MIN ((size_t)8 << 10) /* free blocks past this span whole OS pages: see heap_purge */
#define TH_USED_BITS 20 /* th_page_t.used_word: a page holds at most 4,096 blocks, well under 2^20 */
#define TH_USED_MASK (((uint32_t)1 << TH_USED_BITS) - 1)
#define TH_FREE_ADD (((uint32_t)1 << TH_USED_BITS) - 1) /* one fewer used, one more owner free counted */
#define TH_FREE_COUNT_WRAP ((uint32_t)1 << (32 - TH_USED_BITS)) /* owner frees per carry: 4,096 */

typedef enum th_kind_e {
  TH_KIND_SMALL = 0,
  TH_KIND_MEDIUM = 1,
  TH_KIND_LARGE = 2,
  TH_KIND_HUGE = 3,
} th_kind_t;
#define TH_KINDS_PAGED 3 /* small, medium, large: the kinds a heap carves into pages */

typedef struct th_block_s {
  struct th_block_s *next; /* next free block of the same page, or NULL */
  uintptr_t tag;           /* free_tag(block) while free; 0 once malloc hands it out */
} th_block_t;

/* States of a page's thread_free word, kept in its two low bits (blocks are 16-byte aligned). They let a
 * remote free tell the owner about a page it had put aside as full, without the owner scanning its full
 * pages: only the FULL -> FREEING transition reads the owner heap, and abandon waits out FREEING. */
typedef enum th_delay_e {
  TH_TF_NORMAL = 0,   /* push blocks and say nothing */
  TH_TF_FULL = 1,     /* the owner parked the page as full: the next remote free puts it on heap->ready */
  TH_TF_FREEING = 2,  /* a remote free is putting the page on heap->ready now; others wait */
  TH_TF_NOTIFIED = 3, /* the page is on heap->ready; push blocks and say nothing */
} th_delay_t;
#define TH_TF_MASK ((uintptr_t)3)
/* The thread_free word: [63..48] how many blocks the stack holds, [47..4] the top block, [1..0] the state.
 * Keeping the count in the word tells the owner whether a page is empty (page_is_empty) without walking
 * blocks that another core just wrote. A page holds at most 4,096 blocks, well under 2^16. */
#define TH_TF_COUNT_SHIFT 48
#define TH_TF_PTR_MASK ((((uintptr_t)1 << TH_TF_COUNT_SHIFT) - 1) & ~TH_TF_MASK)

typedef struct th_heap_s th_heap_t;
typedef struct th_segment_s th_segment_t;

/* A thread's frees into one page of another thread heap, held to be pushed as one chain (free.c): head to
 * tail, n blocks; page NULL when the slot holds none. A slot per page index modulo TH_REMOTE_BATCHES. */
#define TH_REMOTE_BATCHES 32
typedef struct th_remote_batch_s {
  struct th_page_s *page;
  th_block_t *head, *tail;
  size_t n;
} th_remote_batch_t;
typedef struct th_remote_batches_s {
  uint64_t held; /* bit i: slot[i] holds blocks */
  th_remote_batch_t slot[TH_REMOTE_BATCHES];
} th_remote_batches_t;
typedef struct th_sampler_s th_sampler_t; /* profile.c: a thread heap's sampling state */
typedef struct th_secure_heap_s th_secure_heap_t; /* secure.c: a secure heap's quarantine */
struct profile_stack_s;

/* A slow-path lock (th_lock in internal.h). holder is the thread that holds it (its thread pointer), so that
 * a fork from a signal handler that interrupted that thread inside the lock does not wait for it
 * (fork_prepare skips it: the interrupted code finishes and releases it, in the parent and in the child).
 * fork_level: the level of the fork_prepare that took it (0: not taken by one), so that each fork handler
 * releases exactly what its own prepare took, also when one fork interrupts another's prepare. */
typedef struct th_mutex_s {
  pthread_mutex_t m;
  _Atomic(uintptr_t) holder;
  unsigned fork_level;
} th_mutex_t;
#define TH_MUTEX_INIT {PTHREAD_MUTEX_INITIALIZER, 0, 0}

/* Invariants (page_is_valid checks them in debug builds):
 *   capacity <= reserved;   start + reserved * block_size <= page end
 *   page_used == capacity - |free| - |local_free|   (blocks in thread_free still count as used)
 *   in_use == 0  =>  the page is in no heap queue, and its lists are empty
 *   in_full == 1 <=> the page is in heap->full, and its thread_free state is FULL, FREEING or NOTIFIED
 *   in_full == 1  =>  used_word >> TH_USED_BITS is all ones until the owner's next free into the page,
 *                     which carries (th_free's one test) and unparks it
 *   page of a secure segment  =>  free == local_free == NULL whenever the program runs: its free blocks wait
 *                     on secure_free, so neither malloc fast path can pop one, and
 *                     page_used == capacity - |secure_free|   (quarantined blocks still count as used)
 * Only the owner thread touches the fields above thread_free; any thread may push onto thread_free. */
typedef struct th_page_s {
  th_block_t *free;       /* malloc pops from here; the owner's frees push here (LIFO) */
  /* The segment's thread_id, copied into every page descriptor (segment_set_owner): th_free finds the page
   * through the page map and tests its owner there, without the segment. Written with thread_id, by
   * whichever thread changes that (unlike the fields around it); on the first cache line, which th_free
   * reads anyway. */
  _Atomic(uintptr_t) owner;
  /* Low TH_USED_BITS bits: blocks handed out and not freed to free/local_free (page_used reads them). The
   * bits above count the owner's frees modulo 2^(32 - TH_USED_BITS): such a free adds TH_FREE_ADD (used >= 1,
   * so that is used - 1 and a carry into the count), and the carry out of the word, once every 4,096 frees,
   * is the heap's clock tick (heap_free_tick): a thread whose mallocs and frees never leave their fast
   * paths still purges. Parking a page as full sets the count to all ones, so the same carry test catches
   * the first free into it. */
  uint32_t used_word;
  uint32_t block_size;    /* for a huge segment: usable bytes of its one block */
  /* Blocks carved so far; the rest of the page is untouched. 64 bits though it never passes 4,096: the
   * block-start test compares a 64-bit index with it straight from memory. */
  uint64_t capacity;
  /* block_size = d * 2^block_shift with d odd; block_inv = d^-1 mod 2^64. For an offset x from start,
   * rotate_right(x * block_inv, block_shift) is x / block_size when block_size divides x, and larger than any
   * block count when it does not (or when x is "negative"): one multiply tells a block start and its index.
   * Both 0 for a free page slot or a huge block, where the test then fails against capacity 0. */
  uint64_t block_inv;
  uint8_t *start;         /* first block */
  uint8_t class_idx;      /* 0 for a free page slot or a huge block */
  uint8_t in_use;         /* the page belongs to a heap queue (or is a huge block) */
  uint8_t in_full;
  uint8_t has_aligned;    /* some block was handed out at an offset for alignment (tag at p - 8) */
  uint8_t is_purged;      /* page memory was returned to the OS since the page was last used */
  uint8_t purge_pending;  /* the free page is on its heap's purge queue */
  uint8_t block_shift;
  uint8_t interior_purged; /* heap_purge returned the insides of the free blocks (see idle_free) */
  uint32_t committed;     /* bytes of this page counted as committed (carved bytes rounded to OS pages) */
  uint16_t reserved;      /* blocks that fit in the page (at most 4,096) */
  /* The owner's flags, one byte: */
  uint8_t tail_fresh : 1; /* the uncarved rest of the page is fresh from the OS (page_extend counts fresh bytes) */
  /* The slot's whole area reads as zero: fresh from the OS, or purged from its first byte to its last (is_purged
   * alone allows unpurged partial OS pages at the ends). page_init moves it to zero_blocks and clears it. */
  uint8_t is_zero : 1;
  /* Every block carved from this page was zero when carved, so one never handed out (a free-list block whose
   * tag is still 0: every free tags the block) is zero but for its link word: th_calloc skips its memset. */
  uint8_t zero_blocks : 1;
  /* The owner's free count carried since page_init (heap_free_tick): the owner freed blocks into the page
   * though the count may read 0 (it wrapped, or the free that unparked the page reset it). heap_sweep tells
   * a page the owner worked in from one whose blocks all came back by other threads' frees. */
  uint8_t owner_freed : 1;
  /* Where the slot is (pool.c), for a small page of a thread heap's segment: TH_OUT_HOME in its segment's heap,
   * or out of it. Written under the pool's lock, by a borrower returning or orphaning the page on its way onto
   * the pool's incoming stack, and by the remote free that claimed a handed-off page (TH_OUT_RECYCLE); read
   * with relaxed atomics, also by remote frees (a FULL page that is an orphan is told about by its last free). */
  uint8_t out;
  _Atomic(uintptr_t) thread_free;  /* remote frees: a block stack, its length and a state (see TH_TF_*) */
  struct th_page_s *next, *prev;   /* heap queue, full queue or purge queue */
  struct th_page_s *ready_next;    /* link on heap->ready (pushed by a remote thread) */
  uint64_t free_since_ms;          /* when the page slot went free, for purging */
  /* Remote frees collected while free held blocks; moved to free when free runs dry (heap_malloc_queue).
   * On the second cache line: its place on the first is owner's. */
  th_block_t *local_free;
  union {
    /* heap_purge's view of a page in use of blocks past TH_PURGE_BLOCK_MIN: `used_word` and `free` at its
     * last round, and since when (os_now_ms, modulo 2^32) they have not changed. Not in secure mode. */
    th_block_t *idle_free;
    /* Secure mode (secure.c): the free list. Each block's next word holds next ^ the page's key ^ the word's
     * own address; the head, in the segment header (which a guard page keeps apart from the blocks), is
     * plain. Reset by page_init. */
    th_block_t *secure_free;
  };
  union {
    struct {
      uint32_t idle_used;
      uint32_t idle_since_ms;
    };
    /* Secure mode (secure.c): the page's key, random, drawn at its first carve: links on secure_free are
     * encoded with it and the blocks' secrets (canary, size record) derived from it. */
    uint64_t secure_key;
  };
} th_page_t;
/* 128 bytes: a power-of-two size turns the page lookup into a shift. */
_Static_assert(sizeof(th_page_t) == 128, "th_page_t is 128 bytes");

/* th_page_t.out: a small page slot lent by its segment's heap to the process's pool (pool.c). */
enum {
  TH_OUT_HOME = 0,     /* the segment's heap's, like any other slot */
  TH_OUT_LENT = 1,     /* a free slot in the pool, still counted in its segment's used_pages */
  TH_OUT_BORROWED = 2, /* in use by another thread heap (segment's borrower table names it) */
  TH_OUT_ORPHAN = 3,   /* no heap's: its borrower exited with blocks in it, or its heap handed it off full;
                        * waits in the pool until its blocks come back or a heap adopts it */
  TH_OUT_RECYCLE = 4,  /* a handed-off page whose blocks all came back: on its way to the pool's free slots */
};

typedef struct th_page_queue_s {
  th_page_t *first, *last;
} th_page_queue_t;

/* Invariants:
 *   (uintptr_t)segment % TH_SEGMENT_SIZE == 0;  size % TH_SEGMENT_SIZE == 0
 *   map[(segment >> TH_SEGMENT_SHIFT) + i] == segment  for every i < size / TH_SEGMENT_SIZE while mapped
 *   used_pages == count of pages[i].in_use + count of pages[i].out == TH_OUT_LENT  (a slot out of its heap
 *     keeps the segment: pool.c)
 *   thread_id == heap->thread_id when owned by a heap; 0 when abandoned, cached or huge
 *   pages[i].owner == thread_id  for every i < page_count with out == TH_OUT_HOME (segment_set_owner writes
 *     them together); a borrowed page's owner is its borrower's thread, a lent slot's and an exited
 *     borrower's orphan's 0, a page handed off full its handing thread's | TH_OWNER_HANDED
 *   the borrower table after pages[] (small segments): the borrowing heap of each page with out == BORROWED
 *   page map words for [segment, segment + size) (segment.c): its pages' descriptors while it is laid out
 *     in pages and neither secure nor sampled; &th_page_map_slow's offset while it is one of those; else 0
 *   heap == the owner heap; NULL when abandoned or cached, and for huge blocks of thread heaps
 *   kind != TH_KIND_HUGE  =>  [segment, segment + commit_end) is writable, the rest has no access, and every
 *     carved block lies below commit_end (lazy commit, segment.c)
 *   is_lazy  =>  a huge block's segment writable from its start to the block's end rounded up to 256 KiB
 *     (huge.c's lazy_end), the rest with no access
 *   in_cache  =>  writable whole (commit_end == size for one last laid out in pages; is_lazy == 0) */
struct th_segment_s {
  size_t size;               /* mapped bytes */
  uint8_t kind;              /* th_kind_t */
  uint8_t page_shift;        /* page index = (p - segment) >> page_shift; 63 for a huge segment */
  uint8_t is_zero;           /* huge: the memory is as fresh from the OS (all zero) */
  uint8_t in_cache;
  uint8_t is_pinned;         /* committed by an explicit heap's initial_size: never purged while it lives */
  /* The byte offset of p's descriptor in pages[] is (p >> page_index_shift) & page_index_mask, with
   * page_index_shift = page_shift - 7 and page_index_mask = (page_count - 1) << 7 (descriptors are 128
   * bytes): from p alone, so a free needs no subtraction, no shift back and no copy of p for it. The
   * segment is 4 MiB-aligned, so the bits the mask keeps are the page index. */
  uint8_t page_index_shift;
  /* A live thread heap's small pages (set when a heap takes the segment, cleared when it is abandoned):
   * other threads' frees into it may wait in the freeing thread's batches (free.c), since no page of a
   * thread heap is freed while a block of it is in use. Not an explicit heap's, which th_heap_destroy frees
   * whole, nor medium or large pages' (a few held blocks would hold megabytes). Atomic: an adopting heap
   * sets it while other threads free. */
  _Atomic(uint8_t) remote_batch;
  uint32_t page_count;
  uint32_t used_pages;
  _Atomic(uintptr_t) thread_id;
  _Atomic(th_heap_t *) heap;
  th_segment_t *next, *prev; /* the heap's segment list of this kind, the abandoned list, or the cache */
  uint64_t page_index_mask;  /* on the first cache line with thread_id and page_index_shift: a free reads all three */
  uint64_t cached_since_ms;  /* when it entered the cache, or was abandoned (the process clock, segment.c) */
  union {
    size_t huge_committed;   /* huge: bytes from the segment start to the block's end, in OS pages */
    /* Paged: bytes from the segment start that are writable; the rest was reserved with no access and is made
     * writable as pages are carved (lazy commit, segment_commit). size unless the segment was mapped lazily. */
    size_t commit_end;
  };
  size_t huge_size;          /* huge: the size asked for (the attribution's in_use) */
  /* huge, while profiling: the block's sample (NULL: not sampled) and its estimates (profile.c) */
  struct profile_stack_s *sample_stack;
  uint64_t sample_bytes, sample_count;
  /* owned by the profiler's sample heap: its map entry is TH_MAP_SLOW, so every free of its blocks takes
   * the checked path (free_checked), which finds the block's sample (profile.c) */
  uint8_t is_sampled;
  /* Made in secure mode (secure.c): its map entry is TH_MAP_SLOW; the header ends with a guard page, and so
   * do medium and large pages (page_area leaves them out); its pages keep their free blocks on secure_free.
   * Kept when the segment is released, so that a late double free of a huge block names its size. */
  uint8_t is_secure;
  /* Secure mode's guard pages still set in this segment (secure.c): 0 none, else the kind they were laid out
   * for plus one; guard_end, for a huge block, is the offset of the guard page after it (0: none). Kept
   * while the segment is cached, so that a segment taken again for the same layout needs no mprotect;
   * read by segment_init before it clears the header. */
  uint8_t guards;
  /* huge, made under lazy commit (huge.c): writable only to about the block's end (lazy_end of huge_committed),
   * the rest with no access; made writable whole when released into the cache. */
  uint8_t is_lazy;
  _Atomic(int) huge_live;    /* huge: 1 while the block is allocated; the exchange to 0 catches double frees */
  size_t guard_end;
  _Alignas(128) th_page_t pages[]; /* page_count descriptors, each on two whole cache lines */
};
_Static_assert(offsetof(th_segment_t, pages) == 128, "the header's fields fit in two cache lines");
_Static_assert(offsetof(th_segment_t, page_index_mask) < 64 && offsetof(th_segment_t, thread_id) < 64,
               "what a free reads of the header is on its first cache line");

typedef struct th_heap_counters_s {
  size_t committed;  /* bytes counted in this heap's pages */
  uint64_t slow_calls;
} th_heap_counters_t;

/* What left the heap's pages, per size class, counted on slow paths only (attribution.c reads it). No
 * malloc is counted: a page's allocations are (its used count) + (its owner frees) + (its collected remote
 * frees), and the owner frees are counted modulo 4,096 in used_word already, so
 *   allocs(c) = frees[c] + sum over live pages of class c of (used + owner-free count in used_word)
 *   frees(c)  = frees[c] + sum over live pages of class c of (owner-free count + remote frees pending)
 * frees[c] gains 4,096 at each clock tick, the owner-free count of a page parked as full, retired or
 * destroyed, 1 at the free that unparks a page, and every collected remote free. Written by the owner
 * (relaxed atomics), read by any thread; folded into the process-wide flow when the heap ends. */
/* A pair counted by the freeing thread's heap (pairs.c): remote frees into blocks of owner. */
#define TH_REMOTE_SLOTS 8
typedef struct th_remote_pair_slot_s {
  _Atomic(th_heap_t *) owner; /* the owning heap (NULL: blocks of exited threads) */
  _Atomic(uint64_t) count;
} th_remote_pair_slot_t;

typedef struct th_heap_flow_s {
  _Atomic(uint64_t) frees[TH_CLASS_COUNT];
  _Atomic(uint64_t) fresh[TH_CLASS_COUNT]; /* bytes carved from memory fresh from the OS */
  /* Huge blocks allocated and freed by this heap's thread, whichever heap they belong to: [0] allocated,
   * [1] freed (blocks, bytes); fresh bytes allocated straight from mmap. */
  _Atomic(uint64_t) huge_blocks[2], huge_bytes[2], huge_fresh;
} th_heap_flow_t;

/* The owner id of a serialized explicit heap's segments: no thread's id, so every free is a remote free. */
#define TH_OWNER_SHARED ((uintptr_t)1)
/* Or'd into a thread's id (a thread pointer, aligned) as the owner of a page its heap handed off full
 * (pool.c): no thread's id either, and that thread's free tells it by one xor. */
#define TH_OWNER_HANDED ((uintptr_t)1)
/* Heap flags beyond the public TH_HEAP_NO_SERIALIZE. */
#define TH_HEAP_EXPLICIT 0x100u /* made by th_heap_create */
#define TH_HEAP_SAMPLES 0x200u  /* the profiler's heap of sampled blocks (profile.c) */
#define TH_HEAP_LIVE_MAGIC 0x7448656170u  /* magic of an explicit heap from create to destroy */
#define TH_SHARDS_MAX 8 /* a serialized heap with no cap and no initial size: up to 2 shards per CPU */

/* A heap. Thread heaps are reached through th_heap_tls; only their thread allocates from them. Explicit
 * heaps (th_heap_create) are the same structure: a no-serialize heap has its creator as owner; a serialized
 * heap has owner TH_OWNER_SHARED and every allocation holds its lock.
 * Invariants:
 *   direct[w] == queues[class of (w * 16)].first, or &th_page_empty when that queue is empty
 *   direct_medium[w] == queues[class of (w * 256)].first, or &th_page_empty, for w * 256 > TH_DIRECT_MAX
 *   direct_large[w] == queues[class of (w * 16384)].first, or &th_page_empty, for w * 16384 > TH_MEDIUM_MAX
 *   secure != NULL  =>  every direct slot is &th_page_empty (every malloc takes the slow path, secure.c), and
 *                       every segment the heap owns has is_secure == 1
 *   every page in queues[c] has class_idx == c and in_full == 0; every page in full has in_full == 1
 *   max_size == 0  ||  stat.committed + huge_bytes <= max_size   (after every allocation) */
struct th_heap_s {
  th_page_t *direct[TH_DIRECT_SLOTS]; /* first: the fast path reads it at offset 0 */
  uintptr_t thread_id;                /* owner thread (its thread pointer); 0 for the empty heap */
  th_page_queue_t queues[TH_CLASS_COUNT];
  th_page_queue_t full;               /* pages with no free block, parked until a remote free */
  th_page_queue_t purge;              /* free page slots, oldest first, waiting for the purge delay */
  _Atomic(th_page_t *) ready;         /* full pages that received a remote free (pushed by other threads) */
  th_segment_t *segments[TH_KINDS_PAGED]; /* segments with a free page slot first */
  th_heap_counters_t stat;
  uint64_t next_purge_ms;             /* heap_purge does nothing before this time */
  /* The purge clock (heap_clock): wall time less the heap's pauses, the gaps between its purge rounds past
   * two round intervals (the thread slept, or ran only its fast paths), each counted as one interval. The
   * ages of the heap's free slots and idle pages are on it, so memory is not given back at the first round
   * after a pause for having waited through it: the program just woke and is about to reuse it. */
  uint64_t paused_ms;
  /* A thread heap's: its thread's CPU time (in ms, plus one: 0 until first read) and count of blocking waits
   * at its last purge round, which tell the process clock a gap the thread ran through from one it slept
   * through (heap_ran_through). */
  uint64_t round_cpu_ms, round_blocked;
  th_heap_t *next_free;               /* link in the pool of unused heap structs */
  /* explicit heaps only */
  unsigned flags;                     /* TH_HEAP_NO_SERIALIZE, TH_HEAP_EXPLICIT */
  uint64_t magic;                     /* TH_HEAP_LIVE_MAGIC from create to destroy */
  size_t max_size;                    /* cap on stat.committed + huge_bytes; 0: none */
  _Atomic(size_t) huge_bytes;         /* committed bytes of the heap's huge blocks */
  th_segment_t *huge;                 /* the heap's huge blocks, under huge_lock */
  th_segment_t *reserve;              /* pinned segments (initial_size) with no page in use */
  th_mutex_t lock;                    /* serialized heaps: held by every allocation */
  th_mutex_t huge_lock;               /* guards huge: any thread may free a huge block */
  th_heap_t *explicit_next, *explicit_prev; /* the list of live explicit heaps, for fork */
  /* A serialized heap is split into shards, each a heap with its own lock and pages, so that threads
   * allocating at once take different locks. shard[0] == the heap itself; a shard's parent is the heap. */
  th_heap_t *parent;                  /* NULL for a heap; the heap, for its shards 1..nshards-1 */
  uint32_t nshards;
  th_heap_t *shard[TH_SHARDS_MAX];
  th_page_t *direct_medium[TH_DIRECT_MEDIUM_SLOTS]; /* slots 0..TH_DIRECT_MAX/256 are never read */
  th_page_t *direct_large[TH_DIRECT_LARGE_SLOTS];   /* slots 0..TH_MEDIUM_MAX/16384 are never read */
  /* While profiling, the heap's sampling state (profile.c), from its first slow path (for the thread that
   * starts profiling, from then) to its end (thread exit, th_heap_destroy); NULL otherwise, which
   * heap_malloc_queue tests. */
  th_sampler_t *sampler;
  /* Secure mode: the heap's quarantine (secure.c), from heap_init to the heap's end; NULL for a heap made
   * with secure mode off. */
  th_secure_heap_t *secure;
  /* A thread heap's: the thread's frees into other thread heaps' small pages, held per page (free.c). */
  th_remote_batches_t remote_batches;
  /* Last, and kept across heap_init: readers may read them while the struct is reused. flow is zeroed when
   * folded (attribution_fold). */
  th_heap_flow_t flow;
  th_heap_t *all_next;                /* every heap struct ever made, newest first */
  th_sampler_t *sampler_spare; /* the sampling state made for this struct, kept for its next thread */
  th_secure_heap_t *secure_spare; /* the quarantine mapped for this struct, kept for its next heap */
  _Atomic(uint32_t) tid;              /* the Linux tid of the heap's thread (its creator's, for explicit heaps) */
  /* Remote frees by this heap's thread, per owner; slot 0 is the owner of the last one (pairs.c). */
  th_remote_pair_slot_t remote[TH_REMOTE_SLOTS];
  /* Serialized explicit heaps: allocations that took the lock, and those that had to wait for it. */
  _Atomic(uint64_t) lock_acquires, lock_waits;
  /* Another thread may free the empty pages of an idle thread heap (sweep.c). in_slow: how deep the owner is
   * in its slow paths (heap_slow_enter), written by the owner only; sweeping: 1 while a sweeper holds the
   * heap, which its owner's slow paths then wait out; swept_ms: when it was last swept, and swept_clock:
   * the heap's clock then (slots stamped at or before it were free at that sweep). Kept across heap_init,
   * like the fields above: a sweeper may look at a struct while it is being reused (an old swept_clock is
   * below every stamp of the new heap, whose clock starts at wall time).
   * sweep_kept: a sweep left segments with no page in use, which the owner's next purge round releases. */
  _Atomic(uint32_t) in_slow;
  _Atomic(uint32_t) sweeping;
  uint64_t swept_ms, swept_clock;
  bool sweep_kept;
};

#endif /* TH_TYPES_H */
