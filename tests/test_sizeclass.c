/* test_sizeclass.c: how much memory threadheap's size classes waste. For every request size from 1 byte
 * to 64 KiB, and for a coarser sample up to 1 MiB (the largest size served from heap pages), it allocates
 * a block and measures waste = (usable - n) / n.
 *
 * What is asserted, and why:
 *  - every block is at least 16 bytes and at least n bytes;
 *  - the worst waste is at most 25% for every n >= 64. Below that the 16-byte granule decides: blocks are
 *    16-byte aligned, so any such allocator rounds 17 up to 32 (88%). For 16 <= n < 64 the test asserts
 *    instead that less than 16 bytes are added, and for n < 16 that the block is exactly 16 bytes;
 *  - the mean waste over 16 B .. 1 MiB is at most 12%, averaged uniformly per request size: each sampled
 *    size stands for the sizes up to the next sample, so the mean equals the mean over every integer size.
 * The log-scale mean (each power-of-two range weighted equally) and the maxima are printed as a report. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "threadheap.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

int main(void) {
  double max_waste = 0, max_waste_all = 0; /* excluding / including the 16-byte granule sizes */
  size_t max_at = 0, max_all_at = 0;
  double weighted_sum = 0, weight_total = 0;
  double octave_sum[21] = {0};
  size_t octave_count[21] = {0};
  long failures_min = 0, failures_granule = 0, failures_max = 0;

  for (size_t n = 1; n <= MiB;) {
    /* Step 1 up to 64 KiB, then a step that is not a multiple of 16 so that the sample falls at every
     * offset within the size classes, plus the exact class-border sizes (powers of two and their
     * neighbours), where the worst rounding happens. */
    size_t next = n < 64 * KiB ? n + 1 : n + 97;
    if (n >= 64 * KiB) {
      /* Also visit 2^k - 1, 2^k, 2^k + 1 on the way. */
      size_t pow2 = (size_t)1 << (64 - __builtin_clzl(n));
      if (next > pow2 - 1 && n < pow2 - 1) next = pow2 - 1;
      if ((n & (n + 1)) == 0 || (n & (n - 1)) == 0) next = n + 1;
    }
    size_t step = next - n; /* the sizes this sample stands for in the uniform mean */
    unsigned char *p = th_malloc(n);
    if (!CHECK_MSG(p != NULL, "malloc(%zu)", n)) break;
    size_t u = th_usable_size(p);
    if (u < 16 || u < n) failures_min++;
    /* Touch both ends: the usable size must really be there. */
    p[0] = 1;
    p[u - 1] = 2;
    th_free(p);

    if (n >= 16) {
      double w = (double)(u - n) / (double)n;
      if (w > max_waste_all) max_waste_all = w, max_all_at = n;
      if (n >= 64) {
        /* From 64 bytes on, 15 bytes of granule rounding are below 25%: the ratio bound applies. */
        if (w > max_waste) max_waste = w, max_at = n;
        if (w > 0.25) failures_max++;
      } else if (u - n >= 16) {
        failures_granule++; /* 16..63 bytes: only the granule may be added */
      }
      weighted_sum += w * (double)step;
      weight_total += (double)step;
      int oct = 0;
      while (((size_t)16 << (oct + 1)) <= n && oct < 20) oct++;
      octave_sum[oct] += w;
      octave_count[oct]++;
    } else if (u > 16) {
      failures_granule++; /* below 16 bytes the block is exactly the 16-byte minimum */
    }

    n = next;
  }

  double mean = weight_total > 0 ? weighted_sum / weight_total : 1.0;
  double log_mean = 0;
  int octaves = 0;
  for (int i = 0; i < 21; i++)
    if (octave_count[i] > 0) log_mean += octave_sum[i] / (double)octave_count[i], octaves++;
  log_mean = octaves ? log_mean / octaves : 1.0;

  printf("size-class waste over 16 B..1 MiB: max %.2f%% (at %zu bytes, n >= 64), "
         "max %.2f%% for n >= 16 (at %zu bytes), mean %.2f%% per size, mean %.2f%% per octave (log "
         "scale)\n",
         max_waste * 100, max_at, max_waste_all * 100, max_all_at, mean * 100, log_mean * 100);

  CHECK_MSG(failures_min == 0, "%ld sizes got a block smaller than max(16, n)", failures_min);
  CHECK_MSG(failures_granule == 0, "%ld sizes below 64 bytes were rounded up by 16 bytes or more",
            failures_granule);
  CHECK_MSG(failures_max == 0, "%ld sizes waste more than 25%% (worst %.2f%% at %zu)", failures_max,
            max_waste * 100, max_at);
  CHECK_MSG(max_waste <= 0.25, "max waste %.2f%%", max_waste * 100);
  CHECK_MSG(mean <= 0.12, "mean waste %.2f%%", mean * 100);
  return check_summary();
}
