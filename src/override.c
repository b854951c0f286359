/* override.c: the standard allocation names, served by threadheap when the library is preloaded or linked.
 * Each is a tail call into the th_* entry point of the same meaning. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"
#include "os.h"

#define TH_EXPORT __attribute__((visibility("default")))

/* malloc and free are aliases of th_malloc and th_free, defined beside them. */
TH_EXPORT void *calloc(size_t count, size_t size) { return th_calloc(count, size); }
TH_EXPORT void *realloc(void *p, size_t size) { return th_realloc(p, size); }
TH_EXPORT void *reallocarray(void *p, size_t count, size_t size) { return th_reallocarray(p, count, size); }
TH_EXPORT void *aligned_alloc(size_t alignment, size_t size) { return th_aligned_alloc(alignment, size); }
TH_EXPORT int posix_memalign(void **out, size_t alignment, size_t size) {
  return th_posix_memalign(out, alignment, size);
}
TH_EXPORT void *memalign(size_t alignment, size_t size) { return th_memalign(alignment, size); }
TH_EXPORT size_t malloc_usable_size(void *p) { return th_usable_size(p); }

TH_EXPORT void *valloc(size_t size) { return th_memalign(os_page_size(), size); }

/* glibc's pvalloc rounds the size up to whole pages (one page for 0). */
TH_EXPORT void *pvalloc(size_t size) {
  size_t ps = os_page_size();
  if (size > SIZE_MAX - ps) {
    errno = ENOMEM;
    return NULL;
  }
  return th_memalign(ps, size == 0 ? ps : align_up(size, ps));
}
