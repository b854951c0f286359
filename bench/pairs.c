/* pairs: threadheap's own speed targets, measured (never asserted).
 *
 *   single  one thread, malloc+free pairs of 16 B .. 1 KiB: nanoseconds per pair, the fast path's cost;
 *   scaling two threads doing pairs of 1 B .. 1 MiB against one thread doing the same, next to the same
 *           measurement for a loop that does no allocation but equal work (it is calibrated to take as
 *           long per iteration as a pair does). On a noisy two-core machine the reference loop does not
 *           reach 2x either, so the ratio of the two speed-ups, not the raw speed-up, says whether the
 *           allocator itself scales: 1.0 means as well as code that never touches the allocator.
 *   --count N --size S: exactly N pairs of S bytes and nothing else, for instruction counting
 *           (bench/callgrind.sh).
 *   --new:  the pairs are C++'s operator new and sized delete instead of malloc and free (pairs_new.cpp);
 *   --realloc, --grow, --usable: each malloc+free pair also reallocates its block to 8 bytes fewer (a
 *           realloc in place for an allocator that keeps it there) or to twice its size (a move), or asks its
 *           malloc_usable_size;
 *   --calloc: the pairs are calloc(1, size) and free.
 *
 * Output: {"experiment":"pairs","mode":"single","size":..,"ns_per_pair":..} and
 * {"experiment":"pairs","mode":"scaling","size":..,"ns_per_pair":..,"speedup":..,"ref_speedup":..,
 *  "scaling":..}
 */
#define _GNU_SOURCE
#include "bench_common.h"

#include <malloc.h>
#include <pthread.h>

static const char *prog = "pairs";

static struct {
  size_t size;
  long iters;    /* per thread */
  int reference; /* 1: the allocation-free loop */
  long ref_work; /* rounds of arithmetic per reference iteration */
  bench_gate_t gate;
} job;

static _Thread_local volatile uint64_t ref_sink;

static enum { API_MALLOC, API_NEW, API_REALLOC, API_GROW, API_USABLE, API_CALLOC } api; /* --new, --realloc, ... */
void pairs_new_loop(size_t size, long n);
void *volatile *pairs_sink(void);
void *volatile *pairs_sink(void) { return &bench_sink; }

static void pair_loop(size_t size, long n) {
  switch (api) {
    case API_NEW: pairs_new_loop(size, n); return;
    case API_REALLOC:
    case API_GROW:
      for (long i = 0; i < n; i++) {
        void *p = malloc(size);
        bench_sink = p;
        p = realloc(p, api == API_GROW ? 2 * size : size > 8 ? size - 8 : size);
        bench_sink = p;
        free(p);
      }
      return;
    case API_USABLE:
      for (long i = 0; i < n; i++) {
        void *p = malloc(size);
        bench_sink = (void *)malloc_usable_size(p);
        bench_sink = p;
        free(p);
      }
      return;
    case API_CALLOC:
      for (long i = 0; i < n; i++) {
        void *p = calloc(1, size);
        bench_sink = p;
        free(p);
      }
      return;
    case API_MALLOC: break;
  }
  for (long i = 0; i < n; i++) {
    void *p = malloc(size);
    bench_sink = p;
    free(p);
  }
}

static void ref_loop(long n, long work) {
  uint64_t s = 88172645463325252ULL + (uint64_t)n;
  for (long i = 0; i < n; i++) {
    for (long w = 0; w < work; w++) bench_rand(&s);
    ref_sink = s;
  }
}

static void *worker(void *arg) {
  (void)arg;
  bench_gate_wait(&job.gate);
  if (job.reference) ref_loop(job.iters, job.ref_work);
  else pair_loop(job.size, job.iters);
  return NULL;
}

/* Seconds for nthreads threads to do job.iters iterations each. */
static double run(int nthreads) {
  pthread_t tid[2];
  job.gate.ready = 0;
  job.gate.go = 0;
  for (int t = 0; t < nthreads; t++)
    if (pthread_create(&tid[t], NULL, worker, NULL) != 0) bench_die(prog, "pthread_create failed");
  double t0 = bench_now();
  bench_gate_open(&job.gate, nthreads);
  for (int t = 0; t < nthreads; t++) pthread_join(tid[t], NULL);
  return bench_now() - t0;
}

/* Iterations that take about `seconds` in one thread, from a short pilot run. */
static long calibrate(double seconds) {
  long n = 1000;
  for (;;) {
    job.iters = n;
    double t = run(1);
    if (t >= seconds / 8 || n > (1L << 34)) return (long)((double)n * seconds / (t > 0 ? t : 1e-9)) + 1;
    n *= 4;
  }
}

int main(int argc, char **argv) {
  long single[BENCH_MAX_LIST], scaling[BENCH_MAX_LIST];
  int nsingle = 0, nscaling = 0, have_sizes = 0;
  double seconds = 0.02;
  long count = -1, csize = 64;
  const char *modes = "single,scaling";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--smoke")) seconds = 0.003;
    else if (!strcmp(a, "--full")) seconds = 0.2;
    else if (!strcmp(a, "--seconds") && v) seconds = atof(v), i++;
    else if (!strcmp(a, "--modes") && v) modes = v, i++;
    else if (!strcmp(a, "--sizes") && v) {
      nsingle = nscaling = bench_parse_list(prog, v, single, BENCH_MAX_LIST);
      memcpy(scaling, single, sizeof single);
      have_sizes = 1;
      i++;
    } else if (!strcmp(a, "--count") && v) count = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--size") && v) csize = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--new")) api = API_NEW;
    else if (!strcmp(a, "--realloc")) api = API_REALLOC;
    else if (!strcmp(a, "--grow")) api = API_GROW;
    else if (!strcmp(a, "--usable")) api = API_USABLE;
    else if (!strcmp(a, "--calloc")) api = API_CALLOC;
    else {
      fprintf(stderr, "usage: pairs [--smoke] [--full] [--seconds S] [--modes single,scaling] [--sizes LIST]\n"
                      "             [--new | --realloc | --grow | --usable | --calloc]\n"
                      "       pairs --count N --size BYTES [--new | --realloc | --grow | --usable | --calloc]\n");
      return 2;
    }
  }
  if (count >= 0) {
    pair_loop((size_t)csize, count);
    return 0;
  }
  if (!have_sizes) {
    for (long s = 16; s <= 1024; s *= 2) single[nsingle++] = s;
    for (long s = 1; s <= (1L << 20); s *= 4) scaling[nscaling++] = s;
  }
  if (seconds <= 0) bench_die(prog, "seconds must be positive");
  int do_single = strstr(modes, "single") != NULL, do_scaling = strstr(modes, "scaling") != NULL;

  for (int i = 0; do_single && i < nsingle; i++) {
    job.size = (size_t)single[i];
    job.reference = 0;
    pair_loop(job.size, 1000); /* warm the size class */
    job.iters = calibrate(seconds);
    double t = run(1);
    bench_json_begin("pairs");
    bench_json_str("mode", "single");
    bench_json_int("size", single[i]);
    bench_json_num("ns_per_pair", t * 1e9 / (double)job.iters);
    bench_json_end();
  }

  for (int i = 0; do_scaling && i < nscaling; i++) {
    job.size = (size_t)scaling[i];
    job.reference = 0;
    pair_loop(job.size, 1000);
    long iters = calibrate(seconds);
    double pair_ns = 0;
    {
      job.iters = 1000000 < iters ? 1000000 : iters;
      pair_ns = run(1) * 1e9 / (double)job.iters;
    }
    /* Size the reference loop so that one of its iterations costs what one pair costs. */
    job.reference = 1;
    job.ref_work = 1;
    job.iters = 1000000;
    double ns_per_work = run(1) * 1e9 / (double)job.iters;
    job.ref_work = (long)(pair_ns / (ns_per_work > 0 ? ns_per_work : 1e-3));
    if (job.ref_work < 1) job.ref_work = 1;
    /* Allocating and reference runs alternate, three rounds, best of each: noise from the rest of the
     * machine hits both kinds alike and the best run is the one least disturbed. */
    double t1 = 1e30, t2 = 1e30, r1 = 1e30, r2 = 1e30;
    job.iters = iters;
    for (int round = 0; round < 3; round++) {
      double x;
      job.reference = 0;
      if ((x = run(1)) < t1) t1 = x;
      if ((x = run(2)) < t2) t2 = x;
      job.reference = 1;
      if ((x = run(1)) < r1) r1 = x;
      if ((x = run(2)) < r2) r2 = x;
    }
    pair_ns = t1 * 1e9 / (double)iters;
    double speedup = 2.0 * t1 / t2, ref_speedup = 2.0 * r1 / r2;
    bench_json_begin("pairs");
    bench_json_str("mode", "scaling");
    bench_json_int("size", scaling[i]);
    bench_json_num("ns_per_pair", pair_ns);
    bench_json_num("speedup", speedup);
    bench_json_num("ref_speedup", ref_speedup);
    bench_json_num("scaling", speedup / ref_speedup);
    bench_json_end();
  }
  return 0;
}
