/* bench_common.h: helpers shared by threadheap's benchmark workloads.
 *
 * Every workload calls the plain malloc family and is never linked against threadheap: the allocator
 * under test is chosen from outside with LD_PRELOAD, so a run without a preload really measures the
 * system malloc. Results go to stdout as one JSON object per line, which the `threadheap bench` driver
 * parses; anything meant for people goes to stderr.
 */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define BENCH_MAX_LIST 64

/* Stores of allocated pointers go here so that no compiler can prove a malloc/free pair dead. It is
 * thread-local: a shared one would make every thread write the same cache line and measure that. */
__attribute__((unused)) static _Thread_local void *volatile bench_sink;

static inline double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline double bench_tv(struct timeval tv) { return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6; }

static inline void bench_die(const char *prog, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", prog);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(2);
}

/* Parses one count with an optional k/m/g suffix (powers of 1024), e.g. "64k" or "8m". */
static inline long bench_parse_num(const char *prog, const char *s) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || errno != 0 || v < 0) bench_die(prog, "bad number '%s'", s);
  switch (*end) {
  case 'k': case 'K': v <<= 10; end++; break;
  case 'm': case 'M': v <<= 20; end++; break;
  case 'g': case 'G': v <<= 30; end++; break;
  default: break;
  }
  if (*end != '\0') bench_die(prog, "bad number '%s'", s);
  return v;
}

/* Parses a comma-separated list such as "1,2,4" or "16,1k,64k"; returns how many values it holds. */
static inline int bench_parse_list(const char *prog, const char *s, long *out, int max) {
  char buf[1024];
  int n = 0;
  if (strlen(s) >= sizeof buf) bench_die(prog, "list too long '%s'", s);
  strcpy(buf, s);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (n == max) bench_die(prog, "too many values in '%s'", s);
    out[n++] = bench_parse_num(prog, tok);
  }
  if (n == 0) bench_die(prog, "empty list");
  return n;
}

/* Reads a "VmRSS:"-style line of /proc/self/status, in KiB; 0 when absent. */
static inline long bench_status_kb(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long v = 0;
  size_t k = strlen(key);
  if (!f) return 0;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, k) == 0) {
      v = strtol(line + k, NULL, 10);
      break;
    }
  }
  fclose(f);
  return v;
}
static inline long bench_rss_kb(void) { return bench_status_kb("VmRSS:"); }
static inline long bench_peak_rss_kb(void) { return bench_status_kb("VmHWM:"); }

static inline int bench_cores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* xorshift64*: a cheap per-thread random source, so the random stream itself never contends. */
static inline uint64_t bench_rand(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1DULL;
}

/* One JSON object per line: bench_json_begin, then fields, then bench_json_end. */
__attribute__((unused)) static char bench_json_buf[4096];
__attribute__((unused)) static size_t bench_json_len;

static inline void bench_json_add(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(bench_json_buf + bench_json_len, sizeof bench_json_buf - bench_json_len, fmt, ap);
  va_end(ap);
  if (n > 0) bench_json_len += (size_t)n;
  if (bench_json_len >= sizeof bench_json_buf) bench_json_len = sizeof bench_json_buf - 1;
}
static inline void bench_json_begin(const char *experiment) {
  bench_json_len = 0;
  bench_json_add("{\"experiment\":\"%s\"", experiment);
}
static inline void bench_json_str(const char *k, const char *v) { bench_json_add(",\"%s\":\"%s\"", k, v); }
static inline void bench_json_int(const char *k, long long v) { bench_json_add(",\"%s\":%lld", k, v); }
static inline void bench_json_num(const char *k, double v) { bench_json_add(",\"%s\":%.6g", k, v); }
static inline void bench_json_end(void) {
  bench_json_add("}");
  puts(bench_json_buf);
  fflush(stdout);
}

/* A start gate: workers spin (yielding, since the machine may have fewer cores than threads) until the
 * main thread opens it, so thread creation is outside the timed region. */
typedef struct {
  _Atomic int ready;
  _Atomic int go;
} bench_gate_t;

static inline void bench_gate_wait(bench_gate_t *g) {
  __atomic_fetch_add(&g->ready, 1, __ATOMIC_ACQ_REL);
  while (!__atomic_load_n(&g->go, __ATOMIC_ACQUIRE)) sched_yield();
}
static inline void bench_gate_open(bench_gate_t *g, int nthreads) {
  while (__atomic_load_n(&g->ready, __ATOMIC_ACQUIRE) < nthreads) sched_yield();
  __atomic_store_n(&g->go, 1, __ATOMIC_RELEASE);
}

#endif
