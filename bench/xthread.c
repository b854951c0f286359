/* xthread: producer/consumer. One thread allocates blocks and hands them to another through a ring; the
 * other thread writes to each block and frees it. Every free is a remote free, the case a thread-private
 * heap must still handle without a global lock and without letting freed memory pile up.
 *
 * The producer keeps --live-mb (default 64 MiB) of blocks in flight, so the footprint that the allocator
 * adds on top of the live data can be read off: peak RSS minus the RSS of the process before its first
 * block, against the live bytes. Throughput is blocks per second through the pair.
 *
 * Output, one line: {"experiment":"xthread","blocks":..,"min_size":..,"max_size":..,"live_mb":..,
 * "seconds":..,"mblocks_per_s":..,"base_rss_kb":..,"peak_rss_kb":..,"overhead":..,"end_rss_kb":..}
 * overhead = (peak - base) / live - 1, e.g. 0.25 means the allocator held 25% more than the live data.
 */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>

static const char *prog = "xthread";

#include <sys/mman.h>

static struct {
  char **slot;         /* the ring: capacity is a power of two, enough for live_limit / min_size blocks */
  unsigned long ring;
  /* Each side writes its own line and reads the other's once per batch or per wait, so the harness adds
   * no cache-line transfer per block: what crosses between the cores is the blocks and the allocator's own
   * state. (A shared live-bytes counter, updated with an atomic add by both threads for every block, cost
   * two line transfers and two full barriers per block and hid the allocators' differences.) */
  _Alignas(64) _Atomic unsigned long head; /* written by the producer: blocks handed over */
  _Atomic long made_bytes;                 /* written by the producer: bytes of those blocks */
  _Alignas(64) _Atomic unsigned long tail; /* written by the consumer, once per batch */
  _Atomic long freed_bytes;                /* written by the consumer, once per batch */
  _Alignas(64) long blocks, live_limit, min_size, max_size;
  bench_gate_t gate;
} q;

static void *producer(void *arg) {
  (void)arg;
  uint64_t seed = 0x243F6A8885A308D3ULL;
  unsigned long head = 0, tail = 0;
  long made = 0, freed = 0;
  bench_gate_wait(&q.gate);
  for (long i = 0; i < q.blocks; i++) {
    size_t size = (size_t)q.min_size + (size_t)(bench_rand(&seed) % (uint64_t)(q.max_size - q.min_size + 1));
    /* Wait while the ring is full or the live data would pass its limit; the consumer's counts are read
     * again only then. */
    while (head - tail >= q.ring || made - freed + (long)size > q.live_limit) {
      unsigned long t = __atomic_load_n(&q.tail, __ATOMIC_ACQUIRE);
      long f = __atomic_load_n(&q.freed_bytes, __ATOMIC_RELAXED);
      if (t == tail && f == freed) sched_yield();
      tail = t, freed = f;
    }
    char *p = malloc(size);
    if (!p) bench_die(prog, "malloc failed");
    memcpy(p, &size, sizeof size); /* the block carries its own length to the consumer */
    q.slot[head & (q.ring - 1)] = p;
    made += (long)size;
    head++;
    __atomic_store_n(&q.made_bytes, made, __ATOMIC_RELAXED);
    __atomic_store_n(&q.head, head, __ATOMIC_RELEASE);
  }
  return NULL;
}

static void *consumer(void *arg) {
  (void)arg;
  unsigned long tail = 0;
  long freed = 0;
  /* The consumer lags on purpose: it waits until the live data is within one block of its limit, then
   * frees a batch of about 1 MiB. So the live data stays at the limit for the whole run and every block
   * is freed long after, and on another thread than, its allocation. */
  long high = q.live_limit - q.max_size, low = q.live_limit - (1L << 20);
  bench_gate_wait(&q.gate);
  while (tail < (unsigned long)q.blocks) {
    unsigned long head = __atomic_load_n(&q.head, __ATOMIC_ACQUIRE);
    long made = __atomic_load_n(&q.made_bytes, __ATOMIC_RELAXED); /* at least the bytes of blocks < head */
    int producer_done = head == (unsigned long)q.blocks;
    if (head == tail || (!producer_done && made - freed < high)) {
      sched_yield();
      continue;
    }
    while (tail < head && (producer_done || made - freed > low)) {
      char *p = q.slot[tail & (q.ring - 1)];
      size_t size;
      memcpy(&size, p, sizeof size); /* the consumer reads and writes the block, as a real one would */
      p[size - 1] = 1;
      free(p);
      freed += (long)size;
      tail++;
    }
    __atomic_store_n(&q.freed_bytes, freed, __ATOMIC_RELAXED);
    __atomic_store_n(&q.tail, tail, __ATOMIC_RELEASE);
  }
  return NULL;
}

int main(int argc, char **argv) {
  long blocks = 5000000, live_mb = 64, min_size = 16, max_size = 1024;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--smoke")) blocks = 300000;
    else if (!strcmp(a, "--full")) blocks = 20000000;
    else if (!strcmp(a, "--blocks") && v) blocks = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--live-mb") && v) live_mb = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--min-size") && v) min_size = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--max-size") && v) max_size = bench_parse_num(prog, v), i++;
    else {
      fprintf(stderr, "usage: xthread [--smoke] [--full] [--blocks N] [--live-mb N] [--min-size B] [--max-size B]\n");
      return 2;
    }
  }
  if (blocks < 1 || live_mb < 1 || min_size < 16 || max_size < min_size)
    bench_die(prog, "need blocks >= 1, live-mb >= 1, 16 <= min-size <= max-size");
  q.ring = 1;
  while (q.ring < (unsigned long)((live_mb << 20) / min_size)) q.ring <<= 1;
  q.slot = mmap(NULL, q.ring * sizeof *q.slot, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (q.slot == MAP_FAILED) bench_die(prog, "mmap of the ring failed");
  /* The ring is written in full before the baseline, so its pages count as the empty process and the
   * difference peak - base is the allocator's alone. */
  memset(q.slot, 0, q.ring * sizeof *q.slot);
  long base = bench_rss_kb();
  q.blocks = blocks;
  q.live_limit = live_mb << 20;
  q.min_size = min_size;
  q.max_size = max_size;
  pthread_t tp, tc;
  if (pthread_create(&tp, NULL, producer, NULL) || pthread_create(&tc, NULL, consumer, NULL))
    bench_die(prog, "pthread_create failed");
  double t0 = bench_now();
  bench_gate_open(&q.gate, 2);
  pthread_join(tp, NULL);
  pthread_join(tc, NULL);
  double secs = bench_now() - t0;
  long peak = bench_peak_rss_kb();
  bench_json_begin("xthread");
  bench_json_int("blocks", blocks);
  bench_json_int("min_size", min_size);
  bench_json_int("max_size", max_size);
  bench_json_int("live_mb", live_mb);
  bench_json_num("seconds", secs);
  bench_json_num("mblocks_per_s", (double)blocks / secs / 1e6);
  bench_json_int("base_rss_kb", base);
  bench_json_int("peak_rss_kb", peak);
  bench_json_num("overhead", (double)(peak - base) / (double)(live_mb << 10) - 1.0);
  bench_json_int("end_rss_kb", bench_rss_kb());
  bench_json_end();
  return 0;
}
