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
 * another allocator's LD_PRELOAD. The cell protocol is contention.c's, shared through contention_common.h:
 * threads share a pool of batches of 1024 pairs, heaps are created before the start gate and destroyed
 * after the cell, and each cell stops at a time bound (default), or after 2^20 pairs (--full).
 *
 * Output, one line per cell, the same fields as contention: {"experiment":"contention","method":..,
 * "size":..,"threads":..,"pairs":..,"seconds":..,"us_per_op":..}
 */
#define _GNU_SOURCE
#include "contention_common.h"

#include "threadheap.h"

/* contention_heaps_new.cpp: n new[]/delete[] pairs of `size` bytes. */
void contention_new_delete(size_t size, int n);

static const char *prog = "contention_heaps";

enum method { M_MALLOC, M_NEW, M_HEAP_SHARED, M_HEAP_PRIVATE, M_HEAP_PRIVATE_NS, M_MMAP, M_COUNT };
static const char *const method_names[M_COUNT] = {"malloc",       "new",  "heap_shared", "heap_private",
                                                  "heap_private_noserialize", "mmap"};

static contention_cell_t cell;
static enum method cell_method;
static size_t cell_size;
static th_heap_t *cell_shared;

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
      contention_batch_malloc(size);
      break;
    case M_NEW:
      contention_new_delete(size, BATCH);
      break;
    case M_MMAP:
      contention_batch_mmap(prog, size);
      break;
    default:
      break;
  }
}

static void *worker(void *arg) {
  (void)arg;
  long done = 0;
  enum method m = cell_method;
  size_t size = cell_size;
  /* A private heap is made before the gate: creating it is not part of the measure. */
  th_heap_t *heap = cell_shared;
  if (m == M_HEAP_PRIVATE || m == M_HEAP_PRIVATE_NS) {
    heap = th_heap_create(m == M_HEAP_PRIVATE_NS ? TH_HEAP_NO_SERIALIZE : 0, 0, 0);
    if (heap == NULL) bench_die(prog, "th_heap_create failed");
  }
  bench_gate_wait(&cell.gate);
  while (contention_take_batch(&cell, done)) {
    if (heap != NULL) batch_heap(heap, size);
    else batch_plain(m, size);
    done += BATCH;
  }
  __atomic_fetch_add(&cell.pairs_done, done, __ATOMIC_RELAXED);
  if (heap != cell_shared) th_heap_destroy(heap);
  return NULL;
}

static void run_cell(enum method m, size_t size, int nthreads, long total_pairs, double seconds) {
  cell_method = m;
  cell_size = size;
  cell_shared = NULL;
  if (m == M_HEAP_SHARED && (cell_shared = th_heap_create(0, 0, 0)) == NULL) bench_die(prog, "th_heap_create failed");
  contention_run_cell(prog, &cell, worker, method_names[m], size, nthreads, total_pairs, seconds);
  th_heap_destroy(cell_shared);
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
  contention_opts_t o = {.seconds = -1, .pairs = -1};
  int on[M_COUNT] = {0};
  int nmethods = 0;
  for (int i = 1; i < argc; i++) {
    if (contention_parse_opt(prog, &o, argc, argv, &i)) continue;
    if ((!strcmp(argv[i], "--methods") || !strcmp(argv[i], "--method")) && i + 1 < argc)
      nmethods += parse_methods(argv[++i], on);
    else usage();
  }
  if (nmethods == 0)
    for (int m = 0; m < M_COUNT; m++) on[m] = 1;
  /* --smoke keeps to the corners of the table (6 methods x 4 sizes x 2 threads), well under a second. */
  if (o.nsizes == 0 && o.smoke) {
    static const long smoke_sizes[] = {1, 64, 4096, 65536};
    for (int i = 0; i < 4; i++) o.sizes[o.nsizes++] = smoke_sizes[i];
  }
  if (o.nthreads == 0 && o.smoke) o.threads[o.nthreads++] = 1, o.threads[o.nthreads++] = 2;
  if (o.nthreads == 0)
    for (int t = 1; t <= 4; t++) o.threads[o.nthreads++] = t;
  contention_finish_opts(prog, &o, 0.002, 1L << 14);
  /* Methods outer, as the seed's tables; then threads, then sizes. */
  for (int m = 0; m < M_COUNT; m++) {
    if (!on[m]) continue;
    for (int t = 0; t < o.nthreads; t++)
      for (int s = 0; s < o.nsizes; s++) run_cell((enum method)m, (size_t)o.sizes[s], (int)o.threads[t], o.pairs, o.seconds);
  }
  return 0;
}
