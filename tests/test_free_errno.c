/* test_free_errno.c: free keeps errno, also when the munmap it makes fails.
 *
 * munmap fails when it must split a mapping and the process is at the kernel's limit on mappings
 * (vm.max_map_count): the split needs one more. So the test takes a 16 MiB block, widens the mapping that
 * holds it by a page on each side (a neighbouring anonymous page merges into it; MAP_FIXED_NOREPLACE never
 * touches what is there already), fills the map count with one-page file mappings (which merge with
 * nothing), then frees the block with errno set. The allocator is asked to unmap at once
 * (THREADHEAP_CACHE_MAX=0 from CTest; glibc unmaps its mmapped chunks always): an unmap of the block's range
 * must now fail, and the block's range must still be mapped afterwards, or the test did not reach the case
 * it is for (a setup failure, reported as such). Then the fillers go, and the process allocates again.
 * The same source runs linked to threadheap, preloaded, and on glibc alone. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"

#define BIG ((size_t)16 << 20)
#define MAX_FILLERS 70000

/* weak, so that the compiler cannot assume free leaves errno alone */
__attribute__((weak)) int get_errno(void) { return errno; }

/* The mapping of /proc/self/maps that holds addr: [*lo, *hi); false if none. */
static bool mapping_of(uintptr_t addr, uintptr_t *lo, uintptr_t *hi) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (f == NULL) return false;
  char line[512];
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) {
    unsigned long a, b;
    if (sscanf(line, "%lx-%lx", &a, &b) == 2 && addr >= a && addr < b) *lo = a, *hi = b, found = true;
  }
  fclose(f);
  return found;
}

static void *fillers[MAX_FILLERS];

int main(void) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);

  errno = 1789;
  free(NULL);
  CHECK_MSG(get_errno() == 1789, "free(NULL) changed errno to %d", get_errno());
  void *small = malloc(100);
  errno = 1789;
  free(small);
  CHECK_MSG(get_errno() == 1789, "free of a small block changed errno to %d", get_errno());
  void *big = malloc(BIG);
  CHECK(big != NULL);
  memset(big, 1, BIG);
  errno = 1789;
  free(big);
  CHECK_MSG(get_errno() == 1789, "free of a 16 MiB block changed errno to %d", get_errno());
  uintptr_t glo, ghi;
  CHECK_MSG(!mapping_of((uintptr_t)big + BIG / 2, &glo, &ghi), "setup: a freed 16 MiB block stays mapped (cache on?)");

  /* The block whose unmap will fail, in a mapping one page wider on each side. */
  char *p = malloc(BIG);
  CHECK(p != NULL);
  memset(p, 2, BIG);
  uintptr_t lo, hi;
  CHECK(mapping_of((uintptr_t)p, &lo, &hi));
  /* The pages merge only with the flags the allocator mapped with (threadheap adds MAP_NORESERVE). */
  uintptr_t wlo = lo, whi = hi;
  int prot = PROT_READ | PROT_WRITE, base = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE;
  const int extra[2] = {0, MAP_NORESERVE};
  for (int i = 0; i < 2 && wlo == lo && whi == hi; i++) {
    void *below = mmap((void *)(lo - page), page, prot, base | extra[i], -1, 0);
    void *above = mmap((void *)hi, page, prot, base | extra[i], -1, 0);
    CHECK(mapping_of((uintptr_t)p, &wlo, &whi));
    if (wlo == lo && whi == hi) { /* not merged: take them away and try the other flags */
      if (below != MAP_FAILED) munmap(below, page);
      if (above != MAP_FAILED) munmap(above, page);
    }
  }
  CHECK_MSG(wlo < lo || whi > hi, "setup: could not widen the block's mapping");

  char path[] = "/tmp/test_free_errno.XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  unlink(path);
  CHECK(ftruncate(fd, (off_t)page) == 0);
  int n = 0;
  while (n < MAX_FILLERS && (fillers[n] = mmap(NULL, page, PROT_READ, MAP_PRIVATE, fd, 0)) != MAP_FAILED) n++;
  CHECK_MSG(n < MAX_FILLERS, "the map count did not run out after %d mappings", n);

  errno = 1789;
  free(p);
  int after = get_errno();
  uintptr_t flo, fhi;
  bool still = mapping_of((uintptr_t)p + BIG / 2, &flo, &fhi);

  for (int i = 0; i < n; i++) munmap(fillers[i], page);
  close(fd);
  CHECK_MSG(after == 1789, "free whose munmap failed changed errno to %d", after);
  CHECK_MSG(still, "setup: the block was unmapped, so no munmap failed (is the cache off?)");

  /* The process goes on: memory can be had and given back. */
  for (int i = 0; i < 64; i++) {
    char *q = malloc(BIG / 4);
    CHECK(q != NULL);
    memset(q, 3, BIG / 4);
    CHECK(q[BIG / 4 - 1] == 3);
    free(q);
  }
  printf("free kept errno when its munmap failed (%d mappings filled the count)\n", n);
  return check_summary();
}
