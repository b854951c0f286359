/* profile.c: heap profiling (THREADHEAP_PROFILE). Byte-weighted Poisson sampling decided on slow paths only,
 * sampled blocks served from segments of their own so that their free finds its sample, call stacks from
 * libunwind interned in memory the profiler maps itself, and per-stack totals from which
 * profile_write.c makes pprof profiles and the leak report.
 *
 * How sampling costs the fast paths nothing (docs/design.md, "Heap profiles"): each thread heap keeps, per
 * size class, the bytes left before the next sample point (an exponential draw, as tcmalloc and jemalloc
 * do). The malloc fast path can only pop the first page's `free` list and the owner's free can only push on
 * it, so the profiler bounds both whenever a slow path runs: the list is cut to L blocks (the rest waits on
 * `local_free`, which heap_malloc_queue leaves alone while profiling), and the owner-free count in
 * `used_word` is set so that the F-th free carries into heap_free_tick. With L + F - 1 allocations at most
 * before the next slow path, and L + F - 1 <= k, the allocation that crosses the sample point (the k+1-th)
 * always reaches the slow path, which samples it. The allocations served in between are counted from the
 * page's own used_word (pops and frees each change it by a known amount). */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
/* Only for libunwind's types and function names: the library itself is opened when profiling starts. */
#define UNW_LOCAL_ONLY
#include <libunwind.h>

#include "internal.h"
#include "os.h"
#include "profile.h"

/* ---- state */

profile_state_t profile;
bool th_profile_on;
static th_heap_t *sample_heap; /* serves sampled blocks; its segments' map entries make every free slow */
static __thread int in_profiler __attribute__((tls_model("initial-exec"))); /* no sampling inside */

/* ---- memory the profiler maps itself: one reservation, bump-allocated without a lock, never freed */

#define ARENA_SIZE ((size_t)512 << 20)
static uint8_t *arena;
static _Atomic(size_t) arena_used;

static void *arena_alloc(size_t n) {
  n = align_up(n, 16);
  size_t off = atomic_fetch_add_explicit(&arena_used, n, memory_order_relaxed);
  if (off + n > ARENA_SIZE) return NULL;
  return arena + off;
}

/* ---- random distances: xorshift per sampler, exponential with mean rate */

static uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

/* The two functions of libm the sampler needs, as short series: linking libm put its whole IFUNC-resolved
 * library in every process's RSS (about 330 KiB, docs/design.md "Resident size at start"), profiling or
 * not. Both are within 1e-11 of libm's, far finer than sampling needs (tcmalloc's sampler makes do with a
 * table of 1,024 logarithms). */

/* ln(x) for x in (0, 1]: x = m * 2^e with m in [1, 2), ln(m) = 2 atanh((m - 1) / (m + 1)). */
static double ln_unit(double x) {
  int e = 0;
  while (x < 0.5) x *= 2.0, e--; /* x >= 2^-53: at most 53 steps, and only on a sample */
  if (x < 1.0) x *= 2.0, e--;
  double s = (x - 1.0) / (x + 1.0), s2 = s * s, term = s, sum = 0.0; /* s in [0, 1/3] */
  for (int k = 1; k < 40; k += 2) sum += term / k, term *= s2;
  return 2.0 * sum + e * 0.69314718055994530942;
}

/* 1 - exp(-x) for x in [0, 1), without cancellation: the alternating series x - x^2/2! + x^3/3! ... */
static double one_minus_exp_neg(double x) {
  double term = x, sum = 0.0;
  for (int k = 2; k < 24; k++) sum += term, term *= -x / k;
  return sum;
}

static int64_t draw_distance(uint64_t *rng) {
  double u = ((double)(rng_next(rng) >> 11) + 1.0) / 9007199254740993.0; /* (0, 1] */
  double d = -ln_unit(u) * (double)profile.rate;
  return d < 1.0 ? 1 : d > 9e15 ? (int64_t)9e15 : (int64_t)d;
}

/* 1 / P(a block of `size` bytes holds a sample point): the Poisson correction that turns sampled totals into
 * estimates of true ones. Blocks of the rate or larger are always sampled. */
static double sample_weight(size_t size) {
  if (size >= profile.rate) return 1.0;
  return 1.0 / one_minus_exp_neg((double)size / (double)profile.rate);
}

/* ---- stacks, interned in open-addressing tables of the arena; inserts by CAS, no lock */

/* The first table has 131,072 slots (1 MiB, touched where stacks hash): room for about 100,000 distinct
 * sampled stacks before a stack's 64 probes all find other stacks; small, because a larger first table
 * weighs on small programs' RSS (docs/design.md). A stack that finds no room goes on to the next table,
 * twice as large, made when first needed; tables only fill, so a stack's place never changes. Five tables
 * have 4 million slots (31 MiB); past them, or when the arena is full, samples go to the overflow stack. */
#define TABLE_SLOTS ((size_t)1 << 17)
#define TABLE_LEVELS 5
static _Atomic(_Atomic(profile_stack_t *) *) tables[TABLE_LEVELS];
static _Atomic(profile_stack_t *) stacks_all;
static profile_stack_t *overflow_stack; /* when the tables or the arena are full */
static uintptr_t own_lo, own_hi;        /* threadheap's own code: its frames are left out of stacks */

/* libunwind's fast path maps a frame cache of 256 KiB per thread at the thread's first sample (freed at its
 * exit): a server of a thousand threads would pay 256 MB for it. So only this many threads at once use it;
 * the others step through their frames with libunwind's ordinary unwinder, which keeps no per-thread state
 * and takes several microseconds a sample. */
#ifndef __SANITIZE_THREAD__
#define FAST_UNWIND_THREADS 64
#else
/* Under ThreadSanitizer, libunwind's cache destructor, which runs at thread exit after the sanitizer has
 * let go of the thread, crashes in its mutex interceptor: only the main thread takes the fast path. */
#define FAST_UNWIND_THREADS 1
#endif
static _Atomic(unsigned) fast_unwind_threads;
enum { UNWIND_UNDECIDED, UNWIND_FAST, UNWIND_STEP };
static __thread uint8_t unwind_kind __attribute__((tls_model("initial-exec")));

/* libunwind's functions, from dlopen when profiling starts (unwind_open), like zlib and protobuf-c: a process
 * that does not profile maps none of it, nor the liblzma it brings (docs/design.md, "Resident size at start").
 * The names are those libunwind.h's macros give (the local-only unwinder's). */
#define UNW_NAME(fn) UNW_NAME_(fn)
#define UNW_NAME_(fn) #fn
static struct {
  __typeof__(unw_tdep_getcontext) *getcontext;
  __typeof__(unw_init_local) *init_local;
  __typeof__(unw_get_reg) *get_reg;
  __typeof__(unw_step) *step;
  __typeof__(unw_backtrace) *backtrace;
} unw;

static bool unwind_open(void) {
  char why[256] = "";
  void *h = profile_open_lib("libunwind.so.8", why, sizeof why);
#define UNW_SYMBOL(field, fn) (unw.field = (__typeof__(unw.field))dlsym(h, UNW_NAME(fn))) != NULL
  if (h && UNW_SYMBOL(getcontext, unw_tdep_getcontext) && UNW_SYMBOL(init_local, unw_init_local) &&
      UNW_SYMBOL(get_reg, unw_get_reg) && UNW_SYMBOL(step, unw_step) && UNW_SYMBOL(backtrace, unw_backtrace))
    return true;
#undef UNW_SYMBOL
  char line[512];
  int n = snprintf(line, sizeof line, "threadheap: heap profiles need libunwind.so.8 (%s); profiling is off\n",
                   why[0] ? why : "a function is missing");
  os_write_err(line, n > 0 && (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
  return false;
}

static int trace_step(void **ip, int cap) {
  unw_context_t uc;
  unw_cursor_t cursor;
  if (unw.getcontext(&uc) != 0 || unw.init_local(&cursor, &uc) != 0) return 0;
  int n = 0;
  unw_word_t pc;
  while (n < cap && unw.get_reg(&cursor, UNW_REG_IP, &pc) == 0 && pc != 0) {
    ip[n++] = (void *)pc;
    if (unw.step(&cursor) <= 0) break;
  }
  return n;
}

/* The caller's call sites, innermost first, threadheap's own frames left out: n of them in pc.
 *
 * libunwind's unw_backtrace, whose x86-64 fast path keeps, per thread, the frame layout of every return
 * address it has seen (in memory it maps itself), about ten times faster than libgcc's _Unwind_Backtrace,
 * which interprets the DWARF call-frame program of every frame anew (docs/design.md). A frame the fast path
 * cannot describe falls back to libunwind's full unwinder. */
static uint32_t trace_here(uintptr_t *pc, uint32_t max) {
  void *ip[PROFILE_DEPTH + 16];
  int cap = (int)(sizeof ip / sizeof ip[0]);
  if (unwind_kind == UNWIND_UNDECIDED) {
    bool fast = atomic_fetch_add_explicit(&fast_unwind_threads, 1, memory_order_relaxed) < FAST_UNWIND_THREADS;
    if (!fast) atomic_fetch_sub_explicit(&fast_unwind_threads, 1, memory_order_relaxed);
    unwind_kind = fast ? UNWIND_FAST : UNWIND_STEP;
  }
  int n = unwind_kind == UNWIND_FAST ? unw.backtrace(ip, cap) : trace_step(ip, cap);
  int i = 0;
  while (i < n && (uintptr_t)ip[i] >= own_lo && (uintptr_t)ip[i] < own_hi) i++; /* still inside threadheap */
  uint32_t k = 0;
  for (; i < n && k < max && ip[i] != NULL; i++)
    pc[k++] = (uintptr_t)ip[i] - 1; /* a return address: the call is the instruction before */
  return k;
}

/* A thread's first unwind, at a point where threadheap's state is whole (the start of profiling, or the
 * start of the slow path that attaches a sampler to the thread's heap; see sampler_attach). libunwind is
 * opened with dlopen, so its thread-local variables are made on their first use in each thread, with malloc:
 * this malloc is served as any other (in_profiler keeps it out of the samples), never from the middle of a
 * page being carved or a block being recorded. A fast-path thread maps its frame cache here too. */
static void unwind_warm(void) {
  if (unwind_kind != UNWIND_UNDECIDED) return;
  uintptr_t warm[PROFILE_DEPTH];
  in_profiler++;
  (void)trace_here(warm, PROFILE_DEPTH);
  in_profiler--;
}

static uint64_t hash_pcs(const uintptr_t *pc, uint32_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  for (uint32_t i = 0; i < n; i++) h = (h ^ pc[i]) * 0xff51afd7ed558ccdull, h ^= h >> 32;
  return h;
}

static profile_stack_t *stack_new(const uintptr_t *pc, uint32_t n, uint64_t h) {
  profile_stack_t *s = arena_alloc(sizeof *s + n * sizeof(uintptr_t));
  if (s == NULL) return NULL;
  s->hash = h;
  s->depth = n;
  memcpy(s->pc, pc, n * sizeof(uintptr_t));
  return s;
}

static void stack_publish(profile_stack_t *s) {
  profile_stack_t *head = atomic_load_explicit(&stacks_all, memory_order_relaxed);
  do s->all_next = head;
  while (!atomic_compare_exchange_weak_explicit(&stacks_all, &head, s, memory_order_release, memory_order_relaxed));
}

/* Table `level`, made now if it is not there yet (NULL: the arena is full). */
static _Atomic(profile_stack_t *) *table_at(size_t level) {
  _Atomic(profile_stack_t *) *t = atomic_load_explicit(&tables[level], memory_order_acquire);
  if (t != NULL) return t;
  _Atomic(profile_stack_t *) *fresh = arena_alloc((TABLE_SLOTS << level) * sizeof *fresh); /* zero: empty */
  if (fresh == NULL) return NULL;
  if (atomic_compare_exchange_strong_explicit(&tables[level], &t, fresh, memory_order_acq_rel, memory_order_acquire))
    return fresh;
  return t; /* another thread made it first: this one stays unused, and untouched, in the arena */
}

/* The caller's stack (threadheap's own frames left out), interned. */
static profile_stack_t *stack_here(void) {
  uintptr_t pc[PROFILE_DEPTH];
  uint32_t n = trace_here(pc, PROFILE_DEPTH);
  uint64_t h = hash_pcs(pc, n);
  for (size_t level = 0; level < TABLE_LEVELS; level++) {
    _Atomic(profile_stack_t *) *table = table_at(level);
    if (table == NULL) break;
    size_t mask = (TABLE_SLOTS << level) - 1;
    for (size_t i = h & mask, probes = 0; probes < 64; i = (i + 1) & mask, probes++) {
      profile_stack_t *s = atomic_load_explicit(&table[i], memory_order_acquire);
      if (s == NULL) {
        profile_stack_t *fresh = stack_new(pc, n, h);
        if (fresh == NULL) return overflow_stack;
        if (atomic_compare_exchange_strong_explicit(&table[i], &s, fresh, memory_order_acq_rel,
                                                    memory_order_acquire)) {
          stack_publish(fresh);
          return fresh;
        }
        /* another thread took the slot: compare with its stack (this one stays unused in the arena) */
      }
      if (s->hash == h && s->depth == n && memcmp(s->pc, pc, n * sizeof(uintptr_t)) == 0) return s;
    }
  }
  return overflow_stack;
}

profile_stack_t *profile_stacks(void) { return atomic_load_explicit(&stacks_all, memory_order_acquire); }

static void add(_Atomic(uint64_t) *c, uint64_t n) { atomic_fetch_add_explicit(c, n, memory_order_relaxed); }
static void sub(_Atomic(uint64_t) *c, uint64_t n) { atomic_fetch_sub_explicit(c, n, memory_order_relaxed); }

/* ---- the peak: the live totals per stack copied when the sampled live bytes pass the last copy by 1/32 */

static _Atomic(uint64_t) live_total, peak_total;
static _Atomic(int) peak_busy;

void profile_peak_snapshot(bool force) {
  uint64_t live = atomic_load_explicit(&live_total, memory_order_relaxed);
  uint64_t peak = atomic_load_explicit(&peak_total, memory_order_relaxed);
  if (force ? live < peak : live <= peak + peak / 32) return;
  if (atomic_exchange_explicit(&peak_busy, 1, memory_order_acquire)) return;
  for (profile_stack_t *s = profile_stacks(); s; s = s->all_next) {
    atomic_store_explicit(&s->peak_count, atomic_load_explicit(&s->live_count, memory_order_relaxed), memory_order_relaxed);
    atomic_store_explicit(&s->peak_bytes, atomic_load_explicit(&s->live_bytes, memory_order_relaxed), memory_order_relaxed);
  }
  atomic_store_explicit(&peak_total, live, memory_order_relaxed);
  atomic_store_explicit(&peak_busy, 0, memory_order_release);
}

/* One sampled allocation of `size` bytes (the block holds `charged` bytes, which decided its weight). */
static profile_stack_t *record_alloc(size_t size, size_t charged, uint64_t *est_bytes, uint64_t *est_count) {
  profile_stack_t *s = stack_here();
  double w = sample_weight(charged);
  *est_bytes = (uint64_t)((double)size * w + 0.5);
  *est_count = (uint64_t)(w * PROFILE_COUNT_ONE + 0.5);
  if (s == NULL) return NULL;
  add(&s->alloc_bytes, *est_bytes);
  add(&s->alloc_count, *est_count);
  add(&s->live_bytes, *est_bytes);
  add(&s->live_count, *est_count);
  add(&live_total, *est_bytes);
  profile_peak_snapshot(false);
  return s;
}

static void record_free(profile_stack_t *s, uint64_t est_bytes, uint64_t est_count) {
  if (s == NULL) return;
  sub(&s->live_bytes, est_bytes);
  sub(&s->live_count, est_count);
  sub(&live_total, est_bytes);
}

/* ---- fresh memory: a process-wide byte countdown over the bytes carved fresh from the OS (slow paths) */

static _Atomic(int64_t) fresh_left, huge_left;
static _Atomic(uint64_t) shared_rng;

static int64_t draw_shared(void) {
  uint64_t r = atomic_fetch_add_explicit(&shared_rng, 0x9E3779B97F4A7C15ull, memory_order_relaxed);
  r ^= r >> 31;
  r |= 1;
  return draw_distance(&r);
}

/* Has a process-wide countdown reached a sample point within these bytes? */
static bool countdown_hits(_Atomic(int64_t) *left, size_t bytes) {
  int64_t before = atomic_fetch_sub_explicit(left, (int64_t)bytes, memory_order_relaxed);
  if (before > (int64_t)bytes) return false;
  atomic_store_explicit(left, draw_shared(), memory_order_relaxed);
  return true;
}

/* bytes were carved fresh for an allocation at stack s (NULL: the caller's, unwound if sampled). */
static void fresh_at(profile_stack_t *s, size_t bytes) {
  if (bytes == 0 || (bytes < profile.rate && !countdown_hits(&fresh_left, bytes))) return;
  if (s == NULL) s = stack_here();
  if (s) add(&s->fresh_bytes, (uint64_t)((double)bytes * sample_weight(bytes) + 0.5));
}

void profile_fresh(size_t bytes) {
  if (!th_profile_on || in_profiler) return;
  in_profiler = 1;
  fresh_at(NULL, bytes);
  in_profiler = 0;
}

/* ---- sampled blocks of heap pages: from sample_heap, handed out 32 bytes into their block, like an aligned
 * block (the aligned tag below the pointer), with the sample in the first three words:
 *   [0] the stack, [1] the estimated bytes, [2] the estimated count | ms since start << 32, [3] aligned tag */

#define SAMPLE_HEADER 32

static void huge_record(th_segment_t *seg, size_t size, size_t charged, bool fresh);

static void *sample_block(th_heap_t *heap, size_t size, size_t charged) {
  /* An explicit heap's sampled block is a huge block of that heap, whose segment keeps the sample: it counts
   * against the heap's cap and goes with th_heap_destroy, as the heap's other blocks do. Elsewhere, a block
   * with no room for the header in a heap page. (huge_alloc's own hooks stay quiet, in_profiler being set.) */
  if (heap_is_explicit(heap) || size > TH_LARGE_MAX - SAMPLE_HEADER) {
    int saved_errno = errno; /* an explicit heap at its cap: the block is served unsampled instead */
    void *p = huge_alloc(heap_is_explicit(heap) ? heap : NULL, size, 16, false);
    if (p) {
      th_segment_t *seg = segment_lookup(p);
      huge_record(seg, size, charged, seg->is_zero);
    }
    errno = saved_errno;
    return p;
  }
  if (sample_heap == NULL) return NULL;
  if (!th_lock_unless_fork(&sample_heap->lock)) return NULL; /* a fork is under way: not sampled */
  /* Every block has 16 usable bytes: malloc(0)'s too, which would otherwise end where its header ends. */
  size_t request = (size < 16 ? 16 : size) + SAMPLE_HEADER;
  /* Fresh memory carved for the block is this allocation's, as it would have been from the thread's heap. */
  _Atomic(uint64_t) *fresh = &sample_heap->flow.fresh[size_class(request)];
  uint64_t fresh_before = atomic_load_explicit(fresh, memory_order_relaxed);
  uintptr_t *b = heap_malloc(sample_heap, request);
  uint64_t fresh_bytes = atomic_load_explicit(fresh, memory_order_relaxed) - fresh_before;
  th_unlock(&sample_heap->lock);
  if (b == NULL) return NULL;
  uint64_t est_bytes, est_count;
  profile_stack_t *s = record_alloc(size, charged, &est_bytes, &est_count);
  if (s) fresh_at(s, (size_t)fresh_bytes);
  if (est_bytes == free_tag(b)) est_bytes++; /* never mistaken for a free block's tag */
  b[0] = (uintptr_t)s;
  b[1] = est_bytes;
  b[2] = (est_count & 0xffffffffu) | ((os_now_ms() - profile.start_ms) << 32);
  void *p = (uint8_t *)b + SAMPLE_HEADER;
  alloc_mark_aligned(b, p);
  return p;
}

void profile_free_sampled(th_block_t *block) {
  const uintptr_t *b = (const uintptr_t *)block;
  record_free((profile_stack_t *)b[0], b[1], b[2] & 0xffffffffu);
}

/* ---- huge blocks: the sample is kept in the segment header */

/* The sample of a huge block, kept in its segment, and (fresh: it was mapped just now) its fresh memory.
 * In the profiler. */
static void huge_record(th_segment_t *seg, size_t size, size_t charged, bool fresh) {
  uint64_t est_bytes, est_count;
  seg->sample_stack = record_alloc(size, charged, &est_bytes, &est_count);
  seg->sample_bytes = est_bytes;
  seg->sample_count = est_count;
  if (seg->sample_stack && fresh) fresh_at(seg->sample_stack, size);
}

void profile_huge_alloc(th_segment_t *seg, size_t size, bool fresh) {
  seg->sample_stack = NULL;
  if (!th_profile_on || in_profiler) return;
  in_profiler = 1;
  if (size >= profile.rate || countdown_hits(&huge_left, size)) huge_record(seg, size, size, fresh);
  else if (fresh) fresh_at(NULL, size);
  in_profiler = 0;
}

void profile_huge_free(th_segment_t *seg) {
  if (seg->sample_stack == NULL) return;
  record_free(seg->sample_stack, seg->sample_bytes, seg->sample_count);
  seg->sample_stack = NULL;
}

/* ---- the per-class budget of a thread heap's first pages (see the top of the file) */

struct th_sampler_s {
  th_page_t *page[TH_CLASS_COUNT];  /* the first page of class c when last cut; NULL: not cut */
  uint32_t base[TH_CLASS_COUNT];    /* its used_word then */
  int64_t left[TH_CLASS_COUNT];     /* bytes of class c still to allocate before the next sample point */
  uint16_t free_share[TH_CLASS_COUNT]; /* the owner's frees per allocation lately, in 256ths (see cut) */
  uint64_t cut_mask;                /* classes with a page cut */
  uint64_t rng;
  size_t busy_class;                /* the class a malloc slow path is serving (cut at its end), or 0 */
};

/* Allocations served from the page since the sampler last looked, and (*frees) the owner's frees: each pop
 * added 1 to used_word and each of the owner's frees added TH_FREE_ADD (2^20 - 1), and there were fewer than
 * 4,096 frees (the F-th carries). */
static uint32_t pops_since(uint32_t base, uint32_t now, uint32_t *frees) {
  uint32_t d = now - base + TH_FREE_COUNT_WRAP;
  *frees = d >> TH_USED_BITS;
  int64_t pops = (int64_t)(d & TH_USED_MASK) - TH_FREE_COUNT_WRAP + *frees;
  return pops < 0 || pops > (1 << 19) ? 0 : (uint32_t)pops; /* slow-path changes between: not counted */
}

static void settle(th_sampler_t *s, size_t c) {
  th_page_t *page = s->page[c];
  if (page == NULL) return;
  uint32_t now = page->used_word, frees;
  uint32_t pops = pops_since(s->base[c], now, &frees);
  if (pops > 0) {
    uint32_t share = frees >= pops ? 256 : frees * 256 / pops;
    s->free_share[c] = (uint16_t)((s->free_share[c] + share + 1) / 2);
  }
  s->left[c] -= (int64_t)pops * (int64_t)class_size(c);
  s->base[c] = now;
}

void profile_settle_all(th_heap_t *heap) {
  th_sampler_t *s = heap->sampler;
  for (uint64_t m = s->cut_mask; m; m &= m - 1) settle(s, (size_t)__builtin_ctzll(m));
}

/* The free list after its first n blocks goes to local_free, where the fast path cannot reach it. */
static void cut_list(th_page_t *page, uint32_t n) {
  th_block_t **link = &page->free;
  for (uint32_t i = 0; i < n && *link; i++) link = &(*link)->next;
  th_block_t *rest = *link;
  if (rest == NULL) return;
  *link = NULL;
  if (page->local_free != NULL) {
    th_block_t *tail = rest;
    while (tail->next) tail = tail->next;
    tail->next = page->local_free;
  }
  page->local_free = rest;
}

static void cut(th_heap_t *heap, th_sampler_t *s, size_t c) {
  th_page_t *page = heap->queues[c].first;
  s->page[c] = page;
  if (page == NULL) {
    s->cut_mask &= ~((uint64_t)1 << c);
    return;
  }
  s->cut_mask |= (uint64_t)1 << c;
  size_t size = class_size(c);
  int64_t left = s->left[c];
  /* k allocations may go by before the one that crosses the sample point: L + F = k + 1. The split follows
   * the page's recent use, so that one slow path, not a series of halvings, usually reaches the sample: a
   * loop that frees what it allocates (share near 1) keeps its list full and needs F large; one that
   * allocates in batches needs L large. A wrong guess only brings the next slow path earlier. */
  uint64_t k = left <= 0 || size >= profile.rate ? 0 : (uint64_t)(left + (int64_t)size - 1) / size - 1;
  uint64_t l = ((k + 1) * (uint64_t)(256 - s->free_share[c]) + 255) / 256;
  if (l < 1) l = 1; /* the list keeps a block, or a batch would take the slow path at once */
  if (l > k) l = k;  /* and F >= 1 */
  uint64_t f64 = k + 1 - l;
  uint32_t f = f64 >= TH_FREE_COUNT_WRAP ? TH_FREE_COUNT_WRAP - 1 : (uint32_t)f64;
  l = k + 1 - f;
  /* The owner's F-th free carries: the count is folded into the flow and set to 4,096 - F, and the flow is
   * lowered by as much, so that flow + count (what attribution.c adds up) stays the true number of frees. */
  uint32_t preset = TH_FREE_COUNT_WRAP - f;
  heap_count_frees(heap, c, (uint64_t)page_owner_frees(page) - preset);
  page->used_word = (page->used_word & TH_USED_MASK) | (preset << TH_USED_BITS);
  if (page->capacity - page_used(page) > l) cut_list(page, (uint32_t)l);
  s->base[c] = page->used_word;
}

/* heap_direct_update: the first page of class c changed. */
void profile_first_changed(th_heap_t *heap, size_t c) {
  th_sampler_t *s = heap->sampler;
  settle(s, c); /* what the old first page served (it is still mapped: it leaves the queue before it goes) */
  if (c == s->busy_class) {
    s->page[c] = NULL; /* the slow path cuts it when it is done */
    return;
  }
  cut(heap, s, c);
}

/* The owner's free count of a page carried (heap_free_tick): settle its class, and cut it again. */
void profile_free_tick(th_heap_t *heap, th_page_t *page) {
  th_sampler_t *s = heap->sampler;
  size_t c = page->class_idx;
  settle(s, c);
  if (c != 0 && s->page[c] == page && heap->queues[c].first == page) cut(heap, s, c);
}

static th_sampler_t *sampler_attach(th_heap_t *heap) {
  th_sampler_t *s = heap->sampler_spare;
  if (s == NULL) {
    s = arena_alloc(sizeof *s);
    if (s == NULL) return NULL;
    s->rng = os_random() | 1;
    heap->sampler_spare = s;
  }
  heap->sampler = s;
  memset(s->page, 0, sizeof s->page);
  s->cut_mask = 0;
  s->busy_class = 0;
  for (size_t c = 0; c < TH_CLASS_COUNT; c++) s->left[c] = draw_distance(&s->rng), s->free_share[c] = 128;
  for (size_t c = 1; c < TH_CLASS_COUNT; c++) cut(heap, s, c);
  unwind_warm(); /* the thread's first slow path while profiling: its unwinder state, made now */
  return s;
}

/* The heap ends (thread exit): its pages keep their lists and counts as they are, and nothing is cut any
 * more; the state waits in sampler_spare for the struct's next thread. */
void profile_heap_end(th_heap_t *heap) {
  heap->sampler = NULL;
  if (unwind_kind == UNWIND_FAST) atomic_fetch_sub_explicit(&fast_unwind_threads, 1, memory_order_relaxed);
  unwind_kind = UNWIND_STEP; /* what the exiting thread still allocates takes no fast slot */
}

/* heap_malloc_slow on a thread heap while profiling: count, sample or serve, then cut the class's page. */
void *profile_malloc(th_heap_t *heap, size_t size) {
  th_sampler_t *s = heap->sampler;
  if (s == NULL) s = sampler_attach(heap);
  if (s == NULL || size > TH_LARGE_MAX) return heap_malloc_fill(heap, size); /* huge: huge_alloc samples */
  size_t c = size_class(size), charged = class_size(c);
  settle(s, c); /* what the fast path served since the last look (other classes: at the next purge) */
  void *p = NULL;
  if (!in_profiler && (charged >= profile.rate || s->left[c] <= (int64_t)charged)) {
    if (charged < profile.rate) s->left[c] = draw_distance(&s->rng);
    in_profiler = 1;
    p = sample_block(heap, size, charged);
    in_profiler = 0;
  } else {
    s->left[c] -= (int64_t)charged;
  }
  if (p == NULL) {
    s->busy_class = c;
    p = heap_malloc_fill(heap, size);
    s->busy_class = 0;
  }
  cut(heap, s, c);
  return p;
}

/* ---- start, dumps, exit */

/* The static library's code, renamed to this section when it was built (CMakeLists.txt): the linker names
 * its bounds. Absent (NULL) in the shared library. */
extern const char __start_threadheap_text[] __attribute__((weak, visibility("hidden")));
extern const char __stop_threadheap_text[] __attribute__((weak, visibility("hidden")));

static void find_own_code(void) {
  /* The executable segment that holds this function: threadheap's own code; or, linked into the program
   * itself (a static link), the section that holds the static library's code. */
  os_code_range((uintptr_t)&find_own_code, &own_lo, &own_hi);
  uintptr_t lo = (uintptr_t)__start_threadheap_text, hi = (uintptr_t)__stop_threadheap_text;
  if (own_hi == 0 && lo != 0 && lo <= (uintptr_t)&find_own_code && (uintptr_t)&find_own_code < hi)
    own_lo = lo, own_hi = hi;
}

void profile_init(void) {
  if (th_options.profile_path == NULL && !th_options.leaks) return;
  arena = os_reserve_rw(ARENA_SIZE);
  if (arena == NULL) return;
  _Atomic(profile_stack_t *) *first = table_at(0);
  overflow_stack = stack_new(NULL, 0, 0);
  if (first == NULL || overflow_stack == NULL) return;
  stack_publish(overflow_stack);
  profile.rate = (size_t)th_options.profile_rate;
  profile.start_ms = os_now_ms();
  profile.start_ns = os_realtime_ns();
  profile.pid = os_process_id();
  atomic_store_explicit(&shared_rng, os_random() | 1, memory_order_relaxed);
  atomic_store_explicit(&fresh_left, draw_shared(), memory_order_relaxed);
  atomic_store_explicit(&huge_left, draw_shared(), memory_order_relaxed);
  find_own_code();
  if (!unwind_open()) return;
  /* The unwinder's first use, here, before any sample: whatever it sets up once is done now. */
  unwind_warm();
  profile_writer_open(); /* zlib and protobuf-c, loaded only now */
  sample_heap = explicit_create_samples();
  if (sample_heap == NULL) return;
  profile_signal_init();
  th_profile_on = true;
  /* This thread's heap may hold blocks already (libc's start, the loading of zlib and protobuf-c above): its
   * lists are cut now, or the fast path would serve them unsampled until its first slow path. */
  th_heap_t *heap = th_heap_tls;
  if (heap != &th_heap_empty && heap->sampler == NULL) {
    heap_slow_enter(heap);
    (void)sampler_attach(heap);
    heap_slow_exit(heap);
  }
}

void profile_fork_child(void) {
  atomic_store_explicit(&fast_unwind_threads, unwind_kind == UNWIND_FAST, memory_order_relaxed);
  atomic_store_explicit(&peak_busy, 0, memory_order_relaxed);
  profile_write_fork_child();
}

void profile_enter(void) { in_profiler++; }
void profile_leave(void) { in_profiler--; }
