/* test_heap_threads.c: explicit heaps under threads, with every block's contents verified.
 *
 *  - a serialized heap (no flag) allocated from, reallocated in and freed into by 8 threads at once, with
 *    blocks handed between threads so that many are freed by a thread that did not allocate them;
 *  - a no-serialize heap whose owner keeps allocating while other threads free its blocks;
 *  - a capped no-serialize heap that passes ten times its cap through blocks freed by other threads: it
 *    only works if the heap collects those frees before it reports ENOMEM;
 *  - th_heap_destroy with live blocks, after other threads have freed the blocks handed to them (their
 *    frees may still sit uncollected in the heap's pages);
 *  - th_realloc from another thread: a serialized heap's block stays in its heap (seen through its cap), a
 *    no-serialize heap's block moves to the calling thread's default heap (it outlives the heap);
 *  - the remote frees that a thread without a default heap collects are counted once it exits.
 *
 *   test_heap_threads [--ops N]    operations per thread in the hammer (fewer under ThreadSanitizer)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "threadheap.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static long g_ops = 10000;

/* A block's bytes depend on its key and position (one mix per 8 bytes); the key is kept beside the pointer. */
static void fill(void *p, size_t n, uint64_t key) {
  unsigned char *b = p;
  uint64_t w = 0;
  for (size_t i = 0; i < n; i++) {
    if ((i & 7) == 0) w = check_mix(key + i);
    b[i] = (unsigned char)(w >> ((i & 7) * 8));
  }
}
static int intact(const void *p, size_t n, uint64_t key) {
  const unsigned char *b = p;
  uint64_t w = 0;
  for (size_t i = 0; i < n; i++) {
    if ((i & 7) == 0) w = check_mix(key + i);
    if (b[i] != (unsigned char)(w >> ((i & 7) * 8))) return 0;
  }
  return 1;
}

static size_t committed(void) {
  th_stats_t s;
  th_stats_get(&s);
  return s.committed;
}

typedef struct {
  unsigned char *p;
  size_t size;
  uint64_t key;
} block_t;

static void run_threads(int n, void *(*fn)(void *), void *args, size_t arg_size) {
  pthread_t t[16];
  for (int i = 0; i < n; i++)
    if (pthread_create(&t[i], NULL, fn, (char *)args + (size_t)i * arg_size) != 0) {
      perror("pthread_create");
      exit(2);
    }
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
}

/* ---- a serialized heap hammered by 8 threads */

#define HAMMER_THREADS 8
#define SLOTS 32
static th_heap_t *g_shared;
static struct {
  pthread_mutex_t lock;
  block_t b;
} g_exchange[SLOTS];

typedef struct {
  int id;
  long allocs, frees, reallocs, handed;
} hammer_arg_t;

static size_t pick_size(uint64_t r) {
  switch (r % 16) {
    case 0: return (size_t)(r >> 8) % (128 * KiB); /* medium and large */
    case 1: return (r >> 8) % 64 == 0 ? 2 * MiB : 100; /* rarely huge */
    default: return (size_t)(r >> 8) % 2048;           /* small */
  }
}

static void *hammer(void *argp) {
  hammer_arg_t *arg = argp;
  block_t own[64];
  memset(own, 0, sizeof own);
  uint64_t serial = (uint64_t)arg->id << 40;
  for (long op = 0; op < g_ops; op++) {
    uint64_t r = check_mix(serial + (uint64_t)op * 7919u);
    block_t *b = &own[r % 64];
    unsigned action = (unsigned)(r >> 56) % 8;
    if (b->p != NULL && !CHECK_MSG(intact(b->p, b->size, b->key), "thread %d: block %p of %zu bytes", arg->id,
                                   (void *)b->p, b->size))
      return NULL;
    if (b->p == NULL) {
      size_t n = pick_size(r);
      b->p = (r >> 20) & 1 ? th_heap_malloc(g_shared, n) : th_heap_calloc(g_shared, 1, n);
      if (!CHECK_MSG(b->p != NULL, "thread %d: allocation of %zu bytes", arg->id, n)) return NULL;
      b->size = n;
      b->key = ++serial;
      fill(b->p, n, b->key);
      arg->allocs++;
    } else if (action < 3) {
      th_free(b->p);
      b->p = NULL;
      arg->frees++;
    } else if (action < 5) {
      size_t n = pick_size(r >> 3);
      unsigned char *q = action == 3 ? th_realloc(b->p, n) : th_heap_realloc(g_shared, b->p, n);
      if (n == 0) {
        b->p = NULL; /* realloc to 0 freed it */
        continue;
      }
      if (!CHECK_MSG(q != NULL, "thread %d: realloc to %zu", arg->id, n)) return NULL;
      size_t keep = n < b->size ? n : b->size;
      CHECK_MSG(intact(q, keep, b->key), "thread %d: realloc %zu -> %zu lost the contents", arg->id, b->size, n);
      b->p = q;
      b->size = n;
      b->key = ++serial;
      fill(q, n, b->key);
      arg->reallocs++;
    } else {
      /* Swap with an exchange slot: someone else will free or reallocate this block. */
      int s = (int)((r >> 32) % SLOTS);
      pthread_mutex_lock(&g_exchange[s].lock);
      block_t mine = *b;
      *b = g_exchange[s].b;
      g_exchange[s].b = mine;
      pthread_mutex_unlock(&g_exchange[s].lock);
      arg->handed++;
    }
  }
  for (int i = 0; i < 64; i++) {
    if (!own[i].p) continue;
    CHECK_MSG(intact(own[i].p, own[i].size, own[i].key), "thread %d: block at the end", arg->id);
    th_free(own[i].p);
  }
  return NULL;
}

static void test_serialized_hammer(void) {
  g_shared = th_heap_create(0, 0, 0);
  if (!CHECK(g_shared != NULL)) return;
  for (int s = 0; s < SLOTS; s++) pthread_mutex_init(&g_exchange[s].lock, NULL);
  hammer_arg_t args[HAMMER_THREADS];
  memset(args, 0, sizeof args);
  for (int i = 0; i < HAMMER_THREADS; i++) args[i].id = i + 1;
  run_threads(HAMMER_THREADS, hammer, args, sizeof args[0]);
  long allocs = 0, frees = 0, reallocs = 0, handed = 0;
  for (int i = 0; i < HAMMER_THREADS; i++) {
    allocs += args[i].allocs, frees += args[i].frees, reallocs += args[i].reallocs, handed += args[i].handed;
  }
  for (int s = 0; s < SLOTS; s++) {
    block_t *b = &g_exchange[s].b;
    if (!b->p) continue;
    CHECK_MSG(intact(b->p, b->size, b->key), "exchange slot %d at the end", s);
    th_free(b->p);
    b->p = NULL;
  }
  printf("serialized heap, %d threads: %ld allocations, %ld frees, %ld reallocs, %ld hand-overs\n",
         HAMMER_THREADS, allocs, frees, reallocs, handed);
  CHECK(allocs > HAMMER_THREADS * g_ops / 4 && handed > 0);
  th_heap_destroy(g_shared);
}

/* ---- a no-serialize heap whose blocks other threads free */

#define BATCH 500
typedef struct {
  block_t blocks[BATCH];
} batch_t;

static void *free_batch(void *argp) {
  batch_t *bt = argp;
  for (int i = 0; i < BATCH; i++) {
    block_t *b = &bt->blocks[i];
    CHECK_MSG(intact(b->p, b->size, b->key), "remote free: block %d of %zu bytes", i, b->size);
    th_free(b->p);
  }
  return NULL;
}

static int alloc_batch(th_heap_t *h, batch_t *bt, uint64_t *serial, size_t max_size) {
  for (int i = 0; i < BATCH; i++) {
    uint64_t r = check_mix(++*serial);
    size_t n = 1 + (size_t)(r % max_size);
    unsigned char *p = th_heap_malloc(h, n);
    if (!CHECK_MSG(p != NULL, "th_heap_malloc(%zu) (errno %d)", n, errno)) return 0;
    bt->blocks[i] = (block_t){p, n, *serial};
    fill(p, n, *serial);
  }
  return 1;
}

static void test_noserialize_remote_frees(void) {
  th_heap_t *h = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
  if (!CHECK(h != NULL)) return;
  static batch_t batches[4];
  uint64_t serial = 1000;
  /* The owner allocates the next batch while threads free the previous ones. */
  for (int round = 0; round < 6; round++) {
    pthread_t t[4];
    int started = 0;
    for (int i = 0; i < 4; i++) {
      if (!alloc_batch(h, &batches[i], &serial, 3000)) break;
      if (pthread_create(&t[i], NULL, free_batch, &batches[i]) != 0) exit(2);
      started++;
    }
    /* And keeps allocating and freeing its own blocks meanwhile. */
    for (int k = 0; k < 2000; k++) {
      size_t n = 16 + (size_t)k % 1000;
      void *p = th_heap_malloc(h, n);
      if (!CHECK(p != NULL)) break;
      fill(p, n, (uint64_t)k);
      CHECK(intact(p, n, (uint64_t)k));
      th_free(p);
    }
    for (int i = 0; i < started; i++) pthread_join(t[i], NULL);
  }
  th_heap_destroy(h);
}

/* Ten rounds of 1 MiB through a 2 MiB cap: each round's blocks are freed by another thread before the next
 * round, so the allocations succeed only if the heap collects remote frees before failing. */
static void test_cap_collects_remote_frees(void) {
  th_heap_t *h = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 2 * MiB);
  if (!CHECK(h != NULL)) return;
  static batch_t bt;
  uint64_t serial = 50000;
  int rounds = 0;
  for (int round = 0; round < 10; round++) {
    /* BATCH blocks of at most 4 KiB: about 1 MiB. */
    if (!alloc_batch(h, &bt, &serial, 4 * KiB)) break;
    run_threads(1, free_batch, &bt, 0);
    rounds++;
  }
  CHECK_MSG(rounds == 10, "only %d rounds of ~1 MiB through a 2 MiB cap", rounds);
  th_heap_destroy(h);
}

/* ---- destroy with live blocks after other threads freed theirs */

static void *free_one(void *p) {
  th_free(p);
  return NULL;
}

static void test_destroy_after_remote_frees(unsigned flags) {
  th_heap_t *h = th_heap_create(flags, 0, 0);
  if (!CHECK(h != NULL)) return;
  static batch_t given[4], kept;
  uint64_t serial = 90000;
  for (int i = 0; i < 4; i++)
    if (!alloc_batch(h, &given[i], &serial, 20000)) return;
  if (!alloc_batch(h, &kept, &serial, 20000)) return;
  void *huge_given = th_heap_malloc(h, 5 * MiB), *huge_kept = th_heap_malloc(h, 5 * MiB);
  CHECK(huge_given != NULL && huge_kept != NULL);
  run_threads(4, free_batch, given, sizeof given[0]);
  run_threads(1, free_one, huge_given, 0);
  for (int i = 0; i < BATCH; i++)
    CHECK_MSG(intact(kept.blocks[i].p, kept.blocks[i].size, kept.blocks[i].key), "kept block %d", i);
  size_t live = 5 * MiB;
  for (int i = 0; i < BATCH; i++) live += kept.blocks[i].size;
  size_t before = committed();
  th_heap_destroy(h);
  size_t after = committed();
  CHECK_MSG(after + live <= before, "flags %u: destroy gave back %zu bytes of %zu live", flags, before - after,
            live);
  /* The allocator is sound afterwards: a new heap of the same kind works. */
  h = th_heap_create(flags, 0, 0);
  if (CHECK(h != NULL)) {
    uint64_t s2 = 1;
    static batch_t again;
    if (alloc_batch(h, &again, &s2, 20000)) run_threads(1, free_batch, &again, 0);
    th_heap_destroy(h);
  }
}

/* ---- th_realloc from another thread */

typedef struct {
  void *p;
  size_t old_size, new_size;
  uint64_t key;
  void *result;
} realloc_arg_t;

static void *realloc_there(void *argp) {
  realloc_arg_t *a = argp;
  CHECK(intact(a->p, a->old_size, a->key));
  a->result = th_realloc(a->p, a->new_size);
  if (CHECK(a->result != NULL)) {
    CHECK(intact(a->result, a->old_size < a->new_size ? a->old_size : a->new_size, a->key));
    fill(a->result, a->new_size, a->key + 1);
  }
  return NULL;
}

static void test_realloc_from_other_thread(void) {
  /* Serialized heap: the block stays in it, so it counts against its cap. */
  th_heap_t *h = th_heap_create(0, 0, 1 * MiB);
  if (!CHECK(h != NULL)) return;
  realloc_arg_t a = {th_heap_malloc(h, 16), 16, 640 * KiB, 77, NULL};
  if (CHECK(a.p != NULL)) {
    fill(a.p, 16, 77);
    run_threads(1, realloc_there, &a, 0);
    errno = 0;
    void *r = th_heap_malloc(h, 640 * KiB);
    CHECK_MSG(r == NULL && errno == ENOMEM, "a serialized heap's block left its heap in th_realloc on another thread");
    th_free(r);
    if (a.result) CHECK(intact(a.result, 640 * KiB, 78));
    th_free(a.result);
  }
  th_heap_destroy(h);

  /* No-serialize heap: the block moves to the other thread's default heap and outlives this heap. */
  static const size_t sizes[][2] = {{100, 3000}, {3000, 100}, {50000, 300000}, {2 * MiB, 3 * MiB}};
  h = th_heap_create(TH_HEAP_NO_SERIALIZE, 0, 0);
  if (!CHECK(h != NULL)) return;
  realloc_arg_t moved[4];
  for (int i = 0; i < 4; i++) {
    moved[i] = (realloc_arg_t){th_heap_malloc(h, sizes[i][0]), sizes[i][0], sizes[i][1], 200 + (uint64_t)i * 2, NULL};
    if (!CHECK(moved[i].p != NULL)) return;
    fill(moved[i].p, sizes[i][0], moved[i].key);
    run_threads(1, realloc_there, &moved[i], 0);
  }
  th_heap_destroy(h);
  for (int i = 0; i < 4; i++) {
    if (!moved[i].result) continue;
    CHECK_MSG(intact(moved[i].result, sizes[i][1], moved[i].key + 1), "block %d after its old heap was destroyed", i);
    th_free(moved[i].result);
  }
}

/* ---- remote frees counted by a thread that never had a default heap
 *
 * A thread that only allocates from an explicit heap collects that heap's remote frees and counts them in
 * batches; its last batch must reach the counters when it exits, though it has no heap of its own to abandon.
 * One thread takes 500 blocks of a serialized heap (one page of 64-byte blocks), the main thread frees them
 * (every free of a serialized heap's block is remote), and a third thread runs the page dry, which collects
 * all 500, then exits. */

#define UNCOUNTED_BLOCKS 500
static th_heap_t *g_uncounted_heap;
static void *g_uncounted[2 * UNCOUNTED_BLOCKS];

static void *alloc_uncounted(void *argp) {
  size_t n = *(size_t *)argp;
  for (size_t i = 0; i < n; i++) {
    g_uncounted[i] = th_heap_malloc(g_uncounted_heap, 64);
    if (g_uncounted[i]) memset(g_uncounted[i], (int)(i & 0xff), 64);
  }
  return NULL;
}

static void test_remote_frees_counted_without_default_heap(void) {
  g_uncounted_heap = th_heap_create(0, 0, 64 * MiB); /* a cap: one shard, so both threads use one page */
  CHECK(g_uncounted_heap != NULL);
  if (!g_uncounted_heap) return;
  size_t n = UNCOUNTED_BLOCKS;
  run_threads(1, alloc_uncounted, &n, 0);
  for (size_t i = 0; i < n; i++) {
    CHECK(g_uncounted[i] != NULL);
    th_free(g_uncounted[i]);
  }
  th_stats_t before, after;
  th_stats_get(&before);
  n = 2 * UNCOUNTED_BLOCKS;
  run_threads(1, alloc_uncounted, &n, 0);
  th_stats_get(&after);
  CHECK_MSG(after.remote_frees - before.remote_frees >= UNCOUNTED_BLOCKS,
            "remote_frees grew by %zu, want at least %d", (size_t)(after.remote_frees - before.remote_frees),
            UNCOUNTED_BLOCKS);
  for (size_t i = 0; i < n; i++) {
    CHECK(g_uncounted[i] != NULL);
    if (!g_uncounted[i]) continue;
    unsigned char want = (unsigned char)(i & 0xff), *b = g_uncounted[i];
    int ok = 1;
    for (int k = 0; k < 64; k++) ok &= b[k] == want;
    CHECK_MSG(ok, "block %zu", i);
  }
  th_heap_destroy(g_uncounted_heap);
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--ops") && i + 1 < argc) g_ops = atol(argv[++i]);
    else {
      fprintf(stderr, "usage: test_heap_threads [--ops N]\n");
      return 2;
    }
  }
  test_serialized_hammer();
  test_noserialize_remote_frees();
  test_cap_collects_remote_frees();
  test_destroy_after_remote_frees(0);
  test_destroy_after_remote_frees(TH_HEAP_NO_SERIALIZE);
  test_realloc_from_other_thread();
  test_remote_frees_counted_without_default_heap();
  return check_summary();
}
