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
#include "contention_common.h"

static const char *prog = "contention";

static contention_cell_t cell;
static size_t cell_size;
static int cell_use_mmap;

static void *worker(void *arg) {
  (void)arg;
  long done = 0;
  size_t size = cell_size;
  bench_gate_wait(&cell.gate);
  while (contention_take_batch(&cell, done)) {
    if (cell_use_mmap) contention_batch_mmap(prog, size);
    else contention_batch_malloc(size);
    done += BATCH;
  }
  __atomic_fetch_add(&cell.pairs_done, done, __ATOMIC_RELAXED);
  return NULL;
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
  contention_opts_t o = {.seconds = -1, .pairs = -1};
  const char *method = "malloc";
  for (int i = 1; i < argc; i++) {
    if (contention_parse_opt(prog, &o, argc, argv, &i)) continue;
    if (!strcmp(argv[i], "--method") && i + 1 < argc) method = argv[++i];
    else usage();
  }
  if (strcmp(method, "malloc") && strcmp(method, "mmap")) bench_die(prog, "unknown method '%s'", method);
  if (o.nthreads == 0) {
    /* The seed's 1..4 threads, then powers of two up to twice the cores: 1,2,3,4 on two cores, 1,2,3,4,
     * 8,16 on eight. */
    int maxt = 2 * bench_cores();
    for (int t = 1; t <= 4; t++) o.threads[o.nthreads++] = t;
    for (int t = 8; t <= maxt && t <= 256 && o.nthreads < BENCH_MAX_LIST; t *= 2) o.threads[o.nthreads++] = t;
  }
  contention_finish_opts(prog, &o, 0.004, 1L << 16);
  cell_use_mmap = strcmp(method, "mmap") == 0;
  /* Threads outer, sizes inner: the order of the seed's tables, one column at a time. */
  for (int t = 0; t < o.nthreads; t++)
    for (int s = 0; s < o.nsizes; s++) {
      cell_size = (size_t)o.sizes[s];
      contention_run_cell(prog, &cell, worker, method, cell_size, (int)o.threads[t], o.pairs, o.seconds);
    }
  return 0;
}
