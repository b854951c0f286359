/* profile.h: what profile.c (sampling, stacks) and profile_write.c (pprof files, the leak report, when to
 * write) share. The hooks the allocator calls are in internal.h. */
#ifndef TH_PROFILE_H
#define TH_PROFILE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PROFILE_DEPTH 64
#define PROFILE_COUNT_ONE 1024 /* object counts are kept in 1/1024ths: estimates are fractional */

/* A call stack and what was sampled at it: estimates of the true totals (each sample weighted by the
 * Poisson correction). Made once, never freed; any thread adds to the counters. */
typedef struct profile_stack_s {
  struct profile_stack_s *all_next; /* every stack, newest first */
  uint64_t hash;
  uint32_t depth;
  _Atomic(uint64_t) alloc_count, alloc_bytes; /* allocations since the start */
  _Atomic(uint64_t) live_count, live_bytes;   /* allocated and not freed */
  _Atomic(uint64_t) peak_count, peak_bytes;   /* live when the live total was highest */
  _Atomic(uint64_t) fresh_bytes;              /* bytes handed out fresh from the OS */
  uintptr_t pc[];                             /* innermost first; each a call site (return address - 1) */
} profile_stack_t;

typedef struct profile_state_s {
  size_t rate;        /* mean bytes between samples */
  uint64_t start_ms;  /* os_now_ms at the start */
  uint64_t start_ns;  /* Unix time at the start */
  long pid;           /* the process that started profiling (a forked child writes PATH.<pid>) */
} profile_state_t;
extern profile_state_t profile;

profile_stack_t *profile_stacks(void);
/* Copy the live totals to the peak ones if the live total passed the peak (force: reached it). */
void profile_peak_snapshot(bool force);
void profile_enter(void);
void profile_leave(void);

/* profile_write.c */
/* dlopen of soname (RTLD_NOW, RTLD_LOCAL), or NULL with dlerror's words copied to why if why is still empty. */
void *profile_open_lib(const char *soname, char *why, size_t cap);
void profile_writer_open(void);
void profile_signal_init(void);
void profile_write_fork_child(void);

/* profile_symbols.c: names, files and lines of code addresses, for the leak report */
void symbols_open(void);
void symbols_describe(uintptr_t pc, char *out, size_t cap);
void symbols_close(void);

#endif /* TH_PROFILE_H */
