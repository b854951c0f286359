/* threads: the same per-thread work (alloc/free pairs of 1 KiB blocks, or of each --sizes value) done by 1,
 * 2, 4, 8 and 16 threads.
 *
 * Each thread does a fixed number of pairs, so the total work grows with the thread count. The speed-up is
 * the throughput (pairs per second over all threads) against the one-thread run of the same process:
 * with thread-private heaps it should follow the number of cores and then stay flat, never fall.
 *
 * Output, one line per thread count: {"experiment":"threads","size":..,"threads":..,"pairs_per_thread":..,
 * "seconds":..,"mpairs_per_s":..,"speedup":..}
 */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>

static const char *prog = "threads";
static size_t g_size;
static long g_pairs;
static bench_gate_t g_gate;

static void *worker(void *arg) {
  (void)arg;
  size_t size = g_size;
  bench_gate_wait(&g_gate);
  for (long i = 0; i < g_pairs; i++) {
    void *p = malloc(size);
    bench_sink = p;
    free(p);
  }
  return NULL;
}

static double run(int nthreads) {
  pthread_t tid[1024];
  g_gate.ready = 0;
  g_gate.go = 0;
  for (int t = 0; t < nthreads; t++)
    if (pthread_create(&tid[t], NULL, worker, NULL) != 0) bench_die(prog, "pthread_create failed");
  double t0 = bench_now();
  bench_gate_open(&g_gate, nthreads);
  for (int t = 0; t < nthreads; t++) pthread_join(tid[t], NULL);
  return bench_now() - t0;
}

int main(int argc, char **argv) {
  long threads[BENCH_MAX_LIST] = {1, 2, 4, 8, 16};
  long sizes[BENCH_MAX_LIST] = {1024};
  int nthreads = 5, nsizes = 1;
  long pairs = 2000000;
  int smoke = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--smoke")) smoke = 1;
    else if (!strcmp(a, "--full")) pairs = 10000000;
    else if (!strcmp(a, "--threads") && v) nthreads = bench_parse_list(prog, v, threads, BENCH_MAX_LIST), i++;
    else if (!strcmp(a, "--sizes") && v) nsizes = bench_parse_list(prog, v, sizes, BENCH_MAX_LIST), i++;
    else if (!strcmp(a, "--pairs") && v) pairs = bench_parse_num(prog, v), i++;
    else {
      fprintf(stderr, "usage: threads [--smoke] [--full] [--threads LIST] [--sizes LIST] [--pairs N]\n"
                      "  default: 1 KiB blocks, threads 1,2,4,8,16, 2000000 pairs per thread\n");
      return 2;
    }
  }
  if (smoke) pairs = 50000;
  if (pairs < 1) bench_die(prog, "pairs must be positive");
  for (int i = 0; i < nsizes; i++)
    if (sizes[i] < 1) bench_die(prog, "sizes must be positive");
  for (int i = 0; i < nthreads; i++)
    if (threads[i] < 1 || threads[i] > 1024) bench_die(prog, "threads must be 1..1024");
  g_pairs = pairs;
  for (int s = 0; s < nsizes; s++) {
    g_size = (size_t)sizes[s];
    /* The one-thread baseline is measured in this same process, right before the others. */
    double base = run(1);
    double base_rate = (double)pairs / base;
    for (int i = 0; i < nthreads; i++) {
      double secs = threads[i] == 1 ? base : run((int)threads[i]);
      double rate = (double)pairs * (double)threads[i] / secs;
      bench_json_begin("threads");
      bench_json_int("size", sizes[s]);
      bench_json_int("threads", threads[i]);
      bench_json_int("pairs_per_thread", pairs);
      bench_json_num("seconds", secs);
      bench_json_num("mpairs_per_s", rate / 1e6);
      bench_json_num("speedup", rate / base_rate);
      bench_json_end();
    }
  }
  return 0;
}
