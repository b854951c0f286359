/* threadheap.h: the public interface of libthreadheap, a contention-free allocator with thread-private heaps.
 *
 * The th_* functions follow the C and POSIX semantics of their standard namesakes as glibc 2.36 implements
 * them: every block is at least 16 bytes and 16-byte aligned, malloc(0) returns a unique pointer, size
 * overflow returns NULL with errno ENOMEM, and misuse (double free, a pointer threadheap never returned)
 * stops the process with one line on stderr that starts "threadheap:".
 *
 * Linking libthreadheap into a program (or preloading it) also replaces malloc, free and the rest of the
 * standard allocation interface, process-wide.
 */
#ifndef THREADHEAP_H
#define THREADHEAP_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TH_API __attribute__((visibility("default")))
#define TH_MALLOC_ATTR __attribute__((malloc, warn_unused_result))
#else
#define TH_API
#define TH_MALLOC_ATTR
#endif

/* threadheap's version, in one place: CMake's project(VERSION) reads these three lines (in this order), and
 * from it come the library's file name, threadheap.pc, the CMake package and the .deb. th_version() returns
 * the same as text, "MAJOR.MINOR.PATCH", which `threadheap --version` prints. */
#define TH_VERSION_MAJOR 0
#define TH_VERSION_MINOR 1
#define TH_VERSION_PATCH 0
TH_API const char *th_version(void);

/* The malloc family. */
TH_API TH_MALLOC_ATTR void *th_malloc(size_t size);
TH_API TH_MALLOC_ATTR void *th_calloc(size_t count, size_t size);
TH_API void *th_realloc(void *p, size_t size);
TH_API void *th_reallocarray(void *p, size_t count, size_t size);
TH_API void th_free(void *p);
TH_API TH_MALLOC_ATTR void *th_aligned_alloc(size_t alignment, size_t size);
TH_API int th_posix_memalign(void **out, size_t alignment, size_t size);
TH_API TH_MALLOC_ATTR void *th_memalign(size_t alignment, size_t size);
TH_API size_t th_usable_size(const void *p);

/* Explicit heaps: a private or shared heap of the program's own, built on the same pages and segments as the
 * per-thread heaps (the seeds' HeapCreate, on Linux).
 *
 *  th_heap_create(flags, initial_size, max_size)
 *    initial_size  bytes committed and touched at creation, so the first allocations take no page faults;
 *                  they stay committed (never purged) while the heap lives.
 *    max_size      cap on the heap's committed bytes (its pages' carved memory plus its huge blocks); 0 for
 *                  no cap. An allocation that would pass it returns NULL with errno ENOMEM, after the heap
 *                  has collected the blocks other threads freed into it; the heap stays usable.
 *    flags         TH_HEAP_NO_SERIALIZE: only the creating thread allocates from the heap, with no lock and
 *                  no atomic read-modify-write; any thread may free its blocks. An allocation from another
 *                  thread stops the process with a "threadheap:" message. Without the flag any thread may
 *                  allocate, under the heap's lock.
 *    Unknown flags, or initial_size > max_size with a cap: NULL with errno EINVAL.
 *  th_heap_destroy(heap) frees every block of the heap at once, in time proportional to its pages. Freeing
 *    one of its blocks during or after destroy is misuse. th_heap_destroy(NULL) does nothing.
 *  th_free(p), th_realloc(p, n) and th_usable_size(p) work for blocks of every heap, from any thread; a block
 *    stays in its heap across th_realloc (a no-serialize heap's block reallocated by another thread moves to
 *    that thread's default heap). th_heap_realloc(h, p, n) with p from another heap allocates in h, copies
 *    and frees p. Functions given a NULL heap return NULL with errno EINVAL. */
typedef struct th_heap_s th_heap_t;
#define TH_HEAP_NO_SERIALIZE 0x1u

TH_API th_heap_t *th_heap_create(unsigned flags, size_t initial_size, size_t max_size);
TH_API void th_heap_destroy(th_heap_t *heap);
TH_API TH_MALLOC_ATTR void *th_heap_malloc(th_heap_t *heap, size_t size);
TH_API TH_MALLOC_ATTR void *th_heap_calloc(th_heap_t *heap, size_t count, size_t size);
TH_API void *th_heap_realloc(th_heap_t *heap, void *p, size_t size);
TH_API TH_MALLOC_ATTR void *th_heap_aligned_alloc(th_heap_t *heap, size_t alignment, size_t size);

/* Return cached and empty memory to the OS now, for this thread's heap and the process-wide caches. */
TH_API void th_collect(void);

/* Allocator counters. Process-wide totals; gauges are exact at quiescence and approximate while threads run. */
typedef struct th_stats_s {
  size_t committed;       /* bytes of pages in use by heaps plus huge blocks, current */
  size_t committed_peak;  /* highest value of committed */
  size_t mapped;          /* bytes of address space mapped from the OS, current */
  size_t cached;          /* resident bytes of the free segments in the segment cache */
  size_t os_maps;         /* count of OS map calls */
  size_t os_unmaps;       /* count of OS unmap calls */
  size_t os_purges;       /* count of purges (memory returned with madvise) */
  size_t purged_bytes;    /* bytes returned with madvise, total */
  size_t cache_hits;      /* huge blocks and segments served from the cache */
  size_t cache_misses;    /* huge blocks and segments that had to be mapped */
  size_t huge_allocs;     /* huge blocks allocated, total */
  size_t remote_frees;    /* frees by a thread that does not own the block, total (counted at collection;
                           * each thread adds its count in batches of 1,024, and the rest when it reads
                           * the counters or exits) */
  size_t heaps_created;   /* thread and explicit heaps created, total */
  size_t heaps_abandoned; /* heaps whose thread exited, total */
  size_t segments_adopted;/* abandoned segments taken over by a live thread, total */
  size_t threads_live;    /* thread heaps in use now */
  size_t segments_waiting;/* abandoned segments not yet adopted, now */
  size_t os_calls;        /* system calls that mapped, unmapped or advised memory, total */
  size_t os_call_ns;      /* time spent inside them, ns, total */
  /* Where the memory threadheap holds goes, computed when read (a walk of every segment's header), as
   * RSS attribution: the first five are resident, `purged` is address space that is not. Their sum is
   * `mapped` plus the touched part of the segment map (in `metadata`). in_use is exact while no other
   * thread allocates or frees, and close otherwise. */
  size_t in_use;          /* bytes in blocks the program holds (size-class sizes; huge blocks to their end page) */
  size_t free_in_pages;   /* resident bytes of pages in use beyond their blocks held: fragmentation */
  size_t empty_pages;     /* resident bytes of page slots with no page, waiting for the purge delay */
  size_t metadata;        /* segment headers and page descriptors, heap structs, the segment map */
  size_t purged;          /* mapped but not resident: returned to the OS, or never touched */
  size_t in_use_peak;     /* the highest in_use seen: at every read, and at every huge allocation (with the
                           * smaller blocks' part as of the last read) */
  /* Blocks and bytes allocated and freed since start, computed when read like the attribution (no counter on
   * the fast paths). Bytes are size-class sizes (huge blocks: the size asked for); a realloc of a huge block
   * counts as a free and an allocation. fresh: handed out from memory new from the OS (each of its pages
   * costs the program a first-touch fault and kernel zeroing); reused: from memory already touched. */
  size_t allocs, frees, alloc_bytes, free_bytes, fresh_bytes, reused_bytes;
  /* The same per size range: [0] small (up to 4 KiB), [1] medium (to 64 KiB), [2] large (to 1 MiB), [3] huge. */
  size_t range_allocs[4], range_frees[4], range_alloc_bytes[4], range_free_bytes[4], range_fresh_bytes[4];
  /* Serialized explicit heaps: allocations that took a heap's lock, and those that had to wait for it. */
  size_t heap_lock_acquires, heap_lock_waits;
  /* realloc of huge blocks (and of blocks it grows past 128 KiB, which become huge): grown in place (within
   * the block's segment, or by mremap), moved by the kernel (mremap), and the bytes neither had to copy (the
   * old block's size), total. */
  size_t remaps_in_place, remaps_moved, remap_bytes_not_copied;
  /* Free small page slots that thread heaps lend each other: in the pool now (committed or purged); pages
   * a heap took from another heap's slots (and pages of exited threads it took over), total; pages whose
   * borrower exited with blocks in them, total; full pages a heap handed to the pool for other threads'
   * frees to empty, total. */
  size_t pool_slots, pages_borrowed, pages_orphaned, pages_handed_off;
} th_stats_t;

TH_API void th_stats_get(th_stats_t *out);
/* The same for one explicit heap: where its memory goes (in_use ... purged, mapped and committed counting its
 * own segments, huge blocks and structs), its allocations and frees per range (its huge blocks in in_use
 * only), and its lock's acquisitions and waits; the process-wide fields are 0. Returns 0, or -1 with errno
 * EINVAL for a NULL heap or out; a destroyed heap stops the process. */
TH_API int th_heap_stats_get(th_heap_t *heap, th_stats_t *out);

/* Who frees whose memory: remote frees (a block freed by a thread other than its owner) per pair of freeing
 * thread and owning thread, Linux thread ids (owner 0: blocks whose thread had exited; for an explicit
 * heap, its creator). Up to max pairs into out, the most frees first; returns how many (with out NULL: how
 * many there are). Each thread keeps its 8 largest owners; exited threads' pairs are kept too. Counted only
 * with THREADHEAP_REMOTE_PAIRS=1, which the live export and THREADHEAP_SHOW_STATS turn on by default (it
 * slows remote frees by about a quarter); otherwise there are none. */
typedef struct th_remote_pair_s {
  int free_tid;
  int owner_tid;
  size_t frees;
} th_remote_pair_t;
TH_API size_t th_stats_remote_pairs(th_remote_pair_t *out, size_t max);
/* Print where the memory goes (a table) and the counters to stderr. */
TH_API void th_stats_print(void);

/* Heap profiling (THREADHEAP_PROFILE=PATH turns it on; docs/profile.md). Writes the profile of the sampled
 * allocations so far to path, in pprof's format (gzipped profile.proto). 0, or -1 with errno set: ENOTSUP
 * when profiling is off, EINVAL for an empty path, or the error of creating or writing the file. */
TH_API int th_profile_dump(const char *path);

#ifdef __cplusplus
}
#endif

#endif /* THREADHEAP_H */
