/* os_linux.c: the OS layer (os_map_aligned and friends); the only file that makes system calls. */
#define _GNU_SOURCE
#include "os.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static size_t page_size = 4096;

static size_t cpu_count = 1;

void os_init(void) {
  long ps = sysconf(_SC_PAGESIZE);
  if (ps > 0) page_size = (size_t)ps;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n > 0) cpu_count = (size_t)n;
}

size_t os_page_size(void) { return page_size; }
size_t os_cpu_count(void) { return cpu_count; }

void *os_map_aligned(size_t size, size_t align) {
  /* Over-map and trim: the kernel gives page alignment only. The hint-free mapping keeps us in the
   * 47-bit user address space that the segment map covers. */
  size_t over = size + align;
  if (over < size) {
    errno = ENOMEM;
    return NULL;
  }
  void *p = mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    options_verbose("the OS refused to map %zu bytes (errno %d)", over, errno);
    return NULL;
  }
  uintptr_t start = (uintptr_t)p;
  uintptr_t aligned = (start + align - 1) & ~(uintptr_t)(align - 1);
  if (aligned > start) munmap(p, aligned - start);
  uintptr_t end = aligned + size;
  if (start + over > end) munmap((void *)end, start + over - end);
  stats_os_map(size);
  return (void *)aligned;
}

void *os_reserve(size_t size) {
  void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    options_verbose("the OS refused to reserve %zu bytes (errno %d)", size, errno);
    return NULL;
  }
  return p;
}

void os_unmap(void *p, size_t size) {
  if (munmap(p, size) == 0) stats_os_unmap(size);
}

void os_purge(void *p, size_t size) {
  /* MADV_DONTNEED rather than MADV_FREE: RSS drops at once, which is what users and their monitors see. */
  if (madvise(p, size, MADV_DONTNEED) == 0) stats_os_purge(size);
}

void os_commit(void *p, size_t size) {
#ifdef MADV_POPULATE_WRITE
  if (madvise(p, size, MADV_POPULATE_WRITE) == 0) return;
#endif
  volatile uint8_t *b = p;
  for (size_t i = 0; i < size; i += page_size) b[i] = b[i];
}

void os_advise_huge(void *p, size_t size) {
#ifdef MADV_HUGEPAGE
  madvise(p, size, MADV_HUGEPAGE);
#else
  (void)p, (void)size;
#endif
}

void *os_remap(void *p, size_t old_size, size_t new_size, void *dest) {
  void *q = dest == NULL ? mremap(p, old_size, new_size, 0)
                         : mremap(p, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, dest);
  return q == MAP_FAILED ? NULL : q;
}

bool os_mutex_lock_timed(pthread_mutex_t *m, unsigned ms) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  t.tv_nsec += (long)ms * 1000000L;
  t.tv_sec += t.tv_nsec / 1000000000L;
  t.tv_nsec %= 1000000000L;
  return pthread_mutex_clocklock(m, CLOCK_MONOTONIC, &t) == 0;
}

uint64_t os_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t os_random(void) {
  uint64_t r = 0;
  if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r = ((uint64_t)ts.tv_nsec << 32) ^ (uint64_t)ts.tv_sec ^ (uint64_t)getpid() ^ (uintptr_t)&r;
  }
  r |= 1; /* a zero key would make a zeroed word look like a freed block's tag */
  return r;
}

const char *os_getenv(const char *name) {
  if (getauxval(AT_SECURE)) return NULL;
  return getenv(name);
}

static bool write_all(int fd, const char *s, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    s += w;
    n -= (size_t)w;
  }
  return true;
}

void os_write_err(const char *s, size_t n) { write_all(STDERR_FILENO, s, n); }

bool os_write_file(const char *path, const char *s, size_t n) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = write_all(fd, s, n);
  return close(fd) == 0 && ok;
}

static int kept_err = -1;
static dev_t kept_dev;
static ino_t kept_ino;

void os_keep_stderr(void) {
  struct stat st;
  int fd = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 100);
  if (fd < 0) return;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return;
  }
  kept_dev = st.st_dev;
  kept_ino = st.st_ino;
  kept_err = fd;
}

void os_write_err_late(const char *s, size_t n) {
  if (write_all(STDERR_FILENO, s, n) || errno != EBADF || kept_err < 0) return;
  /* The program may have closed the copy too, and the number may name another file now. */
  struct stat st;
  if (fstat(kept_err, &st) == 0 && st.st_dev == kept_dev && st.st_ino == kept_ino) write_all(kept_err, s, n);
}

long os_process_id(void) { return (long)getpid(); }

_Noreturn void os_abort(void) { abort(); }
