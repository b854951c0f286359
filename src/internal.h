/* internal.h: the functions that cross files, grouped by the file that defines them, and the inline helpers
 * that the fast paths share. Everything else is static. */
#ifndef TH_INTERNAL_H
#define TH_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "threadheap.h"
#include "types.h"
#ifdef TH_ASAN
#include <sanitizer/asan_interface.h> /* before the pragma below: these come from the sanitizer runtime */
#endif
#ifdef TH_VALGRIND
#include <valgrind/memcheck.h>
#endif

/* Nothing declared below leaves the library: saying so here, not only at the definitions, lets the compiler
 * address the globals the fast paths read (th_segment_map) directly instead of through the GOT. */
#pragma GCC visibility push(hidden)

#define th_likely(x) __builtin_expect(!!(x), 1)
#define th_unlikely(x) __builtin_expect(!!(x), 0)
#define TH_NOINLINE __attribute__((noinline))
#define TH_COLD __attribute__((cold, noinline))
/* The fast paths start on a cache line: where they happen to fall otherwise moved a malloc/free pair's
 * time by a third (docs/design.md). */
#define TH_HOT __attribute__((aligned(64)))

/* th_check stays on in release builds and stops the process; th_assert is for debug builds only. */
#define th_check(cond, msg) \
  do { \
    if (th_unlikely(!(cond))) report_fatal(msg); \
  } while (0)
#ifdef TH_DEBUG
#define th_assert(cond) \
  do { \
    if (!(cond)) report_assert(#cond, __FILE__, __LINE__); \
  } while (0)
#else
#define th_assert(cond) ((void)0)
#endif

/* ---- free.c */
typedef enum th_op_e { TH_OP_FREE, TH_OP_REALLOC, TH_OP_USABLE_SIZE } th_op_t;
typedef enum th_misuse_e { TH_MISUSE_FREED, TH_MISUSE_INVALID, TH_MISUSE_INTERIOR } th_misuse_t;
void free_checked(void *p); /* every free th_free does not do: the checks, then the free */
/* The block that p points to, checked: stops the process on an invalid, interior or freed pointer. */
th_block_t *free_check_block(const void *p, th_op_t op, th_segment_t **seg_out, th_page_t **page_out);
size_t free_usable_size(const th_page_t *page, const void *p);
_Noreturn void report_misuse(th_misuse_t kind, th_op_t op, const void *p, const void *block, size_t size);
_Noreturn void report_fatal(const char *msg);
_Noreturn void th_new_out_of_memory(void);
_Noreturn void report_heap_misuse(const char *op, const char *problem, const void *heap);
_Noreturn void report_block(const char *problem, const void *page, const void *p, size_t size);
/* The same for a block whose record of the size asked for was overwritten: most, the largest it could be. */
_Noreturn void report_block_lost(const char *problem, const void *p, size_t most);
_Noreturn void report_assert(const char *cond, const char *file, int line);

/* ---- alloc.c */
/* heap: an explicit heap, or NULL for the calling thread's default heap */
void *alloc_aligned(th_heap_t *heap, size_t alignment, size_t size);
void *alloc_memalign(th_heap_t *heap, size_t alignment, size_t size);
bool alloc_too_large(size_t size);
void *alloc_realloc_checked(void *p, th_segment_t *seg, th_page_t *page, size_t size);
void *alloc_move(th_heap_t *dest, void *p, const th_page_t *page, size_t size);
bool alloc_is_aligned_tag(const void *p);
/* p, inside block b at 32 bytes or more, is handed out as an aligned block is (the tag below it). */
void alloc_mark_aligned(void *b, void *p);

/* ---- heap.c */
extern th_heap_t th_heap_empty;
extern th_page_t th_page_empty;
void *heap_malloc_queue(th_heap_t *heap, size_t size);
void *heap_malloc_slow(th_heap_t *heap, size_t size);
void *heap_malloc_fill(th_heap_t *heap, size_t size);
void *heap_malloc_huge(th_heap_t *heap, size_t size);
th_page_t *heap_page_with_free(th_heap_t *heap, size_t c);
void heap_init(th_heap_t *heap);
void heap_queue_remove(th_heap_t *heap, th_page_queue_t *q, th_page_t *page);
void heap_queue_push_front(th_heap_t *heap, th_page_queue_t *q, th_page_t *page);
void heap_queue_push_back(th_heap_t *heap, th_page_queue_t *q, th_page_t *page);
void heap_page_retire(th_heap_t *heap, th_page_t *page);
void heap_page_insert(th_heap_t *heap, th_page_t *page);
void heap_collect_ready(th_heap_t *heap);
void heap_purge(th_heap_t *heap, bool force);
void heap_collect_remote(th_heap_t *heap);
void heap_collect(th_heap_t *heap);
void heap_exit(th_heap_t *heap);
void heap_free_local(th_heap_t *heap, th_page_t *page);
void heap_free_tick(th_heap_t *heap, th_page_t *page);
void heap_sweep(th_heap_t *heap, uint64_t now);

/* ---- pool.c: free small page slots that thread heaps lend to each other */
bool pool_eligible(const th_heap_t *heap);
th_page_t *pool_borrow(th_heap_t *heap, bool purged);
void pool_lend(th_page_t *page);
bool pool_take_back(th_page_t *page, uint64_t now, uint64_t delay, bool force);
bool pool_is_empty(void);
void pool_return(th_page_t *page);
void pool_orphan(th_heap_t *heap, th_page_t *page);
th_page_t *pool_adopt_orphan(th_heap_t *heap, size_t c);
/* pool_hand_off's results */
enum { POOL_NO_LOCK = -1, POOL_BLOCKS_ARRIVED = 0, POOL_HANDED_OFF = 1 };
int pool_hand_off(th_heap_t *heap, th_page_queue_t *q, th_page_t *page);
void pool_recycle(th_page_t *page);
bool pool_reclaim(th_page_t *page);
void pool_forget_heap(th_heap_t *heap);
void pool_round(uint64_t delay);
void pool_lock_all(unsigned level);
void pool_unlock_all(unsigned level, bool child);

/* ---- sweep.c */
void sweep_idle_heaps(th_heap_t *self, uint64_t now);
bool sweep_all_heaps(th_heap_t *self);
void heap_slow_wait(th_heap_t *heap);
void sweep_lock_all(unsigned level);
void sweep_unlock_all(unsigned level, bool child);

/* ---- free.c: the remote batches, pushed on slow paths, by th_collect and th_stats_get, and at thread exit */
void free_remote_flush(void);
/* A block of seg's page, checked and tagged free by a thread that does not own seg: held or pushed. */
void free_remote_send(th_segment_t *seg, th_page_t *page, th_block_t *b);

/* ---- page.c */
void page_init(th_page_t *page, th_segment_t *seg, size_t index, size_t class_idx);
void page_forget(th_page_t *page);
bool page_extend(th_heap_t *heap, th_page_t *page);
size_t page_collect(th_page_t *page);
bool page_is_empty(const th_page_t *page);
bool page_parked_is_empty(const th_page_t *page);
void page_discard_free(th_page_t *page);
bool page_try_set_full(th_page_t *page);
void page_clear_delay(th_page_t *page);
bool page_try_set_orphan(th_page_t *page);
bool page_try_claim_orphan(th_page_t *page);
void page_push_remote_chain(th_page_t *page, th_block_t *head, th_block_t *tail, size_t n);
bool page_list_contains(const th_page_t *page, const th_block_t *block);
void page_purge_free_blocks(th_page_t *page);
void page_purge_tail(th_page_t *page);
void page_purge_slot(th_page_t *page);
uint8_t *page_area(const th_segment_t *seg, size_t index, size_t *size_out);
bool page_is_valid(const th_page_t *page);

/* ---- segment.c */
extern _Atomic(uint8_t) th_segment_map[TH_MAP_ENTRIES];
/* The page map (segment.c): a word per 64 KiB of the address space, the offset from the map's own start to
 * the descriptor of the page there, for the pages of paged segments whose frees th_free may take. Every other
 * entry names one of two stand-in descriptors of zeros (owner 0, capacity 0), which fail every test th_free
 * makes: 0 names the map's first 128 bytes (its entries for the first MiB of the address space, where no
 * segment can be), for memory that is not a paged segment's (huge blocks, cached memory, foreign
 * pointers); th_page_map_slow, for the pages of secure and sampled segments, so that free_remote sends
 * their frees to secure_free_fast by one compare. mask is 2^31 - 1 once the map is reserved, and 0 before,
 * or when the OS refused its address space: every pointer then takes entry 0 and every free the checked
 * path. One cache line: th_free reads both. */
typedef struct th_page_map_s {
  _Atomic(uintptr_t *) map;
  /* Written once, after map and before the first segment the map names (__atomic_store_n), read plainly
   * and before map (page_map_lookup's fence): th_free's `and` then takes it from memory, where an atomic
   * load costs a separate instruction. */
  uintptr_t mask;
} th_page_map_t;
extern th_page_map_t th_page_map;
#define TH_PAGE_MAP_SHIFT 16
extern th_page_t th_page_map_slow;
th_segment_t *segment_lookup_slow(uintptr_t region, uint8_t back);
void segment_set_owner(th_segment_t *seg, uintptr_t thread_id);
void segment_map_set(th_segment_t *seg, size_t size, bool mapped);
th_page_t *segment_page_alloc(th_heap_t *heap, th_kind_t kind);
void segment_page_free(th_heap_t *heap, th_page_t *page);
void segment_lend_slots(th_heap_t *heap);
void segment_take_back_slots(th_heap_t *heap, bool force);
/* The process's purge clock: wall time less the pauses of the whole process (segment.c). */
uint64_t process_clock(void);
void segment_page_free_kept(th_heap_t *heap, th_page_t *page);
void segment_release_unused(th_heap_t *heap);
size_t segment_header_size(size_t page_count, bool secure);
/* lazy (lazy commit, when not 0): a segment fresh from the OS is reserved with no access but for its first
 * `lazy` bytes; a paged one is made writable as carved (segment_commit), a huge one (is_lazy) by huge.c. */
th_segment_t *segment_map_new(size_t size, th_kind_t kind, bool secure, size_t lazy);
/* Lazy commit: make the segment writable from its start through end (rounded up); false when the OS refuses
 * (strict overcommit's limit), with errno set. Owner only. */
bool segment_commit(th_segment_t *seg, const void *end);
void segment_init(th_segment_t *seg, size_t size, th_kind_t kind, bool untouched, bool secure);
void segment_release(th_segment_t *seg);
size_t segment_cache_resident(void);
void segment_cache_purge(bool force);
/* A purge round of any heap, whose thread ran through its gap or not: the process clock (segment.c). */
void process_clock_round(uint64_t now, uint64_t round, bool ran);
void segment_abandon(th_segment_t *seg);
bool segment_try_adopt(th_heap_t *heap, th_kind_t kind, uint64_t min_age_ms);
void segment_lock_all(unsigned level);
void segment_unlock_all(unsigned level, bool child);
/* Map entries [lo, hi) hold every segment ever mapped (lo > hi before the first). */
void segment_map_range(size_t *lo, size_t *hi);

/* ---- huge.c */
/* owner: the explicit heap the block belongs to, or NULL for a block of a thread heap */
void *huge_alloc(th_heap_t *owner, size_t size, size_t alignment, bool zero);
void huge_free(th_segment_t *seg, const void *p, th_op_t op);
bool huge_recently_freed(const void *p, size_t *usable);
void *huge_realloc(th_segment_t *seg, void *p, size_t size);
void huge_release_all(th_heap_t *owner);
void huge_disown(th_segment_t *seg);

/* ---- explicit.c */
void *explicit_huge_alloc(th_heap_t *heap, size_t size, size_t alignment, bool zero);
void *explicit_huge_realloc(th_heap_t *heap, th_segment_t *seg, void *p, size_t size);
/* The profiler's heap of sampled blocks: serialized, one shard, its segments marked (TH_HEAP_SAMPLES). */
th_heap_t *explicit_create_samples(void);
void explicit_lock_all(unsigned level);
void explicit_unlock_all(unsigned level, bool child);

/* ---- thread.c */
extern __thread th_heap_t *th_heap_tls __attribute__((tls_model("initial-exec")));
extern uintptr_t th_key;
th_heap_t *thread_heap_init(void);
bool thread_exited(void);
void thread_flush_stats_at_exit(void);
void *thread_late_malloc(size_t size);
th_heap_t *thread_struct_alloc(void);
void thread_struct_free(th_heap_t *heap);
void process_init(void);
size_t thread_struct_bytes(void);
/* Every heap struct ever made (linked through all_next); they are never unmapped. */
th_heap_t *thread_heaps_all(void);
/* The forking thread, from the end of threadheap's fork prepare handler until its parent or child handler
 * runs; 0 otherwise (see th_lock). */
extern _Atomic(uintptr_t) thread_fork_owner;
/* Waits for m unless a fork begins meanwhile (see th_lock_unless_fork); true when m is held. */
bool thread_lock_wait(pthread_mutex_t *m);
/* fork_prepare's: take l for the fork at this level, unless this thread holds it or is taking or releasing
 * it (a fork from a signal handler that interrupted it there); and after the fork, release (in the child:
 * reset) what the prepare of this level took. */
void thread_lock_for_fork(th_mutex_t *l, unsigned level);
void thread_unlock_after_fork(th_mutex_t *l, unsigned level, bool child);

/* ---- attribution.c */
/* Fill out's attribution fields (in_use ... purged) from a walk of every segment; mapped and cached must be
 * set already. */
void attribution_compute(th_stats_t *out);
/* Frees into a page of no heap's (an orphan's, pool.c), counted in the process-wide flow. */
void attribution_count_frees(size_t c, uint64_t n);
/* A heap's flow joins the process-wide one, and the heap's is zeroed: at thread exit and heap destroy. */
void attribution_fold(th_heap_t *heap);
/* A huge block allocated (fresh: its memory new from the OS) or freed, of size bytes. */
void attribution_huge(bool alloc, size_t size, bool fresh);

/* ---- pairs.c */
/* free_remote's count went to another owner than the last: note the new pair. */
void pairs_note_owner(th_heap_t *owner);
/* At thread exit: the thread's pairs move to the process-wide table of exited threads. */
void pairs_thread_done(th_heap_t *heap);

/* ---- valgrind.c (the TH_VALGRIND build option): explicit heaps as memcheck memory pools; empty otherwise */
#ifdef TH_VALGRIND
void vg_heap_new(th_heap_t *heap);
void vg_heap_gone(th_heap_t *heap);
void *vg_alloc(void *p, size_t size, bool zeroed);
void vg_free(void *p);
th_heap_t *vg_realloc_begin(void *p);
void *vg_realloc_end(th_heap_t *old, void *p, void *q, size_t size);
void vg_defined(void *p, size_t size);
#else
static inline void vg_heap_new(th_heap_t *heap) { (void)heap; }
static inline void vg_heap_gone(th_heap_t *heap) { (void)heap; }
static inline void *vg_alloc(void *p, size_t size, bool zeroed) { (void)size, (void)zeroed; return p; }
static inline void vg_free(void *p) { (void)p; }
static inline th_heap_t *vg_realloc_begin(void *p) { (void)p; return NULL; }
static inline void *vg_realloc_end(th_heap_t *old, void *p, void *q, size_t size) {
  (void)old, (void)p, (void)size;
  return q;
}
static inline void vg_defined(void *p, size_t size) { (void)p, (void)size; }
#endif

/* ---- profile.c, profile_write.c: heap profiles (THREADHEAP_PROFILE, THREADHEAP_LEAKS) */
extern bool th_profile_on; /* sampling is under way: the slow paths call the hooks below */
void profile_init(void);
void profile_done(void); /* at exit: the last profile and the leak report */
void profile_fork_child(void);
void profile_tick(uint64_t now_ms); /* from heap_purge: THREADHEAP_PROFILE_INTERVAL and SIGUSR2 dumps */
void *profile_malloc(th_heap_t *heap, size_t size);
void profile_settle_all(th_heap_t *heap);
void profile_first_changed(th_heap_t *heap, size_t c);
void profile_free_tick(th_heap_t *heap, th_page_t *page);
void profile_heap_end(th_heap_t *heap);
void profile_fresh(size_t bytes);
void profile_free_sampled(th_block_t *block);
/* A huge block allocated (fresh: mapped just now, for fresh_space) or reallocated: sampled or not. */
void profile_huge_alloc(th_segment_t *seg, size_t size, bool fresh);
void profile_huge_free(th_segment_t *seg);

/* ---- secure.c: secure mode (THREADHEAP_SECURE): every malloc and free of a secure heap takes a slow path */
void secure_start(void); /* the library constructor, once the options are read */
void secure_heap_attach(th_heap_t *heap); /* a heap made in secure mode: its quarantine */
void *secure_malloc(th_heap_t *heap, size_t size); /* heap_malloc_queue on a secure heap */
void *secure_malloc_fill(th_heap_t *heap, size_t size); /* heap_malloc_fill on a secure heap */
/* th_free's call for a pointer in a TH_MAP_SLOW segment's first region: freed there, or passed on to
 * free_checked. */
void secure_free_fast(void *p);
void secure_free(th_segment_t *seg, th_page_t *page, th_block_t *b, const void *p); /* free_checked: p in block b */
/* th_realloc of a secure block: checked; true when resized in place (within its size class). */
bool secure_realloc(th_segment_t *seg, th_page_t *page, void *p, size_t size);
size_t secure_usable_size(const th_page_t *page, const void *p);
bool secure_is_free(const th_page_t *page, const th_block_t *b); /* free_check_block: a tagged block's witness */
void secure_carve(th_page_t *page, uint8_t *first, size_t n); /* page_extend: n fresh blocks from first */
/* page_collect: the remote stack taken; returns how many blocks the page counts free now (0: they wait for
 * the quarantine) */
size_t secure_collect(th_page_t *page, th_block_t *head, size_t n);
/* heap_purge's round: remote frees into the quarantine, and the rings of classes long not freed emptied */
void secure_purge(th_heap_t *heap);
void secure_flush(th_heap_t *heap); /* heap_collect: the quarantine empties */
size_t secure_free_count(const th_page_t *page, bool *ok); /* page_is_valid */
void secure_segment_init(th_segment_t *seg);    /* guard pages set */
void secure_segment_release(th_segment_t *seg); /* and lifted */
void secure_huge_alloc(th_segment_t *seg, void *p, size_t size);

/* ---- export.c */
/* THREADHEAP_STATS_INTERVAL: publish the counters if the interval has passed (slow paths call it). */
void export_tick(uint64_t now_ms);
/* At exit: remove the file. In a forked child: forget the parent's file. */
void export_done(void);
void export_fork_child(void);

/* ---- options.c */
typedef struct th_options_s {
  long purge_delay;  /* THREADHEAP_PURGE_DELAY, ms */
  long cache_max;    /* THREADHEAP_CACHE_MAX, bytes */
  long show_stats;   /* THREADHEAP_SHOW_STATS */
  long verbose;      /* THREADHEAP_VERBOSE */
  long huge_pages;   /* THREADHEAP_HUGE_PAGES */
  long stats_pid;    /* THREADHEAP_STATS_PID: only this process prints the counters at exit; 0: any */
  const char *stats_file; /* THREADHEAP_STATS_FILE: where the counters go at exit; NULL: stderr */
  long stats_interval; /* THREADHEAP_STATS_INTERVAL, ms: publish the counters this often (0: never) */
  long remote_pairs;   /* THREADHEAP_REMOTE_PAIRS: count who frees whose memory; default: with the export
                        * or SHOW_STATS on */
  const char *profile_path; /* THREADHEAP_PROFILE: heap profiling on, the profile written here at exit */
  long profile_rate;        /* THREADHEAP_PROFILE_RATE: mean bytes between samples */
  long profile_interval;    /* THREADHEAP_PROFILE_INTERVAL, s: also write PATH.<n> this often (0: never) */
  long profile_signal;      /* THREADHEAP_PROFILE_SIGNAL: SIGUSR2 writes PATH.<n> (if the program has no handler) */
  long leaks;               /* THREADHEAP_LEAKS: print the sampled blocks still live at exit */
  long secure;              /* THREADHEAP_SECURE: 1 checks blocks (secure.c), 2 also zeroes them when freed */
  long lazy_commit;         /* THREADHEAP_LAZY_COMMIT: segments made writable as carved; default:
                             * on under strict overcommit (vm.overcommit_memory = 2) */
  long page_pool;           /* THREADHEAP_PAGE_POOL: thread heaps lend free small page slots (pool.c) */
} th_options_t;
extern th_options_t th_options;
void options_init(void); /* process_init (once), and the library constructor */
void options_print(void);
/* One "threadheap: ..." line on stderr when THREADHEAP_VERBOSE is on; keeps errno. Slow paths only. */
void options_verbose(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- stats.c */
void stats_os_map(size_t size);
void stats_os_unmap(size_t size);
void stats_os_purge(size_t size);
void stats_os_call(uint64_t ns);
void stats_committed(long delta);
void stats_cached(long delta);
void stats_count(size_t *counter);
void stats_add(size_t *counter, size_t n);
/* in_use_peak rises to in_use if that is higher. */
void stats_peak_in_use(size_t in_use);
void stats_add_remote(size_t n);
/* The calling thread's batched counts into the shared counters (th_stats_get and thread exit call it). */
void stats_flush_thread(void);
/* THREADHEAP_SHOW_STATS: print the counters at exit (to THREADHEAP_STATS_FILE or stderr). stats_init runs
 * after options_init and prepares that. */
void stats_init(void);
void stats_print_at_exit(void);
extern th_stats_t th_stats_global;
extern const char *const stats_names[]; /* th_stats_t's fields, in order */

/* ---- shared inline helpers */

static inline uintptr_t thread_id(void) { return (uintptr_t)__builtin_thread_pointer(); }

/* Every slow-path lock is taken through these. Between threadheap's fork handlers the forking thread holds
 * all of them, with the data they guard consistent; fork handlers the program registered before threadheap's
 * run inside that window (their prepare after ours, their child before ours) and may allocate: for that
 * thread the lock is as good as held, so none is taken. Other threads take the lock, and wait. While a thread
 * takes or releases a lock, th_lock_busy names it, and once it holds one, the lock's holder names the thread:
 * so a fork from a signal handler that interrupted the thread there knows not to wait for it. Each sets
 * th_lock_busy back to what it was: a signal handler's fork may take and release locks in the middle of the
 * code it interrupted, which must still be named busy when the handler returns. */
extern __thread th_mutex_t *th_lock_busy __attribute__((tls_model("initial-exec")));

static inline bool th_fork_owner_is_me(void) {
  return th_unlikely(atomic_load_explicit(&thread_fork_owner, memory_order_relaxed) == thread_id());
}
static inline void th_lock(th_mutex_t *l) {
  if (th_fork_owner_is_me()) return;
  th_mutex_t *was = th_lock_busy;
  th_lock_busy = l;
  pthread_mutex_lock(&l->m);
  atomic_store_explicit(&l->holder, thread_id(), memory_order_relaxed);
  th_lock_busy = was;
}
/* true when the lock is now held (or skipped, see th_lock); false when another thread holds it. */
static inline bool th_trylock(th_mutex_t *l) {
  if (th_fork_owner_is_me()) return true;
  th_mutex_t *was = th_lock_busy;
  th_lock_busy = l;
  bool held = pthread_mutex_trylock(&l->m) == 0;
  if (held) atomic_store_explicit(&l->holder, thread_id(), memory_order_relaxed);
  th_lock_busy = was;
  return held;
}
static inline void th_unlock(th_mutex_t *l) {
  if (th_fork_owner_is_me()) return;
  th_mutex_t *was = th_lock_busy;
  th_lock_busy = l;
  atomic_store_explicit(&l->holder, 0, memory_order_relaxed);
  pthread_mutex_unlock(&l->m);
  th_lock_busy = was;
}
static inline void th_mutex_init(th_mutex_t *l) {
  pthread_mutex_init(&l->m, NULL);
  atomic_store_explicit(&l->holder, 0, memory_order_relaxed);
  l->fork_level = 0;
}

/* The locks that malloc, free and realloc of ordinary blocks may take (the segment cache, the abandoned
 * segments, the heap-struct pool) never make a thread wait while a fork is under way. Any thread may be inside
 * stdio when it allocates (getline grows its buffer holding the FILE's lock), and glibc's fork takes the stdio
 * list lock after the atfork prepare handlers, threadheap's among them, have run: a thread waiting here for a
 * lock the forking thread holds would keep a FILE locked that fflush(NULL) waits for while holding the list
 * lock that fork waits for. So: false, without the lock, once a fork has begun and the lock is busy; the caller
 * then does without (maps instead of taking from the cache, unmaps instead of caching, skips a purge or an
 * adoption), touching only memory no lock guards. Otherwise the lock is held (or skipped, see th_lock). */
static inline bool th_lock_unless_fork(th_mutex_t *l) {
  if (th_fork_owner_is_me()) return true;
  th_mutex_t *was = th_lock_busy;
  th_lock_busy = l;
  bool held = th_likely(pthread_mutex_trylock(&l->m) == 0) || thread_lock_wait(&l->m);
  if (held) atomic_store_explicit(&l->holder, thread_id(), memory_order_relaxed);
  th_lock_busy = was;
  return held;
}

/* Size class of a request: multiples of 16 to 128, then four classes per power of two (worst waste < 25%). */
static inline size_t size_class(size_t n) {
  if (n <= 128) return n <= 16 ? 1 : (n + 15) >> 4;
  size_t w = n - 1;
  size_t b = 63 ^ (size_t)__builtin_clzl(w); /* the top bit's index: one bsr */
  return 8 + (b - 7) * 4 + ((w >> (b - 2)) & 3) + 1;
}

static inline size_t class_size(size_t c) {
  if (c <= 8) return c * 16;
  size_t k = c - 9, b = 7 + k / 4, q = k % 4;
  return ((size_t)1 << b) + (q + 1) * ((size_t)1 << (b - 2));
}

static inline th_kind_t class_kind(size_t c) {
  size_t s = class_size(c);
  return s <= TH_SMALL_MAX ? TH_KIND_SMALL : s <= TH_MEDIUM_MAX ? TH_KIND_MEDIUM : TH_KIND_LARGE;
}

/* The segment that holds p, or NULL when p is not in memory threadheap mapped. The map keeps a byte per
 * 4 MiB region: 0 for memory not ours, k for "the segment starts k-1 regions back" (255: look again from
 * there, for huge blocks longer than 254 regions). One load and a compare for every block but huge ones. */
static inline th_segment_t *segment_lookup(const void *p) {
  uintptr_t i = (uintptr_t)p >> TH_SEGMENT_SHIFT;
  if (th_unlikely(i >= TH_MAP_ENTRIES)) return NULL;
  uint8_t back = atomic_load_explicit(&th_segment_map[i], memory_order_relaxed);
  if (th_likely(back == 1)) return (th_segment_t *)(i << TH_SEGMENT_SHIFT);
  return segment_lookup_slow(i, back);
}

static inline th_page_t *segment_page_of(th_segment_t *seg, const void *p) {
  return (th_page_t *)((uint8_t *)seg->pages + (((uintptr_t)p >> seg->page_index_shift) & seg->page_index_mask));
}

/* The page descriptor th_free takes for p: the page map's entry for p's low 47 bits (a shift and the mask,
 * no bounds test: a pointer past 2^47 names another address's page, whose block-start test its high bits
 * then fail). A stand-in of zeros for memory that is not a paged segment's, or a secure one's. */
static inline th_page_t *page_map_lookup(const void *p) {
  uintptr_t i = ((uintptr_t)p >> TH_PAGE_MAP_SHIFT) & th_page_map.mask;
  /* The mask before the map: page_map_reserve stores the map first, so a mask that is no longer 0 comes
   * with the map it indexes (x86-64 keeps loads in order; this keeps the compiler from swapping them). */
  atomic_signal_fence(memory_order_acquire);
  uintptr_t *map = atomic_load_explicit(&th_page_map.map, memory_order_relaxed);
  return (th_page_t *)((uintptr_t)map + __atomic_load_n(&map[i], __ATOMIC_RELAXED));
}

/* A page descriptor's segment: descriptors live in their segment's header, in its first region. */
static inline th_segment_t *segment_of_page(const th_page_t *page) {
  return (th_segment_t *)((uintptr_t)page & ~(uintptr_t)(TH_SEGMENT_SIZE - 1));
}

/* A small segment's borrower table, after its page descriptors: the heap each page is lent to (pool.c).
 * Atomic: another thread's remote free reads it (page_heap) while the borrower may be exiting, as it reads
 * a segment's heap while its owner abandons it. */
static inline _Atomic(th_heap_t *) *page_borrower(const th_page_t *page) {
  th_segment_t *seg = segment_of_page(page);
  return (_Atomic(th_heap_t *) *)(void *)(seg->pages + seg->page_count) + (page - seg->pages);
}
static inline uint8_t page_out(const th_page_t *page) { return __atomic_load_n(&page->out, __ATOMIC_RELAXED); }

/* The heap whose blocks the page holds: its borrower's while lent out (NULL once its borrower exited), else
 * its segment's. */
static inline th_heap_t *page_heap(const th_page_t *page, memory_order order) {
  if (th_unlikely(page_out(page) != TH_OUT_HOME)) return atomic_load_explicit(page_borrower(page), order);
  return atomic_load_explicit(&segment_of_page(page)->heap, order);
}

/* Pages first..last (linked by ready_next) onto the heap's ready stack, which any thread may push to and only
 * its owner, or a sweeper holding the heap, takes whole. */
static inline void heap_ready_push(th_heap_t *heap, th_page_t *first, th_page_t *last) {
  th_page_t *top = atomic_load_explicit(&heap->ready, memory_order_relaxed);
  do {
    last->ready_next = top;
  } while (!atomic_compare_exchange_weak_explicit(&heap->ready, &top, first, memory_order_release,
                                                  memory_order_relaxed));
}

/* Remote frees into a page: a chain of n blocks one thread freed, head to tail (one block, or free.c's
 * remote batch), pushed with one CAS when the page is not parked as full (state NORMAL or NOTIFIED);
 * page_push_remote_chain handles the rest and retries. */
static inline void page_push_remote_n(th_page_t *page, th_block_t *head, th_block_t *tail, size_t n) {
  uintptr_t tf = atomic_load_explicit(&page->thread_free, memory_order_relaxed);
  uintptr_t state = tf & TH_TF_MASK;
  if (th_likely(state == TH_TF_NORMAL || state == TH_TF_NOTIFIED)) {
    tail->next = (th_block_t *)(tf & TH_TF_PTR_MASK);
    uintptr_t pushed = ((tf & ~TH_TF_PTR_MASK) + ((uintptr_t)n << TH_TF_COUNT_SHIFT)) | (uintptr_t)head;
    if (th_likely(atomic_compare_exchange_strong_explicit(&page->thread_free, &tf, pushed, memory_order_release,
                                                          memory_order_relaxed)))
      return;
  }
  page_push_remote_chain(page, head, tail, n);
}

/* A free by a thread that does not own the page. */
static inline void page_push_remote(th_page_t *page, th_block_t *block) { page_push_remote_n(page, block, block, 1); }

/* A counter one thread writes (or one lock guards) and any thread reads: a relaxed load and store, no locked
 * instruction. */
static inline void count_add(_Atomic(uint64_t) *count, uint64_t n) {
  atomic_store_explicit(count, atomic_load_explicit(count, memory_order_relaxed) + n, memory_order_relaxed);
}

/* One more remote free of a pair (free_remote): the freeing thread alone writes the count, other threads
 * read it. On x86-64 one add to memory (the compiler makes a relaxed atomic increment a load, an add and a
 * store); a torn read cannot happen for an aligned 8-byte word. */
static inline void pairs_count_one(_Atomic(uint64_t) *count) {
#if defined(__x86_64__)
  __asm__("addq $1, %0" : "+m"(*count));
#else
  count_add(count, 1);
#endif
}

/* The index of the block that starts at p, or a number larger than any block count when no block of the page
 * starts there: one multiply and a rotate (see th_page_t.block_inv). */
static inline uint64_t page_block_index(const th_page_t *page, const void *p) {
  uint64_t x = ((uint64_t)(uintptr_t)p - (uint64_t)(uintptr_t)page->start) * page->block_inv;
  unsigned k = page->block_shift;
  return (x >> k) | (x << ((64 - k) & 63));
}

/* Is p the start of a block the page has carved? capacity grows under the owner while other threads free:
 * a relaxed atomic load. */
static inline bool page_is_block(const th_page_t *page, const void *p) {
  return page_block_index(page, p) < __atomic_load_n(&page->capacity, __ATOMIC_RELAXED);
}

/* The same test by the owner, who alone writes capacity: a plain load, which the compare takes straight from
 * memory (an atomic load costs th_free a separate instruction). */
static inline bool page_is_block_owner(const th_page_t *page, const void *p) {
  return page_block_index(page, p) < page->capacity;
}

/* The second word of a free block: the double-free tag, the block's address plus an odd constant past any
 * block's size (one lea, where a key in memory costs a load): never a pointer into the block nor an aligned
 * one. It only filters: a program word that happens to match sends its free to the slow path, which looks
 * the block up in the page's lists before it reports anything. */
#define TH_FREE_TAG_OFFSET ((uintptr_t)0x6b43a9b5)
static inline uintptr_t free_tag(const void *block) { return (uintptr_t)block + TH_FREE_TAG_OFFSET; }

/* The checks free_check_block makes, made as th_free's fast path makes them, for the entry points that look
 * a block up without freeing it (realloc, malloc_usable_size): p's page from the page map (a stand-in, for
 * memory that is no paged segment's or a secure or sampled one's, has capacity 0), the start of a block
 * its page has carved (a free page slot has capacity 0 too), not tagged free. Its page; NULL when a test
 * fails (NULL included), and free_check_block then decides, and reports. Any thread: capacity is read
 * atomically. */
static inline th_page_t *block_page_fast(const void *p) {
  th_page_t *page = page_map_lookup(p);
  if (th_unlikely(!page_is_block(page, p) || ((const th_block_t *)p)->tag == free_tag(p))) return NULL;
  return page;
}

/* Offset of p from the block that holds it: 0 for a block start. Slow paths only (a 32-bit division: a
 * page's offsets are under 4 MiB). */
static inline size_t page_block_offset(const th_page_t *page, const void *p) {
  uint32_t off = (uint32_t)((const uint8_t *)p - page->start);
  return off % page->block_size;
}

static inline size_t align_up(size_t n, size_t a) { return (n + a - 1) & ~(a - 1); }

/* The bytes an explicit heap's cap counts: its pages' committed memory and its huge blocks. */
static inline size_t heap_committed(th_heap_t *heap) {
  return heap->stat.committed + atomic_load_explicit(&heap->huge_bytes, memory_order_relaxed);
}

static inline bool heap_is_explicit(const th_heap_t *heap) { return (heap->flags & TH_HEAP_EXPLICIT) != 0; }

/* The time between two purge rounds of a heap (heap_purge), and between two sweeps (sweep.c): a quarter of
 * the purge delay, at least 10 ms. */
static inline uint64_t purge_round_ms(uint64_t delay) { return delay / 4 > 10 ? delay / 4 : 10; }

/* The pause in progress at now since a purge round at last (0: none yet): a gap of more than two round
 * intervals, less the one interval it counts as (a heap's clock, and the process's in segment.c). */
static inline uint64_t pause_since(uint64_t last, uint64_t now, uint64_t round) {
  return last != 0 && now > last + 2 * round ? now - last - round : 0;
}

/* The heap's pause in progress at wall time now, which its next round adds to paused_ms (heap_purge). */
static inline uint64_t heap_pause_pending(const th_heap_t *heap, uint64_t now) {
  uint64_t round = purge_round_ms((uint64_t)th_options.purge_delay);
  uint64_t next = __atomic_load_n(&heap->next_purge_ms, __ATOMIC_RELAXED); /* (a sweeper may ask: heap_sweep) */
  return pause_since(next != 0 ? next - round : 0, now, round); /* next - round: the last round */
}

/* The heap's purge clock at wall time now (th_heap_t.paused_ms), with a pause in progress already taken out:
 * what the heap's next round will read. A slot freed in a pause, before that round, is stamped on it; on the
 * clock of its last round (wall time less paused_ms alone) it would be stamped past the time the next round
 * reads, and look older than any delay to it: a program that freed its memory on waking, to reuse it at
 * once, had it purged under its feet. */
static inline uint64_t heap_clock(const th_heap_t *heap, uint64_t now) {
  return now - heap->paused_ms - heap_pause_pending(heap, now);
}

/* Has the stamp, on the same clock as now, waited age ms? A stamp ahead of now (taken just before a gap
 * became a pause, which the round then took out) has not. */
static inline bool clock_waited(uint64_t now, uint64_t stamp, uint64_t age) { return now >= stamp && now - stamp >= age; }

/* The owner enters and leaves its heap's slow paths, everything that touches more than the first page of a
 * class: a sweeper (sweep.c) frees pages of a heap only while it holds the heap and its owner is in none.
 * The owner's side of the asymmetric fence is a plain store, a compiler barrier and a plain load; the
 * sweeper's, a store, a barrier on every thread (os_fence_all_threads) and a load, so that one of them
 * always sees the other. Depth, not a flag: slow paths nest (a free inside a malloc slow path). */
static inline void heap_slow_mark(th_heap_t *heap) {
  atomic_store_explicit(&heap->in_slow, atomic_load_explicit(&heap->in_slow, memory_order_relaxed) + 1,
                        memory_order_relaxed);
  atomic_signal_fence(memory_order_seq_cst);
}
static inline void heap_slow_enter(th_heap_t *heap) {
  heap_slow_mark(heap);
  if (th_unlikely(atomic_load_explicit(&heap->sweeping, memory_order_acquire) != 0)) heap_slow_wait(heap);
}
static inline void heap_slow_exit(th_heap_t *heap) {
  atomic_store_explicit(&heap->in_slow, atomic_load_explicit(&heap->in_slow, memory_order_relaxed) - 1,
                        memory_order_release);
}

/* The explicit heap a shard belongs to (a heap is its own first shard). */
static inline th_heap_t *heap_outer(th_heap_t *heap) { return heap->parent ? heap->parent : heap; }

/* AddressSanitizer builds (TH_ASAN) poison a free small or medium block past its two list words, so that a
 * use after free inside threadheap's pages is reported; other builds compile these to nothing. Poison never
 * outlives the page: segment_page_free unpoisons what the page carved, so a huge block or another page
 * that later takes the memory starts clean. */
#ifdef TH_ASAN
static inline void block_poison(void *b, size_t size) {
  if (size > sizeof(th_block_t) && size <= TH_MEDIUM_MAX)
    ASAN_POISON_MEMORY_REGION((uint8_t *)b + sizeof(th_block_t), size - sizeof(th_block_t));
}
static inline void block_unpoison(void *b, size_t size) { ASAN_UNPOISON_MEMORY_REGION(b, size); }
#elif defined(TH_VALGRIND)
/* Under valgrind (TH_VALGRIND): a block handed out is accessible again, whatever memcheck was told at its
 * last free (valgrind.c keeps freed explicit-heap blocks no-access past their list words). */
static inline void block_poison(void *b, size_t size) { (void)b, (void)size; }
static inline void block_unpoison(void *b, size_t size) { VALGRIND_MAKE_MEM_UNDEFINED(b, size); }
#else
static inline void block_poison(void *b, size_t size) { (void)b, (void)size; }
static inline void block_unpoison(void *b, size_t size) { (void)b, (void)size; }
#endif

static inline uint32_t page_used(const th_page_t *page) { return page->used_word & TH_USED_MASK; }
/* The owner's frees into the page not yet folded into its heap's flow (all ones while parked as full). */
static inline uint32_t page_owner_frees(const th_page_t *page) { return page->used_word >> TH_USED_BITS; }
/* No free of the owner's into the page since it was started or last unparked: its blocks went to other
 * threads (a producer's page), which a sweep purges at once and a heap hands off when it fills. */
static inline bool page_handed_away(const th_page_t *page) { return page_owner_frees(page) == 0 && !page->owner_freed; }

/* Blocks of class c freed from the heap's pages, folded on a slow path (th_heap_flow_t). Owner only. */
static inline void heap_count_frees(th_heap_t *heap, size_t c, uint64_t n) { count_add(&heap->flow.frees[c], n); }
static inline void heap_count_fresh(th_heap_t *heap, size_t c, uint64_t bytes) {
  count_add(&heap->flow.fresh[c], bytes);
}

/* Hand out the first free block of a page that has one: pop, count it used, clear its free tag. */
static inline void *page_pop(th_page_t *page) {
  th_block_t *b = page->free;
  page->free = b->next;
  page->used_word++;
  b->tag = 0;
  block_unpoison(b, page->block_size);
  return b;
}

/* One block fewer used by the owner's free, and one more free counted above TH_USED_BITS: true when that
 * count carries out of the word, once every 4,096 frees of the page (the heap's clock tick). On x86-64 the
 * add to memory sets the carry flag the test reads; the compiler's own form loads, adds and stores. */
static inline bool page_count_free(th_page_t *page) {
  bool carry;
#if defined(__x86_64__)
  __asm__("addl %2, %0" : "+m"(page->used_word), "=@ccc"(carry) : "i"(TH_FREE_ADD));
#else
  carry = __builtin_add_overflow(page->used_word, TH_FREE_ADD, &page->used_word);
#endif
  return carry;
}

/* The page's free list ran dry: the remote frees collected onto local_free earlier become the free list.
 * Owner only; no lock, no atomic. */
static inline void page_free_from_local(th_page_t *page) {
  th_assert(page->free == NULL);
  page->free = page->local_free;
  page->local_free = NULL;
}

/* The page the small direct table gives for a request of size <= TH_DIRECT_MAX bytes: an entry per 16 bytes. */
static inline th_page_t *heap_direct_small(const th_heap_t *heap, size_t size) {
  return heap->direct[(size + 15) >> 4];
}

/* The page the direct tables give for a request of size <= TH_LARGE_MAX bytes (its class's first page, or an
 * empty one). */
static inline th_page_t *heap_page_for_size(th_heap_t *heap, size_t size) {
  if (th_likely(size <= TH_DIRECT_MAX)) return heap_direct_small(heap, size);
  if (size <= TH_MEDIUM_MAX) return heap->direct_medium[(size + 255) >> 8];
  return heap->direct_large[(size + 16383) >> 14];
}

/* The malloc fast path on a heap: a table lookup and a pop, no lock, no atomic; everything else is a tail
 * call to `slow` (heap_malloc_queue, or operator new's, which adds the new_handler loop). Always inlined
 * with a constant `slow`, so the call is direct. */
__attribute__((always_inline)) static inline void *heap_malloc_or(th_heap_t *heap, size_t size,
                                                                  void *(*slow)(th_heap_t *, size_t)) {
  th_page_t *page;
  /* heap_page_for_size's lookup with the huge case as its last branch: a test of its own before or after the
   * lookup (NULL for huge) cost the pop path 4 instructions. */
  if (th_likely(size <= TH_DIRECT_MAX)) page = heap_direct_small(heap, size);
  else if (size <= TH_MEDIUM_MAX) page = heap->direct_medium[(size + 255) >> 8];
  else if (size <= TH_LARGE_MAX) page = heap->direct_large[(size + 16383) >> 14];
  else return slow(heap, size);
  if (th_likely(page->free != NULL)) return page_pop(page);
  return slow(heap, size);
}

/* The malloc fast path on a heap (th_malloc on the thread's, th_heap_malloc on an explicit one). */
static inline void *heap_malloc(th_heap_t *heap, size_t size) { return heap_malloc_or(heap, size, heap_malloc_queue); }

#pragma GCC visibility pop

#endif /* TH_INTERNAL_H */
