/* wake: what the first burst after an idle pause costs, as a server's first request after a quiet second.
 *
 * A burst allocates N blocks of one size, writes each whole and frees them all; the program then works a
 * little (malloc/free pairs of 16 bytes for --work ms, the allocator's housekeeping time), sleeps --sleep ms,
 * and runs the same burst again. An allocator that gives back free memory at its first chance after the
 * pause makes that second burst fault its memory in again; one that keeps what was just used does not.
 * The second burst is timed, with its minor page faults, and the RSS before it.
 *
 * Output, one line: {"experiment":"wake","size":..,"blocks":..,"sleep_ms":..,"ms":..,"minflt":..,
 * "rss_kb":..}
 */
#define _GNU_SOURCE
#include "bench_common.h"

static const char *prog = "wake";

static void burst(void **b, long n, size_t size) {
  for (long i = 0; i < n; i++) {
    b[i] = malloc(size);
    if (b[i] == NULL) bench_die(prog, "out of memory");
    memset(b[i], (int)i, size);
  }
  for (long i = 0; i < n; i++) free(b[i]);
}

static void work(double seconds) {
  for (double end = bench_now() + seconds; bench_now() < end;) {
    for (int i = 0; i < 20000; i++) {
      volatile char *p = malloc(16);
      if (p == NULL) bench_die(prog, "out of memory");
      p[0] = (char)i;
      free((void *)p);
    }
  }
}

int main(int argc, char **argv) {
  long size = 32768, blocks = 1024, work_ms = 30, sleep_ms = 1000;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--smoke")) blocks = 64, sleep_ms = 200;
    else if (!strcmp(a, "--size") && v) size = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--blocks") && v) blocks = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--work") && v) work_ms = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--sleep") && v) sleep_ms = bench_parse_num(prog, v), i++;
    else {
      fprintf(stderr, "usage: wake [--smoke] [--size BYTES] [--blocks N] [--work MS] [--sleep MS]\n");
      return 2;
    }
  }
  if (size < 1 || blocks < 1) bench_die(prog, "--size and --blocks must be at least 1");
  void **b = calloc((size_t)blocks, sizeof *b);
  if (b == NULL) bench_die(prog, "out of memory");
  burst(b, blocks, (size_t)size);
  work((double)work_ms / 1e3);
  usleep((useconds_t)sleep_ms * 1000);

  long rss = bench_rss_kb();
  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  double t0 = bench_now();
  burst(b, blocks, (size_t)size);
  double secs = bench_now() - t0;
  getrusage(RUSAGE_SELF, &r1);
  bench_json_begin("wake");
  bench_json_int("size", size);
  bench_json_int("blocks", blocks);
  bench_json_int("sleep_ms", sleep_ms);
  bench_json_num("ms", secs * 1e3);
  bench_json_int("minflt", r1.ru_minflt - r0.ru_minflt);
  bench_json_int("rss_kb", rss);
  bench_json_end();
  free(b);
  return 0;
}
