/* contention_common.h: what bench/contention.c and bench/contention_heaps.c share. Both time the same cell:
 * N threads take batches of BATCH alloc/free pairs from one pool (an atomic decrement), until the pool is
 * empty or the cell's time bound passes, and report microseconds per pair over all threads. They differ in
 * the methods they run and in their default thread counts; each supplies its worker and its method name. */
#ifndef TH_BENCH_CONTENTION_COMMON_H
#define TH_BENCH_CONTENTION_COMMON_H

#include "bench_common.h"

#include <pthread.h>
#include <sys/mman.h>

#define BATCH 1024

/* The two batches both programs run: malloc/free pairs, and mmap/munmap pairs (the OS every time). */
static inline void contention_batch_malloc(size_t size) {
  for (int i = 0; i < BATCH; i++) {
    void *p = malloc(size);
    bench_sink = p;
    free(p);
  }
}
static inline void contention_batch_mmap(const char *prog, size_t size) {
  for (int i = 0; i < BATCH; i++) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) bench_die(prog, "mmap failed");
    bench_sink = p;
    munmap(p, size);
  }
}

/* The pool and clock of the cell being run; workers read deadline and take batches. */
typedef struct {
  double deadline; /* 0: no time bound */
  _Atomic long batches;
  _Atomic long pairs_done;
  bench_gate_t gate;
} contention_cell_t;

/* A worker's loop: while batches remain and the deadline has not passed, run one more batch. */
static inline int contention_take_batch(contention_cell_t *c, long done) {
  if (done > 0 && c->deadline > 0 && bench_now() >= c->deadline) return 0;
  return __atomic_sub_fetch(&c->batches, 1, __ATOMIC_RELAXED) >= 0;
}

/* Run one cell with nthreads workers and print its JSON line. The clock starts once every worker is at
 * the gate, so thread creation (and a worker's set-up before the gate, such as its own heap) is outside it. */
static inline void contention_run_cell(const char *prog, contention_cell_t *c, void *(*worker)(void *),
                                       const char *method, size_t size, int nthreads, long total_pairs,
                                       double seconds) {
  pthread_t tid[256];
  c->batches = total_pairs > 0 ? total_pairs / BATCH : (1L << 40);
  c->pairs_done = 0;
  c->gate.ready = 0;
  c->gate.go = 0;
  c->deadline = 0;
  for (int t = 0; t < nthreads; t++)
    if (pthread_create(&tid[t], NULL, worker, NULL) != 0) bench_die(prog, "pthread_create failed");
  while (__atomic_load_n(&c->gate.ready, __ATOMIC_ACQUIRE) < nthreads) sched_yield();
  double t0 = bench_now();
  if (seconds > 0) c->deadline = t0 + seconds;
  bench_gate_open(&c->gate, nthreads);
  for (int t = 0; t < nthreads; t++) pthread_join(tid[t], NULL);
  double elapsed = bench_now() - t0;
  long pairs = c->pairs_done;
  bench_json_begin("contention");
  bench_json_str("method", method);
  bench_json_int("size", (long long)size);
  bench_json_int("threads", nthreads);
  bench_json_int("pairs", pairs);
  bench_json_num("seconds", elapsed);
  bench_json_num("us_per_op", elapsed * 1e6 / (double)pairs);
  bench_json_end();
}

/* The options both programs take. */
typedef struct {
  long sizes[BENCH_MAX_LIST], threads[BENCH_MAX_LIST];
  int nsizes, nthreads, smoke, full;
  double seconds; /* -1: the default */
  long pairs;     /* -1: the default */
} contention_opts_t;

/* One of the shared options at argv[*i] (taking its value from argv[*i + 1]); 0 when a is not one of them. */
static inline int contention_parse_opt(const char *prog, contention_opts_t *o, int argc, char **argv, int *i) {
  const char *a = argv[*i];
  const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
  if (!strcmp(a, "--smoke")) o->smoke = 1;
  else if (!strcmp(a, "--full")) o->full = 1;
  else if (!strcmp(a, "--sizes") && v) o->nsizes = bench_parse_list(prog, v, o->sizes, BENCH_MAX_LIST), ++*i;
  else if (!strcmp(a, "--threads") && v) o->nthreads = bench_parse_list(prog, v, o->threads, BENCH_MAX_LIST), ++*i;
  else if (!strcmp(a, "--seconds") && v) o->seconds = atof(v), ++*i;
  else if (!strcmp(a, "--pairs") && v) o->pairs = bench_parse_num(prog, v), ++*i;
  else return 0;
  return 1;
}

/* After the program's own defaults: sizes 1..64k (powers of two) when none were given, the lists checked,
 * and each cell's budget: --full runs 2^20 pairs with no time bound; --smoke a small pool and a few ms;
 * the default, 2^20 pairs or 30 ms, whichever ends first. */
static inline void contention_finish_opts(const char *prog, contention_opts_t *o, double smoke_seconds,
                                          long smoke_pairs) {
  if (o->nsizes == 0)
    for (long s = 1; s <= 65536; s *= 2) o->sizes[o->nsizes++] = s;
  for (int i = 0; i < o->nthreads; i++)
    if (o->threads[i] < 1 || o->threads[i] > 256) bench_die(prog, "threads must be 1..256");
  for (int i = 0; i < o->nsizes; i++)
    if (o->sizes[i] < 1) bench_die(prog, "sizes must be at least 1");
  if (o->full) {
    o->pairs = o->pairs > 0 ? o->pairs : (1L << 20);
    o->seconds = 0;
  } else if (o->smoke) {
    if (o->seconds < 0) o->seconds = smoke_seconds;
    if (o->pairs < 0) o->pairs = smoke_pairs;
  } else {
    if (o->seconds < 0) o->seconds = 0.03;
    if (o->pairs < 0) o->pairs = 1L << 20;
  }
}

#endif
