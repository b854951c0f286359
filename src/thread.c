/* thread.c: process start (process_init), a thread's first heap (thread_heap_init), and its end: the heap is
 * abandoned, its segments wait for adoption, and its struct is kept for the next thread. Also fork. */
#include <errno.h>
#include <string.h>

#include "internal.h"
#include "os.h"

__thread th_heap_t *th_heap_tls __attribute__((tls_model("initial-exec"))) = &th_heap_empty;

/* Per-process random key for the double-free tag of free blocks. */
uintptr_t th_key;

static pthread_key_t heap_key;
static _Atomic(int) init_state; /* 0: not started, 1: running, 2: done */

/* Heap structs are never unmapped: a remote free may still be reading one (see page_push_remote_chain). Unused
 * ones wait in a pool for the next thread: heaps_pool under heaps_lock, and heaps_returned, a stack that
 * thread_struct_free pushes on without a lock (so that a thread exiting during a fork does not wait) and that
 * the next locked thread_struct_alloc takes whole. */
static th_mutex_t heaps_lock = TH_MUTEX_INIT;
static th_heap_t *heaps_pool;
static _Atomic(th_heap_t *) heaps_returned;
static uint8_t *heaps_chunk;
static size_t heaps_chunk_left;
#define HEAPS_CHUNK_SIZE ((size_t)256 << 10)
#define HEAP_STRUCT_SIZE align_up(sizeof(th_heap_t), 64)
static _Atomic(size_t) heaps_made; /* structs carved or mapped, ever (never unmapped): metadata */
static _Atomic(th_heap_t *) heaps_all; /* every struct ever made, through all_next */

size_t thread_struct_bytes(void) {
  return atomic_load_explicit(&heaps_made, memory_order_relaxed) * HEAP_STRUCT_SIZE;
}

th_heap_t *thread_heaps_all(void) { return atomic_load_explicit(&heaps_all, memory_order_acquire); }

/* A struct made for the first time joins heaps_all (push only, so readers may walk it at any time). */
static th_heap_t *struct_made(th_heap_t *heap) {
  if (heap == NULL) return NULL;
  atomic_fetch_add_explicit(&heaps_made, 1, memory_order_relaxed);
  th_heap_t *top = atomic_load_explicit(&heaps_all, memory_order_relaxed);
  do heap->all_next = top;
  while (!atomic_compare_exchange_weak_explicit(&heaps_all, &top, heap, memory_order_release,
                                                memory_order_relaxed));
  return heap;
}

static void thread_done(void *arg);

void process_init(void) {
  if (th_likely(atomic_load_explicit(&init_state, memory_order_acquire) == 2)) return;
  int expected = 0;
  if (!atomic_compare_exchange_strong_explicit(&init_state, &expected, 1, memory_order_acq_rel,
                                               memory_order_acquire)) {
    while (atomic_load_explicit(&init_state, memory_order_acquire) != 2) __builtin_ia32_pause();
    return;
  }
  os_init();
  (void)os_fence_register(); /* for sweeps (sweep.c): cheap now, with one thread */
  th_key = (uintptr_t)os_random();
  if (pthread_key_create(&heap_key, thread_done) != 0) report_fatal("cannot create the thread key");
  options_init(); /* before the first heap, whose mode they choose */
  atomic_store_explicit(&init_state, 2, memory_order_release);
}

th_heap_t *thread_struct_alloc(void) {
  th_heap_t *heap = NULL;
  if (th_lock_unless_fork(&heaps_lock)) {
    if (heaps_pool == NULL)
      heaps_pool = atomic_exchange_explicit(&heaps_returned, NULL, memory_order_acquire);
    heap = heaps_pool;
    if (heap) {
      heaps_pool = heap->next_free;
    } else if (heaps_chunk_left >= HEAP_STRUCT_SIZE) {
      heap = struct_made((th_heap_t *)heaps_chunk);
      heaps_chunk += HEAP_STRUCT_SIZE;
      heaps_chunk_left -= HEAP_STRUCT_SIZE;
    }
    th_unlock(&heaps_lock);
    if (heap) return heap;
  } else {
    /* A fork is under way: a struct of its own mapping, which later joins the pool like any other. */
    return struct_made(os_map_aligned(align_up(HEAP_STRUCT_SIZE, os_page_size()), os_page_size()));
  }
  /* Map outside the lock; a racing thread may map too, and the spare chunk then serves later threads. */
  uint8_t *chunk = os_map_aligned(HEAPS_CHUNK_SIZE, os_page_size());
  if (chunk == NULL) return NULL;
  heap = struct_made((th_heap_t *)chunk);
  if (th_lock_unless_fork(&heaps_lock)) {
    heaps_chunk = chunk + HEAP_STRUCT_SIZE;
    heaps_chunk_left = HEAPS_CHUNK_SIZE - HEAP_STRUCT_SIZE;
    th_unlock(&heaps_lock);
  }
  return heap;
}

th_heap_t *thread_heap_init(void) {
  process_init();
  th_heap_t *heap = thread_struct_alloc();
  if (heap == NULL) return NULL;
  heap_slow_enter(heap); /* a sweeper may be looking at the struct: it sweeps only live heaps (sweep.c) */
  heap_init(heap);
  __atomic_store_n(&heap->thread_id, thread_id(), __ATOMIC_RELAXED);
  if (th_options.secure) secure_heap_attach(heap);
  heap_slow_exit(heap);
  atomic_store_explicit(&heap->tid, os_thread_tid(), memory_order_relaxed);
  th_heap_tls = heap;
  /* Keys below PTHREAD_KEY_2NDLEVEL_SIZE need no allocation; ours is created first thing. */
  pthread_setspecific(heap_key, heap);
  stats_count(&th_stats_global.heaps_created);
  stats_count(&th_stats_global.threads_live);
  return heap;
}

/* Set once the thread's heap is abandoned. Other key destructors and libc's own cleanup may still call
 * malloc and free after that: frees take the remote path (the segments have no owner any more), and
 * mallocs go to the late heap, since a new heap made now might be created after the last destructor round
 * and never be abandoned. */
static __thread bool thread_is_done __attribute__((tls_model("initial-exec")));
static _Atomic(th_heap_t *) late_heap;

/* A serialized explicit heap shared by every thread past its exit, made on first use and never destroyed. */
void *thread_late_malloc(size_t size) {
  th_heap_t *heap = atomic_load_explicit(&late_heap, memory_order_acquire);
  if (heap == NULL) {
    th_heap_t *made = th_heap_create(0, 0, 0);
    if (made == NULL) return NULL;
    if (atomic_compare_exchange_strong_explicit(&late_heap, &heap, made, memory_order_acq_rel,
                                                memory_order_acquire)) {
      heap = made;
    } else {
      th_heap_destroy(made); /* another exiting thread made it first */
    }
  }
  return th_heap_malloc(heap, size);
}

bool thread_exited(void) { return thread_is_done; }

/* A thread without a default heap may still count remote frees, when it collects an explicit heap's pages:
 * its key gets a value (the empty heap) so that thread_done runs at its exit and adds its last batch. */
void thread_flush_stats_at_exit(void) {
  if (th_heap_tls != &th_heap_empty || thread_is_done) return;
  if (atomic_load_explicit(&init_state, memory_order_acquire) != 2) return;
  if (pthread_getspecific(heap_key) == NULL) pthread_setspecific(heap_key, &th_heap_empty);
}

static void thread_done(void *arg) {
  th_heap_t *heap = arg;
  free_remote_flush(); /* the frees it holds for other threads' pages, before its own pages are looked at */
  if (heap == &th_heap_empty) stats_flush_thread(); /* see thread_flush_stats_at_exit */
  if (heap == NULL || heap == &th_heap_empty) return;
  th_heap_tls = &th_heap_empty;
  thread_is_done = true;
  heap_slow_enter(heap); /* no sweeper (sweep.c) while the heap ends, and none after: thread_id is 0 */
  profile_heap_end(heap);
  /* After this no remote free can name the heap: full pages go back to NORMAL first. */
  for (th_page_t *page = heap->full.first; page; page = page->next) page_clear_delay(page);
  heap_exit(heap);
  for (size_t k = 0; k < TH_KINDS_PAGED; k++) {
    th_segment_t *seg = heap->segments[k];
    while (seg) {
      th_segment_t *next = seg->next;
      segment_abandon(seg);
      seg = next;
    }
    heap->segments[k] = NULL;
  }
  __atomic_store_n(&heap->thread_id, 0, __ATOMIC_RELAXED);
  heap_slow_exit(heap);
  stats_flush_thread();
  attribution_fold(heap);
  pairs_thread_done(heap);
  stats_count(&th_stats_global.heaps_abandoned);
  atomic_fetch_sub_explicit((_Atomic(size_t) *)&th_stats_global.threads_live, 1, memory_order_relaxed);
  thread_struct_free(heap);
}

void thread_struct_free(th_heap_t *heap) {
  th_heap_t *top = atomic_load_explicit(&heaps_returned, memory_order_relaxed);
  do heap->next_free = top;
  while (!atomic_compare_exchange_weak_explicit(&heaps_returned, &top, heap, memory_order_release,
                                                memory_order_relaxed));
}

/* ---- fork: every slow-path lock is taken before fork and released in both processes after it. In the
 * child, other threads' heaps may be half-updated (their owners take no lock), so their segments keep their
 * dead owners' ids: the child never adopts them, and its frees into them are remote pushes.
 *
 * fork_pending counts the forks whose prepare handler has begun and whose parent or child handler has not
 * run: while it is not zero, threads do not wait for the locks th_lock_unless_fork takes (see there). A fork
 * from inside the window (a fork handler the program registered before threadheap's, which runs while the
 * forking thread holds every lock) only counts its depth: the locks stay held for the outer fork.
 *
 * The stdio list lock comes first. glibc's fork takes it after the prepare handlers, and a thread in
 * fflush(NULL) holds it while it waits for each FILE's lock, which a thread in getline holds while realloc
 * grows its buffer. The ordinary allocation paths never wait for a lock during a fork (th_lock_unless_fork),
 * but an explicit heap's shard and huge-block locks have nothing to fall back on: a getline buffer from a
 * serialized heap must wait for them. Holding the list lock before them puts threadheap's locks after stdio's,
 * where glibc's own malloc takes its arena locks: a thread inside stdio that waits for a threadheap lock then
 * holds nothing the forking thread still needs. The lock is recursive (glibc's fork takes it again); the
 * parent releases it once more, and the child resets it, as glibc does for its own. It is recursive only
 * once its owner is set, though: taken, its word is locked first and its owner written after; released,
 * the owner is cleared before the word. A signal handler that forked in between waited for its own thread
 * for good (test_fork_signal hung in 1 of 24 runs on a loaded machine), so both run with every signal
 * blocked. Where libc has no such lock (the weak references are null), only the ordinary paths are safe. */

extern void _IO_list_lock(void) __attribute__((weak));
extern void _IO_list_unlock(void) __attribute__((weak));
extern void _IO_list_resetlock(void) __attribute__((weak));
static inline bool stdio_list_lock_known(void) { return _IO_list_lock && _IO_list_unlock && _IO_list_resetlock; }

_Atomic(uintptr_t) thread_fork_owner;
static _Atomic(unsigned) fork_pending;
static unsigned fork_depth; /* nested forks inside the window; only the owner touches it */
/* fork_prepare calls under way in this thread: 2 when a signal handler forks while this thread was in the
 * middle of threadheap's own prepare handler. */
static __thread unsigned fork_level __attribute__((tls_model("initial-exec")));
__thread th_mutex_t *th_lock_busy __attribute__((tls_model("initial-exec")));

bool thread_lock_wait(pthread_mutex_t *m) {
  /* Woken at least every millisecond to look at fork_pending: a fork that begins while this thread waits
   * takes the lock next, and the thread must not wait for that. */
  while (atomic_load_explicit(&fork_pending, memory_order_acquire) == 0)
    if (os_mutex_lock_timed(m, 1)) return true;
  return pthread_mutex_trylock(m) == 0;
}

void thread_lock_for_fork(th_mutex_t *l, unsigned level) {
  /* Held, or being taken or released, by this thread: a signal handler interrupted it there. The code it
   * interrupted finishes with the lock and releases it, in the parent and in the child alike. */
  if (atomic_load_explicit(&l->holder, memory_order_relaxed) == thread_id() || th_lock_busy == l) return;
  th_mutex_t *was = th_lock_busy;
  th_lock_busy = l;
  pthread_mutex_lock(&l->m);
  atomic_store_explicit(&l->holder, thread_id(), memory_order_relaxed);
  l->fork_level = level;
  th_lock_busy = was;
}

void thread_unlock_after_fork(th_mutex_t *l, unsigned level, bool child) {
  if (l->fork_level != level) return;
  th_mutex_t *was = th_lock_busy;
  th_lock_busy = l; /* a fork from a signal handler that interrupts the release must not wait for l */
  l->fork_level = 0;
  atomic_store_explicit(&l->holder, 0, memory_order_relaxed);
  if (child) pthread_mutex_init(&l->m, NULL);
  else pthread_mutex_unlock(&l->m);
  th_lock_busy = was;
}

static void fork_prepare(void) {
  if (atomic_load_explicit(&thread_fork_owner, memory_order_relaxed) == thread_id()) {
    fork_depth++;
    return;
  }
  if (stdio_list_lock_known()) os_without_signals(_IO_list_lock);
  unsigned level = ++fork_level;
  atomic_fetch_add_explicit(&fork_pending, 1, memory_order_acq_rel);
  thread_lock_for_fork(&heaps_lock, level);
  explicit_lock_all(level);
  segment_lock_all(level);
  sweep_lock_all(level);
  atomic_store_explicit(&thread_fork_owner, thread_id(), memory_order_relaxed);
}

static void fork_parent(void) {
  if (fork_depth > 0) {
    fork_depth--;
    return;
  }
  unsigned level = fork_level--;
  atomic_store_explicit(&thread_fork_owner, 0, memory_order_relaxed);
  sweep_unlock_all(level, false);
  segment_unlock_all(level, false);
  explicit_unlock_all(level, false);
  thread_unlock_after_fork(&heaps_lock, level, false);
  atomic_fetch_sub_explicit(&fork_pending, 1, memory_order_acq_rel);
  if (stdio_list_lock_known()) os_without_signals(_IO_list_unlock);
}

static void fork_child(void) {
  if (fork_depth > 0) {
    fork_depth--;
    return;
  }
  unsigned level = fork_level--;
  atomic_store_explicit(&thread_fork_owner, 0, memory_order_relaxed);
  sweep_unlock_all(level, true);
  segment_unlock_all(level, true);
  explicit_unlock_all(level, true);
  thread_unlock_after_fork(&heaps_lock, level, true);
  if (stdio_list_lock_known()) _IO_list_resetlock();
  /* A fork inside another's prepare (from a signal handler) leaves the outer prepare to finish: it still
   * counts as pending. */
  atomic_store_explicit(&fork_pending, fork_level, memory_order_relaxed);
  export_fork_child();
  profile_fork_child();
}

/* Runs once libc is ready: options are read here and never earlier, and the fork handlers are registered
 * before the program's own, so the program's prepare handlers (which may allocate) run before ours lock. */
__attribute__((constructor(101))) static void library_init(void) {
  process_init();
  options_init(); /* again only if process_init ran before the environment could be read */
  options_print();
  secure_start();
  stats_init();
  pthread_atfork(fork_prepare, fork_parent, fork_child);
  profile_init();
}

/* Runs at exit, after the program's own destructors and atexit handlers; it only reads the counters. */
__attribute__((destructor)) static void library_done(void) {
  profile_done();
  stats_print_at_exit();
  export_done();
}

void th_collect(void) {
  free_remote_flush();
  th_heap_t *heap = th_heap_tls;
  if (heap != &th_heap_empty) heap_collect(heap);
  segment_cache_purge(true);
}
