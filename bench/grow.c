/* grow: a buffer grown by realloc, as a string builder, a vector or a read buffer grows, then freed.
 *
 * Each chain starts with a 4 KiB block and reallocs it, writing each new part, until it holds --max bytes:
 * by half its size each time (--step 0, the default: geometric growth) or by --step bytes each time. The
 * chain is repeated --chains times, in each of --threads threads at once; the wall time per chain (of one
 * thread), its minor page faults and the peak RSS are printed. An allocator that can grow a block where it
 * lies (mremap, or room behind it) copies nothing; one that moves it copies every byte at every move, and may
 * keep each block it left behind.
 *
 * Output, one line: {"experiment":"grow","max":..,"step":..,"chains":..,"threads":..,"us_per_chain":..,
 * "minflt_per_chain":..,"peak_rss_kb":..}
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "bench_common.h"

static const char *prog = "grow";
static long max = 2L << 20, step = 0, chains = 300;

/* The chains of one thread; returns how many of them kept their first and last bytes. */
static void *grow_chains(void *arg) {
  (void)arg;
  long kept = 0;
  for (long c = 0; c < chains; c++) {
    size_t n = 4096;
    unsigned char *p = malloc(n);
    if (p == NULL) bench_die(prog, "out of memory");
    memset(p, 1, n);
    while (n < (size_t)max) {
      size_t m = step ? n + (size_t)step : n + n / 2;
      if (m > (size_t)max) m = (size_t)max;
      unsigned char *q = realloc(p, m);
      if (q == NULL) bench_die(prog, "out of memory");
      p = q;
      memset(p + n, (int)(m & 0xff), m - n);
      n = m;
    }
    /* every byte kept: the first written before every move, the last after */
    kept += p[0] == 1 && p[n - 1] == (unsigned char)(max & 0xff);
    free(p);
  }
  return (void *)kept;
}

int main(int argc, char **argv) {
  long threads = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--smoke")) chains = 5;
    else if (!strcmp(a, "--max") && v) max = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--step") && v) step = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--chains") && v) chains = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--threads") && v) threads = bench_parse_num(prog, v), i++;
    else {
      fprintf(stderr, "usage: grow [--smoke] [--max BYTES] [--step BYTES] [--chains N] [--threads N]\n");
      return 2;
    }
  }
  if (max <= 4096 || chains < 1 || step < 0 || threads < 1 || threads > 64)
    bench_die(prog, "--max must be past 4096, --chains at least 1, --threads 1 to 64");

  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  double t0 = bench_now();
  pthread_t t[64];
  for (long i = 0; i < threads; i++)
    if (pthread_create(&t[i], NULL, grow_chains, NULL) != 0) bench_die(prog, "pthread_create failed");
  long kept = 0;
  for (long i = 0; i < threads; i++) {
    void *k;
    pthread_join(t[i], &k);
    kept += (long)k;
  }
  double secs = bench_now() - t0;
  getrusage(RUSAGE_SELF, &r1);
  if (kept != chains * threads) bench_die(prog, "the buffer's bytes were not kept");
  bench_json_begin("grow");
  bench_json_int("max", max);
  bench_json_int("step", step);
  bench_json_int("chains", chains);
  bench_json_int("threads", threads);
  bench_json_num("us_per_chain", secs * 1e6 / (double)chains);
  bench_json_num("minflt_per_chain", (double)(r1.ru_minflt - r0.ru_minflt) / (double)(chains * threads));
  bench_json_int("peak_rss_kb", bench_peak_rss_kb());
  bench_json_end();
  return 0;
}
