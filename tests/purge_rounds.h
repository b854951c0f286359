/* purge_rounds.h: what the tests of purging share: purge rounds on demand, and the resident pages of a range.
 * A heap's rounds come from its owner's clock tick, once every 4,096 frees of a page; run_rounds makes them
 * for a given time with pairs of 16-byte blocks. */
#ifndef TH_TESTS_PURGE_ROUNDS_H
#define TH_TESTS_PURGE_ROUNDS_H

#include <stdint.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "threadheap.h"

static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline void run_rounds(double seconds) {
  for (double end = now_s() + seconds; now_s() < end;) {
    for (int i = 0; i < 20000; i++) {
      volatile char *p = th_malloc(16);
      p[0] = (char)i;
      th_free((void *)p);
    }
  }
}

/* Resident OS pages of [lo, lo + len), lo page-aligned and len at most 4 MiB; -1 once it is unmapped. */
static inline long resident_pages(uintptr_t lo, size_t len) {
  size_t ps = (size_t)sysconf(_SC_PAGESIZE);
  static unsigned char vec[(4u << 20) / 4096 + 1];
  if (len > ps * (sizeof vec - 1) || mincore((void *)lo, len, vec) != 0) return -1;
  long n = 0;
  for (size_t i = 0; i < len / ps; i++) n += vec[i] & 1;
  return n;
}

#endif
