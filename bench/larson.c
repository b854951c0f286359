/* larson: a server simulation. Each of T threads owns an array of live blocks and, for a number of
 * operations, replaces a random block with a new one of random size. After each round the threads exit
 * and a new set of threads starts, each taking over the array of a different thread of the previous round,
 * so most frees hit blocks that another (often already exited) thread allocated: the pattern of a server
 * whose requests are picked up by whichever worker is free. Throughput and memory (peak and final RSS)
 * are reported, since an allocator can win the first by letting the second grow.
 *
 * Output, one line: {"experiment":"larson","threads":..,"rounds":..,"ops_per_round":..,"slots":..,
 * "min_size":..,"max_size":..,"seconds":..,"mops_per_s":..,"peak_rss_kb":..,"end_rss_kb":..}
 */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>

static const char *prog = "larson";
static long g_ops, g_slots, g_min, g_max;

/* One cache line per thread: the seed is written on every operation, and two threads writing one line would
 * time the line's trips between cores instead of the allocator. */
typedef struct {
  _Alignas(64) char **slot;
  uint64_t seed;
} arena_t;

static void *worker(void *arg) {
  arena_t *a = arg;
  for (long i = 0; i < g_ops; i++) {
    uint64_t r = bench_rand(&a->seed);
    size_t k = (size_t)(r % (uint64_t)g_slots);
    size_t size = (size_t)g_min + (size_t)((r >> 32) % (uint64_t)(g_max - g_min + 1));
    free(a->slot[k]);
    char *p = malloc(size);
    if (!p) bench_die(prog, "malloc failed");
    p[0] = (char)r;
    p[size - 1] = (char)r;
    a->slot[k] = p;
  }
  return NULL;
}

int main(int argc, char **argv) {
  long nthreads = 0, rounds = 20, ops = 100000, slots = 10000, min = 16, max = 512;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--smoke")) rounds = 5, ops = 5000;
    else if (!strcmp(a, "--full")) rounds = 50, ops = 200000;
    else if (!strcmp(a, "--threads") && v) nthreads = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--rounds") && v) rounds = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--ops") && v) ops = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--slots") && v) slots = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--min-size") && v) min = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--max-size") && v) max = bench_parse_num(prog, v), i++;
    else {
      fprintf(stderr, "usage: larson [--smoke] [--full] [--threads N] [--rounds N] [--ops N] [--slots N]\n"
                      "              [--min-size B] [--max-size B]\n"
                      "  default: threads = 2x cores (at most 8), 20 rounds of 100000 operations per thread,\n"
                      "  10000 slots, 16..512 B\n");
      return 2;
    }
  }
  if (nthreads == 0) nthreads = 2 * bench_cores() > 8 ? 8 : 2 * bench_cores();
  if (nthreads < 1 || nthreads > 1024 || rounds < 1 || ops < 1 || slots < 1 || min < 1 || max < min)
    bench_die(prog, "bad parameters");
  g_ops = ops;
  g_slots = slots;
  g_min = min;
  g_max = max;
  arena_t *arena = aligned_alloc(64, (size_t)nthreads * sizeof *arena);
  if (arena) memset(arena, 0, (size_t)nthreads * sizeof *arena);
  pthread_t *tid = calloc((size_t)nthreads, sizeof *tid);
  if (!arena || !tid) bench_die(prog, "out of memory");
  /* The main thread fills every array first, so even the first round frees foreign blocks. */
  for (long t = 0; t < nthreads; t++) {
    arena[t].seed = 0x9E3779B97F4A7C15ULL * (uint64_t)(t + 1);
    arena[t].slot = malloc((size_t)slots * sizeof(char *));
    if (!arena[t].slot) bench_die(prog, "out of memory");
    for (long k = 0; k < slots; k++) {
      arena[t].slot[k] = malloc((size_t)min);
      if (!arena[t].slot[k]) bench_die(prog, "malloc failed");
    }
  }
  double t0 = bench_now();
  for (long r = 0; r < rounds; r++) {
    /* Round r: thread t works on the array that thread t-1 used in round r-1 (rotation by r). */
    for (long t = 0; t < nthreads; t++)
      if (pthread_create(&tid[t], NULL, worker, &arena[(t + r) % nthreads]) != 0)
        bench_die(prog, "pthread_create failed");
    for (long t = 0; t < nthreads; t++) pthread_join(tid[t], NULL);
  }
  double secs = bench_now() - t0;
  long peak = bench_peak_rss_kb();
  for (long t = 0; t < nthreads; t++) {
    for (long k = 0; k < slots; k++) free(arena[t].slot[k]);
    free(arena[t].slot);
  }
  bench_json_begin("larson");
  bench_json_int("threads", nthreads);
  bench_json_int("rounds", rounds);
  bench_json_int("ops_per_round", ops);
  bench_json_int("slots", slots);
  bench_json_int("min_size", min);
  bench_json_int("max_size", max);
  bench_json_num("seconds", secs);
  bench_json_num("mops_per_s", (double)rounds * (double)ops * (double)nthreads / secs / 1e6);
  bench_json_int("peak_rss_kb", peak);
  bench_json_int("end_rss_kb", bench_rss_kb());
  bench_json_end();
  free(arena);
  free(tid);
  return 0;
}
