/* live_peak.c: the most bytes a program held live at once, whatever allocator serves it.
 *
 * Preloaded ahead of the allocator under test (LD_PRELOAD="build/lib/liblive_peak.so <allocator>.so"), it
 * passes every call of the malloc family on to the next definition (RTLD_NEXT) and keeps a count of the
 * bytes live, as that allocator's malloc_usable_size reports them, and its high-water mark, which each
 * process prints on stderr at exit: "live_peak: pid <pid>: <bytes> bytes" (a forked child starts from its
 * parent's count). Beside a program's peak RSS, it tells the program's memory from its allocator's: how much
 * the allocator held beyond what was live at the worst moment (docs/mimalloc-bench.md, rptest). The count
 * is exact, not sampled, and costs an atomic add and a malloc_usable_size a call: a tool to measure memory
 * with, not to time a program under.
 *
 * Counted: malloc, calloc, realloc, reallocarray, free, memalign, aligned_alloc, posix_memalign, valloc,
 * pvalloc, and C++'s plain and array operator new and delete (sized or not) where the allocator beneath
 * defines them beside its malloc, as threadheap does; libstdc++'s own call malloc and free, counted there.
 * Not counted: the aligned and nothrow forms of new and delete, memory a program maps itself, and dlsym's
 * own allocations while the functions beneath are looked up (a small static buffer serves them). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *(*next_malloc)(size_t);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static void (*next_free)(void *);
static void *(*next_memalign)(size_t, size_t);
static void *(*next_aligned_alloc)(size_t, size_t);
static int (*next_posix_memalign)(void **, size_t, size_t);
static void *(*next_valloc)(size_t);
static void *(*next_pvalloc)(size_t);
static size_t (*next_usable_size)(void *);
static void *(*next_new)(size_t);
static void *(*next_new_array)(size_t);
static void (*next_delete)(void *);
static void (*next_delete_array)(void *);

static _Atomic(long) live, peak;
static bool count_new; /* the allocator beneath defines operator new beside its malloc */

/* dlsym may allocate (its error buffer) before next_calloc is known: such blocks come from here and are
 * never freed on (free ignores them). */
static _Alignas(16) unsigned char boot[4096];
static _Atomic(size_t) boot_used;

static bool from_boot(const void *p) {
  return (const unsigned char *)p >= boot && (const unsigned char *)p < boot + sizeof boot;
}

static void *boot_alloc(size_t n) {
  size_t at = atomic_fetch_add(&boot_used, (n + 15) & ~(size_t)15);
  return at + n <= sizeof boot ? boot + at : NULL;
}

/* The thread that looks the functions up: its own allocations meanwhile (dlsym's) come from boot. */
static _Thread_local bool resolving;

/* Do f and g come from the same loaded object? */
static bool same_object(void *f, void *g) {
  Dl_info a, b;
  return f != NULL && g != NULL && dladdr(f, &a) != 0 && dladdr(g, &b) != 0 && a.dli_fbase == b.dli_fbase;
}

static void resolve(void) {
  static _Atomic(int) state; /* 0 not yet, 1 being looked up, 2 done */
  int expected = 0;
  if (!atomic_compare_exchange_strong(&state, &expected, 1)) {
    while (atomic_load(&state) != 2) {
    }
    return;
  }
  resolving = true;
  next_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
  next_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
  next_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
  next_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
  next_memalign = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "memalign");
  next_aligned_alloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
  next_posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
  next_valloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "valloc");
  next_pvalloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "pvalloc");
  next_usable_size = (size_t(*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
  /* C++'s operators only when the allocator beneath defines them beside its malloc: libstdc++'s call malloc
   * and free, counted there, and counting them here too would count those blocks twice. */
  next_new = (void *(*)(size_t))dlsym(RTLD_NEXT, "_Znwm");
  next_new_array = (void *(*)(size_t))dlsym(RTLD_NEXT, "_Znam");
  next_delete = (void (*)(void *))dlsym(RTLD_NEXT, "_ZdlPv");
  next_delete_array = (void (*)(void *))dlsym(RTLD_NEXT, "_ZdaPv");
  count_new = same_object(next_malloc, (void *)next_new);
  if (!next_malloc || !next_calloc || !next_realloc || !next_free || !next_usable_size) {
    static const char msg[] = "live_peak: the malloc family beneath was not found\n";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
    abort();
  }
  resolving = false;
  atomic_store(&state, 2);
}

static void count_in(void *p) {
  if (p == NULL) return;
  long n = (long)next_usable_size(p);
  long now = atomic_fetch_add_explicit(&live, n, memory_order_relaxed) + n;
  long high = atomic_load_explicit(&peak, memory_order_relaxed);
  while (now > high &&
         !atomic_compare_exchange_weak_explicit(&peak, &high, now, memory_order_relaxed, memory_order_relaxed)) {
  }
}

static void count_out(void *p) {
  if (p != NULL) atomic_fetch_sub_explicit(&live, (long)next_usable_size(p), memory_order_relaxed);
}

void *malloc(size_t n) {
  if (next_malloc == NULL) {
    if (resolving) return boot_alloc(n);
    resolve();
  }
  void *p = next_malloc(n);
  count_in(p);
  return p;
}

void *calloc(size_t count, size_t n) {
  if (next_calloc == NULL) {
    if (resolving) { /* static memory is zero */
      size_t bytes;
      return __builtin_mul_overflow(count, n, &bytes) ? NULL : boot_alloc(bytes);
    }
    resolve();
  }
  void *p = next_calloc(count, n);
  count_in(p);
  return p;
}

void free(void *p) {
  if (p == NULL || from_boot(p)) return;
  if (next_free == NULL) resolve();
  count_out(p);
  next_free(p);
}

void *realloc(void *p, size_t n) {
  if (next_realloc == NULL) {
    if (resolving) { /* dlsym growing its buffer: a new static block */
      unsigned char *q = boot_alloc(n);
      if (q != NULL && p != NULL) { /* p's block is at most what lies between it and q */
        size_t len = (size_t)(q - (unsigned char *)p);
        memcpy(q, p, len < n ? len : n);
      }
      return q;
    }
    resolve();
  }
  if (from_boot(p)) { /* a boot block grows into a real one */
    size_t room = (size_t)(boot + sizeof boot - (unsigned char *)p);
    void *q = malloc(n);
    if (q != NULL) memcpy(q, p, n < room ? n : room);
    return q;
  }
  long before = p != NULL ? (long)next_usable_size(p) : 0;
  void *q = next_realloc(p, n);
  if (q == NULL && n != 0) return NULL; /* p stays live, as it was */
  atomic_fetch_sub_explicit(&live, before, memory_order_relaxed);
  count_in(q);
  return q;
}

void *reallocarray(void *p, size_t count, size_t n) {
  size_t bytes;
  if (__builtin_mul_overflow(count, n, &bytes)) {
    errno = ENOMEM;
    return NULL;
  }
  return realloc(p, bytes);
}

void *memalign(size_t alignment, size_t n) {
  if (next_memalign == NULL) resolve();
  void *p = next_memalign(alignment, n);
  count_in(p);
  return p;
}

void *aligned_alloc(size_t alignment, size_t n) {
  if (next_aligned_alloc == NULL) resolve();
  void *p = next_aligned_alloc(alignment, n);
  count_in(p);
  return p;
}

int posix_memalign(void **out, size_t alignment, size_t n) {
  if (next_posix_memalign == NULL) resolve();
  int err = next_posix_memalign(out, alignment, n);
  if (err == 0) count_in(*out);
  return err;
}

void *valloc(size_t n) {
  if (next_valloc == NULL) resolve();
  void *p = next_valloc(n);
  count_in(p);
  return p;
}

void *pvalloc(size_t n) {
  if (next_pvalloc == NULL) resolve();
  void *p = next_pvalloc(n);
  count_in(p);
  return p;
}

/* C++ (the Itanium ABI's names). Passed on to the next definition, the allocator's or libstdc++'s (which
 * keeps new's handler and bad_alloc); counted only when it is the allocator's. */
void *_Znwm(size_t n) {
  if (next_malloc == NULL) resolve();
  void *p = next_new(n);
  if (count_new) count_in(p);
  return p;
}

void *_Znam(size_t n) {
  if (next_malloc == NULL) resolve();
  void *p = next_new_array(n);
  if (count_new) count_in(p);
  return p;
}

void _ZdlPv(void *p) {
  if (next_malloc == NULL) resolve();
  if (count_new) count_out(p);
  next_delete(p);
}

void _ZdaPv(void *p) {
  if (next_malloc == NULL) resolve();
  if (count_new) count_out(p);
  next_delete_array(p);
}

void _ZdlPvm(void *p, size_t n) {
  (void)n;
  _ZdlPv(p);
}

void _ZdaPvm(void *p, size_t n) {
  (void)n;
  _ZdaPv(p);
}

__attribute__((destructor)) static void report(void) {
  char line[64];
  int n = snprintf(line, sizeof line, "live_peak: pid %ld: %ld bytes\n", (long)getpid(), atomic_load(&peak));
  if (n > 0) {
    ssize_t ignored = write(2, line, (size_t)n);
    (void)ignored;
  }
}
