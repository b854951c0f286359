/* override.c: the standard allocation names, served by threadheap when the library is preloaded or linked.
 * Each is a tail call into the th_* entry point of the same meaning; malloc_trim, mallinfo2 and mallopt map
 * glibc's interface onto threadheap's own (th_collect, th_stats_get). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "os.h"

/* Referenced from alloc.c, so that a static link that pulls in malloc also pulls in this file: otherwise a
 * program calling only malloc and free would get libc's realloc and calloc beside threadheap's free. */
const char override_anchor = 1;

#define TH_EXPORT __attribute__((visibility("default")))

/* malloc, calloc, realloc, free and malloc_usable_size are aliases of their th_ functions, defined beside
 * them: a wrapper here reached them through the PLT, two jumps more. */
TH_EXPORT void *reallocarray(void *p, size_t count, size_t size) { return th_reallocarray(p, count, size); }
TH_EXPORT void *aligned_alloc(size_t alignment, size_t size) { return th_aligned_alloc(alignment, size); }
TH_EXPORT int posix_memalign(void **out, size_t alignment, size_t size) {
  return th_posix_memalign(out, alignment, size);
}
TH_EXPORT void *memalign(size_t alignment, size_t size) { return th_memalign(alignment, size); }

TH_EXPORT void *valloc(size_t size) { return th_memalign(os_page_size(), size); }

/* pvalloc rounds the size up to whole pages, and gives 0 one page (glibc 2.36 gives 0 a minimal block: its
 * mask is -(pagesize - 1)). */
TH_EXPORT void *pvalloc(size_t size) {
  size_t ps = os_page_size();
  if (size > SIZE_MAX - ps) {
    errno = ENOMEM;
    return NULL;
  }
  return th_memalign(ps, size == 0 ? ps : align_up(size, ps));
}

/* ---- the rest of glibc's interface: trimming, counters, options, and the __libc_ names */

/* malloc_trim: everything threadheap can give back now. The calling thread adopts the segments of exited
 * threads (their empty pages are freed on adoption), then its heap and the segment cache are purged with no
 * delay. pad is ignored: threadheap keeps no top chunk to leave padding on. Returns 1 when memory went back
 * to the OS, as glibc does; the counters are process-wide, so a purge by another thread at the same moment
 * also counts. */
TH_EXPORT int malloc_trim(size_t pad) {
  (void)pad;
  th_stats_t before, after;
  th_stats_get(&before);
  th_heap_t *heap = th_heap_tls;
  if (heap != &th_heap_empty) {
    heap_slow_enter(heap);
    for (size_t k = 0; k < TH_KINDS_PAGED; k++)
      while (segment_try_adopt(heap, (th_kind_t)k, 0)) {
      }
    heap_slow_exit(heap);
  }
  th_collect();
  th_stats_get(&after);
  return after.purged_bytes != before.purged_bytes || after.os_unmaps != before.os_unmaps;
}

/* mallinfo2 from th_stats_get's attribution (docs/design.md has the table):
 *   arena     bytes mapped from the OS (segments, huge blocks, the segment cache)
 *   uordblks  bytes in blocks the program holds (in_use)
 *   fordblks  resident bytes not in use: free blocks in pages, empty pages, the segment cache
 *   keepcost  bytes in the segment cache, which malloc_trim releases
 *   usmblks   the highest in_use seen
 *   ordblks, smblks, hblks, hblkhd, fsmblks  0: threadheap counts no free blocks, and maps every block the
 *             same way, so there is no separate mmap count. */
TH_EXPORT struct mallinfo2 mallinfo2(void) {
  th_stats_t s;
  th_stats_get(&s);
  struct mallinfo2 mi;
  memset(&mi, 0, sizeof mi);
  mi.arena = s.mapped;
  mi.uordblks = s.in_use;
  mi.fordblks = s.free_in_pages + s.empty_pages + s.cached;
  mi.keepcost = s.cached;
  mi.usmblks = s.in_use_peak;
  return mi;
}

static int saturate(size_t v) { return v > (size_t)INT_MAX ? INT_MAX : (int)v; }

/* mallinfo: the same values, each clamped to INT_MAX (glibc's int fields wrap; saturating is more useful). */
static struct mallinfo mallinfo_int(void) {
  struct mallinfo2 m = mallinfo2();
  struct mallinfo mi;
  memset(&mi, 0, sizeof mi);
  mi.arena = saturate(m.arena);
  mi.uordblks = saturate(m.uordblks);
  mi.fordblks = saturate(m.fordblks);
  mi.keepcost = saturate(m.keepcost);
  mi.usmblks = saturate(m.usmblks);
  return mi;
}
TH_EXPORT struct mallinfo mallinfo(void) { return mallinfo_int(); }

/* malloc_stats: the counters to stderr, as th_stats_print writes them, then glibc's summary lines (tools parse
 * them) from the same numbers: one arena, all of threadheap. Like glibc's, it is no cancellation point: a
 * thread with a cancellation pending prints everything and is cancelled at its next cancellation point. */
TH_EXPORT void malloc_stats(void) {
  int old_state;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old_state);
  th_stats_print();
  th_stats_t s;
  th_stats_get(&s);
  char buf[512];
  int n = snprintf(buf, sizeof buf,
                   "Arena 0:\nsystem bytes     = %10zu\nin use bytes     = %10zu\n"
                   "Total (incl. mmap):\nsystem bytes     = %10zu\nin use bytes     = %10zu\n"
                   "max mmap regions = %10u\nmax mmap bytes   = %10u\n",
                   s.mapped, s.in_use, s.mapped, s.in_use, 0u, 0u);
  if (n > 0) os_write_err(buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
  pthread_setcancelstate(old_state, NULL);
}

/* malloc_info: the counters as XML, in the shape glibc uses (a <malloc> element of <total> lines). */
TH_EXPORT int malloc_info(int options, FILE *fp) {
  if (options != 0) return EINVAL; /* as glibc: the error number, errno untouched */
  th_stats_t s;
  th_stats_get(&s);
  fprintf(fp,
          "<malloc version=\"threadheap-%d.%d\">\n"
          "<total type=\"mapped\" size=\"%zu\"/>\n"
          "<total type=\"committed\" size=\"%zu\"/>\n"
          "<total type=\"committed_peak\" size=\"%zu\"/>\n"
          "<total type=\"cached\" size=\"%zu\"/>\n"
          "<total type=\"in_use\" size=\"%zu\"/>\n"
          "<total type=\"free_in_pages\" size=\"%zu\"/>\n"
          "<total type=\"empty_pages\" size=\"%zu\"/>\n"
          "<total type=\"metadata\" size=\"%zu\"/>\n"
          "<total type=\"not_resident\" size=\"%zu\"/>\n"
          "<system type=\"current\" size=\"%zu\"/>\n"
          "<system type=\"max\" size=\"%zu\"/>\n"
          "</malloc>\n",
          TH_VERSION_MAJOR, TH_VERSION_MINOR, s.mapped, s.committed, s.committed_peak, s.cached, s.in_use,
          s.free_in_pages, s.empty_pages, s.metadata, s.purged, s.mapped, s.committed_peak);
  return 0;
}

/* A private mallopt parameter: threadheap answers it with TH_MALLOPT_ME, which lets one copy of threadheap
 * ask whether the mallopt that serves the process is another copy's (see check_one_copy). */
#define TH_MALLOPT_IDENTIFY 0x74680001
#define TH_MALLOPT_ME 0x7468

/* mallopt: glibc's parameters (M_MMAP_THRESHOLD, M_ARENA_MAX, ...) tune mechanisms threadheap does not
 * have; each is accepted and ignored, and the answer is 1 (success), as glibc gives for any parameter it
 * takes. threadheap's own options are environment variables (README). */
static int override_mallopt(int param, int value) {
  (void)value;
  return param == TH_MALLOPT_IDENTIFY ? TH_MALLOPT_ME : 1;
}
TH_EXPORT int mallopt(int param, int value) __attribute__((alias("override_mallopt")));

/* The __libc_ names glibc 2.36 exports for its own allocator; some programs and interposers call them
 * directly. Each serves the same block as its standard namesake. */
TH_EXPORT void *__libc_malloc(size_t size) { return th_malloc(size); }
TH_EXPORT void __libc_free(void *p) { th_free(p); }
TH_EXPORT void *__libc_calloc(size_t count, size_t size) { return th_calloc(count, size); }
TH_EXPORT void *__libc_realloc(void *p, size_t size) { return th_realloc(p, size); }
TH_EXPORT void *__libc_memalign(size_t alignment, size_t size) { return th_memalign(alignment, size); }
TH_EXPORT void *__libc_valloc(size_t size) { return valloc(size); }
TH_EXPORT void *__libc_pvalloc(size_t size) { return pvalloc(size); }
TH_EXPORT struct mallinfo __libc_mallinfo(void) { return mallinfo_int(); }
TH_EXPORT int __libc_mallopt(int param, int value) __attribute__((alias("override_mallopt")));

/* ---- two copies in one process

 * A program linked with the static library and also run with the shared one preloaded (or loading it with
 * dlopen) holds two copies of threadheap, each with its own segment map: a block of one freed by the other
 * would be an invalid pointer. The copy whose standard names the process does not use asks the mallopt that
 * the dynamic linker resolves whether it belongs to threadheap, and stops the process if so. The check runs
 * once, in the constructor of each copy: a forked child runs no constructor, and after exec the new image
 * checks itself afresh. It reads no memory: it calls a function the dynamic linker found. */
__attribute__((constructor(102))) static void check_one_copy(void) {
  int (*global)(int, int) = (int (*)(int, int))dlsym(RTLD_DEFAULT, "mallopt");
  if (global == NULL || global == override_mallopt) return;
  if (global(TH_MALLOPT_IDENTIFY, 0) == TH_MALLOPT_ME)
    report_fatal("two copies of threadheap in one process (a static copy linked into the program and a "
                 "shared one preloaded or loaded with dlopen); use one of them");
}
