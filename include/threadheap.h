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

#define TH_VERSION_MAJOR 0
#define TH_VERSION_MINOR 1

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

/* Return cached and empty memory to the OS now, for this thread's heap and the process-wide caches. */
TH_API void th_collect(void);

/* Allocator counters. Process-wide totals; gauges are exact at quiescence and approximate while threads run. */
typedef struct th_stats_s {
  size_t committed;       /* bytes of pages in use by heaps plus huge blocks, current */
  size_t committed_peak;  /* highest value of committed */
  size_t mapped;          /* bytes of address space mapped from the OS, current */
  size_t cached;          /* bytes of free segments kept committed in the segment cache */
  size_t os_maps;         /* count of OS map calls */
  size_t os_unmaps;       /* count of OS unmap calls */
  size_t os_purges;       /* count of purges (memory returned with madvise) */
  size_t purged_bytes;    /* bytes returned with madvise, total */
  size_t cache_hits;      /* huge blocks and segments served from the cache */
  size_t cache_misses;    /* huge blocks and segments that had to be mapped */
  size_t huge_allocs;     /* huge blocks allocated, total */
  size_t remote_frees;    /* frees by a thread that does not own the block, total (counted at collection) */
  size_t heaps_created;   /* thread and explicit heaps created, total */
  size_t heaps_abandoned; /* heaps whose thread exited, total */
  size_t segments_adopted;/* abandoned segments taken over by a live thread, total */
  size_t threads_live;    /* thread heaps in use now */
  size_t segments_waiting;/* abandoned segments not yet adopted, now */
} th_stats_t;

TH_API void th_stats_get(th_stats_t *out);
/* Print the counters to stderr, one per line. */
TH_API void th_stats_print(void);

#ifdef __cplusplus
}
#endif

#endif /* THREADHEAP_H */
