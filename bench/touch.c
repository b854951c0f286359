/* touch: what it costs to write one byte to every page of 256 MiB obtained in different ways (seed 003).
 *
 *   malloc     the allocator under test (switched with LD_PRELOAD);
 *   mmap       anonymous private mapping, the OS baseline every allocator builds on;
 *   file       shared mapping of a temporary file (page cache pages, written back later);
 *   static     a zero-initialized static array (the same demand-zero pages, no call at all);
 *   huge       anonymous mapping aligned to 2 MiB with MADV_HUGEPAGE, so the kernel may fault 2 MiB at a
 *              time: the upper bound of what fewer faults can buy.
 *
 * Each method runs once per process on fresh memory (a second pass would measure nothing but the cache);
 * the driver repeats processes. Setup (mapping, file creation) is outside the timed loop.
 *
 * Output, one line per method: {"experiment":"touch","method":..,"size_mb":..,"ms":..,"minflt":..,
 * "majflt":..,"sys_ms":..}
 */
#define _GNU_SOURCE
#include "bench_common.h"

#include <fcntl.h>
#include <sys/mman.h>

#define STATIC_MB 256

static const char *prog = "touch";
static char static_area[(size_t)STATIC_MB << 20];

static void measure(const char *method, char *p, size_t size, size_t page) {
  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  double t0 = bench_now();
  for (size_t off = 0; off < size; off += page) ((volatile char *)p)[off] = 1;
  double secs = bench_now() - t0;
  getrusage(RUSAGE_SELF, &r1);
  bench_json_begin("touch");
  bench_json_str("method", method);
  bench_json_int("size_mb", (long long)(size >> 20));
  bench_json_num("ms", secs * 1e3);
  bench_json_int("minflt", r1.ru_minflt - r0.ru_minflt);
  bench_json_int("majflt", r1.ru_majflt - r0.ru_majflt);
  bench_json_num("sys_ms", (bench_tv(r1.ru_stime) - bench_tv(r0.ru_stime)) * 1e3);
  bench_json_end();
}

int main(int argc, char **argv) {
  const char *methods = "malloc,mmap,file,static,huge";
  const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  long mb = STATIC_MB;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--smoke")) mb = 32;
    else if (!strcmp(a, "--full")) mb = STATIC_MB;
    else if (!strcmp(a, "--methods") && v) methods = v, i++;
    else if (!strcmp(a, "--size-mb") && v) mb = bench_parse_num(prog, v), i++;
    else if (!strcmp(a, "--dir") && v) dir = v, i++;
    else {
      fprintf(stderr, "usage: touch [--smoke] [--methods malloc,mmap,file,static,huge] [--size-mb N] [--dir D]\n");
      return 2;
    }
  }
  if (mb < 1 || mb > STATIC_MB) bench_die(prog, "size must be 1..%d MiB", STATIC_MB);
  size_t size = (size_t)mb << 20, page = (size_t)sysconf(_SC_PAGESIZE);
  char list[256];
  snprintf(list, sizeof list, "%s", methods);
  for (char *save = NULL, *m = strtok_r(list, ",", &save); m; m = strtok_r(NULL, ",", &save)) {
    if (!strcmp(m, "malloc")) {
      char *p = malloc(size);
      if (!p) bench_die(prog, "malloc failed");
      measure(m, p, size, page);
      free(p);
    } else if (!strcmp(m, "mmap")) {
      char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) bench_die(prog, "mmap failed");
      measure(m, p, size, page);
      munmap(p, size);
    } else if (!strcmp(m, "file")) {
      char path[4096];
      snprintf(path, sizeof path, "%s/threadheap-touch-XXXXXX", dir);
      int fd = mkstemp(path);
      if (fd < 0) bench_die(prog, "cannot create a temporary file in %s", dir);
      unlink(path);
      if (ftruncate(fd, (off_t)size) != 0) bench_die(prog, "ftruncate failed");
      char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) bench_die(prog, "mmap of file failed");
      measure(m, p, size, page);
      munmap(p, size);
      close(fd);
    } else if (!strcmp(m, "static")) {
      measure(m, static_area, size, page);
    } else if (!strcmp(m, "huge")) {
      size_t huge = 2u << 20;
      char *raw = mmap(NULL, size + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (raw == MAP_FAILED) bench_die(prog, "mmap failed");
      char *p = (char *)(((uintptr_t)raw + huge - 1) & ~(uintptr_t)(huge - 1));
      madvise(p, size, MADV_HUGEPAGE); /* best effort: without THP support this is plain mmap */
      measure(m, p, size, page);
      munmap(raw, size + huge);
    } else {
      bench_die(prog, "unknown method '%s'", m);
    }
  }
  return 0;
}
