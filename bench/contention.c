/* contention: alloc/free pairs of one size by 1..N threads, microseconds per pair over all threads.
 *
 * Threads share one pool of batches of 1024 pairs (taken with an atomic decrement), so a cell measures how
 * fast the allocator gets a fixed amount of work done by however many threads, not how fast one thread
 * runs. With perfect scaling, two threads on two cores take half the time per pair of one thread;
 * contention shows up as the opposite. By default each cell stops at a time bound; --full runs 2^20 pairs
 * per cell. --method mmap replaces malloc/free with mmap/munmap, the price of going to the OS every time.
 *
 * Output, one line per cell: {"experiment":"contention","method":..,"size":..,"threads":..,"pairs":..,
 * "seconds":..,"us_per_op":..}
 */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <sys/mman.h>

#define BATCH 1024

static const char *prog = "contention";

static struct {
  size_t size;
  int use_mmap;
  double deadline; /* 0: no time bound */
  _Atomic long batches;
  _Atomic long pairs_done;
  bench_gate_t gate;
} cell;

static void *worker(void *arg) {
  (void)arg;
  long done = 0;
  size_t size = cell.size;
  bench_gate_wait(&cell.gate);
  while (__atomic_sub_fetch(&cell.batches, 1, __ATOMIC_RELAXED) >= 0) {
    if (cell.use_mmap) {
      for (int i = 0; i < BATCH; i++) {
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) bench_die(prog, "mmap failed");
        bench_sink = p;
        munmap(p, size);
      }
    } else {
      for (int i = 0; i < BATCH; i++) {
        void *p = malloc(size);
        bench_sink = p;
        free(p);
      }
    }
    done += BATCH;
    if (cell.deadline > 0 && bench_now() >= cell.deadline) break;
  }
  __atomic_fetch_add(&cell.pairs_done, done, __ATOMIC_RELAXED);
  return NULL;
}

static void run_cell(size_t size, int nthreads, long total_pairs, double seconds, const char *method) {
  pthread_t tid[256];
  cell.size = size;
  cell.use_mmap = strcmp(method, "mmap") == 0;
  cell.batches = total_pairs > 0 ? total_pairs / BATCH : (1L << 40);
  cell.pairs_done = 0;
  cell.gate.ready = 0;
  cell.gate.go = 0;
  cell.deadline = 0;
  for (int t = 0; t < nthreads; t++)
    if (pthread_create(&tid[t], NULL, worker, NULL) != 0) bench_die(prog, "pthread_create failed");
  double t0 = bench_now();
  if (seconds > 0) cell.deadline = t0 + seconds;
  bench_gate_open(&cell.gate, nthreads);
  for (int t = 0; t < nthreads; t++) pthread_join(tid[t], NULL);
  double elapsed = bench_now() - t0;
  long pairs = cell.pairs_done;
  bench_json_begin("contention");
  bench_json_str("method", method);
  bench_json_int("size", (long long)size);
  bench_json_int("threads", nthreads);
  bench_json_int("pairs", pairs);
  bench_json_num("seconds", elapsed);
  bench_json_num("us_per_op", elapsed * 1e6 / (double)pairs);
  bench_json_end();
}

static void usage(void) {
  fprintf(stderr,
          "usage: contention [--smoke] [--full] [--sizes LIST] [--threads LIST] [--method malloc|mmap]\n"
          "                  [--seconds S] [--pairs N]\n"
          "  default: sizes 1..64k (powers of two), threads 1..4 then powers of two up to 2x cores,\n"
          "  each cell bounded by time (--full: 2^20 pairs per cell)\n");
  exit(2);
}

int main(int argc, char **argv) {
  long sizes[BENCH_MAX_LIST], threads[BENCH_MAX_LIST];
  int nsizes = 0, nthreads = 0;
  const char *method = "malloc";
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
    else if (!strcmp(a, "--method") && v) method = v, i++;
    else if (!strcmp(a, "--seconds") && v) seconds = atof(v), i++;
    else if (!strcmp(a, "--pairs") && v) pairs = bench_parse_num(prog, v), i++;
    else usage();
  }
  if (strcmp(method, "malloc") && strcmp(method, "mmap")) bench_die(prog, "unknown method '%s'", method);
  if (nsizes == 0)
    for (long s = 1; s <= 65536; s *= 2) sizes[nsizes++] = s;
  if (nthreads == 0) {
    /* The seed's 1..4 threads, then powers of two up to twice the cores: 1,2,3,4 on two cores, 1,2,3,4,
     * 8,16 on eight. */
    int maxt = 2 * bench_cores();
    for (int t = 1; t <= 4; t++) threads[nthreads++] = t;
    for (int t = 8; t <= maxt && t <= 256 && nthreads < BENCH_MAX_LIST; t *= 2) threads[nthreads++] = t;
  }
  for (int i = 0; i < nthreads; i++)
    if (threads[i] < 1 || threads[i] > 256) bench_die(prog, "threads must be 1..256");
  for (int i = 0; i < nsizes; i++)
    if (sizes[i] < 1) bench_die(prog, "sizes must be at least 1");
  if (full) {
    pairs = pairs > 0 ? pairs : (1L << 20);
    seconds = 0;
  } else if (smoke) {
    if (seconds < 0) seconds = 0.004;
    if (pairs < 0) pairs = 1L << 16;
  } else {
    if (seconds < 0) seconds = 0.03;
    if (pairs < 0) pairs = 1L << 20;
  }
  /* Threads outer, sizes inner: the order of the seed's tables, one column at a time. */
  for (int t = 0; t < nthreads; t++)
    for (int s = 0; s < nsizes; s++) run_cell((size_t)sizes[s], (int)threads[t], pairs, seconds, method);
  return 0;
}
