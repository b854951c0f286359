/* contention_heaps: seed 000's table with threadheap's explicit heaps. Alloc/free pairs of one size by 1..N
 * threads, microseconds per pair over all threads, for six methods:
 *
 *   malloc                    malloc/free (threadheap's, since this binary links the library)
 *   new                       new char[]/delete[] (libstdc++'s operator new over the same malloc)
 *   heap_shared               th_heap_malloc/th_free on one serialized heap shared by every thread
 *   heap_private              th_heap_malloc/th_free on a serialized heap per thread
 *   heap_private_noserialize  the same on a TH_HEAP_NO_SERIALIZE heap per thread
 *   mmap                      mmap/munmap, the price of going to the OS every time
 *
 * Unlike the other workloads this one links libthreadheap (it calls th_heap_*), so it is never run under
 * another allocator's LD_PRELOAD. The cell protocol is contention.c's: threads share a pool of batches of
 * 1024 pairs, heaps are created before the start gate and destroyed after the cell, and each cell stops at
 * a time bound (default), or after 2^20 pairs (--full).
 *
 * Output, one line per cell, the same fields as contention: {"experiment":"contention","method":..,
 * "size":..,"threads":..,"pairs":..,"seconds":..,"us_per_op":..}
 */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <sys/mman.h>

#include "threadheap.h"

#define BATCH 1024

/* contention_heaps_new.cpp: n new[]/delete[] pairs of `size` bytes. */
void contention_new_delete(size_t size, int n);

static const char *prog = "contention_heaps";

enum method { M_MALLOC, M_NEW, M_HEAP_SHARED, M_HEAP_PRIVATE, M_HEAP_PRIVATE_NS, M_MMAP, M_COUNT };
static const char *const method_names[M_COUNT] = {"malloc",       "new",  "heap_shared", "heap_private",
                                                  "heap_private_noserialize", "mmap"};

static struct {
  enum method method;
  size_t size;
  th_heap_t *shared;
  double deadline; /* 0: no time bound */
  _Atomic long batches;
  _Atomic long pairs_done;
  bench_gate_t gate;
} cell;

static void batch_heap(th_heap_t *heap, size_t size) {
  for (int i = 0; i < BATCH; i++) {
    void *p = th_heap_malloc(heap, size);
    if (p == NULL) bench_die(prog, "th_heap_malloc(%zu) failed", size);
    bench_sink = p;
    th_free(p);
  }
}

static void batch_plain(enum method m, size_t size) {
  switch (m) {
    case M_MALLOC:
      for (int i = 0; i < BATCH; i++) {
        void *p = malloc(size);
        bench_sink = p;
        free(p);
      }
      break;
    case M_NEW:
      contention_new_delete(size, BATCH);
      break;
    case M_MMAP:
      for (int i = 0; i < BATCH; i++) {
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) bench_die(prog, "mmap failed");
        bench_sink = p;
        munmap(p, size);
      }
      break;
    default:
      break;
  }
}

static void *worker(void *arg) {
  (void)arg;
  long done = 0;
  enum method m = cell.method;
  size_t size = cell.size;
  /* A private heap is made before the gate: creating it is not part of the measure. */
  th_heap_t *heap = cell.shared;
  if (m == M_HEAP_PRIVATE || m == M_HEAP_PRIVATE_NS) {
    heap = th_heap_create(m == M_HEAP_PRIVATE_NS ? TH_HEAP_NO_SERIALIZE : 0, 0, 0);
    if (heap == NULL) bench_die(prog, "th_heap_create failed");
  }
  bench_gate_wait(&cell.gate);
  while (__atomic_sub_fetch(&cell.batches, 1, __ATOMIC_RELAXED) >= 0) {
    if (heap != NULL) batch_heap(heap, size);
    else batch_plain(m, size);
    done += BATCH;
    if (cell.deadline > 0 && bench_now() >= cell.deadline) break;
  }
  __atomic_fetch_add(&cell.pairs_done, done, __ATOMIC_RELAXED);
  if (heap != cell.shared) th_heap_destroy(heap);
  return NULL;
}

static void run_cell(enum method m, size_t size, int nthreads, long total_pairs, double seconds) {
  pthread_t tid[256];
  cell.method = m;
  cell.size = size;
  cell.shared = NULL;
  if (m == M_HEAP_SHARED && (cell.shared = th_heap_create(0, 0, 0)) == NULL) bench_die(prog, "th_heap_create failed");
  cell.batches = total_pairs > 0 ? total_pairs / BATCH : (1L << 40);
  cell.pairs_done = 0;
  cell.gate.ready = 0;
  cell.gate.go = 0;
  cell.deadline = 0;
  for (int t = 0; t < nthreads; t++)
    if (pthread_create(&tid[t], NULL, worker, NULL) != 0) bench_die(prog, "pthread_create failed");
  /* Wait for every worker (and its private heap) before starting the clock. */
  while (__atomic_load_n(&cell.gate.ready, __ATOMIC_ACQUIRE) < nthreads) sched_yield();
  double t0 = bench_now();
  if (seconds > 0) cell.deadline = t0 + seconds;
  bench_gate_open(&cell.gate, nthreads);
  for (int t = 0; t < nthreads; t++) pthread_join(tid[t], NULL);
  double elapsed = bench_now() - t0;
  th_heap_destroy(cell.shared);
  long pairs = cell.pairs_done;
  bench_json_begin("contention");
  bench_json_str("method", method_names[m]);
  bench_json_int("size", (long long)size);
  bench_json_int("threads", nthreads);
  bench_json_int("pairs", pairs);
  bench_json_num("seconds", elapsed);
  bench_json_num("us_per_op", elapsed * 1e6 / (double)pairs);
  bench_json_end();
}

static void usage(void) {
  fprintf(stderr,
          "usage: contention_heaps [--smoke] [--full] [--sizes LIST] [--threads LIST] [--methods LIST]\n"
          "                        [--seconds S] [--pairs N]\n"
          "  methods: malloc,new,heap_shared,heap_private,heap_private_noserialize,mmap (default: all)\n"
          "  default: sizes 1..64k (powers of two), threads 1..4, each cell bounded by time\n"
          "  (--full: 2^20 pairs per cell; --smoke: sizes 1,64,4k,64k and threads 1,2, a few ms each)\n");
  exit(2);
}

/* Parses a comma-separated list of method names into flags; returns how many. */
static int parse_methods(const char *s, int *on) {
  char buf[256];
  int n = 0;
  if (strlen(s) >= sizeof buf) bench_die(prog, "method list too long");
  strcpy(buf, s);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int found = 0;
    for (int m = 0; m < M_COUNT; m++)
      if (!strcmp(tok, method_names[m])) on[m] = 1, found = 1, n++;
    if (!found) bench_die(prog, "unknown method '%s'", tok);
  }
  return n;
}

int main(int argc, char **argv) {
  long sizes[BENCH_MAX_LIST], threads[BENCH_MAX_LIST];
  int nsizes = 0, nthreads = 0;
  int on[M_COUNT] = {0};
  int nmethods = 0;
  int smoke = 0, full = 0;
  double seconds = -1;
  long pairs = -1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--smoke")) smoke = 1;
    else if (!strcmp(a, "--full")) full = 1;
    else if (!strcmp(a, "--sizes") && v) nsizes = bench_parse_list(prog, v, sizes, BENCH_MAX_LIST), i++;
    else if (!strcmp(a, "--threads") && v) nthreads = bench_parse_list(prog, v, threads, BENCH_MAX_LIST), i++;
    else if ((!strcmp(a, "--methods") || !strcmp(a, "--method")) && v) nmethods += parse_methods(v, on), i++;
    else if (!strcmp(a, "--seconds") && v) seconds = atof(v), i++;
    else if (!strcmp(a, "--pairs") && v) pairs = bench_parse_num(prog, v), i++;
    else usage();
  }
  if (nmethods == 0)
    for (int m = 0; m < M_COUNT; m++) on[m] = 1;
  /* --smoke keeps to the corners of the table (6 methods x 4 sizes x 2 threads), well under a second. */
  if (nsizes == 0 && smoke) {
    static const long smoke_sizes[] = {1, 64, 4096, 65536};
    for (int i = 0; i < 4; i++) sizes[nsizes++] = smoke_sizes[i];
  }
  if (nthreads == 0 && smoke) threads[nthreads++] = 1, threads[nthreads++] = 2;
  if (nsizes == 0)
    for (long s = 1; s <= 65536; s *= 2) sizes[nsizes++] = s;
  if (nthreads == 0)
    for (int t = 1; t <= 4; t++) threads[nthreads++] = t;
  for (int i = 0; i < nthreads; i++)
    if (threads[i] < 1 || threads[i] > 256) bench_die(prog, "threads must be 1..256");
  for (int i = 0; i < nsizes; i++)
    if (sizes[i] < 1) bench_die(prog, "sizes must be at least 1");
  if (full) {
    pairs = pairs > 0 ? pairs : (1L << 20);
    seconds = 0;
  } else if (smoke) {
    if (seconds < 0) seconds = 0.002;
    if (pairs < 0) pairs = 1L << 14;
  } else {
    if (seconds < 0) seconds = 0.03;
    if (pairs < 0) pairs = 1L << 20;
  }
  /* Methods outer, as the seed's tables; then threads, then sizes. */
  for (int m = 0; m < M_COUNT; m++) {
    if (!on[m]) continue;
    for (int t = 0; t < nthreads; t++)
      for (int s = 0; s < nsizes; s++) run_cell((enum method)m, (size_t)sizes[s], (int)threads[t], pairs, seconds);
  }
  return 0;
}
