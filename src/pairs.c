/* pairs.c: who frees whose memory (pairs_note_owner, th_stats_remote_pairs): remote frees counted per pair of
 * freeing thread and owning heap, the diagnosis for producer/consumer programs whose memory grows.
 *
 * The freeing thread counts in its own heap struct: slot 0 holds the owner of its last remote free, and
 * free_remote adds one there when the next remote free goes to the same owner (a compare and an add, on the
 * remote path only). A free to another owner comes here: the owner moves to slot 0 and the others shift;
 * with every slot taken, the smallest count leaves the table (a bounded matrix: the top pairs). A thread
 * that frees without ever allocating gets a heap here, so that its counts have a home. Readers read the
 * slots of every heap struct ever made; a thread that exits leaves its pairs in a small process-wide table. */
#include <string.h>

#include "internal.h"
#include "os.h"

/* Pairs of exited threads: key = freeing tid << 32 | owner tid, claimed with a CAS; full: dropped. */
#define EXITED_PAIRS 64
static _Atomic(uint64_t) exited_key[EXITED_PAIRS];
static _Atomic(uint64_t) exited_count[EXITED_PAIRS];

static uint32_t heap_tid(const th_heap_t *h) {
  return h ? atomic_load_explicit(&h->tid, memory_order_relaxed) : 0;
}

void pairs_note_owner(th_heap_t *owner) {
  th_heap_t *me = th_heap_tls;
  if (me == &th_heap_empty) {
    if (thread_exited()) return;
    me = thread_heap_init();
    if (me == NULL) return;
  }
  th_remote_pair_slot_t *s = me->remote;
  uint64_t count = 1;
  size_t at = TH_REMOTE_SLOTS - 1; /* the slot to take: the owner's own, else the smallest count's */
  for (size_t i = 1; i < TH_REMOTE_SLOTS; i++) {
    if (atomic_load_explicit(&s[i].owner, memory_order_relaxed) == owner) {
      at = i;
      count += atomic_load_explicit(&s[i].count, memory_order_relaxed);
      break;
    }
    if (atomic_load_explicit(&s[i].count, memory_order_relaxed) <
        atomic_load_explicit(&s[at].count, memory_order_relaxed))
      at = i;
  }
  for (size_t i = at; i > 0; i--) { /* slots 0..at-1 move down one */
    atomic_store_explicit(&s[i].owner, atomic_load_explicit(&s[i - 1].owner, memory_order_relaxed),
                          memory_order_relaxed);
    atomic_store_explicit(&s[i].count, atomic_load_explicit(&s[i - 1].count, memory_order_relaxed),
                          memory_order_relaxed);
  }
  atomic_store_explicit(&s[0].owner, owner, memory_order_relaxed);
  atomic_store_explicit(&s[0].count, count, memory_order_relaxed);
}

static void exited_add(uint64_t key, uint64_t n) {
  for (size_t i = 0; i < EXITED_PAIRS; i++) {
    uint64_t k = atomic_load_explicit(&exited_key[i], memory_order_acquire);
    if (k == 0 && atomic_compare_exchange_strong_explicit(&exited_key[i], &k, key, memory_order_acq_rel,
                                                          memory_order_acquire))
      k = key;
    if (k == key) {
      atomic_fetch_add_explicit(&exited_count[i], n, memory_order_relaxed);
      return;
    }
  }
}

void pairs_thread_done(th_heap_t *heap) {
  uint64_t me = heap_tid(heap);
  for (size_t i = 0; i < TH_REMOTE_SLOTS; i++) {
    uint64_t n = atomic_load_explicit(&heap->remote[i].count, memory_order_relaxed);
    th_heap_t *owner = atomic_load_explicit(&heap->remote[i].owner, memory_order_relaxed);
    if (n) exited_add(me << 32 | heap_tid(owner), n);
    atomic_store_explicit(&heap->remote[i].count, 0, memory_order_relaxed);
    atomic_store_explicit(&heap->remote[i].owner, NULL, memory_order_relaxed);
  }
  atomic_store_explicit(&heap->tid, 0, memory_order_relaxed);
}

/* Add n frees of the pair to out (merging equal pairs); false when out is full. */
static bool collect(th_remote_pair_t *out, size_t max, size_t *len, int from, int to, uint64_t n) {
  for (size_t i = 0; i < *len; i++) {
    if (out[i].free_tid == from && out[i].owner_tid == to) {
      out[i].frees += n;
      return true;
    }
  }
  if (*len == max) return false;
  out[*len].free_tid = from;
  out[*len].owner_tid = to;
  out[*len].frees = n;
  (*len)++;
  return true;
}

TH_API size_t th_stats_remote_pairs(th_remote_pair_t *out, size_t max) {
  th_remote_pair_t all[128];
  size_t len = 0;
  for (th_heap_t *h = thread_heaps_all(); h; h = h->all_next) {
    uint32_t from = heap_tid(h);
    if (from == 0) continue;
    for (size_t i = 0; i < TH_REMOTE_SLOTS; i++) {
      uint64_t n = atomic_load_explicit(&h->remote[i].count, memory_order_relaxed);
      if (n) collect(all, 128, &len, (int)from, (int)heap_tid(atomic_load_explicit(&h->remote[i].owner,
                                                                                 memory_order_relaxed)), n);
    }
  }
  for (size_t i = 0; i < EXITED_PAIRS; i++) {
    uint64_t k = atomic_load_explicit(&exited_key[i], memory_order_acquire);
    if (k) collect(all, 128, &len, (int)(k >> 32), (int)(uint32_t)k,
                   atomic_load_explicit(&exited_count[i], memory_order_relaxed));
  }
  for (size_t i = 1; i < len; i++) { /* largest first; a few dozen pairs at most */
    th_remote_pair_t p = all[i];
    size_t j = i;
    for (; j > 0 && all[j - 1].frees < p.frees; j--) all[j] = all[j - 1];
    all[j] = p;
  }
  if (out == NULL) return len;
  size_t n = len < max ? len : max;
  memcpy(out, all, n * sizeof *out);
  return n;
}
