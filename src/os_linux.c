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
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

static size_t page_size = 4096;

/* Every system call that maps, unmaps or advises memory is timed (two clock reads, tens of nanoseconds
 * beside a call of microseconds) and counted: the time a program spends in its allocator's OS calls is
 * one of the costs th_stats_get and the live export show. */
static inline uint64_t clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#define TIMED(call)                                   \
  ({                                                  \
    uint64_t t0_ = clock_ns();                        \
    __typeof__(call) r_ = (call);                     \
    stats_os_call(clock_ns() - t0_);                  \
    r_;                                               \
  })

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
  void *p = TIMED(mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  if (p == MAP_FAILED) {
    options_verbose("the OS refused to map %zu bytes (errno %d)", over, errno);
    return NULL;
  }
  uintptr_t start = (uintptr_t)p;
  uintptr_t aligned = (start + align - 1) & ~(uintptr_t)(align - 1);
  if (aligned > start) TIMED(munmap(p, aligned - start));
  uintptr_t end = aligned + size;
  if (start + over > end) TIMED(munmap((void *)end, start + over - end));
  stats_os_map(size);
  return (void *)aligned;
}

void *os_reserve(size_t size) {
  void *p = TIMED(mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  if (p == MAP_FAILED) {
    options_verbose("the OS refused to reserve %zu bytes (errno %d)", size, errno);
    return NULL;
  }
  return p;
}

void os_unmap(void *p, size_t size) {
  if (TIMED(munmap(p, size)) == 0) stats_os_unmap(size);
}

void os_purge(void *p, size_t size) {
  /* MADV_DONTNEED rather than MADV_FREE: RSS drops at once, which is what users and their monitors see. */
  if (TIMED(madvise(p, size, MADV_DONTNEED)) == 0) stats_os_purge(size);
}

void os_commit(void *p, size_t size) {
#ifdef MADV_POPULATE_WRITE
  if (TIMED(madvise(p, size, MADV_POPULATE_WRITE)) == 0) return;
#endif
  volatile uint8_t *b = p;
  for (size_t i = 0; i < size; i += page_size) b[i] = b[i];
}

void os_advise_huge(void *p, size_t size) {
#ifdef MADV_HUGEPAGE
  TIMED(madvise(p, size, MADV_HUGEPAGE));
#else
  (void)p, (void)size;
#endif
}

void *os_remap(void *p, size_t old_size, size_t new_size, void *dest) {
  void *q = dest == NULL ? TIMED(mremap(p, old_size, new_size, 0))
                         : TIMED(mremap(p, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, dest));
  return q == MAP_FAILED ? NULL : q;
}

bool os_mutex_lock_timed(pthread_mutex_t *m, unsigned ms) {
  /* timedlock rather than clocklock: ThreadSanitizer (GCC 12) sees only the former take the lock. A jump of
   * the real-time clock only shortens or lengthens one wait. */
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_nsec += (long)ms * 1000000L;
  t.tv_sec += t.tv_nsec / 1000000000L;
  t.tv_nsec %= 1000000000L;
  return pthread_mutex_timedlock(m, &t) == 0;
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

uint32_t os_thread_tid(void) { return (uint32_t)gettid(); }

void os_thread_name(uint32_t tid, char name[16]) {
  memset(name, 0, 16);
  char path[48];
  int n = 0;
  const char *pre = "/proc/self/task/";
  while (pre[n]) path[n] = pre[n], n++;
  char digits[12];
  int d = 0;
  do digits[d++] = (char)('0' + tid % 10), tid /= 10;
  while (tid);
  while (d) path[n++] = digits[--d];
  memcpy(path + n, "/comm", 6);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t r = read(fd, name, 15);
  close(fd);
  if (r <= 0) {
    memset(name, 0, 16);
    return;
  }
  if (name[r - 1] == '\n') name[r - 1] = '\0';
}

size_t os_read_self(void *dst, const void *src, size_t n) {
  struct iovec local = {dst, n}, remote = {(void *)src, n};
  ssize_t r = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
  return r < 0 ? 0 : (size_t)r;
}

uint64_t os_realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void *os_export_open(const char *path, size_t size) {
  for (int attempt = 0; attempt < 2; attempt++) {
    int fd = TIMED(open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (fd < 0) {
      /* A file of this pid can only be a dead process's (pids are reused): replace it. */
      if (errno == EEXIST && attempt == 0 && unlink(path) == 0) continue;
      return NULL;
    }
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)size) == 0)
      p = TIMED(mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    if (p == MAP_FAILED) {
      unlink(path);
      return NULL;
    }
    return p;
  }
  return NULL;
}

void os_export_remove(const char *path) { unlink(path); }

_Noreturn void os_abort(void) { abort(); }
