/* random: the multiprocessor heap test of seed 004. N threads each do M operations on a window of live
 * blocks: pick a random slot, free its block if it holds one, otherwise allocate a block of random size
 * up to a maximum and write to it. A heap behind one lock shows up here as lost throughput and as a flood
 * of context switches (threads sleeping on the lock), which is why those are counted with getrusage.
 *
 * Output, one line: {"experiment":"random","threads":..,"max_size":..,"ops_per_thread":..,"window":..,
 * "seconds":..,"mops_per_s":..,"vcsw_per_s":..,"ivcsw_per_s":..,"peak_rss_kb":..}
 */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>

static const char *prog = "random";
static long g_ops, g_window, g_max;
static bench_gate_t g_gate;

static void *worker(void *arg) {
  uint64_t seed = 0x9E3779B97F4A7C15ULL * ((uint64_t)(uintptr_t)arg + 1);
  char **slot = calloc((size_t)g_window, sizeof *slot);
  if (!slot) bench_die(prog, "out of memory");
  bench_gate_wait(&g_gate);
  for (long i = 0; i < g_ops; i++) {
    uint64_t r = bench_rand(&seed);
    size_t k = (size_t)(r % (uint64_t)g_window);
    if (slot[k]) {
      free(slot[k]);
      slot[k] = NULL;
    } else {
      size_t size = 1 + (size_t)((r >> 32) % (uint64_t)g_max);
      slot[k] = malloc(size);
      if (!slot[k]) bench_die(prog, "malloc failed");
      slot[k][0] = (char)i;
    }
  }
  for (long k = 0; k < g_window; k++) free(slot[k]);
  free(slot);
  return NULL;
}

int main(int argc, char **argv) {
  long nthreads = 3, ops = 1000000, window = 1000, max = 2048;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--smoke")) ops = 20000;
    else if (!strcmp(a, "--full")) ops = 3000000;
    else if (!strcmp(a, "--threads") && v) nthreads = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--ops") && v) ops = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--window") && v) window = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--max-size") && v) max = bench_parse_num(prog, v), i++;
    else {
      fprintf(stderr, "usage: random [--smoke] [--full] [--threads N] [--ops N] [--window N] [--max-size BYTES]\n"
                      "  default: 3 threads, 1000000 operations each, window 1000, sizes 1..2048\n");
      return 2;
    }
  }
  if (nthreads < 1 || nthreads > 1024 || ops < 1 || window < 1 || max < 1)
    bench_die(prog, "threads, ops, window and max-size must be positive");
  g_ops = ops;
  g_window = window;
  g_max = max;
  pthread_t tid[1024];
  for (long t = 0; t < nthreads; t++)
    if (pthread_create(&tid[t], NULL, worker, (void *)(uintptr_t)t) != 0) bench_die(prog, "pthread_create failed");
  struct rusage r0, r1;
  bench_gate_open(&g_gate, (int)nthreads);
  getrusage(RUSAGE_SELF, &r0);
  double t0 = bench_now();
  for (long t = 0; t < nthreads; t++) pthread_join(tid[t], NULL);
  double secs = bench_now() - t0;
  getrusage(RUSAGE_SELF, &r1);
  bench_json_begin("random");
  bench_json_int("threads", nthreads);
  bench_json_int("max_size", max);
  bench_json_int("ops_per_thread", ops);
  bench_json_int("window", window);
  bench_json_num("seconds", secs);
  bench_json_num("mops_per_s", (double)ops * (double)nthreads / secs / 1e6);
  bench_json_num("vcsw_per_s", (double)(r1.ru_nvcsw - r0.ru_nvcsw) / secs);
  bench_json_num("ivcsw_per_s", (double)(r1.ru_nivcsw - r0.ru_nivcsw) / secs);
  bench_json_num("sys_seconds", bench_tv(r1.ru_stime) - bench_tv(r0.ru_stime));
  bench_json_int("peak_rss_kb", bench_peak_rss_kb());
  bench_json_end();
  return 0;
}
