/* large: the hidden costs of large blocks (seed 001). For blocks of 8..40 MiB, three loops per size:
 *
 *   untouched  malloc + free, memory never written: what a naive timer around new/delete sees;
 *   touched    malloc + write one byte per page + free: allocation, first touch (the page faults and the
 *              kernel zeroing each page) and free (unmapping touched pages) timed apart;
 *   reused     one buffer allocated once and written every iteration: the floor that any allocator's
 *              touched loop is compared against, since reuse never faults. Its iterations alternate with
 *              the touched loop's, so that both see the same machine.
 *
 * With --cycle, one loop instead: each iteration allocates the next of the sizes in turn, writes one byte
 * per page and frees it, the way a program's buffers of varying sizes come and go (mode "cycle", figures per
 * MiB of all the blocks). The benchmark driver does not run it.
 *
 * Costs are reported per MiB, with the process's system time and minor faults per iteration, because on
 * Linux most of the cost of a fresh large block is kernel work done inside the first write. An allocator
 * that caches large blocks shows touched costs close to the floor.
 *
 * Output, one line per size and loop: {"experiment":"large","mode":..,"size_mb":..,"iterations":..,
 * "alloc_us_per_mb":..,"touch_us_per_mb":..,"free_us_per_mb":..,"total_us_per_mb":..,"sys_us_per_mb":..,
 * "minflt_per_iter":..}
 */
#define _GNU_SOURCE
#include <stdbool.h>

#include "bench_common.h"

static const char *prog = "large";

/* The fence waits for the writes to reach the cache: without it the last few dozen (each a cache miss) are
 * still in the store buffer when the clock is read, and drain inside whatever is timed next, the free of a
 * touched block, or nothing timed after the floor's write. */
static void touch_pages(volatile char *p, size_t size, size_t page, int iter) {
  for (size_t off = 0; off < size; off += page) p[off] = (char)iter;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* One malloc, write (iteration >= 0: one byte per page; -1: untouched), free; each part's time added. */
static void timed_round(size_t size, size_t page, int iteration, double *ta, double *tt, double *tf) {
  double t0 = bench_now();
  char *p = malloc(size);
  double t1 = bench_now();
  if (!p) bench_die(prog, "malloc(%zu) failed", size);
  if (iteration >= 0) touch_pages(p, size, page, iteration);
  bench_sink = p;
  double t2 = bench_now();
  free(p);
  double t3 = bench_now();
  *ta += t1 - t0;
  *tt += t2 - t1;
  *tf += t3 - t2;
}

/* A line's cost fields, per MiB of the mib MiB its iters iterations allocated, and its end. */
static void report_costs(double mib, int iters, double a, double t, double f, double sys, long flt) {
  double per = 1e6 / mib;
  bench_json_num("alloc_us_per_mb", a * per);
  bench_json_num("touch_us_per_mb", t * per);
  bench_json_num("free_us_per_mb", f * per);
  bench_json_num("total_us_per_mb", (a + t + f) * per);
  bench_json_num("sys_us_per_mb", sys * per);
  bench_json_num("minflt_per_iter", (double)flt / iters);
  bench_json_end();
}

static void report_raw(const char *mode, long mb, int iters, double a, double t, double f, double sys, long flt) {
  bench_json_begin("large");
  bench_json_str("mode", mode);
  bench_json_int("size_mb", mb);
  bench_json_int("iterations", iters);
  report_costs((double)mb * iters, iters, a, t, f, sys, flt);
}

static void report(const char *mode, long mb, int iters, double a, double t, double f, struct rusage *r0,
                   struct rusage *r1) {
  report_raw(mode, mb, iters, a, t, f, bench_tv(r1->ru_stime) - bench_tv(r0->ru_stime),
             r1->ru_minflt - r0->ru_minflt);
}

/* --cycle: the sizes in turn, each block written once a page and freed; figures per MiB of all the blocks. */
static void run_cycle(const long *mbs, int n, int iters, size_t page) {
  double ta = 0, tt = 0, tf = 0;
  long total_mb = 0;
  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  for (int it = 0; it < iters; it++) {
    long mb = mbs[it % n];
    total_mb += mb;
    timed_round((size_t)mb << 20, page, it, &ta, &tt, &tf);
  }
  getrusage(RUSAGE_SELF, &r1);
  bench_json_begin("large");
  bench_json_str("mode", "cycle");
  bench_json_int("sizes", n);
  bench_json_int("iterations", iters);
  bench_json_num("mean_size_mb", (double)total_mb / iters);
  report_costs((double)total_mb, iters, ta, tt, tf, bench_tv(r1.ru_stime) - bench_tv(r0.ru_stime),
               r1.ru_minflt - r0.ru_minflt);
}

int main(int argc, char **argv) {
  long sizes[BENCH_MAX_LIST] = {8, 16, 24, 32, 40};
  int nsizes = 5, iters = 20;
  bool cycle = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--smoke")) iters = 2;
    else if (!strcmp(a, "--full")) iters = 100;
    else if (!strcmp(a, "--sizes") && v) nsizes = bench_parse_list(prog, v, sizes, BENCH_MAX_LIST), i++;
    else if (!strcmp(a, "--iterations") && v) iters = (int)bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--cycle")) cycle = true;
    else {
      fprintf(stderr, "usage: large [--smoke] [--full] [--sizes LIST-IN-MiB] [--iterations N] [--cycle]\n");
      return 2;
    }
  }
  if (iters < 1) bench_die(prog, "iterations must be positive");
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  /* Sizes are in MiB; a value given with a suffix (e.g. 8m) is taken as bytes and rounded to MiB. */
  for (int s = 0; s < nsizes; s++) {
    if (sizes[s] >= (1L << 20)) sizes[s] >>= 20;
    if (sizes[s] < 1) bench_die(prog, "sizes are in MiB and must be at least 1");
  }
  if (cycle) {
    run_cycle(sizes, nsizes, iters, page);
    return 0;
  }
  for (int s = 0; s < nsizes; s++) {
    long mb = sizes[s];
    size_t size = (size_t)mb << 20;
    struct rusage r0, r1;
    /* Blocks freed untouched first. Then blocks written on every page before the free, with the floor (a
     * buffer kept and rewritten) timed in the same loop, one iteration of each in turn, so that whatever
     * drifts during the run (frequency, caches, the rest of the machine) hits both alike: timed one after
     * the other, the second loop ran faster whichever it was. One untimed round of each comes first: the
     * figures are the steady state of a program that keeps doing this, not its first call. */
    double ta = 0, tt = 0, tf = 0;
    char *w = malloc(size);
    if (!w) bench_die(prog, "malloc(%zu) failed", size);
    bench_sink = w;
    free(w);
    getrusage(RUSAGE_SELF, &r0);
    for (int it = 0; it < iters; it++) timed_round(size, page, -1, &ta, &tt, &tf);
    getrusage(RUSAGE_SELF, &r1);
    report("untouched", mb, iters, ta, tt, tf, &r0, &r1);

    char *buf = malloc(size);
    if (!buf) bench_die(prog, "malloc(%zu) failed", size);
    touch_pages(buf, size, page, 0);
    w = malloc(size);
    if (!w) bench_die(prog, "malloc(%zu) failed", size);
    touch_pages(w, size, page, -1);
    bench_sink = w;
    free(w);
    ta = tt = tf = 0;
    double floor_t = 0, floor_sys = 0;
    long floor_flt = 0;
    getrusage(RUSAGE_SELF, &r0);
    for (int it = 0; it < iters; it++) {
      timed_round(size, page, it, &ta, &tt, &tf);
      /* The floor's iteration, kept out of the touched loop's rusage. */
      struct rusage f0, f1;
      getrusage(RUSAGE_SELF, &f0);
      double t4 = bench_now();
      touch_pages(buf, size, page, it + 1);
      floor_t += bench_now() - t4;
      getrusage(RUSAGE_SELF, &f1);
      floor_sys += bench_tv(f1.ru_stime) - bench_tv(f0.ru_stime);
      floor_flt += f1.ru_minflt - f0.ru_minflt;
    }
    getrusage(RUSAGE_SELF, &r1);
    /* The touched loop's rusage without the floor's share. */
    double sys_touched = bench_tv(r1.ru_stime) - bench_tv(r0.ru_stime) - floor_sys;
    long flt_touched = (r1.ru_minflt - r0.ru_minflt) - floor_flt;
    report_raw("touched", mb, iters, ta, tt, tf, sys_touched, flt_touched);
    report_raw("reused", mb, iters, 0, floor_t, 0, floor_sys, floor_flt);
    free(buf);
  }
  return 0;
}
